'use strict'
// The API with two app instances on one database, as in production.
const { test, before, after } = require('node:test')
const assert = require('node:assert/strict')
const { createDatabase, until, startApp, call, databaseUrl } = require('./helpers')
const { createApp } = require('../src/app')
const { policyField } = require('../src/rateLimits')

let db, a, b
before(async () => {
  db = await createDatabase('fm_dash_api', `
    SELECT flagmeter.define_meter('api_calls'), flagmeter.define_meter('tokens'), flagmeter.define_meter('storage', 'max');
    SELECT flagmeter.define_plan('free'), flagmeter.set_limit('free', 'api_calls', 20, 'month', 'hard'),
           flagmeter.set_limit('free', 'tokens', 1000000, 'month', 'soft');
    SELECT flagmeter.assign_plan(t, 'free') FROM unnest(ARRAY['acme', 'globex', 'initech']) t;
    -- metered without limit: a plan of no limits (a tenant without a plan is refused)
    SELECT flagmeter.define_plan('metered');
    SELECT flagmeter.assign_plan(t, 'metered') FROM unnest(ARRAY['t0', 't1', 't2', 't3', 't4', 'mixed', 'known']) t;
    -- a rate limit and no quota: 5 calls a minute (bursts of 5); eager has its own
    SELECT flagmeter.define_plan('throttled'), flagmeter.set_rate_limit('throttled', 'api_calls', 5, '1 minute');
    SELECT flagmeter.assign_plan(t, 'throttled') FROM unnest(ARRAY['hasty', 'eager']) t;
    SELECT flagmeter.override_rate_limit('eager', 'api_calls', 2, '1 second', 4);
    -- distinct values: 3 active users a month (hard); u5 may add one an hour
    SELECT flagmeter.define_meter('active_users', 'unique', 'active users');
    SELECT flagmeter.define_plan('users'), flagmeter.set_limit('users', 'active_users', 3, 'month', 'hard');
    SELECT flagmeter.assign_plan(t, 'users') FROM unnest(ARRAY['u1', 'u2', 'u3', 'u4', 'u5']) t;
    SELECT flagmeter.override_rate_limit('u5', 'active_users', 1, '1 hour');`)
  ;[a, b] = await Promise.all([startApp(db, null), startApp(db, null)])
})
after(async () => {
  const codes = await Promise.all([a, b].filter(Boolean).map((app) => app.stop()))
  await db.drop()
  assert.deepEqual(codes, [0, 0], 'both instances stop cleanly on SIGTERM')
})

async function scalar (sql) {
  const { rows } = await db.query(sql)
  return Object.values(rows[0])[0]
}

/** The value of one series of an instance's /metrics (0 when absent). */
async function metric (app, series) {
  const text = await (await fetch(`${app.url}/metrics`)).text()
  const line = text.split('\n').find((l) => l.startsWith(series + ' '))
  return line ? Number(line.slice(series.length + 1)) : 0
}

test('events through two instances: every answered event counted once, duplicates 409', async () => {
  const n = 400
  const requests = []
  for (let i = 0; i < n; i++) {
    const app = i % 2 ? a : b
    requests.push(call(`${app.url}/api/events`, 'POST', { tenant: `t${i % 5}`, meter: 'tokens', amount: i % 7 + 1, id: `e${i}` }))
  }
  // the same ids again, each through the other instance, meanwhile
  for (let i = 0; i < n; i += 8) {
    requests.push(call(`${(i % 2 ? b : a).url}/api/events`, 'POST', { tenant: `t${i % 5}`, meter: 'tokens', amount: i % 7 + 1, id: `e${i}` }))
  }
  const answers = await Promise.all(requests)
  const by = (s) => answers.filter((r) => r.status === s).length
  assert.equal(by(200) + by(409), answers.length, `statuses: ${[...new Set(answers.map((r) => r.status))]}`)
  assert.equal(by(200), n)
  assert.equal(by(409), n / 8)
  for (const r of answers.filter((x) => x.status === 409)) assert.equal(r.body.counted, false)
  let expected = 0
  for (let i = 0; i < n; i++) expected += i % 7 + 1
  // durable when answered: counted in the database, read by another session, right away
  assert.equal(Number(await scalar("SELECT sum(amount) FROM flagmeter.events WHERE tenant LIKE 't_'")), expected)
  let viaApi = 0
  for (let t = 0; t < 5; t++) {
    const u = await call(`${a.url}/api/usage/t${t}`)
    viaApi += u.body.meters.find((m) => m.meter === 'tokens').used
  }
  assert.equal(viaApi, expected)
})

