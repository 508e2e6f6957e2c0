'use strict'
// Databases of the cluster a suite runs against (PGHOST, PGPORT, PGUSER, as
// make test hands its cluster over, or runner.js's own): one-off sessions,
// the template each run creates flagmeter in once, and a database per test
// file cloned from it.
const pg = require('pg')

/** node-postgres settings for database on the suite's cluster. */
function connection (database, extra = {}) {
  return { host: process.env.PGHOST, port: Number(process.env.PGPORT), user: process.env.PGUSER, database, ...extra }
}

/** fn(client) on a session of its own to database, closed after. */
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
 * The template database name, created (action 'CREATE': dropped first,
 * then CREATE EXTENSION flagmeter and check(client) on it, which throws
 * when the flagmeter installed is not a build of this tree) or dropped
 * ('DROP').  One CREATE EXTENSION for a whole run: the extension's script
 * is read from the server's share directory once, right at the start, so
 * that on a machine where other builds of flagmeter get installed into
 * that directory while a run goes on, the tests keep testing the one
 * installed now.
 */
async function template (name, action, check = async () => {}) {
  await admin('postgres', async (c) => {
    await c.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`)
    if (action === 'CREATE') await c.query(`CREATE DATABASE ${name}`)
  })
  if (action !== 'CREATE') return
  await admin(name, async (c) => {
    await c.query('CREATE EXTENSION flagmeter')
    await check(c)
  })
}

/**
 * A database of its own with flagmeter and setupSql: a clone of the
 * template when it exists (the runner made it), or CREATE EXTENSION here
 * when a test file runs on its own.  Returns { name, connection(extra),
 * query(text, values), drop() }.
 */
async function createDatabase (name, setupSql = '', { template } = {}) {
  const cloned = await admin('postgres', async (c) => {
    await c.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`)
    const { rows } = await c.query('SELECT count(*)::int AS n FROM pg_database WHERE datname = $1', [template ?? null])
    await c.query(`CREATE DATABASE ${name}${rows[0].n ? ` TEMPLATE ${template}` : ''}`)
    return rows[0].n > 0
  })
  await admin(name, async (c) => {
    if (!cloned) await c.query('CREATE EXTENSION flagmeter')
    if (setupSql) await c.query(setupSql)
  })
  return {
    name,
    connection: (extra) => connection(name, extra),
    query: (text, values) => admin(name, (c) => c.query(text, values)),
    drop: () => admin('postgres', (c) => c.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`))
  }
}

function sleep (ms) {
  return new Promise((resolve) => setTimeout(resolve, ms))
}

/** Wait until cond() is true, polling; fails after ms. */
async function until (cond, ms = 10000, what = 'condition') {
  const end = Date.now() + ms
  while (!(await cond())) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`)
    await sleep(20)
  }
}

module.exports = { connection, admin, template, createDatabase, sleep, until }
