'use strict'
// One group of value calls of unique meters (fm.trackValue, consumeValue,
// forgetValue): one statement, so one transaction (autocommit).  There is
// no batch function of them: the statement calls the function once per
// element of the arrays, in their order (unnest's rows, one at a time, the
// function of each row run before the next row is read), and returns each
// answer with its element's number (item, 1-based) in that order.  Order
// matters between the calls of one group: the sixth new value of a tenant
// at a quota of five is the one refused, a value forgotten before it is
// counted again is new again.  A call the server refuses rolls the whole
// statement back: nothing of the group is written (src/batcher.js splits it).
const { types } = require('../numbers')
const { DECISION_COLUMNS } = require('./decision')

/** @typedef {import('../interfaces').Int} Int */

/**
 * The statement that makes `call` of each element x of the arrays
 * (tenant x.t, meter x.m, value x.v, occurred_at x.a): `columns` of its row.
 * @param {string} columns  the answer's columns (of x, and of d: the row of `call`)
 * @param {string} call  a function call in FROM, on x.t, x.m, x.v (and x.a), aliased d
 * @param {boolean} occurred  whether the arrays have a fourth, of event times
 */
function grouped (columns, call, occurred) {
  const arrays = occurred ? '$1::text[], $2::text[], $3::text[], $4::timestamptz[]' : '$1::text[], $2::text[], $3::text[]'
  const names = occurred ? 't, m, v, a, i' : 't, m, v, i'
  return `SELECT x.i::int AS item, ${columns}` +
    ` FROM unnest(${arrays}) WITH ORDINALITY AS x(${names}) CROSS JOIN LATERAL ${call}` +
    ' ORDER BY x.i'
}

const trackText = grouped('d.added', 'flagmeter.track_value(x.t, x.m, x.v, COALESCE(x.a, now())) AS d(added)', true)
const consumeText = grouped(DECISION_COLUMNS, 'flagmeter.consume_value(x.t, x.m, x.v) AS d', false)
const forgetText = grouped('d.forgotten', 'flagmeter.forget_value(x.t, x.m, x.v) AS d(forgotten)', false)

/**
 * @param {import('pg').ClientBase} db
 * @param {string[]} tenants
 * @param {string[]} meters
 * @param {string[]} values
 * @param {Array<Date | null> | null} occurredAt  null: none has one (now())
 * @returns {Promise<import('./rows').ValueAddedRow[]>}
 */
async function trackValues (db, tenants, meters, values, occurredAt) {
  const { rows } = await db.query({ text: trackText, values: [tenants, meters, values, occurredAt], types })
  return rows
}

/**
 * @param {import('pg').ClientBase} db
 * @param {string[]} tenants
 * @param {string[]} meters
 * @param {string[]} values
 * @returns {Promise<import('./rows').BatchDecisionRow[]>}
 */
async function consumeValues (db, tenants, meters, values) {
  const { rows } = await db.query({ text: consumeText, values: [tenants, meters, values], types })
  return rows
}

/**
 * @param {import('pg').ClientBase} db
 * @param {string[]} tenants
 * @param {string[]} meters
 * @param {string[]} values
 * @returns {Promise<import('./rows').ValueForgottenRow[]>}
 */
async function forgetValues (db, tenants, meters, values) {
  const { rows } = await db.query({ text: forgetText, values: [tenants, meters, values], types })
  return rows
}

module.exports = { trackValues, consumeValues, forgetValues }
