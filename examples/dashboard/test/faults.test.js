'use strict'
// The app while its database goes away, on a cluster of this file's own
// (@flagmeter/test-helpers, test/node-helpers/cluster.js): it degrades, it does not die.
// Under a load of POST /api/events with ids: 503 with Retry-After within
// the deadline while the database is away, never a 500, /healthz up and
// /readyz down meanwhile, 200 again after; every id answered 200 counted
// once; the page shows a banner while the database is away; webhook
// deliveries carry on after pg_terminate_backend of every app session.
const { test, before, after } = require('node:test')
const assert = require('node:assert/strict')
const fs = require('node:fs')
const http = require('node:http')
const os = require('node:os')
const path = require('node:path')
const { Cluster, sleep } = require('@flagmeter/test-helpers')
const { startApp, call, freePort, until } = require('./helpers')

const DEADLINE_MS = 2000
const SETUP = `
  SELECT flagmeter.define_meter('api_calls');
  SELECT flagmeter.define_plan('free'), flagmeter.set_limit('free', 'api_calls', 400, 'month', 'soft', '{50,80,100}');
  SELECT flagmeter.assign_plan('t' || i, 'free') FROM generate_series(0, 9) i;
  SELECT flagmeter.assign_plan('alerted', 'free');`

let cluster, app, receiver, receiverPort
const alerts = []
let n = 0

before(async () => {
  cluster = await Cluster.create('dash_faults')
  const name = await cluster.createDatabase('dash_faults', SETUP)
  const db = { connection: () => cluster.connection(name), name }
  receiverPort = await freePort()
  receiver = http.createServer((req, res) => {
    let data = ''
    req.on('data', (d) => { data += d })
    req.on('end', () => { alerts.push(JSON.parse(data)); res.writeHead(200); res.end('ok') })
  })
  await new Promise((resolve) => receiver.listen(receiverPort, '127.0.0.1', resolve))
  app = await startApp(db, null, {
    FLAGMETER_TIMEOUT_MS: String(DEADLINE_MS),
    WEBHOOK_RETRY_MS: '100',
    WEBHOOK_RETRY_MAX_MS: '400',
    DASHBOARD_STATE_MS: '300'
  })
  const r = await call(`${app.url}/api/webhooks`, 'POST', { url: `http://127.0.0.1:${receiverPort}/hook` })
  assert.equal(r.status, 201)
})
after(async () => {
  // a test that failed half-way left its load running: it would keep the
  // process alive for ever, posting to a port another run may take
  await Promise.all([...loads].map((l) => l.stop()))
  if (app) await app.stop()
  if (receiver) await new Promise((resolve) => receiver.close(resolve))
  if (cluster) cluster.destroy()
})

const loads = new Set()

/** Callers of POST /api/events with ids until stop(); each answer's status and time. */
function load (callers = 8) {
  const answers = []
  const acked = new Set()
  let stopping = false
  const loops = Array.from({ length: callers }, async (_, w) => {
    for (let i = 0; !stopping; i++) {
      const id = `e${++n}`
      const t0 = Date.now()
      let status
      let headers
      try {
        const r = await call(`${app.url}/api/events`, 'POST', { tenant: `t${w}`, meter: 'api_calls', id })
        status = r.status
        headers = r.headers
      } catch (err) {
        status = `no answer: ${err.message}`
      }
      answers.push({ status, ms: Date.now() - t0, at: t0, retryAfter: headers?.get('retry-after') })
      if (status === 200) acked.add(id)
      else await sleep(50)
    }
  })
  const l = {
    answers,
    acked,
    async stop () {
      stopping = true
      await Promise.all(loops)
      loads.delete(l)
    }
  }
  loads.add(l)
  return l
}

async function checkCounted (acked) {
  const { rows } = await cluster.sql('dash_faults',
    'SELECT count(*)::int AS n, count(DISTINCT idempotency_key)::int AS k FROM flagmeter.events WHERE idempotency_key = ANY($1)', [[...acked]])
  assert.deepEqual(rows[0], { n: acked.size, k: acked.size }, 'every id answered 200 is counted, once')
}

