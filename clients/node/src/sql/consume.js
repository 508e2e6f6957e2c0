'use strict'
// consume of one meter inside the caller's transaction.
const { types } = require('../numbers')
const { DECISION_COLUMNS } = require('./decision')

const text = 'SELECT ' + DECISION_COLUMNS +
  ' FROM flagmeter.consume($1, $2, $3::bigint, $4)'

/**
 * @param {import('pg').ClientBase} db
 * @param {string} tenant
 * @param {string} meter
 * @param {import('../interfaces').Int} amount
 * @param {string | null} key
 * @returns {Promise<import('./rows').DecisionRow>}
 */
async function consume (db, tenant, meter, amount, key) {
  const { rows } = await db.query({ text, values: [tenant, meter, amount, key], types })
  return rows[0]
}

module.exports = { consume }
