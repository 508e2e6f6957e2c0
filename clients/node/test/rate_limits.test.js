'use strict'
// Rate limits through the client, against a real cluster with flagmeter
// preloaded (the limiter lives in shared memory): fm.rateLimit for the
// app's own keys, grouped into limit_batch and answered per call; and the
// tenants' rate limits that consume, check and reserve apply with the
// quota (reason rate_limited, retryAfterMs).  Nothing sleeps: limits whose
// window is an hour refill too slowly to change during a test, and the
// tests about time run their calls on a session whose limiter clock they
// set (flagmeter.set_test_clock, a day ahead of the real one so that other
// sessions never see those keys as idle).
const { test, before, after } = require('node:test')
const assert = require('node:assert/strict')
const pg = require('pg')
const { FlagMeter } = require('..')
const { createDatabase } = require('./helpers')

const HOUR = 3600 * 1000

let db
before(async () => {
  db = await createDatabase('fm_node_rate_limits', `
    SELECT flagmeter.define_meter('api_calls');
    SELECT flagmeter.define_meter('tokens');
    SELECT flagmeter.define_plan('free');
    SELECT flagmeter.set_limit('free', 'api_calls', 1000, 'lifetime');
    SELECT flagmeter.set_limit('free', 'tokens', 100000, 'lifetime');
    SELECT flagmeter.set_rate_limit('free', 'api_calls', 2, '1 hour');
    SELECT flagmeter.set_rate_limit('free', 'tokens', 100, '1 hour');
    SELECT flagmeter.assign_plan(t, 'free') FROM unnest(ARRAY['acme', 'multi', 'reserver', 'crowd', 'fast']) t;
    SELECT flagmeter.override_rate_limit('fast', 'api_calls', 10, '1 second', 1);`)
})
after(async () => { await db.drop() })

// maxInFlight 1: the first call goes alone, the others queue behind it and
// go as one group
function client (extra = {}) {
  return new FlagMeter({ connection: db.connection(), listen: false, ...extra })
}

/**
 * A client whose calls all run on one session, and at(ms) that sets that
 * session's limiter clock to ms after a fixed time a day from now.
 */
function clockedClient () {
  const pool = new pg.Pool({ ...db.connection(), max: 1, idleTimeoutMillis: 0 })
  pool.on('error', () => {})
  const fm = new FlagMeter({ pool, listen: false, maxInFlight: 1 })
  const base = Math.ceil(Date.now() / 1000) * 1000 + 24 * HOUR
  return {
    fm,
    at: async (/** @type {number} */ ms) => { await pool.query('SELECT flagmeter.set_test_clock($1)', [new Date(base + ms)]) },
    close: async () => {
      await fm.close()
      await pool.end()
    }
  }
}

async function used (tenant, meter) {
  const { rows } = await db.query('SELECT flagmeter.used(flagmeter.usage($1, $2))::int AS u', [tenant, meter])
  return rows[0].u
}

test('rateLimit grants the burst, then refuses with retryAfterMs until a unit is back', async () => {
  const { fm, at, close } = clockedClient()
  try {
    const limit = { rate: 3, per: '1 hour' } // a unit every 20 minutes, bursts of 3
    await at(0)
    assert.deepEqual(await fm.rateLimit('login:ann', limit), { allowed: true, remaining: 2, retryAfterMs: null, resetAfterMs: HOUR / 3 })
    assert.equal((await fm.rateLimit('login:ann', limit)).remaining, 1)
    assert.deepEqual(await fm.rateLimit('login:ann', limit), { allowed: true, remaining: 0, retryAfterMs: null, resetAfterMs: HOUR })
    assert.deepEqual(await fm.rateLimit('login:ann', limit), { allowed: false, remaining: 0, retryAfterMs: HOUR / 3, resetAfterMs: HOUR })
    // another key has its own burst
    assert.equal((await fm.rateLimit('login:bob', limit)).remaining, 2)
    // retryAfterMs is exact: a millisecond early is still refused, on time is granted
    await at(HOUR / 3 - 1)
    const early = await fm.rateLimit('login:ann', limit)
    assert.deepEqual([early.allowed, early.retryAfterMs], [false, 1])
    await at(HOUR / 3)
    assert.deepEqual(await fm.rateLimit('login:ann', limit), { allowed: true, remaining: 0, retryAfterMs: null, resetAfterMs: HOUR })
    // idle for an hour: a full burst again
    await at(2 * HOUR)
    assert.deepEqual(await fm.rateLimit('login:ann', { ...limit, cost: 0 }), { allowed: true, remaining: 3, retryAfterMs: null, resetAfterMs: 0 })
  } finally { await close() }
})

