'use strict'
// Faults of the database under a load of concurrent callers (track with
// and without keys, consume with keys, LISTEN active), each on a real
// cluster of this file's own (@flagmeter/test-helpers: test/node-helpers/cluster.js): the process lives,
// every acknowledged call is counted once, every failed call says whether
// it was applied, no call outlives its deadline, and the events and the
// version converge once the database is back (test/faults/load.js).
// No fm.on('error') listener is attached: without one, nothing may end the
// process either.
const { test, before, after } = require('node:test')
const assert = require('node:assert/strict')
const { FlagMeter } = require('..')
const { Cluster, batchingProxy, sleep } = require('@flagmeter/test-helpers')
const { Load, SETUP } = require('./faults/load')

const TIMEOUT_MS = 3000
let cluster
let n = 0

before(async () => {
  cluster = await Cluster.create('faults')
})
after(() => { cluster.destroy() })

/** A database of its own, a client with LISTEN on it, a load; fault(); the checks. */
async function underFault (fault, { clientOptions = {}, load = {}, prepare = async () => {} } = {}) {
  const db = await cluster.createDatabase(`faults_${++n}`, SETUP)
  await prepare(db)
  const query = (text, values) => cluster.sql(db, text, values)
  const { userForRequests, statementTimeout, through, ...options } = clientOptions
  const request = cluster.connection(db, { application_name: 'fm-request' })
  if (through) Object.assign(request, { host: through.host, port: through.port })
  if (userForRequests) request.user = userForRequests
  if (statementTimeout) request.options = `-c statement_timeout=${statementTimeout}`
  const fm = new FlagMeter({
    connection: request,
    listen: cluster.connection(db, { application_name: 'fm-listen' }),
    timeoutMs: TIMEOUT_MS,
    reconnect: { initialDelayMs: 50, maxDelayMs: 500 },
    ...options
  })
  const warnings = []
  const warn = console.warn
  console.warn = (msg) => warnings.push(msg)
  try {
    await fm.ready()
    const from = fm.version
    const l = new Load(fm, { timeoutMs: TIMEOUT_MS, ...load }).start()
    await sleep(500)
    const faultAt = Date.now()
    await fault({ db, fm, query })
    await l.recovered(faultAt)
    await sleep(300)
    await l.stop()
    const summary = await l.verify(query)
    summary.events = await l.verifyEvents(query, from)
    summary.warnings = warnings.length
    return summary
  } finally {
    console.warn = warn
    await fm.close()
    await cluster.sql('postgres', `DROP DATABASE ${db} WITH (FORCE)`).catch(() => {})
  }
}

test('fast restart (pg_ctl restart -m fast)', async () => {
  const s = await underFault(async () => { await cluster.restartAsync('fast') })
  console.log('# fast restart:', JSON.stringify(s))
})

test('crash: immediate stop, then start (crash recovery)', async () => {
  const s = await underFault(async () => { await cluster.crashAsync() })
  console.log('# crash:', JSON.stringify(s))
})

test('the database away longer than the deadline: calls fail within it, then carry on', async () => {
  const s = await underFault(async () => {
    await cluster.stopAsync('fast')
    await sleep(TIMEOUT_MS + 1500)
    await cluster.startAsync()
  })
  console.log('# away:', JSON.stringify(s))
  assert.ok(s.failed.FLAGMETER_NOT_APPLIED > 0, 'calls made while it was away failed, not applied')
})

test('pg_terminate_backend of the request path', async () => {
  const s = await underFault(async ({ db }) => {
    for (let i = 0; i < 5; i++) {
      await cluster.terminate(db, { applicationName: 'fm-request' })
      await sleep(100)
    }
  })
  console.log('# terminate request path:', JSON.stringify(s))
})

test('pg_terminate_backend of the LISTEN session: it reconnects and replays', async () => {
  const s = await underFault(async ({ db, fm }) => {
    const before = fm.stats().reconnects
    const states = []
    fm.on('disconnected', () => states.push(['disconnected', fm.connected]))
    fm.on('connected', () => states.push(['connected', fm.connected]))
    assert.equal(await cluster.terminate(db, { applicationName: 'fm-listen' }), 1)
    const end = Date.now() + 10000
    while (fm.stats().reconnects === before || !fm.connected) {
      if (Date.now() > end) throw new Error('the LISTEN session did not come back')
      await sleep(20)
    }
    assert.deepEqual(states, [['disconnected', false], ['connected', true]], 'the events say what fm.connected says')
  })
  console.log('# terminate listen:', JSON.stringify(s))
})

test('sessions terminated just after their login, read in one chunk with it', async () => {
  // pg-pool stops listening to a new connection as it lends it: a FATAL in
  // the same read as the login's ReadyForQuery came in that gap, unheard,
  // and ended the process
  const proxy = await batchingProxy(cluster)
  try {
    const s = await underFault(async ({ db }) => {
      const end = Date.now() + 3000
      let seeded = 0
      let young = 0
      while (Date.now() < end) {
        const all = Date.now() - seeded > 300 // all of them now and then: new logins
        if (all) seeded = Date.now()
        const { rows } = await cluster.sql('postgres', `
          SELECT count(pg_terminate_backend(pid))::int AS n FROM pg_stat_activity
           WHERE datname = $1 AND application_name = 'fm-request'
             AND ($2 OR backend_start > now() - interval '25 ms')`, [db, all])
        if (!all) young += rows[0].n
        await sleep(3)
      }
      assert.ok(young > 0, 'sessions were terminated just after their login')
    }, { clientOptions: { through: proxy } })
    console.log('# terminated after login:', JSON.stringify(s))
  } finally {
    await proxy.close()
  }
})

