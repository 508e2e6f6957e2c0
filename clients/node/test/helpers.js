'use strict'
// Test helpers: a database of its own per test file, on the cluster npm
// test runs against (PGHOST, PGPORT, PGUSER: see run.js), with flagmeter
// created in it and dropped after.
const pg = require('pg')

function connection (database, extra = {}) {
  return { host: process.env.PGHOST, port: Number(process.env.PGPORT), user: process.env.PGUSER, database, ...extra }
}

async function admin (database, fn) {
  const c = new pg.Client(connection(database))
  await c.connect()
  try {
    return await fn(c)
  } finally {
    await c.end()
  }
}

/**
 * A database of flagmeter: a clone of run.js's template (CREATE EXTENSION
 * done there), or CREATE EXTENSION here when a file runs on its own.
 * Returns { name, connection, query, drop }.
 */
async function createDatabase (name, setupSql = '') {
  const template = await admin('postgres', async (c) => {
    await c.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`)
    const { rows } = await c.query("SELECT count(*)::int AS n FROM pg_database WHERE datname = 'fm_node_template'")
    await c.query(`CREATE DATABASE ${name}${rows[0].n ? ' TEMPLATE fm_node_template' : ''}`)
    return rows[0].n > 0
  })
  await admin(name, async (c) => {
    if (!template) await c.query('CREATE EXTENSION flagmeter')
    if (setupSql) await c.query(setupSql)
  })
  return {
    name,
    connection: (extra) => connection(name, extra),
    query: (text, values) => admin(name, (c) => c.query(text, values)),
    drop: () => admin('postgres', (c) => c.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`))
  }
}

/** Transactions committed in the database so far (pg_stat_database). */
async function commits (db) {
  return admin(db.name, async (c) => {
    await c.query('SELECT pg_stat_clear_snapshot()')
    const { rows } = await c.query('SELECT xact_commit::bigint AS n FROM pg_stat_database WHERE datname = current_database()')
    return Number(rows[0].n)
  })
}

/** Wait until cond() is true, polling; fails after ms. */
async function until (cond, ms = 10000, what = 'condition') {
  const end = Date.now() + ms
  while (!(await cond())) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`)
    await new Promise((resolve) => setTimeout(resolve, 20))
  }
}

module.exports = { createDatabase, connection, commits, until, admin }