function checkAnswers (answers) {
  for (const a of answers) {
    assert.ok(a.status === 200 || a.status === 503, `an event is answered 200 or 503, not ${a.status}`)
    if (a.status === 503) assert.equal(a.retryAfter, '1', '503 says when to come back')
    assert.ok(a.ms <= DEADLINE_MS + 1000, `answered within the deadline: ${a.ms} ms`)
  }
}

test('pg_ctl restart -m fast under load: the app lives, answers 200 or 503, counts every 200 once', async () => {
  const l = load()
  await sleep(500)
  await cluster.restartAsync('fast')
  const back = Date.now()
  await until(async () => l.answers.some((a) => a.at > back && a.status === 200), 15000, '200 after the restart')
  await sleep(300)
  await l.stop()
  assert.equal(app.exitedCode(), null, `the app is alive:\n${app.output()}`)
  checkAnswers(l.answers)
  await checkCounted(l.acked)
})

test('the database stopped: 503 within the deadline, /healthz up, /readyz down, the page shows it; all back after', async () => {
  const { chromium } = require('playwright-core')
  const userDir = fs.mkdtempSync(path.join(os.tmpdir(), 'fm-dash-faults-'))
  const browser = await chromium.launchPersistentContext(userDir, {
    executablePath: '/usr/bin/chromium',
    headless: true,
    args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking',
      '--disable-component-update', '--disable-sync']
  })
  try {
    const page = await browser.newPage()
    await page.goto(app.url + '/')
    await page.waitForSelector('tr[data-tenant="t0"]')
    assert.equal(await page.isHidden('#database'), true, 'no banner while the database is there')
    const l = load()
    await sleep(300)
    await cluster.stopAsync('fast')
    const stoppedAt = Date.now()
    await page.waitForSelector('#database', { state: 'visible', timeout: 10000 })
    assert.match(await page.textContent('#database'), /database unreachable/)
    const health = await call(`${app.url}/healthz`)
    assert.equal(health.status, 200)
    const t0 = Date.now()
    const ready = await call(`${app.url}/readyz`)
    assert.equal(ready.status, 503)
    assert.equal(ready.body.ready, false)
    assert.ok(Date.now() - t0 < 2500, '/readyz answers within its own second')
    await sleep(DEADLINE_MS + 1500) // away longer than the deadline
    const during = l.answers.filter((a) => a.at > stoppedAt + 200)
    assert.ok(during.some((a) => a.status === 503), 'events made while it was away were answered 503')
    await cluster.startAsync()
    const back = Date.now()
    await page.waitForSelector('#database', { state: 'hidden', timeout: 15000 })
    await until(async () => (await call(`${app.url}/readyz`)).status === 200, 15000, '/readyz after the start')
    await until(async () => l.answers.some((a) => a.at > back && a.status === 200), 15000, '200 after the start')
    await l.stop()
    assert.equal(app.exitedCode(), null, `the app is alive:\n${app.output()}`)
    checkAnswers(l.answers)
    await checkCounted(l.acked)
  } finally {
    await browser.close()
    fs.rmSync(userDir, { recursive: true, force: true })
  }
})

test('pg_terminate_backend of every app session: it lives, and an alert after it is delivered', async () => {
  const terminated = await cluster.terminate('dash_faults')
  assert.ok(terminated >= 3, `the request path, the LISTEN session and the webhook session: ${terminated} ended`)
  // the first call after may meet a session that just ended: the client sends it again
  for (let i = 0; i < 220; i++) {
    const r = await call(`${app.url}/api/events`, 'POST', { tenant: 'alerted', meter: 'api_calls', id: `alert-${i}` })
    assert.equal(r.status, 200, JSON.stringify(r.body))
  }
  // 220 of 400: the 50 % threshold, announced, delivered by the deliverer's new session
  await until(async () => alerts.some((a) => a.tenant === 'alerted' && a.threshold === 50), 20000, 'the alert delivered')
  assert.equal(app.exitedCode(), null, `the app is alive:\n${app.output()}`)
  assert.doesNotMatch(app.output(), /Unhandled 'error' event/)
})
