'use strict'
// Step 2 of the client protocol: the version and the state the cache holds,
// read in one REPEATABLE READ transaction after LISTEN.  Blocked rows come
// with the end of their period, so the cache expires them on time without
// waiting for maintain() (NULL end: a lifetime period, never).
const { types } = require('../numbers')
const { blockedText } = require('./blockedUntil')
const { limitsText } = require('./limits')

/**
 * Inside a transaction: { version, blocked, limits }.
 * @param {import('pg').ClientBase} db
 * @returns {Promise<import('./rows').State>}
 */
async function readState (db) {
  const v = await db.query({ text: 'SELECT flagmeter.latest_version() AS version', types })
  const blocked = await db.query({ text: blockedText + ' FROM flagmeter.blocked b', types })
  const limits = await db.query({ text: limitsText, types })
  return { version: v.rows[0].version, blocked: blocked.rows, limits: limits.rows }
}

/**
 * Run fn(db) in one REPEATABLE READ, READ ONLY transaction.
 * @template T
 * @param {import('pg').ClientBase} db
 * @param {(db: import('pg').ClientBase) => Promise<T>} fn
 * @returns {Promise<T>}
 */
async function inSnapshot (db, fn) {
  await db.query('BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY')
  try {
    const result = await fn(db)
    await db.query('COMMIT')
    return result
  } catch (err) {
    await db.query('ROLLBACK').catch(() => {})
    throw err
  }
}

module.exports = { readState, inSnapshot }