test('retryAfterMs is rounded up to whole milliseconds: a retry after it is never early', async () => {
  const { fm, at, close } = clockedClient()
  try {
    const limit = { rate: 64, per: 1, burst: 1 } // a unit every 15.625 ms
    await at(0)
    assert.equal((await fm.rateLimit('poll:ann', limit)).allowed, true)
    const refused = await fm.rateLimit('poll:ann', limit)
    assert.deepEqual([refused.allowed, refused.retryAfterMs, refused.resetAfterMs], [false, 16, 16])
    await at(15)
    assert.deepEqual((await fm.rateLimit('poll:ann', limit)).retryAfterMs, 1)
    await at(16)
    assert.deepEqual((await fm.rateLimit('poll:ann', limit)).allowed, true)
  } finally { await close() }
})

test('burst, cost 0 (look without spending), a cost above the burst', async () => {
  const fm = client()
  try {
    const limit = { rate: 1, per: 3600, burst: 5n }
    assert.equal((await fm.rateLimit('upload:ann', { ...limit, cost: 4 })).remaining, 1)
    const look = await fm.rateLimit('upload:ann', { ...limit, cost: 0 })
    assert.deepEqual([look.allowed, look.remaining, look.retryAfterMs], [true, 1, null])
    assert.equal((await fm.rateLimit('upload:ann', { ...limit, cost: 0 })).remaining, 1, 'looking spent nothing')
    // more than the burst can never fit: waiting cannot help
    const never = await fm.rateLimit('upload:ann', { ...limit, cost: 6 })
    assert.deepEqual([never.allowed, never.retryAfterMs], [false, null])
  } finally { await fm.close() }
})

test('fm.limit(key, options) is the rate limiter; fm.limit(tenant, meter) still reads the cache', async () => {
  const fm = client()
  try {
    const limit = { rate: 2, per: '1 hour' }
    assert.deepEqual((await fm.limit('export:ann', limit)).remaining, 1)
    assert.deepEqual((await fm.rateLimit('export:ann', limit)).remaining, 0, 'one limiter under both names')
    assert.equal((await fm.limit('export:ann', limit)).allowed, false)
    assert.equal(fm.limit('nobody', 'calls'), undefined)
    assert.throws(() => fm.limit('export:ann'), TypeError)
  } finally { await fm.close() }
})

test('concurrent calls go as one limit_batch and are answered each, in order', async () => {
  const fm = client({ maxInFlight: 1 })
  try {
    const limit = { rate: 3, per: '1 hour' }
    const first = fm.rateLimit('ip:10.0.0.1', limit) // alone: the others queue behind it
    const rest = Array.from({ length: 5 }, () => fm.rateLimit('ip:10.0.0.1', limit))
    const others = Array.from({ length: 20 }, (_, i) => fm.rateLimit(`ip:10.0.1.${i}`, limit))
    const all = await Promise.all([first, ...rest, ...others])
    assert.deepEqual(all.slice(0, 6).map((d) => d.allowed), [true, true, true, false, false, false])
    assert.deepEqual(all.slice(0, 3).map((d) => d.remaining), [2, 1, 0])
    assert.ok(all.slice(6).every((d) => d.allowed && d.remaining === 2))
    const stats = fm.stats().rateLimit
    assert.equal(stats.calls, 26)
    assert.equal(stats.groups, 2, 'the first alone, the 25 others in one group')
  } finally { await fm.close() }
})

