'use strict'
// check: the decision for amount more, exact (reads every committed event).
const { types } = require('../numbers')
const { DECISION_COLUMNS } = require('./decision')

const text = 'SELECT ' + DECISION_COLUMNS +
  ' FROM flagmeter.check($1, $2, $3::bigint)'

/**
 * @param {import('pg').ClientBase} db
 * @param {string} tenant
 * @param {string} meter
 * @param {import('../interfaces').Int} amount
 * @returns {Promise<import('./rows').DecisionRow>}
 */
async function check (db, tenant, meter, amount) {
  const { rows } = await db.query({ text, values: [tenant, meter, amount], types })
  return rows[0]
}

module.exports = { check }
