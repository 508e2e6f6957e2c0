'use strict'
// Webhook delivery under failure, against a local receiver that fails,
// times out and recovers, with two app instances (one deliverer at a time)
// and a restart of the deliverer.
const { test, before, after } = require('node:test')
const assert = require('node:assert/strict')
const http = require('node:http')
const { createDatabase, until, startApp, call, freePort } = require('./helpers')

let RECEIVER_PORT
const FAST = { WEBHOOK_TIMEOUT_MS: '300', WEBHOOK_RETRY_MS: '100', WEBHOOK_RETRY_MAX_MS: '400' }

// The receiver: every request is logged; behaviour per path, by a plan of
// answers ('fail', 'hang', then 'ok' for ever; /dead always fails).
const log = []
const plans = { '/hook': ['fail', 'fail', 'hang'], '/dead': null }
const inFlight = new Map()
let maxInFlightPerTenant = 0
const hanging = new Set()
const receiver = http.createServer((req, res) => {
  let data = ''
  req.on('data', (d) => { data += d })
  req.on('end', () => {
    const body = JSON.parse(data)
    const key = `${req.url} ${body.tenant}`
    inFlight.set(key, (inFlight.get(key) ?? 0) + 1)
    maxInFlightPerTenant = Math.max(maxInFlightPerTenant, inFlight.get(key))
    const plan = plans[req.url]
    const what = plan === null ? 'fail' : (plan.shift() ?? 'ok')
    const entry = { path: req.url, what, body, at: Date.now() }
    log.push(entry)
    const done = () => inFlight.set(key, inFlight.get(key) - 1)
    if (what === 'hang') {
      hanging.add(res)
      res.on('close', done)
      return // no answer: the deliverer's timeout
    }
    done()
    res.writeHead(what === 'ok' ? 200 : 500)
    res.end(what)
  })
})

let db, a, b
before(async () => {
  RECEIVER_PORT = await freePort()
  await new Promise((resolve) => receiver.listen(RECEIVER_PORT, '127.0.0.1', resolve))
  db = await createDatabase('fm_dash_hooks', `
    SELECT flagmeter.define_meter('api_calls');
    SELECT flagmeter.define_plan('free'), flagmeter.set_limit('free', 'api_calls', 10, 'month', 'hard', '{50,80,100}');
    SELECT flagmeter.assign_plan(t, 'free') FROM unnest(ARRAY['acme', 'globex', 'initech']) t;`)
  ;[a, b] = await Promise.all([startApp(db, null, FAST), startApp(db, null, FAST)])
})
after(async () => {
  for (const res of hanging) res.destroy()
  await Promise.all([a, b].filter(Boolean).map((app) => app.stop()))
  await db.drop()
  await new Promise((resolve) => receiver.close(resolve))
})

const delivered = (path, tenant) => log.filter((e) => e.path === path && e.what === 'ok' && (!tenant || e.body.tenant === tenant))

async function alertVersions (tenant) {
  const { rows } = await db.query(
    "SELECT version::int AS v FROM flagmeter.outbox WHERE tenant = $1 AND kind IN ('threshold', 'blocked', 'unblocked') ORDER BY version", [tenant])
  return rows.map((r) => r.v)
}

async function consume (app, tenant, n) {
  for (let i = 0; i < n; i++) await call(`${app.url}/api/consume`, 'POST', { tenant, meter: 'api_calls' })
}

test('failures, a timeout, recovery: every alert once, in version order, Slack-compatible', async () => {
  const hook = await call(`${a.url}/api/webhooks`, 'POST', { url: `http://127.0.0.1:${RECEIVER_PORT}/hook` })
  assert.equal(hook.status, 201)
  await consume(a, 'acme', 10) // 50 %, 80 %, 100 %, blocked
  const versions = await alertVersions('acme')
  assert.equal(versions.length, 4)
  await until(async () => delivered('/hook', 'acme').length === 4, 20000, 'four alerts delivered')
  const attempts = log.filter((e) => e.path === '/hook')
  // the first alert was tried until the receiver recovered: two 500s, one timeout, then 200
  assert.deepEqual(attempts.slice(0, 4).map((e) => [e.what, e.body.version]), [
    ['fail', versions[0]], ['fail', versions[0]], ['hang', versions[0]], ['ok', versions[0]]])
  assert.deepEqual(delivered('/hook', 'acme').map((e) => e.body.version), versions)
  // retried with growing delays (100 ms, then about 200 ms, jittered down to half)
  assert.ok(attempts[1].at - attempts[0].at >= 50, `${attempts[1].at - attempts[0].at} ms`)
  assert.ok(attempts[3].at - attempts[2].at >= 300, 'the hung attempt was given up after its timeout')
  const [first, , , blocked] = delivered('/hook', 'acme').map((e) => e.body)
  assert.equal(first.text, ':warning: acme reached 50 % of its api_calls quota (5 of 10 used)')
  assert.deepEqual([first.kind, first.tenant, first.meter, first.threshold, first.used, first.quota], ['threshold', 'acme', 'api_calls', 50, 5, 10])
  assert.equal(blocked.kind, 'blocked')
  assert.match(blocked.text, /acme is blocked on api_calls/)
})

