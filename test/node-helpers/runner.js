'use strict'
// `npm test` of a Node suite (clients/node, examples/dashboard): its
// test/*.test.js (those whose names contain one of the arguments, when
// given) with node:test, one file at a time, against a real cluster.
//
// With PGHOST and PGPORT set (make test hands its cluster over that way),
// the suite uses that cluster.  Otherwise the runner starts a throwaway
// one first (cluster.js: PostgreSQL 15 of this machine, or what
// FLAGMETER_PG_RUN runs; flagmeter preloaded; a port of 54341-54360, its
// unix socket in its own directory), and stops and deletes it after.
// Either way flagmeter is created once, in a template database every test
// file clones (db.js: template, createDatabase), dropped at the end.
const { spawn } = require('node:child_process')
const fs = require('node:fs')
const path = require('node:path')
const { Cluster } = require('./cluster')
const { template } = require('./db')
const { RANGES, portRange } = require('./ports')

/**
 * Run the suite of dir (its *.test.js) and set process.exitCode.
 * templateName, check: the template (db.js template()).
 */
async function runSuite ({ dir, templateName, check, only = process.argv.slice(2) }) {
  let cluster = null
  try {
    if (!process.env.PGHOST || !process.env.PGPORT) {
      cluster = await Cluster.create('run', { ports: portRange(...RANGES.run), conf: { max_connections: 200 } })
      Object.assign(process.env, { PGHOST: cluster.dir, PGPORT: String(cluster.port), PGUSER: 'postgres' })
      console.log(`# throwaway cluster on port ${cluster.port} (${cluster.dir})`)
    }
    await template(templateName, 'CREATE', check)
    const files = fs.readdirSync(dir).filter((f) => f.endsWith('.test.js'))
      .filter((f) => only.length === 0 || only.some((o) => f.includes(o))).sort().map((f) => path.join(dir, f))
    const child = spawn(process.execPath, ['--test', '--test-concurrency=1', ...files], { stdio: 'inherit' })
    process.exitCode = await new Promise((resolve) => child.on('exit', (c, sig) => resolve(c ?? (sig ? 1 : 0))))
    await template(templateName, 'DROP').catch((err) => console.error(err.message))
  } catch (err) {
    console.error(err)
    process.exitCode = 1
  } finally {
    if (cluster) {
      cluster.stop()
      cluster.destroy()
    }
  }
}

module.exports = { runSuite }