test('bad input: 400 with the SQLSTATE, and only the bad event fails', async () => {
  const good = Array.from({ length: 60 }, (_, i) => call(`${(i % 2 ? a : b).url}/api/events`, 'POST', { tenant: 'mixed', meter: 'api_calls', amount: 1, id: `m${i}` }))
  const bad = [
    call(`${a.url}/api/events`, 'POST', { tenant: 'mixed', meter: 'nope', amount: 1 }),
    call(`${b.url}/api/events`, 'POST', { tenant: 'mixed', meter: 'api_calls', amount: 1, id: 'k'.repeat(300) }),
    call(`${a.url}/api/events`, 'POST', { tenant: 'x'.repeat(300), meter: 'api_calls' })
  ]
  const answers = await Promise.all([...good, ...bad])
  assert.deepEqual(answers.slice(0, 60).map((r) => r.status), Array(60).fill(200))
  const [nope, longKey, longTenant] = answers.slice(60)
  assert.equal(nope.status, 400)
  assert.equal(nope.body.sqlstate, '42704')
  assert.match(nope.body.error, /meter "nope" does not exist/)
  assert.equal(longKey.status, 400)
  assert.equal(longKey.body.sqlstate, '22023')
  assert.equal(longTenant.status, 400)
  assert.equal(longTenant.body.sqlstate, '22023')
  assert.equal(Number(await scalar("SELECT count(*) FROM flagmeter.events WHERE tenant = 'mixed'")), 60)
  // checked by the app before the database: no SQLSTATE to give
  for (const body of [{ meter: 'api_calls' }, { tenant: 'acme', meter: 'api_calls', amount: -1 }, { tenant: 'acme', meter: 'api_calls', amount: 1.5 }]) {
    const r = await call(`${a.url}/api/events`, 'POST', body)
    assert.equal(r.status, 400, JSON.stringify(body))
  }
  const notJson = await fetch(`${a.url}/api/events`, { method: 'POST', body: '{"tenant":' })
  assert.equal(notJson.status, 400)
})

test('a tenant never assigned a plan: 400 with QT001, and only its calls fail', async () => {
  const good = Array.from({ length: 40 }, (_, i) => call(`${(i % 2 ? a : b).url}/api/events`, 'POST', { tenant: 'known', meter: 'tokens', amount: 1, id: `s${i}` }))
  const stranger = [
    call(`${a.url}/api/events`, 'POST', { tenant: 'stranger', meter: 'tokens', amount: 1 }),
    call(`${b.url}/api/consume`, 'POST', { tenant: 'stranger', meter: 'api_calls', amount: 1 })
  ]
  const answers = await Promise.all([...good, ...stranger])
  assert.deepEqual(answers.slice(0, 40).map((r) => r.status), Array(40).fill(200))
  for (const r of answers.slice(40)) {
    assert.equal(r.status, 400)
    assert.equal(r.body.sqlstate, 'QT001')
    assert.match(r.body.error, /tenant "stranger" is not assigned a plan/)
  }
  assert.equal(Number(await scalar("SELECT count(*) FROM flagmeter.events WHERE tenant = 'stranger'")), 0)
})