test('idle_session_timeout closes idle pool connections', async () => {
  const s = await underFault(async ({ db, fm }) => {
    await cluster.sql('postgres', `ALTER DATABASE ${db} SET idle_session_timeout = '200ms'`)
    // new sessions get it: end the pool's present ones
    await cluster.terminate(db, { applicationName: 'fm-request' })
    await sleep(1500)
    await cluster.sql('postgres', `ALTER DATABASE ${db} RESET idle_session_timeout`)
    await cluster.terminate(db, { applicationName: 'fm-request' })
  }, { load: { keyed: 2, consumers: 1, unkeyed: 1 } })
  console.log('# idle_session_timeout:', JSON.stringify(s))
})

test('out of connections (53300): not applied, then carries on', async () => {
  // the request path's role (not a superuser: they have no limit) is
  // allowed no connection while its sessions are ended
  await cluster.sql('postgres', 'CREATE ROLE fm_few LOGIN').catch(() => {})
  const grant = (db) => cluster.sql(db, `GRANT USAGE ON SCHEMA flagmeter TO fm_few;
    GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA flagmeter TO fm_few`)
  const s = await underFault(async ({ db }) => {
    await cluster.sql('postgres', 'ALTER ROLE fm_few CONNECTION LIMIT 0')
    await cluster.terminate(db, { applicationName: 'fm-request' })
    const pg = require('pg')
    const probe = new pg.Client(cluster.connection(db, { user: 'fm_few' }))
    await assert.rejects(probe.connect(), (err) => err.code === '53300')
    await sleep(TIMEOUT_MS + 500)
    await cluster.sql('postgres', 'ALTER ROLE fm_few CONNECTION LIMIT -1')
  }, { clientOptions: { userForRequests: 'fm_few' }, prepare: grant })
  console.log('# 53300:', JSON.stringify(s))
  assert.ok(s.failed.FLAGMETER_NOT_APPLIED > 0, 'calls failed, not applied, while no connection could be had')
})

test('a statement timeout (57014): not applied, sent again, then counted', async () => {
  const s = await underFault(async ({ db }) => {
    // every write of events waits for this lock, past the request path's statement_timeout
    const pg = require('pg')
    const c = new pg.Client(cluster.connection(db))
    await c.connect()
    await c.query('BEGIN')
    await c.query('LOCK TABLE flagmeter.events IN ACCESS EXCLUSIVE MODE')
    await sleep(1500)
    await c.query('COMMIT')
    await c.end()
  }, { clientOptions: { statementTimeout: 300 } })
  console.log('# statement timeout:', JSON.stringify(s))
})

test("the README's example app lives through a fast restart and pg_terminate_backend while it tracks", async () => {
  const path = require('node:path')
  const { spawn } = require('node:child_process')
  const db = await cluster.createDatabase(`faults_${++n}`, SETUP)
  const app = spawn(process.execPath, [path.join(__dirname, '..', 'examples', 'app.js')], {
    env: { ...process.env, DATABASE_URL: cluster.url(db), PORT: '0' },
    stdio: ['ignore', 'pipe', 'pipe']
  })
  let out = ''
  app.stdout.on('data', (d) => { out += d })
  app.stderr.on('data', (d) => { out += d })
  let exited = null
  app.on('exit', (code, sig) => { exited = code ?? sig })
  try {
    const end = Date.now() + 20000
    let m
    while (!(m = /listening on (\d+)/.exec(out))) {
      if (exited !== null || Date.now() > end) throw new Error(`the app did not start:\n${out}`)
      await sleep(20)
    }
    const url = `http://127.0.0.1:${m[1]}/api/events`
    const acked = new Set()
    const statuses = {}
    let stop = false
    // what a caller of the app does: on 503 it sends the same event again
    const caller = async (w) => {
      for (let i = 0; !stop; i++) {
        const key = `app-${w}-${i}`
        for (;;) {
          const r = await fetch(url, { method: 'POST', body: JSON.stringify({ tenant: `t${i % 40}`, meter: 'api_calls', key }) })
          statuses[r.status] = (statuses[r.status] ?? 0) + 1
          await r.arrayBuffer()
          if (r.status === 200) { acked.add(key); break }
          assert.equal(r.status, 503, `an event is answered 200 or 503, not ${r.status}`)
          await sleep(50)
        }
      }
    }
    const callers = Array.from({ length: 8 }, (_, w) => caller(w))
    await sleep(500)
    await cluster.restartAsync('fast')
    await sleep(800)
    assert.ok(await cluster.terminate(db) > 0)
    await sleep(800)
    stop = true
    await Promise.all(callers)
    assert.equal(exited, null, `the app is alive:\n${out}`)
    const { rows } = await cluster.sql(db, 'SELECT count(*)::int AS n, count(DISTINCT idempotency_key)::int AS k FROM flagmeter.events WHERE idempotency_key = ANY($1)', [[...acked]])
    assert.deepEqual(rows[0], { n: acked.size, k: acked.size }, 'every event answered 200 counted once')
    console.log('# example app:', JSON.stringify({ acked: acked.size, statuses }))
  } finally {
    app.kill('SIGTERM')
    if (exited === null) await new Promise((resolve) => app.on('exit', resolve))
  }
})
