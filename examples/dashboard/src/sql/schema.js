'use strict'
// Creates the app's schema (sql/schema.sql) if it is not there yet.  One
// instance at a time (a transaction-level advisory lock), so instances
// that start together do not race on CREATE.
const fs = require('node:fs')
const path = require('node:path')

const text = fs.readFileSync(path.join(__dirname, '..', '..', 'sql', 'schema.sql'), 'utf8')

async function applySchema (pool) {
  const db = await pool.connect()
  try {
    await db.query('BEGIN')
    await db.query("SELECT pg_advisory_xact_lock(hashtext('flagmeter dashboard schema'))")
    await db.query(text)
    await db.query('COMMIT')
  } catch (err) {
    await db.query('ROLLBACK').catch(() => {})
    throw err
  } finally {
    db.release()
  }
}

module.exports = { applySchema }