test('consume on two instances: never past the hard limit, 429 with rate-limit headers', async () => {
  const answers = await Promise.all(Array.from({ length: 60 }, (_, i) =>
    call(`${(i % 2 ? a : b).url}/api/consume`, 'POST', { tenant: 'acme', meter: 'api_calls', amount: 1, id: `c${i}` })))
  const granted = answers.filter((r) => r.status === 200)
  const refused = answers.filter((r) => r.status === 429)
  assert.equal(granted.length, 20)
  assert.equal(refused.length, 40)
  const resets = await scalar("SELECT ceil(extract(epoch FROM period_end))::bigint FROM flagmeter.status WHERE tenant = 'acme' AND meter = 'api_calls'")
  for (const r of refused) {
    assert.equal(r.body.reason, 'quota_exceeded')
    assert.equal(r.body.error, 'quota exceeded')
    // a quota is not a rate limit: no fields of the rate-limit draft
    assert.equal(r.headers.get('ratelimit'), null)
    assert.equal(r.headers.get('ratelimit-policy'), null)
    assert.equal(r.headers.get('x-ratelimit-limit'), '20')
    assert.equal(r.headers.get('x-ratelimit-remaining'), '0')
    assert.equal(r.headers.get('x-ratelimit-reset'), String(resets))
    assert.ok(Number(r.headers.get('retry-after')) > 0)
    assert.equal(r.body.granted, false)
  }
  const remaining = granted.map((r) => Number(r.headers.get('x-ratelimit-remaining'))).sort((x, y) => x - y)
  assert.deepEqual(remaining, Array.from({ length: 20 }, (_, i) => i))
  // a retried id gets its first decision, through either instance
  const again = await call(`${a.url}/api/consume`, 'POST', { tenant: 'acme', meter: 'api_calls', amount: 1, id: 'c0' })
  assert.equal(again.status, answers[0].status)
  assert.equal(Number(await scalar("SELECT used FROM flagmeter.status WHERE tenant = 'acme' AND meter = 'api_calls'")), 20)
})

test('a consume refused for its rate: 429, Retry-After, RateLimit-Policy and RateLimit, counted by reason', async () => {
  const series = 'dashboard_consume_refusals_total{reason="rate_limited"}'
  const before = await Promise.all([a, b].map((app) => metric(app, series)))
  // 20 at once through both instances against bursts of 5: the limiter is shared
  const answers = await Promise.all(Array.from({ length: 20 }, (_, i) =>
    call(`${(i % 2 ? a : b).url}/api/consume`, 'POST', { tenant: 'hasty', meter: 'api_calls', amount: 1, id: `h${i}` })))
  const granted = answers.filter((r) => r.status === 200)
  const refused = answers.filter((r) => r.status === 429)
  assert.equal(granted.length, 5)
  assert.equal(refused.length, 15)
  for (const r of granted) {
    assert.equal(r.body.reason, 'unlimited')
    assert.equal(r.headers.get('ratelimit'), null)
  }
  for (const r of refused) {
    assert.equal(r.body.reason, 'rate_limited')
    assert.equal(r.body.error, 'rate limited')
    assert.equal(r.body.granted, false)
    // one unit every 12 s: the 6th is due 12 s after the first, less the time since
    const retryAfter = Number(r.headers.get('retry-after'))
    assert.ok(Number.isInteger(retryAfter) && retryAfter >= 1 && retryAfter <= 12, `Retry-After: ${retryAfter}`)
    assert.ok(r.body.retry_after_ms > 0 && r.body.retry_after_ms <= 12000, `retry_after_ms: ${r.body.retry_after_ms}`)
    assert.equal(retryAfter, Math.ceil(r.body.retry_after_ms / 1000), 'seconds, rounded up')
    assert.equal(r.headers.get('ratelimit-policy'), '"default";q=5;w=60')
    assert.equal(r.headers.get('ratelimit'), `"default";r=0;t=${retryAfter}`)
    // no quota on this meter: no X-RateLimit-* of a quota
    assert.equal(r.headers.get('x-ratelimit-limit'), null)
  }
  // each instance counts what it answered, in /metrics and on its dashboard
  const after = await Promise.all([a, b].map((app) => metric(app, series)))
  for (const [k, app] of [a, b].entries()) {
    const answered = answers.filter((r, i) => (i % 2 ? a : b) === app && r.status === 429).length
    assert.equal(after[k] - before[k], answered)
    const state = await call(`${app.url}/api/state`)
    assert.deepEqual(state.body.rate_limited.find((t) => t.tenant === 'hasty'), { tenant: 'hasty', count: answered })
  }
  assert.equal(Number(await scalar("SELECT count(*) FROM flagmeter.events WHERE tenant = 'hasty'")), 5)
})

