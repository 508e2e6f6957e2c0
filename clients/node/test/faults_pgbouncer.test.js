'use strict'
// Faults between the client and the database: pgbouncer (transaction mode,
// the request path) restarted and paused, and a failover: the primary
// stopped, its synchronous standby promoted, pgbouncer re-pointed at it
// (RELOAD).  The same load and checks as test/faults.test.js.
const { test, before, after } = require('node:test')
const assert = require('node:assert/strict')
const { FlagMeter } = require('..')
const { Cluster, Pgbouncer, sleep } = require('@flagmeter/test-helpers')
const { Load, SETUP } = require('./faults/load')

const TIMEOUT_MS = 3000
let n = 0

/**
 * A client whose request path goes through pgbouncer, its LISTEN session
 * directly to the cluster (listenVia: 'cluster') or through pgbouncer's
 * session-mode alias (listenVia: 'pgbouncer'); a load; fault(); the checks.
 */
async function underFault (cluster, bouncerOf, fault, { listenVia = 'cluster' } = {}) {
  const db = await cluster.createDatabase(`faults_bouncer_${++n}`, SETUP)
  const bouncer = await bouncerOf(db)
  let primary = cluster
  const query = (text, values) => primary.sql(db, text, values)
  const fm = new FlagMeter({
    connection: bouncer.connection(db),
    listen: listenVia === 'cluster' ? cluster.connection(db) : bouncer.connection(`${db}_session`),
    timeoutMs: TIMEOUT_MS,
    reconnect: { initialDelayMs: 50, maxDelayMs: 500 }
  })
  fm.on('error', () => {}) // heard (the other file runs without a listener)
  try {
    await fm.ready()
    const from = fm.version
    const l = new Load(fm, { timeoutMs: TIMEOUT_MS }).start()
    await sleep(500)
    const faultAt = Date.now()
    const next = await fault({ db, bouncer })
    if (next) primary = next
    await l.recovered(faultAt)
    await sleep(300)
    await l.stop()
    const summary = await l.verify(query)
    summary.events = await l.verifyEvents(query, from)
    return summary
  } finally {
    await fm.close()
    await bouncer.destroy()
  }
}

let cluster
before(async () => { cluster = await Cluster.create('bouncer') })
after(() => { cluster.destroy() })

test('pgbouncer restarted', async () => {
  const s = await underFault(cluster, (db) => Pgbouncer.create(cluster), async ({ bouncer }) => {
    await bouncer.stop()
    await sleep(500)
    await bouncer.start()
  })
  console.log('# pgbouncer restart:', JSON.stringify(s))
})

test('pgbouncer PAUSE, then RESUME', async () => {
  const s = await underFault(cluster, (db) => Pgbouncer.create(cluster), async ({ db, bouncer }) => {
    await bouncer.admin(`PAUSE ${db}`)
    await sleep(1500)
    await bouncer.admin(`RESUME ${db}`)
  })
  console.log('# pgbouncer pause:', JSON.stringify(s))
})

test('pgbouncer PAUSE longer than the deadline: calls fail, keyed ones are settled by their key', async () => {
  const s = await underFault(cluster, (db) => Pgbouncer.create(cluster), async ({ db, bouncer }) => {
    await bouncer.admin(`PAUSE ${db}`)
    await sleep(TIMEOUT_MS + 1000)
    await bouncer.admin(`RESUME ${db}`)
  })
  console.log('# pgbouncer long pause:', JSON.stringify(s))
  assert.ok(s.failed.FLAGMETER_OUTCOME_UNKNOWN > 0, 'calls held by pgbouncer past their deadline: outcome unknown')
})

test('failover: the primary stops, its standby is promoted, pgbouncer is re-pointed (RELOAD)', async () => {
  // commits wait for the standby: what was acknowledged survives the failover
  const primary = await Cluster.create('failover', { conf: { synchronous_standby_names: "'*'" } })
  const standby = await primary.standby('failover_standby')
  standby.configure({ synchronous_standby_names: "''" })
  await standby.restartAsync('fast')
  try {
    const s = await underFault(primary, (db) => Pgbouncer.create(primary, { sessionDatabases: [db] }), async ({ bouncer }) => {
      await primary.stopAsync('immediate')
      await standby.promoteAsync()
      await bouncer.repoint(standby)
      return standby
    }, { listenVia: 'pgbouncer' })
    console.log('# failover:', JSON.stringify(s))
    assert.ok(s.acked > 0)
  } finally {
    standby.destroy()
    primary.destroy()
  }
})