test('a call with bad input fails alone; its group is answered, each key spent once', async () => {
  const fm = client({ maxInFlight: 1 })
  try {
    const limit = { rate: 5, per: '1 hour' }
    const keys = Array.from({ length: 30 }, (_, i) => `group:${i}`)
    const first = fm.rateLimit('group:first', limit)
    const calls = keys.map((k) => fm.rateLimit(k, limit))
    // what only the server can judge: per beyond an hour, a key over 256
    // bytes, an interval it cannot read
    calls.splice(7, 0, fm.rateLimit('group:bad-per', { rate: 5, per: 7200 }))
    calls.splice(15, 0, fm.rateLimit('k'.repeat(300), limit))
    calls.splice(22, 0, fm.rateLimit('group:bad-text', { rate: 5, per: '1 parsec' }))
    // what the client judges itself, before the call can join a group
    calls.push(fm.rateLimit('group:neg', { rate: -1, per: 1 }))
    const results = await Promise.allSettled([first, ...calls])
    const refused = results.map((r, i) => [i, r]).filter(([, r]) => r.status === 'rejected')
    assert.deepEqual(refused.map(([i]) => i), [8, 16, 23, 34])
    const codes = refused.map(([, r]) => r.reason.code ?? r.reason.name)
    assert.deepEqual(codes.slice(0, 2), ['22023', '22023'])
    assert.match(codes[2], /^22/) // invalid_datetime_format or invalid_parameter_value
    assert.equal(codes[3], 'RangeError')
    assert.ok(refused.slice(0, 3).every(([, r]) => r.reason.outcome === 'refused'))
    const answered = results.filter((r) => r.status === 'fulfilled')
    assert.equal(answered.length, 31)
    assert.ok(answered.every((r) => r.value.allowed && r.value.remaining === 4), 'every key spent once, by its own call')
    assert.ok(fm.stats().splits >= 1, 'the refused group was split')
    // the split sent the good calls again: none of them was spent twice
    const looks = await Promise.all(keys.map((k) => fm.rateLimit(k, { ...limit, cost: 0 })))
    assert.ok(looks.every((d) => d.remaining === 4), looks.map((d) => d.remaining).join(','))
  } finally { await fm.close() }
})

test('arguments the client checks are refused before anything is sent', async () => {
  const fm = client()
  try {
    const bad = [
      ['', { rate: 1, per: 1 }, TypeError],
      ['k', undefined, TypeError],
      ['k', { rate: 0, per: 1 }, RangeError],
      ['k', { rate: 1.5, per: 1 }, TypeError],
      ['k', { rate: 1, per: 0 }, RangeError],
      ['k', { rate: 1, per: '' }, TypeError],
      ['k', { rate: 1, per: 1, burst: 0 }, RangeError],
      ['k', { rate: 1, per: 1, cost: -1 }, RangeError]
    ]
    for (const [key, options, type] of bad) {
      await assert.rejects(fm.rateLimit(/** @type {any} */ (key), /** @type {any} */ (options)), type)
    }
    assert.equal(fm.stats().rateLimit.calls, 0)
  } finally { await fm.close() }
})

test('consume under a plan rate limit: rate_limited with retryAfterMs, usage unchanged', async () => {
  const fm = client()
  try {
    const a = await fm.consume('acme', 'api_calls', 1)
    const b = await fm.consume('acme', 'api_calls', 1)
    assert.deepEqual([a.granted, a.reason, a.retryAfterMs, b.granted], [true, 'ok', null, true])
    const refused = await fm.consume('acme', 'api_calls', 1)
    assert.equal(refused.granted, false)
    assert.equal(refused.reason, 'rate_limited')
    // 2 an hour: one unit back every 30 minutes
    assert.ok(refused.retryAfterMs !== null && refused.retryAfterMs > 0 && refused.retryAfterMs <= HOUR / 2, `retryAfterMs ${refused.retryAfterMs}`)
    assert.deepEqual([refused.used, refused.quota, refused.remaining], [2, 1000, 998], 'the quota figures, unchanged')
    assert.equal(await used('acme', 'api_calls'), 2)
    // check decides the same without spending
    const checked = await fm.check('acme', 'api_calls', 1)
    assert.deepEqual([checked.granted, checked.reason], [false, 'rate_limited'])
    assert.ok(checked.retryAfterMs !== null && checked.retryAfterMs > 0)
    // track is never rate limited
    assert.equal((await fm.track('acme', 'api_calls', 1)).counted, true)
    assert.equal(await used('acme', 'api_calls'), 3)
  } finally { await fm.close() }
})

