'use strict'
// The dashboard in a real browser: Debian's chromium, driven by
// playwright-core (no browser download).  Loads /, drives usage through the
// API, and checks that the quota bars, the blocked list, the rate-limited
// counts and the live chart change without a reload; and that a unique
// meter shows its distinct count, its quota and its values per day.  The screenshot is kept in test/output/ (or
// $DASHBOARD_TEST_OUTPUT).
const { test, before, after } = require('node:test')
const assert = require('node:assert/strict')
const { spawnSync } = require('node:child_process')
const fs = require('node:fs')
const path = require('node:path')
const { createDatabase, startApp, call } = require('./helpers')

const CHROMIUM = '/usr/bin/chromium'
const OUTPUT = process.env.DASHBOARD_TEST_OUTPUT || path.join(__dirname, 'output')

/** Install Debian's chromium when it is missing (as root); fail clearly otherwise. */
function ensureChromium () {
  if (fs.existsSync(CHROMIUM)) return
  if (process.getuid() !== 0) throw new Error(`${CHROMIUM} is missing and this is not root: apt-get install -y chromium`)
  const r = spawnSync('apt-get', ['install', '-y', '--no-install-recommends', 'chromium'], {
    env: { ...process.env, DEBIAN_FRONTEND: 'noninteractive' }, encoding: 'utf8'
  })
  if (r.status !== 0 || !fs.existsSync(CHROMIUM)) throw new Error(`apt-get install chromium failed:\n${r.stdout}\n${r.stderr}`)
}

let db, app, browser, userDir
before(async () => {
  ensureChromium()
  db = await createDatabase('fm_dash_browser', `
    SELECT flagmeter.define_meter('api_calls'), flagmeter.define_meter('tokens');
    SELECT flagmeter.define_plan('free'), flagmeter.set_limit('free', 'api_calls', 10, 'month', 'hard'),
           flagmeter.set_limit('free', 'tokens', 5000, 'month', 'soft');
    SELECT flagmeter.define_plan('pro'), flagmeter.set_limit('pro', 'api_calls', 1000, 'month', 'hard'),
           flagmeter.set_limit('pro', 'tokens', 100000, 'month', 'soft');
    -- months from two hours ago, so that the last hour's events are in this period
    SELECT flagmeter.assign_plan(t, p, now() - interval '2 hours')
    FROM (VALUES ('acme', 'free'), ('globex', 'pro'), ('initech', 'free')) v(t, p);
    -- globex: 40 000 tokens over the last 40 minutes; initech at 84 % of its tokens
    SELECT flagmeter.track_batch(array_fill('globex'::text, ARRAY[40]), array_fill('tokens'::text, ARRAY[40]),
        (SELECT array_agg(900 + 50 * (i % 5)) FROM generate_series(1, 40) i)::bigint[],
        (SELECT array_agg(now() - i * interval '1 minute') FROM generate_series(1, 40) i));
    SELECT flagmeter.track('initech', 'tokens', 4200), flagmeter.track('initech', 'api_calls', 3);
    -- initech: one API call an hour, so that its second is refused for its rate
    SELECT flagmeter.override_rate_limit('initech', 'api_calls', 1, '1 hour');
    -- distinct values: active users, 3 a month on the free plan (hard)
    SELECT flagmeter.define_meter('users', 'unique', 'active users');
    SELECT flagmeter.set_limit('free', 'users', 3, 'month', 'hard'), flagmeter.set_limit('pro', 'users', 100, 'month', 'hard');`)
  app = await startApp(db, null, { DASHBOARD_STATE_MS: '300', DASHBOARD_SERIES_MS: '500' })
  const { chromium } = require('playwright-core')
  userDir = fs.mkdtempSync(path.join(require('node:os').tmpdir(), 'fm-dash-chromium-'))
  // an empty profile of its own (playwright passes it as --user-data-dir), headless
  browser = await chromium.launchPersistentContext(userDir, {
    executablePath: CHROMIUM,
    headless: true,
    viewport: { width: 1280, height: 900 },
    args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking',
      '--disable-component-update', '--disable-sync']
  })
})
after(async () => {
  if (browser) await browser.close()
  if (app) await app.stop()
  if (db) await db.drop()
  if (userDir) fs.rmSync(userDir, { recursive: true, force: true })
})

