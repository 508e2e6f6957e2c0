'use strict'
// Test helpers: a database per file (a clone of run.js's template), the
// app started as a child process the way a user starts it, small HTTP calls.
const { spawn } = require('node:child_process')
const path = require('node:path')
// connections and one-off sessions as the client's tests make them
const { connection, admin, until } = require('../../../clients/node/test/helpers')

const TEMPLATE = 'fm_dash_template'

/**
 * The template every file clones: CREATE EXTENSION once, at the start of
 * the run, checked to be a build with minute buckets (on a shared machine
 * another tree's build may be installed over this one meanwhile).
 */
async function template (action) {
  await admin('postgres', async (c) => {
    await c.query(`DROP DATABASE IF EXISTS ${TEMPLATE} WITH (FORCE)`)
    if (action === 'CREATE') await c.query(`CREATE DATABASE ${TEMPLATE}`)
  })
  if (action !== 'CREATE') return
  await admin(TEMPLATE, async (c) => {
    await c.query('CREATE EXTENSION flagmeter')
    await c.query("SELECT count(*) FROM flagmeter.usage_series('t', 'm', now() - interval '1 minute', now(), 'minute')")
      .catch((err) => {
        if (err.code === '42704') return // meter "m" does not exist: the bucket was accepted
        throw new Error(`the flagmeter installed in this server is not a build of this tree: ${err.message}`)
      })
  })
}

/** A database of its own, with flagmeter and setupSql: { name, connection, query, drop }. */
async function createDatabase (name, setupSql = '') {
  await admin('postgres', async (c) => {
    await c.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`)
    await c.query(`CREATE DATABASE ${name} TEMPLATE ${TEMPLATE}`)
  })
  if (setupSql) await admin(name, (c) => c.query(setupSql))
  return {
    name,
    connection: () => connection(name),
    query: (text, values) => admin(name, (c) => c.query(text, values)),
    drop: () => admin('postgres', (c) => c.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`))
  }
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

// Ports of 54363-54380, handed out once each per test process; a port
// something else listens on (another run of these tests) is skipped.
const given = new Set()
async function freePort () {
  const net = require('node:net')
  for (let p = 54363; p <= 54380; p++) {
    if (given.has(p)) continue
    const ok = await new Promise((resolve) => {
      const s = net.createServer()
      s.once('error', () => resolve(false))
      s.listen(p, '127.0.0.1', () => s.close(() => resolve(true)))
    })
    if (ok) {
      given.add(p)
      return p
    }
  }
  throw new Error('no free port in 54363-54380')
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

module.exports = { template, createDatabase, until, startApp, call, databaseUrl, freePort }
