'use strict'
// The limits in force (override, else plan) as the cache holds them: all
// of them at start, then those a limit_changed or plan_changed event names.
const { types } = require('../numbers')

const limitsText = 'SELECT tenant, meter, aggregation, quota, period, mode, thresholds, plan,' +
  ' anchor, timezone FROM flagmeter.effective_limits'

// NULL arguments match everything: (tenant), (tenant, meter) or (plan, meter)
const someText = limitsText +
  ' WHERE ($1::text IS NULL OR tenant = $1) AND ($2::text IS NULL OR meter = $2)' +
  ' AND ($3::text IS NULL OR plan = $3)'

/**
 * @param {import('pg').ClientBase} db
 * @param {{ tenant?: string | null, meter?: string | null, plan?: string | null }} match
 * @returns {Promise<import('./rows').LimitRow[]>}
 */
async function limitsOf (db, { tenant = null, meter = null, plan = null }) {
  const { rows } = await db.query({ text: someText, values: [tenant, meter, plan], types })
  return rows
}

module.exports = { limitsOf, limitsText }
