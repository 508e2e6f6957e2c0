'use strict'
// consume across several meters, all or nothing, inside the caller's
// transaction: one decision per meter in argument order.
const { types } = require('../numbers')
const { DECISION_COLUMNS } = require('./decision')

const text = 'SELECT ' + DECISION_COLUMNS +
  ' FROM flagmeter.consume($1, $2::text[], $3::bigint[], $4)'

/**
 * @param {import('pg').ClientBase} db
 * @param {string} tenant
 * @param {string[]} meters
 * @param {import('../interfaces').Int[]} amounts
 * @param {string | null} key
 * @returns {Promise<import('./rows').DecisionRow[]>}
 */
async function consumeMeters (db, tenant, meters, amounts, key) {
  const { rows } = await db.query({ text, values: [tenant, meters, amounts, key], types })
  return rows
}

module.exports = { consumeMeters }
