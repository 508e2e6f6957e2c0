'use strict'
// track inside the caller's transaction: unbatched, rolled back with it.
const { types } = require('../numbers')

const text = 'SELECT flagmeter.track($1, $2, $3::bigint, COALESCE($4::timestamptz, now()), $5) AS counted'

/**
 * @param {import('pg').ClientBase} db
 * @param {string} tenant
 * @param {string} meter
 * @param {import('../interfaces').Int} amount
 * @param {Date | null} occurredAt  null: now()
 * @param {string | null} key
 * @returns {Promise<boolean>}
 */
async function track (db, tenant, meter, amount, occurredAt, key) {
  const { rows } = await db.query({ text, values: [tenant, meter, amount, occurredAt, key], types })
  return rows[0].counted
}

module.exports = { track }
