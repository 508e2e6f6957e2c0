'use strict'
// Test helpers: a database of its own per test file, on the cluster npm
// test runs against (PGHOST, PGPORT, PGUSER: see run.js), with flagmeter
// created in it (a clone of the run's template) and dropped after.  The
// sessions, templates and clusters are @flagmeter/test-helpers'
// (test/node-helpers), shared with examples/dashboard.
const { connection, admin, until, createDatabase: create } = require('@flagmeter/test-helpers')

const TEMPLATE = 'fm_node_template'

/** Throws unless the flagmeter of the template is a build of this tree. */
async function checkBuild (c) {
  const { rows } = await c.query("SELECT to_regprocedure('flagmeter.consume_batch(text[], text[], bigint[], text[], integer[])') IS NOT NULL AS ok")
  if (!rows[0].ok) throw new Error('the flagmeter installed in this server has no consume_batch: not a build of this tree')
}

/**
 * A database of flagmeter: a clone of run.js's template (CREATE EXTENSION
 * done there), or CREATE EXTENSION here when a file runs on its own.
 * Returns { name, connection, query, drop }.
 */
function createDatabase (name, setupSql = '') {
  return create(name, setupSql, { template: TEMPLATE })
}

/** Transactions committed in the database so far (pg_stat_database). */
async function commits (db) {
  return admin(db.name, async (c) => {
    await c.query('SELECT pg_stat_clear_snapshot()')
    const { rows } = await c.query('SELECT xact_commit::bigint AS n FROM pg_stat_database WHERE datname = current_database()')
    return Number(rows[0].n)
  })
}

module.exports = { createDatabase, connection, commits, until, admin, TEMPLATE, checkBuild }