test('bars, blocked list, rate-limited counts and chart change live, without a reload', async () => {
  const page = await browser.newPage()
  const errors = []
  page.on('pageerror', (err) => errors.push(err.message))
  const requests = []
  page.on('request', (r) => requests.push(r.url()))
  await page.goto(app.url + '/')
  // first state: both tenants with a bar per meter, nothing blocked
  await page.waitForSelector('tr[data-tenant="globex"] .bar[data-meter="tokens"]')
  await page.evaluate(() => { window.loadedOnce = true })
  assert.equal(await page.getAttribute('tr[data-tenant="globex"] .bar[data-meter="tokens"]', 'data-used'), '40000')
  assert.equal(await page.getAttribute('tr[data-tenant="acme"] .bar[data-meter="api_calls"]', 'data-state'), 'ok')
  assert.equal(await page.getAttribute('tr[data-tenant="initech"] .bar[data-meter="tokens"]', 'data-state'), 'warning')
  assert.equal(await page.textContent('#blocked'), 'none')
  assert.equal(await page.textContent('#rate-limited'), 'none')
  // the chart shows the first tenant (acme), api_calls: nothing yet
  await page.waitForFunction(() => window.dashboard.series && window.dashboard.series.tenant === 'acme')
  assert.equal(await page.getAttribute('#chart', 'data-total'), '0')
  assert.equal(await page.locator('#chart canvas').count(), 1)

  // usage through the API: acme reaches 80 %, then its hard limit
  for (let i = 0; i < 8; i++) assert.equal((await call(`${app.url}/api/consume`, 'POST', { tenant: 'acme', meter: 'api_calls' })).status, 200)
  await page.waitForSelector('tr[data-tenant="acme"] .bar[data-meter="api_calls"][data-state="warning"]', { timeout: 15000 })
  await page.waitForFunction(() => document.querySelector('#chart').dataset.total === '8', null, { timeout: 15000 })
  for (let i = 0; i < 3; i++) await call(`${app.url}/api/consume`, 'POST', { tenant: 'acme', meter: 'api_calls' })
  await page.waitForSelector('#blocked li[data-tenant="acme"][data-meter="api_calls"]', { timeout: 15000 })
  await page.waitForSelector('tr[data-tenant="acme"] .bar[data-meter="api_calls"][data-state="exceeded"]', { timeout: 15000 })
  await page.waitForFunction(() => document.querySelector('#chart').dataset.total === '10', null, { timeout: 15000 })
  await page.waitForSelector('#events li[data-kind="blocked"]', { timeout: 15000 })
  await page.waitForSelector('#top tr[data-tenant="acme"][data-meter="api_calls"]', { timeout: 15000 })
  const width = await page.$eval('tr[data-tenant="acme"] .bar[data-meter="api_calls"] .fill', (e) => e.style.width)
  assert.equal(width, '100%')

  // another tenant and meter for the chart: the stream follows the choice
  await call(`${app.url}/api/events`, 'POST', { tenant: 'globex', meter: 'tokens', amount: 2500 })
  await page.selectOption('#tenant-select', 'globex')
  await page.selectOption('#meter-select', 'tokens')
  await page.waitForFunction(() => document.querySelector('#chart').dataset.total === '42500', null, { timeout: 15000 })
  await page.waitForSelector('tr[data-tenant="globex"] .bar[data-meter="tokens"][data-used="42500"]', { timeout: 15000 })

  // initech past its rate: the page counts its refusals (its first call is granted)
  const statuses = []
  for (let i = 0; i < 3; i++) statuses.push((await call(`${app.url}/api/consume`, 'POST', { tenant: 'initech', meter: 'api_calls' })).status)
  assert.deepEqual(statuses, [200, 429, 429])
  await page.waitForSelector('#rate-limited li[data-tenant="initech"][data-count="2"]', { timeout: 15000 })
  assert.equal(await page.textContent('#rate-limited li[data-tenant="initech"]'), 'initech · 2 requests')

  // still the page that was loaded first: no reload, no polling of the API
  assert.equal(await page.evaluate(() => window.loadedOnce), true)
  const updates = await page.evaluate(() => window.dashboard.updates)
  assert.ok(updates.state >= 3 && updates.series >= 3 && updates.quota >= 2, JSON.stringify(updates))
  const api = requests.filter((u) => u.includes('/api/'))
  assert.ok(api.every((u) => u.includes('/api/stream')), api.join('\n'))
  assert.ok(api.length <= 4, `${api.length} stream connections: ${api.join(', ')}`)
  // every file came from the app (offline: no CDN)
  assert.ok(requests.every((u) => u.startsWith(app.url)), requests.join('\n'))
  assert.deepEqual(errors, [])

  fs.mkdirSync(OUTPUT, { recursive: true })
  const shot = path.join(OUTPUT, 'dashboard.png')
  await page.screenshot({ path: shot, fullPage: true })
  console.log(`# screenshot: ${shot}`)
  await page.close()
})