test("a tenant's own rate limit in the policy, and a changed one once the instance hears of it", async () => {
  // 2 a second in bursts of 4: at least the 4 of the burst granted, the rest refused within a second
  let answers = await Promise.all(Array.from({ length: 10 }, () =>
    call(`${a.url}/api/consume`, 'POST', { tenant: 'eager', meter: 'api_calls' })))
  const refused = answers.filter((r) => r.status === 429)
  assert.ok(refused.length >= 1 && refused.length <= 6, `${refused.length} refused`)
  for (const r of refused) {
    assert.equal(r.headers.get('ratelimit-policy'), '"default";q=2;w=1;flagmeter-burst=4')
    assert.equal(r.headers.get('retry-after'), '1')
    assert.equal(r.headers.get('ratelimit'), '"default";r=0;t=1')
  }
  // the instance read that policy once; a new one replaces it when limit_changed arrives
  await db.query("SELECT flagmeter.override_rate_limit('eager', 'api_calls', 1, '1 hour')")
  await until(async () => {
    answers = await Promise.all([a, b].map((app) => call(`${app.url}/api/consume`, 'POST', { tenant: 'eager', meter: 'api_calls' })))
    return answers.every((r) => r.headers.get('ratelimit-policy') === '"default";q=1;w=3600')
  }, 15000, 'the new policy on both instances')
  // more than the burst can never be granted: no Retry-After, no t
  const tooMuch = await call(`${a.url}/api/consume`, 'POST', { tenant: 'eager', meter: 'api_calls', amount: 2 })
  assert.equal(tooMuch.status, 429)
  assert.equal(tooMuch.body.reason, 'rate_limited')
  assert.equal(tooMuch.body.retry_after_ms, null)
  assert.equal(tooMuch.headers.get('retry-after'), null)
  assert.equal(tooMuch.headers.get('ratelimit'), '"default";r=0')
  assert.equal(tooMuch.headers.get('ratelimit-policy'), '"default";q=1;w=3600')
  // a window that is not whole seconds: the next whole second, and the units it holds
  assert.equal(policyField({ rate: 3, per: 1.5, burst: 3 }), '"default";q=4;w=2')
  assert.equal(policyField({ rate: 1, per: 1, burst: 10n ** 16n }), '"default";q=1;w=1;flagmeter-burst=999999999999999')
})

test('both dashboards show the same blocked tenant, and its usage', async () => {
  await until(async () => {
    const states = await Promise.all([a, b].map((app) => call(`${app.url}/api/state`)))
    return states.every((s) => s.body.blocked.some((x) => x.tenant === 'acme' && x.meter === 'api_calls'))
  }, 15000, 'acme blocked on both instances')
  const [sa, sb] = await Promise.all([a, b].map((app) => call(`${app.url}/api/state`)))
  assert.deepEqual(sa.body.blocked, sb.body.blocked)
  assert.deepEqual(sa.body.tenants, sb.body.tenants)
  assert.notEqual(sa.body.instance, sb.body.instance)
  const acme = sa.body.tenants.find((t) => t.tenant === 'acme')
  assert.equal(acme.plan, 'free')
  assert.deepEqual(acme.meters.find((m) => m.meter === 'api_calls'), {
    ...acme.meters.find((m) => m.meter === 'api_calls'), used: 20, quota: 20, remaining: 0, state: 'exceeded'
  })
  const kinds = sb.body.events.filter((e) => e.tenant === 'acme').map((e) => e.kind)
  assert.ok(kinds.includes('blocked') && kinds.includes('threshold'), kinds.join())
})

