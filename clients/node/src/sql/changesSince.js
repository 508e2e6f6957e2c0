'use strict'
// The quota events committed after a version, in version (= commit) order:
// the catch-up after a gap, a resync hint or a reconnect.
const { types } = require('../numbers')

// config as text: parsed by the number rule, as a payload's is
const text = 'SELECT version, kind, tenant, meter, plan, period_start, threshold, used, quota,' +
  ' feature, enabled, config::text AS config FROM flagmeter.changes_since($1::bigint)'

/**
 * @param {import('pg').ClientBase} db
 * @param {import('../interfaces').Int | null} version
 * @returns {Promise<import('./rows').OutboxRow[]>}
 */
async function changesSince (db, version) {
  const { rows } = await db.query({ text, values: [String(version)], types })
  return rows
}

module.exports = { changesSince }
