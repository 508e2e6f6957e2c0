'use strict'
// One group of consume calls: one statement (one transaction).  Row i of
// the arrays is one meter of item items[i]; the server decides the items
// in order, each exactly as consume, and returns one decision per row in
// argument order.
const { types } = require('../numbers')
const { DECISION_COLUMNS } = require('./decision')

const text = 'SELECT item, ' + DECISION_COLUMNS +
  ' FROM flagmeter.consume_batch($1::text[], $2::text[], $3::bigint[], $4::text[], $5::int[])'

/**
 * @param {import('pg').ClientBase} db
 * @param {string[]} tenants
 * @param {string[]} meters
 * @param {import('../interfaces').Int[]} amounts
 * @param {Array<string | null> | null} keys  null: none has a key
 * @param {number[]} items
 * @returns {Promise<import('./rows').BatchDecisionRow[]>}
 */
async function consumeBatch (db, tenants, meters, amounts, keys, items) {
  const { rows } = await db.query({ text, values: [tenants, meters, amounts, keys, items], types })
  return rows
}

module.exports = { consumeBatch }