test('GET /api/usage/:tenant: every meter, limited or not', async () => {
  await call(`${a.url}/api/events`, 'POST', { tenant: 'globex', meter: 'storage', amount: 42 })
  const r = await call(`${b.url}/api/usage/globex`)
  assert.equal(r.status, 200)
  assert.equal(r.body.plan, 'free')
  assert.deepEqual(r.body.meters.map((m) => m.meter), ['active_users', 'api_calls', 'storage', 'tokens'])
  const storage = r.body.meters.find((m) => m.meter === 'storage')
  assert.deepEqual([storage.used, storage.quota, storage.remaining, storage.state, storage.resets_at], [42, null, null, 'ok', null])
  const calls = r.body.meters.find((m) => m.meter === 'api_calls')
  assert.deepEqual([calls.used, calls.quota, calls.remaining, calls.state, calls.blocked], [0, 20, 20, 'ok', false])
  assert.ok(!Number.isNaN(Date.parse(calls.resets_at)))
  const acme = await call(`${b.url}/api/usage/acme`)
  assert.equal(acme.body.meters.find((m) => m.meter === 'api_calls').blocked, true)
  // a tenant never assigned a plan is refused (QT001): not found
  const stranger = await call(`${a.url}/api/usage/nobody`)
  assert.equal(stranger.status, 404)
  assert.equal(stranger.body.sqlstate, 'QT001')
  assert.match(stranger.body.error, /tenant "nobody" is not assigned a plan/)
})

test('value events through two instances: each distinct value counted once per period, never refused', async () => {
  const post = (app, value) => call(`${app.url}/api/events`, 'POST', { tenant: 'u1', meter: 'active_users', value })
  const series = 'dashboard_usage_events_total{result="new_value"}'
  const before = await Promise.all([a, b].map((app) => metric(app, series)))
  // one after another: new, new, then counted already
  assert.deepEqual((await post(a, 'ann')).body, { counted: true, new: true })
  assert.deepEqual((await post(b, 'bob')).body, { counted: true, new: true })
  assert.deepEqual((await post(b, 'ann')).body, { counted: true, new: false })
  // five more values, each sent four times at once through both instances:
  // each is new exactly once, whichever request commits first
  const answers = await Promise.all(Array.from({ length: 20 }, (_, i) => post(i % 2 ? a : b, `v${i % 5}`)))
  assert.deepEqual(answers.map((r) => r.status), Array(20).fill(200))
  for (let v = 0; v < 5; v++) {
    assert.equal(answers.filter((r, i) => i % 5 === v && r.body.new).length, 1, `v${v} new once`)
  }
  // 7 distinct values past a hard quota of 3: tracking is never refused; durable when answered
  assert.equal(Number(await scalar("SELECT used FROM flagmeter.status WHERE tenant = 'u1' AND meter = 'active_users'")), 7)
  const usage = await call(`${b.url}/api/usage/u1`)
  const users = usage.body.meters.find((m) => m.meter === 'active_users')
  assert.deepEqual([users.aggregation, users.unit, users.used, users.quota, users.remaining, users.state],
    ['unique', 'active users', 7, 3, 0, 'exceeded'])
  const after = await Promise.all([a, b].map((app) => metric(app, series)))
  assert.equal(after[0] + after[1] - before[0] - before[1], 7)
  // the dashboard's state says what the meter counts
  const state = await call(`${a.url}/api/state`)
  const shown = state.body.tenants.find((t) => t.tenant === 'u1').meters.find((m) => m.meter === 'active_users')
  assert.deepEqual([shown.aggregation, shown.unit, shown.used], ['unique', 'active users', 7])
})