test('grouped consumes of a rate limited tenant: the burst granted, the rest rate_limited', async () => {
  const fm = client({ maxInFlight: 1 })
  try {
    const decisions = await Promise.all(Array.from({ length: 12 }, () => fm.consume('crowd', 'api_calls', 1)))
    assert.deepEqual(decisions.map((d) => d.granted), [true, true, ...Array(10).fill(false)])
    assert.ok(decisions.slice(2).every((d) => d.reason === 'rate_limited' && d.retryAfterMs > 0))
    assert.ok(decisions.slice(0, 2).every((d) => d.retryAfterMs === null))
    assert.equal(await used('crowd', 'api_calls'), 2)
    assert.ok(fm.stats().consume.groups < 12)
  } finally { await fm.close() }
})

test('several meters: the rate limited one says rate_limited, the others other_meter_refused', async () => {
  const fm = client()
  try {
    await fm.consume('multi', 'api_calls', 2)
    const [calls, tokens] = await fm.consume('multi', ['api_calls', 'tokens'], [1, 10])
    assert.deepEqual([calls.granted, calls.reason], [false, 'rate_limited'])
    assert.ok(calls.retryAfterMs !== null && calls.retryAfterMs > 0)
    assert.deepEqual([tokens.granted, tokens.reason], [false, 'other_meter_refused'])
    assert.equal(await used('multi', 'tokens'), 0, 'all or nothing')
  } finally { await fm.close() }
})

test('a consume refused for its rate is not remembered under its key: after retryAfterMs it is decided again', async () => {
  const { fm, at, close } = clockedClient()
  try {
    // fast: 10 a second, bursts of 1 (its own override)
    await at(0)
    assert.equal((await fm.consume('fast', 'api_calls', 1, { key: 'req-1' })).granted, true)
    const refused = await fm.consume('fast', 'api_calls', 1, { key: 'req-2' })
    assert.deepEqual([refused.granted, refused.reason, refused.retryAfterMs], [false, 'rate_limited', 100])
    await at(99)
    assert.deepEqual((await fm.consume('fast', 'api_calls', 1, { key: 'req-2' })).retryAfterMs, 1)
    await at(100)
    const again = await fm.consume('fast', 'api_calls', 1, { key: 'req-2' })
    assert.deepEqual([again.granted, again.reason, again.retryAfterMs], [true, 'ok', null])
    // and now it is remembered: the same key gets the same decision
    await at(200)
    assert.deepEqual((await fm.consume('fast', 'api_calls', 1, { key: 'req-2' })).used, again.used)
    assert.equal(await used('fast', 'api_calls'), 2)
  } finally { await close() }
})

test('reserve under a rate limit: refused with retryAfterMs', async () => {
  const fm = client()
  try {
    const held = await fm.reserve('reserver', 'tokens', 80)
    assert.deepEqual([held.granted, held.retryAfterMs], [true, null])
    const refused = await fm.reserve('reserver', 'tokens', 30)
    assert.equal(refused.granted, false)
    assert.equal(refused.reservationId, null)
    assert.ok(refused.retryAfterMs !== null && refused.retryAfterMs > 0 && refused.retryAfterMs <= HOUR, `retryAfterMs ${refused.retryAfterMs}`)
    assert.equal(await fm.release(held.reservationId), true)
  } finally { await fm.close() }
})
