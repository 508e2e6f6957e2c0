'use strict'
// One group of rate limit calls (fm.rateLimit): one statement.  Element i
// of the arrays is call i; the server checks every element before it spends
// from any key, so a group refused for one call's input spent nothing and
// can be split and sent again.  What it spends stays spent whatever becomes
// of the statement's transaction: the limiter is in shared memory.
const { types } = require('../numbers')
const { milliseconds } = require('./decision')

const text = 'SELECT item, allowed, remaining, ' + milliseconds('retry_after', 'retry_after_ms') + ', ' +
  milliseconds('reset_after', 'reset_after_ms') +
  ' FROM flagmeter.limit_batch($1::text[], $2::bigint[], $3::interval[], $4::bigint[], $5::bigint[])'

/**
 * @param {import('pg').ClientBase} db
 * @param {string[]} keys
 * @param {import('../interfaces').Int[]} rates
 * @param {string[]} pers  interval texts
 * @param {Array<import('../interfaces').Int | null>} bursts  null: the rate
 * @param {Array<import('../interfaces').Int | null>} costs  null: 1
 * @returns {Promise<import('./rows').RateDecisionRow[]>}
 */
async function limitBatch (db, keys, rates, pers, bursts, costs) {
  const { rows } = await db.query({ text, values: [keys, rates, pers, bursts, costs], types })
  return rows
}

module.exports = { limitBatch }