test('bad value input: 400 with a clear message, nothing written', async () => {
  const cases = [
    [{ tenant: 'u3', meter: 'active_users', value: '' }, /value must be a non-empty string/],
    [{ tenant: 'u3', meter: 'active_users', value: 42 }, /value must be a non-empty string/],
    [{ tenant: 'u3', meter: 'active_users', value: null }, /value must be a non-empty string/],
    [{ tenant: 'u3', meter: 'active_users', value: 'ann', amount: 1 }, /an amount or a value, not both/],
    [{ tenant: 'u3', meter: 'active_users', value: 'ann', id: 'k1' }, /a value takes no id/],
    [{ meter: 'active_users', value: 'ann' }, /tenant is required/],
    [{ tenant: 'u3', meter: 'active_users', value: 'x'.repeat(1025) }, /value is too long: 1025 bytes/, '22001'],
    [{ tenant: 'u3', meter: 'tokens', value: 'ann' }, /meter "tokens" does not count distinct values/, '42809'],
    [{ tenant: 'u3', meter: 'active_users', amount: 1 }, /meter "active_users" counts distinct values, not amounts/, '42809'],
    [{ tenant: 'u3', meter: 'active_users' }, /meter "active_users" counts distinct values, not amounts/, '42809'],
    [{ tenant: 'u3', meter: 'nope', value: 'ann' }, /meter "nope" does not exist/, '42704'],
    [{ tenant: 'stranger', meter: 'active_users', value: 'ann' }, /tenant "stranger" is not assigned a plan/, 'QT001']
  ]
  for (const path of ['/api/events', '/api/consume']) {
    for (const [k, [body, message, sqlstate]] of cases.entries()) {
      const r = await call(`${(k % 2 ? a : b).url}${path}`, 'POST', body)
      const what = `${path} ${JSON.stringify(body).slice(0, 80)}`
      assert.equal(r.status, 400, what)
      assert.match(r.body.error, message, what)
      assert.equal(r.body.sqlstate, sqlstate, what)
    }
  }
  // a value of 1024 bytes is fine
  assert.equal((await call(`${a.url}/api/events`, 'POST', { tenant: 'u4', meter: 'active_users', value: 'é'.repeat(512) })).status, 200)
  assert.equal(Number(await scalar("SELECT count(*) FROM flagmeter.unique_values WHERE tenant IN ('u3', 'stranger')")), 0)
  assert.equal(Number(await scalar("SELECT count(*) FROM flagmeter.events WHERE tenant IN ('u3', 'stranger')")), 0)
})

test('consume with a value: granted while one more fits or when counted already, 429 at the hard limit', async () => {
  // ten new values at once through both instances against a quota of 3
  const answers = await Promise.all(Array.from({ length: 10 }, (_, i) =>
    call(`${(i % 2 ? a : b).url}/api/consume`, 'POST', { tenant: 'u2', meter: 'active_users', value: `user${i}` })))
  const granted = answers.filter((r) => r.status === 200)
  const refused = answers.filter((r) => r.status === 429)
  assert.equal(granted.length, 3)
  assert.equal(refused.length, 7)
  assert.deepEqual(granted.map((r) => Number(r.headers.get('x-ratelimit-remaining'))).sort(), [0, 1, 2])
  const resets = await scalar("SELECT ceil(extract(epoch FROM period_end))::bigint FROM flagmeter.status WHERE tenant = 'u2' AND meter = 'active_users'")
  for (const r of refused) {
    // the same answer as a consume of an amount refused for its quota
    assert.equal(r.body.error, 'quota exceeded')
    assert.equal(r.body.reason, 'quota_exceeded')
    assert.equal(r.body.granted, false)
    assert.deepEqual([r.body.used, r.body.quota, r.body.remaining, r.body.meter], [3, 3, 0, 'active_users'])
    assert.equal(r.headers.get('x-ratelimit-limit'), '3')
    assert.equal(r.headers.get('x-ratelimit-remaining'), '0')
    assert.equal(r.headers.get('x-ratelimit-reset'), String(resets))
    assert.ok(Number(r.headers.get('retry-after')) > 0)
    assert.equal(r.headers.get('ratelimit'), null)
  }
  // a value counted already is granted at the limit, and counts nothing more
  const value = `user${answers.indexOf(granted[0])}`
  const again = await call(`${a.url}/api/consume`, 'POST', { tenant: 'u2', meter: 'active_users', value })
  assert.equal(again.status, 200)
  assert.deepEqual([again.body.granted, again.body.used, again.body.remaining], [true, 3, 0])
  // a refused value was not recorded: refused again
  const refusedValue = `user${answers.indexOf(refused[0])}`
  assert.equal((await call(`${b.url}/api/consume`, 'POST', { tenant: 'u2', meter: 'active_users', value: refusedValue })).status, 429)
  assert.equal(Number(await scalar("SELECT used FROM flagmeter.status WHERE tenant = 'u2' AND meter = 'active_users'")), 3)
  assert.equal(Number(await scalar("SELECT count(*) FROM flagmeter.unique_values WHERE tenant = 'u2'")), 3)
})

