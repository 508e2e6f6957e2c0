'use strict'
// Test helpers: a database per file (a clone of run.js's template), the
// app started as a child process the way a user starts it, small HTTP calls.
// Sessions, templates, clusters and ports are @flagmeter/test-helpers'
// (test/node-helpers), shared with clients/node.
const { spawn } = require('node:child_process')
const path = require('node:path')
const { until, createDatabase: create, RANGES, portRange } = require('@flagmeter/test-helpers')

const TEMPLATE = 'fm_dash_template'

/**
 * Throws unless the flagmeter of the template is a build with minute
 * buckets (on a shared machine another tree's build may be installed over
 * this one meanwhile).
 */
async function checkBuild (c) {
  await c.query("SELECT count(*) FROM flagmeter.usage_series('t', 'm', now() - interval '1 minute', now(), 'minute')")
    .catch((err) => {
      if (err.code === '42704') return // meter "m" does not exist: the bucket was accepted
      throw new Error(`the flagmeter installed in this server is not a build of this tree: ${err.message}`)
    })
}

/** A database of its own, with flagmeter and setupSql: { name, connection, query, drop }. */
function createDatabase (name, setupSql = '') {
  return create(name, setupSql, { template: TEMPLATE })
}

const SERVER = path.join(__dirname, '..', 'server.js')

function databaseUrl (db) {
  const c = db.connection()
  return `postgresql://${encodeURIComponent(c.user)}@/${c.database}?host=${encodeURIComponent(c.host)}&port=${c.port}`
}

/**
 * `node server.js` on port (a free one when null), for database db;
 * resolves once it listens.
 * Returns { url, stop(signal) } (stop resolves with the exit code).
 */
async function startApp (db, port, env = {}) {
  port = port ?? await freePort()
  const child = spawn(process.execPath, [SERVER], {
    env: { ...process.env, DATABASE_URL: databaseUrl(db), PORT: String(port), INSTANCE_NAME: `app ${port}`, ...env },
    stdio: ['ignore', 'pipe', 'pipe']
  })
  let output = ''
  child.stdout.on('data', (d) => { output += d })
  child.stderr.on('data', (d) => { output += d })
  // never outlive the test process, however it ends
  const orphan = () => child.kill('SIGKILL')
  process.on('exit', orphan)
  const exited = new Promise((resolve) => child.on('exit', (code, sig) => {
    process.off('exit', orphan)
    resolve(code ?? sig)
  }))
  await Promise.race([
    until(async () => output.includes('listening on'), 30000, `app on port ${port} to listen`),
    exited.then((code) => { throw new Error(`app on port ${port} exited (${code}):\n${output}`) })
  ])
  return {
    port,
    url: `http://127.0.0.1:${port}`,
    output: () => output,
    exited,
    /** The exit code or signal once it exited, null while it runs. */
    exitedCode: () => child.exitCode ?? child.signalCode,
    async stop (signal = 'SIGTERM') {
      if (child.exitCode === null && child.signalCode === null) child.kill(signal)
      return exited
    }
  }
}

// The app tests' ports (54363-54380), each handed out once per test
// process; a port something else listens on (another run of these tests)
// is skipped.
const appPorts = portRange(...RANGES.apps)
function freePort () {
  return appPorts.take()
}

/** fetch + JSON: { status, headers, body }. */
async function call (url, method = 'GET', body) {
  const res = await fetch(url, {
    method,
    headers: body === undefined ? {} : { 'content-type': 'application/json' },
    body: body === undefined ? undefined : JSON.stringify(body)
  })
  const text = await res.text()
  let parsed = text
  try { parsed = JSON.parse(text) } catch {}
  return { status: res.status, headers: res.headers, body: parsed }
}

module.exports = { createDatabase, until, startApp, call, databaseUrl, freePort, TEMPLATE, checkBuild }
