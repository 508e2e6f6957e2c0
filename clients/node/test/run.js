'use strict'
// npm test: run test/*.test.js with node:test against a real cluster.
//
// With PGHOST and PGPORT set (make test hands its cluster over that way),
// the tests use that cluster: each file creates its own database with
// CREATE EXTENSION flagmeter and drops it.  Otherwise this script starts a
// throwaway PostgreSQL 15 cluster first (initdb and pg_ctl from
// /usr/lib/postgresql/15/bin, as the current user, or as postgres through
// runuser when run as root), with flagmeter preloaded, on a free port of
// 54341-54360 and a socket in a temp dir, and stops and deletes it after.

const { spawnSync, spawn } = require('node:child_process')
const fs = require('node:fs')
const net = require('node:net')
const os = require('node:os')
const path = require('node:path')

const BIN = process.env.FLAGMETER_PG_BINDIR || '/usr/lib/postgresql/15/bin'
const asRoot = process.getuid && process.getuid() === 0

function runAs (cmd, args) {
  const [c, a] = asRoot ? ['runuser', ['-u', 'postgres', '--', cmd, ...args]] : [cmd, args]
  const r = spawnSync(c, a, { encoding: 'utf8' })
  if (r.status !== 0) throw new Error(`${cmd} ${args.join(' ')} failed: ${r.stderr || r.stdout}`)
  return r.stdout
}

function portFree (port) {
  return new Promise((resolve) => {
    const s = net.createServer()
    s.once('error', () => resolve(false))
    s.listen(port, '127.0.0.1', () => s.close(() => resolve(true)))
  })
}

async function startCluster () {
  let port
  for (let p = 54341; p <= 54360 && port === undefined; p++) {
    if (await portFree(p) && !fs.existsSync(`/tmp/.s.PGSQL.${p}`)) port = p
  }
  if (port === undefined) throw new Error('no free port in 54341-54360')
  const dir = fs.mkdtempSync(path.join('/tmp', 'fm-node-'))
  if (asRoot) spawnSync('chown', ['postgres:', dir])
  const data = path.join(dir, 'data')
  runAs(path.join(BIN, 'initdb'), ['-D', data, '-U', 'postgres', '-A', 'trust', '-E', 'UTF8', '--locale=C', '--no-instructions'])
  const conf = [
    `port = ${port}`,
    "listen_addresses = ''",
    `unix_socket_directories = '${dir}'`,
    "shared_preload_libraries = 'flagmeter'",
    'max_connections = 200'
  ].join('\n')
  runAs('sh', ['-c', `cat >> '${data}/postgresql.conf' <<'EOF'\n${conf}\nEOF`])
  runAs(path.join(BIN, 'pg_ctl'), ['-D', data, '-l', path.join(dir, 'server.log'), '-w', 'start'])
  return {
    env: { PGHOST: dir, PGPORT: String(port), PGUSER: 'postgres' },
    stop () {
      try {
        runAs(path.join(BIN, 'pg_ctl'), ['-D', data, '-m', 'fast', '-w', 'stop'])
      } finally {
        fs.rmSync(dir, { recursive: true, force: true })
      }
    }
  }
}

const TEMPLATE = 'fm_node_template'

async function template (env, action) {
  const pg = require('pg')
  const conn = (database) => ({ host: env.PGHOST, port: Number(env.PGPORT), user: env.PGUSER, database })
  const admin = new pg.Client(conn('postgres'))
  await admin.connect()
  try {
    await admin.query(`DROP DATABASE IF EXISTS ${TEMPLATE} WITH (FORCE)`)
    if (action === 'DROP') return
    await admin.query(`CREATE DATABASE ${TEMPLATE}`)
  } finally { await admin.end() }
  const db = new pg.Client(conn(TEMPLATE))
  await db.connect()
  try {
    await db.query('CREATE EXTENSION flagmeter')
    const { rows } = await db.query("SELECT to_regprocedure('flagmeter.consume_batch(text[], text[], bigint[], text[], integer[])') IS NOT NULL AS ok")
    if (!rows[0].ok) throw new Error('the flagmeter installed in this server has no consume_batch: not a build of this tree')
  } finally { await db.end() }
}

async function main () {
  let cluster = null
  let env = process.env
  if (!process.env.PGHOST || !process.env.PGPORT) {
    cluster = await startCluster()
    env = { ...process.env, ...cluster.env }
    console.log(`# throwaway cluster on port ${cluster.env.PGPORT} (${cluster.env.PGHOST})`)
  }
  // One CREATE EXTENSION for the whole run, into a template every test file
  // clones (helpers.createDatabase): the extension's script is read from
  // the server's share directory once, right at the start.  On a machine
  // where other builds of flagmeter get installed into that directory
  // while a run goes on, the tests keep testing the one installed now.
  await template(env, 'CREATE')
  const files = fs.readdirSync(__dirname).filter((f) => f.endsWith('.test.js')).sort()
    .map((f) => path.join(__dirname, f))
  const child = spawn(process.execPath, ['--test', '--test-concurrency=1', ...files], { env, stdio: 'inherit' })
  const code = await new Promise((resolve) => child.on('exit', (c, sig) => resolve(c ?? (sig ? 1 : 0))))
  await template(env, 'DROP').catch((err) => console.error(err.message))
  if (cluster) cluster.stop()
  process.exitCode = code
}

main().catch((err) => {
  console.error(err)
  process.exitCode = 1
})
