'use strict'
// One group of track calls: one statement, so one transaction (autocommit),
// and its answer arrives after the commit, i.e. once the events are durable.
// track_events answers per event (false: the key was counted before).
const { types } = require('../numbers')

const text = 'SELECT flagmeter.track_events($1::text[], $2::text[], $3::bigint[], $4::timestamptz[], $5::text[]) AS counted'

/**
 * @param {import('pg').ClientBase} db
 * @param {string[]} tenants
 * @param {string[]} meters
 * @param {import('../interfaces').Int[]} amounts
 * @param {Array<Date | null> | null} occurredAt  null: none has one
 * @param {Array<string | null> | null} keys  null: none has a key
 * @returns {Promise<boolean[]>}
 */
async function trackEvents (db, tenants, meters, amounts, occurredAt, keys) {
  const { rows } = await db.query({ text, values: [tenants, meters, amounts, occurredAt, keys], types })
  return rows[0].counted
}

module.exports = { trackEvents }
