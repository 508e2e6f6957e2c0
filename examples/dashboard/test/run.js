'use strict'
// npm test: test/*.test.js with node:test against the cluster in PGHOST and
// PGPORT (as `make test` hands it over; a cluster with flagmeter
// installed).  flagmeter is created once, in a template database each file
// clones (test/helpers.js).  Each file starts the app
// as child processes on ports the system picks.  The browser test needs
// Debian's chromium and installs it when missing and run as root.
const { spawn } = require('node:child_process')
const fs = require('node:fs')
const path = require('node:path')

if (!process.env.PGHOST || !process.env.PGPORT) {
  console.error('examples/dashboard tests: set PGHOST and PGPORT to a PostgreSQL 15 cluster with flagmeter installed (make test does)')
  process.exit(1)
}
const only = process.argv.slice(2)
const files = fs.readdirSync(__dirname).filter((f) => f.endsWith('.test.js'))
  .filter((f) => only.length === 0 || only.some((o) => f.includes(o))).sort().map((f) => path.join(__dirname, f))

async function main () {
  const { template } = require('./helpers')
  await template('CREATE')
  const child = spawn(process.execPath, ['--test', '--test-concurrency=1', ...files], { stdio: 'inherit' })
  const code = await new Promise((resolve) => child.on('exit', (c, sig) => resolve(c ?? (sig ? 1 : 0))))
  await template('DROP').catch((err) => console.error(err.message))
  process.exitCode = code
}

main().catch((err) => {
  console.error(err)
  process.exitCode = 1
})