test('a unique meter: its distinct count against its quota, and distinct values per day', async () => {
  const page = await browser.newPage()
  const errors = []
  page.on('pageerror', (err) => errors.push(err.message))
  await page.goto(app.url + '/')
  const users = 'tr[data-tenant="acme"] .bar[data-meter="users"]'
  await page.waitForSelector(`${users}[data-used="0"][data-aggregation="unique"]`)

  // value events through the API: ann, bob, and ann again (counted once)
  const seen = []
  for (const value of ['ann', 'bob', 'ann']) seen.push((await call(`${app.url}/api/events`, 'POST', { tenant: 'acme', meter: 'users', value })).body.new)
  assert.deepEqual(seen, [true, true, false])
  await page.waitForSelector(`${users}[data-used="2"]`, { timeout: 15000 })
  assert.equal(await page.textContent(`${users} .figures`), '2 / 3 active users · 67 %')

  // consume with values: cy fits, dee is refused at the hard limit, ann is counted already
  const cy = await call(`${app.url}/api/consume`, 'POST', { tenant: 'acme', meter: 'users', value: 'cy' })
  const dee = await call(`${app.url}/api/consume`, 'POST', { tenant: 'acme', meter: 'users', value: 'dee' })
  const ann = await call(`${app.url}/api/consume`, 'POST', { tenant: 'acme', meter: 'users', value: 'ann' })
  assert.deepEqual([cy.status, dee.status, dee.body.reason, ann.status], [200, 429, 'quota_exceeded', 200])
  await page.waitForSelector(`${users}[data-used="3"][data-state="exceeded"]`, { timeout: 15000 })
  assert.equal(await page.textContent(`${users} .figures`), '3 / 3 active users · 100 %')
  await page.waitForSelector('#blocked li[data-tenant="acme"][data-meter="users"]', { timeout: 15000 })

  // the chart of a unique meter: distinct values per UTC day over 30 days, not a sum
  await page.selectOption('#tenant-select', 'acme')
  await page.selectOption('#meter-select', 'users')
  await page.waitForFunction(() => document.querySelector('#chart').dataset.today === '3', null, { timeout: 15000 })
  assert.equal(await page.getAttribute('#chart', 'data-bucket'), 'day')
  assert.equal(await page.getAttribute('#chart', 'data-total'), null)
  assert.equal(await page.textContent('#chart-title'), 'Last 30 days, distinct per day (UTC)')
  assert.equal(await page.textContent('#chart-total'), '3 active users today')
  const points = await page.evaluate(() => window.dashboard.series.points)
  assert.equal(points.length, 30)
  assert.deepEqual(points.slice(0, -1).map((p) => Number(p[1])), Array(29).fill(0))
  assert.equal(await page.evaluate(() => window.dashboard.chart.series[1].label), 'users: active users per day')
  // one more active user on globex's chart, live
  await call(`${app.url}/api/events`, 'POST', { tenant: 'globex', meter: 'users', value: 'eve' })
  await page.selectOption('#tenant-select', 'globex')
  await page.waitForFunction(() => document.querySelector('#chart').dataset.today === '1', null, { timeout: 15000 })
  await call(`${app.url}/api/events`, 'POST', { tenant: 'globex', meter: 'users', value: 'fay' })
  await page.waitForFunction(() => document.querySelector('#chart').dataset.today === '2', null, { timeout: 15000 })

  // back to a meter that sums: per minute again
  await page.selectOption('#meter-select', 'tokens')
  await page.waitForFunction(() => document.querySelector('#chart').dataset.bucket === 'minute', null, { timeout: 15000 })
  assert.equal(await page.textContent('#chart-title'), 'Last hour, per minute')
  assert.equal(await page.getAttribute('#chart', 'data-today'), null)
  assert.deepEqual(errors, [])

  fs.mkdirSync(OUTPUT, { recursive: true })
  await page.selectOption('#meter-select', 'users')
  await page.waitForFunction(() => document.querySelector('#chart').dataset.bucket === 'day', null, { timeout: 15000 })
  const shot = path.join(OUTPUT, 'dashboard-unique.png')
  await page.screenshot({ path: shot, fullPage: true })
  console.log(`# screenshot: ${shot}`)
  await page.close()
})