test('consume with a value past the rate limit: 429 with Retry-After, RateLimit-Policy and RateLimit', async () => {
  const first = await call(`${a.url}/api/consume`, 'POST', { tenant: 'u5', meter: 'active_users', value: 'ann' })
  assert.equal(first.status, 200)
  const r = await call(`${b.url}/api/consume`, 'POST', { tenant: 'u5', meter: 'active_users', value: 'bob' })
  assert.equal(r.status, 429)
  assert.equal(r.body.error, 'rate limited')
  assert.equal(r.body.reason, 'rate_limited')
  assert.ok(r.body.retry_after_ms > 0 && r.body.retry_after_ms <= 3600000, `retry_after_ms: ${r.body.retry_after_ms}`)
  const retryAfter = r.headers.get('retry-after')
  assert.equal(retryAfter, String(Math.ceil(r.body.retry_after_ms / 1000)))
  assert.equal(r.headers.get('ratelimit-policy'), '"default";q=1;w=3600')
  assert.equal(r.headers.get('ratelimit'), `"default";r=0;t=${retryAfter}`)
  // the quota's figures, unchanged
  assert.equal(r.headers.get('x-ratelimit-limit'), '3')
  assert.equal(r.headers.get('x-ratelimit-remaining'), '2')
  // a value counted already spends nothing of the rate
  assert.equal((await call(`${b.url}/api/consume`, 'POST', { tenant: 'u5', meter: 'active_users', value: 'ann' })).status, 200)
  assert.equal(Number(await scalar("SELECT used FROM flagmeter.status WHERE tenant = 'u5' AND meter = 'active_users'")), 1)
})

test('/metrics: requests, latency, batches, events', async () => {
  const res = await fetch(`${a.url}/metrics`)
  assert.equal(res.status, 200)
  assert.match(res.headers.get('content-type'), /^text\/plain/)
  const text = await res.text()
  assert.match(text, /^http_requests_total\{method="POST",route="\/api\/events",status="200"\} \d+/m)
  assert.match(text, /^http_request_duration_seconds_bucket\{le="0\.1",method="POST",route="\/api\/consume"\} \d+/m)
  const batches = Number(/^flagmeter_client_batches_total\{kind="track"\} (\d+)/m.exec(text)[1])
  const calls = Number(/^flagmeter_client_calls_total\{kind="track"\} (\d+)/m.exec(text)[1])
  assert.ok(batches >= 1 && batches <= calls, `${calls} calls in ${batches} batches`)
  assert.match(text, /^dashboard_usage_events_total\{result="counted"\} \d+/m)
  // once each: acme on api_calls, u1 (by tracking) and u2 (by consuming) on active_users
  assert.match(text, /^dashboard_quota_events_total\{kind="blocked"\} 3$/m)
  assert.match(text, /^dashboard_usage_events_total\{result="new_value"\} [1-9]\d*$/m)
  assert.match(text, /^dashboard_usage_events_total\{result="known_value"\} [1-9]\d*$/m)
  assert.match(text, /^dashboard_consume_refusals_total\{reason="quota_exceeded"\} [1-9]\d*$/m)
  assert.match(text, /^dashboard_consume_refusals_total\{reason="rate_limited"\} [1-9]\d*$/m)
})

test("the app's connections run with jit off", async () => {
  // the dashboard's reads of every tenant compile slower than they run
  const app = createApp({ databaseUrl: databaseUrl(db), log: () => {} })
  try {
    assert.equal((await app.fm.pool.query('SHOW jit')).rows[0].jit, 'off')
  } finally {
    await app.close()
  }
})