test('a dead URL does not hold up other tenants or the global webhook', async () => {
  const dead = await call(`${b.url}/api/webhooks`, 'POST', { url: `http://127.0.0.1:${RECEIVER_PORT}/dead`, tenant: 'globex' })
  assert.equal(dead.status, 201)
  await consume(b, 'globex', 5) // 50 %
  await consume(a, 'initech', 8) // 50 %, 80 %
  await until(async () => delivered('/hook', 'globex').length === 1 && delivered('/hook', 'initech').length === 2,
    20000, 'globex and initech alerts on the global webhook')
  await until(async () => log.filter((e) => e.path === '/dead').length >= 3, 20000, 'the dead URL retried')
  const hooks = await call(`${a.url}/api/webhooks`)
  const deadHook = hooks.body.find((w) => w.id === dead.body.id)
  assert.equal(deadHook.cursors.length, 1)
  const c = deadHook.cursors[0]
  assert.equal(c.tenant, 'globex')
  assert.ok(c.attempts >= 2, `attempts ${c.attempts}`)
  assert.equal(c.last_error, 'HTTP 500')
  assert.equal(c.delivered, 0)
  // only the head event of a pair is ever in flight
  assert.equal(maxInFlightPerTenant, 1)
})

test('one deliverer across instances; a restart neither loses nor floods', async () => {
  const { rows } = await db.query("SELECT count(*)::int AS n FROM pg_locks WHERE locktype = 'advisory' AND granted")
  assert.equal(rows[0].n, 1)
  const before = log.filter((e) => e.path === '/hook').length
  // stop both instances, whichever delivers; record alerts while none runs
  await Promise.all([a.stop(), b.stop()])
  await db.query("SELECT flagmeter.override_limit('acme', 'api_calls', 100)") // acme unblocked
  const versions = await alertVersions('acme')
  assert.equal(versions.length, 5)
  ;[a, b] = await Promise.all([startApp(db, a.port, FAST), startApp(db, b.port, FAST)])
  await until(async () => delivered('/hook', 'acme').length === 5, 20000, 'the unblocked alert after the restart')
  assert.deepEqual(delivered('/hook', 'acme').map((e) => e.body.version), versions)
  assert.equal(delivered('/hook', 'acme')[4].body.kind, 'unblocked')
  // nothing delivered before went out again
  const since = log.filter((e) => e.path === '/hook').slice(before)
  assert.deepEqual(since.map((e) => e.body.version), [versions[4]])
  const locks = await db.query("SELECT count(*)::int AS n FROM pg_locks WHERE locktype = 'advisory' AND granted")
  assert.equal(locks.rows[0].n, 1)
})

// Transactions the database committed, as its statistics have them.
async function commits () {
  await db.query('SELECT pg_stat_clear_snapshot()')
  const { rows } = await db.query('SELECT xact_commit::int AS n FROM pg_stat_database WHERE datname = current_database()')
  return rows[0].n
}

test('idle, the deliverer and its standby look at the database about once a poll, kicked or not', async (t) => {
  // every alert is out: nothing pending, so the deliverer has no retry due
  // (the dead URL's alerts would be retried for ever: it goes)
  await db.query("DELETE FROM dashboard.webhooks WHERE url LIKE '%/dead'")
  await until(async () => {
    const { rows } = await db.query('SELECT count(*)::int AS n FROM dashboard.webhook_cursors WHERE delivered_through < pending_through')
    return rows[0].n === 0
  }, 20000, 'the cursors to be drained')
  // a quota event kicks both instances' deliverers (the standby's too)
  await db.query("SELECT flagmeter.override_limit('initech', 'api_calls', 1000)")
  await new Promise((resolve) => setTimeout(resolve, 1500))
  const start = await commits()
  await new Promise((resolve) => setTimeout(resolve, 4000))
  const spent = (await commits()) - start
  // at rest: the deliverer's scan, fill and next-due reads once a second
  // (pollMs), the standby's lock attempt every 2 s, the apps' own reads;
  // a deliverer that polled every 10 ms, or a kicked standby that retried
  // its lock without sleeping, commits thousands in 4 s
  t.diagnostic(`${spent} transactions in 4 s`)
  assert.ok(spent < 100, `${spent} transactions in 4 s`)
})
