'use strict'
// Credit grants and reservations (README "Credit grants", "Reservations"):
// unbatched calls, each its own statement on the connection given.
const { types } = require('../numbers')
const { DECISION_COLUMNS, milliseconds } = require('./decision')

const balanceText = 'SELECT flagmeter.balance($1, $2) AS balance'
const reserveText = 'SELECT granted, reservation_id, reserved, expires_at, balance, ' + milliseconds('retry_after', 'retry_after_ms') +
  ' FROM flagmeter.reserve($1, $2, $3::bigint, $4::interval, $5)'
const settleText = 'SELECT ' + DECISION_COLUMNS +
  ' FROM flagmeter.settle($1::bigint, $2::bigint)'
const releaseText = 'SELECT flagmeter.release($1::bigint) AS released'

/** @typedef {import('../interfaces').Int} Int */

/**
 * @param {import('pg').ClientBase} db
 * @param {string} tenant
 * @param {string} meter
 * @returns {Promise<Int | null>}
 */
async function balance (db, tenant, meter) {
  const { rows } = await db.query({ text: balanceText, values: [tenant, meter], types })
  return rows[0].balance
}

/**
 * @param {import('pg').ClientBase} db
 * @param {string} tenant
 * @param {string} meter
 * @param {Int} amount
 * @param {string} ttl  an interval text
 * @param {string | null} key
 * @returns {Promise<import('./rows').ReservationRow>}
 */
async function reserve (db, tenant, meter, amount, ttl, key) {
  const { rows } = await db.query({ text: reserveText, values: [tenant, meter, amount, ttl, key], types })
  return rows[0]
}

/**
 * @param {import('pg').ClientBase} db
 * @param {Int} reservationId
 * @param {Int} actual
 * @returns {Promise<import('./rows').DecisionRow>}
 */
async function settle (db, reservationId, actual) {
  const { rows } = await db.query({ text: settleText, values: [reservationId, actual], types })
  return rows[0]
}

/**
 * @param {import('pg').ClientBase} db
 * @param {Int} reservationId
 * @returns {Promise<boolean>}
 */
async function release (db, reservationId) {
  const { rows } = await db.query({ text: releaseText, values: [reservationId], types })
  return rows[0].released
}

module.exports = { balance, reserve, settle, release }
