'use strict'
// Test helpers: a database per file (the client's test helper), the app
// started as a child process the way a user starts it, and small HTTP calls.
const { spawn } = require('node:child_process')
const path = require('node:path')
const { createDatabase, until } = require('../../../clients/node/test/helpers')

const SERVER = path.join(__dirname, '..', 'server.js')

function databaseUrl (db) {
  const c = db.connection()
  return `postgresql://${encodeURIComponent(c.user)}@/${c.database}?host=${encodeURIComponent(c.host)}&port=${c.port}`
}

/**
 * `node server.js` on port, for database db; resolves once it listens.
 * Returns { url, stop(signal) } (stop resolves with the exit code).
 */
async function startApp (db, port, env = {}) {
  const child = spawn(process.execPath, [SERVER], {
    env: { ...process.env, DATABASE_URL: databaseUrl(db), PORT: String(port), INSTANCE_NAME: `app ${port}`, ...env },
    stdio: ['ignore', 'pipe', 'pipe']
  })
  let output = ''
  child.stdout.on('data', (d) => { output += d })
  child.stderr.on('data', (d) => { output += d })
  const exited = new Promise((resolve) => child.on('exit', (code, sig) => resolve(code ?? sig)))
  await Promise.race([
    until(async () => output.includes('listening on'), 30000, `app on port ${port} to listen`),
    exited.then((code) => { throw new Error(`app on port ${port} exited (${code}):\n${output}`) })
  ])
  return {
    url: `http://127.0.0.1:${port}`,
    output: () => output,
    exited,
    async stop (signal = 'SIGTERM') {
      if (child.exitCode === null && child.signalCode === null) child.kill(signal)
      return exited
    }
  }
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

module.exports = { createDatabase, until, startApp, call, databaseUrl }
