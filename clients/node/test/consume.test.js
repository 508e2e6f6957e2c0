'use strict'
const { test, before, after } = require('node:test')
const assert = require('node:assert/strict')
const { FlagMeter } = require('..')
const { createDatabase } = require('./helpers')

let db
before(async () => {
  db = await createDatabase('fm_node_consume', `
    SELECT flagmeter.define_meter('api_calls');
    SELECT flagmeter.define_meter('tokens');
    SELECT flagmeter.define_plan('free');
    SELECT flagmeter.set_limit('free', 'api_calls', 100, 'lifetime');
    SELECT flagmeter.set_limit('free', 'tokens', 1000, 'lifetime');
    SELECT flagmeter.assign_plan(t, 'free') FROM unnest(ARRAY['hot', 'multi', 'keyed', 'fail', 'tx']) t;`)
})
after(async () => { await db.drop() })

function client (extra = {}) {
  return new FlagMeter({ connection: db.connection(), listen: false, ...extra })
}

async function used (tenant, meter) {
  const { rows } = await db.query('SELECT flagmeter.used(flagmeter.usage($1, $2))::int AS u', [tenant, meter])
  return rows[0].u
}

test('a decision has the fields of flagmeter.decision', async () => {
  const fm = client()
  try {
    const d = await fm.consume('hot', 'api_calls', 1)
    assert.deepEqual(d, { granted: true, used: 1, quota: 100, remaining: 99, resetsAt: null, overage: 0, meter: 'api_calls', reason: 'ok', fromGrants: 0, balance: 99, retryAfterMs: null })
  } finally { await fm.close() }
})

test('a tenant never assigned a plan: refused (QT001) by default, metered without limit once configured', async () => {
  const fm = client()
  try {
    await assert.rejects(fm.consume('nobody', 'api_calls', 2), (err) => {
      assert.equal(err.code, 'QT001')
      assert.match(err.message, /tenant "nobody" is not assigned a plan/)
      return true
    })
    await db.query("SELECT flagmeter.configure(unassigned_tenants => 'unlimited')")
    const free = await fm.consume('nobody', 'api_calls', 2)
    assert.equal(free.granted, true)
    assert.equal(free.quota, null)
    assert.equal(free.remaining, null)
    assert.ok(free.resetsAt instanceof Date)
  } finally {
    await db.query("SELECT flagmeter.configure(unassigned_tenants => 'refuse')")
    await fm.close()
  }
})

test('concurrent consumes of a hot tenant: grouped, and never past the hard limit', async () => {
  const fm = client()
  try {
    const decisions = await Promise.all(Array.from({ length: 300 }, () => fm.consume('hot', 'api_calls', 1)))
    const granted = decisions.filter((d) => d.granted).length
    assert.equal(granted, 99) // one was consumed by the first test
    assert.equal(await used('hot', 'api_calls'), 100)
    // grants report increasing usage, in the order the server decided them
    const usedWhenGranted = decisions.filter((d) => d.granted).map((d) => d.used).sort((a, b) => a - b)
    assert.deepEqual(usedWhenGranted, Array.from({ length: 99 }, (_, i) => i + 2))
    assert.ok(decisions.filter((d) => !d.granted).every((d) => d.used === 100 && d.remaining === 0))
    assert.ok(fm.stats().consume.groups < 300 / 10, `groups: ${fm.stats().consume.groups}`)
  } finally { await fm.close() }
})

test('several meters: all or nothing within the call, independent of the others', async () => {
  const fm = client({ maxInFlight: 1 })
  try {
    const first = fm.consume('multi', 'api_calls', 1)
    const [a, b, c] = await Promise.all([
      fm.consume('multi', ['api_calls', 'tokens'], [50, 900]),
      fm.consume('multi', ['tokens', 'api_calls'], [200, 1]), // tokens would pass 1000: none
      fm.consume('multi', 'tokens', 100),
      first
    ])
    assert.deepEqual(a.map((d) => [d.meter, d.granted, d.used]), [['api_calls', true, 51], ['tokens', true, 900]])
    assert.deepEqual(b.map((d) => [d.meter, d.granted, d.used]), [['tokens', false, 900], ['api_calls', false, 51]])
    assert.deepEqual([c.granted, c.used], [true, 1000])
    assert.equal(fm.stats().consume.groups, 2)
    assert.equal(await used('multi', 'api_calls'), 51)
  } finally { await fm.close() }
})

test('keys: a retry gets the first decision and records nothing', async () => {
  const fm = client()
  try {
    const [x, y] = await Promise.all([
      fm.consume('keyed', 'api_calls', 10, { key: 'req-1' }),
      fm.consume('keyed', 'api_calls', 10, { key: 'req-1' })
    ])
    assert.deepEqual(x, y)
    const z = await fm.consume('keyed', 'api_calls', 10, { key: 'req-1' })
    assert.deepEqual(z, x)
    assert.equal(await used('keyed', 'api_calls'), 10)
  } finally { await fm.close() }
})

test('a consume refused for its own input fails alone; the rest of its group is decided', async () => {
  const fm = client({ maxInFlight: 1 })
  try {
    const alone = fm.consume('fail', 'api_calls', 1)
    const group = [fm.consume('fail', 'api_calls', 1), fm.consume('fail', 'nope', 1), fm.consume('fail', ['tokens', 'api_calls'], [1, 1])]
    const settled = await Promise.allSettled([alone, ...group])
    assert.deepEqual(settled.map((s) => s.status), ['fulfilled', 'fulfilled', 'rejected', 'fulfilled'])
    assert.equal(/** @type {PromiseRejectedResult} */ (settled[2]).reason.code, '42704')
    assert.equal(await used('fail', 'api_calls'), 3)
    // a consume that reuses a key of track fails the same way (23505)
    await fm.track('fail', 'api_calls', 1, { key: 'tracked' }).catch(() => {})
    await assert.rejects(fm.consume('fail', 'api_calls', 1, { key: 'tracked' }), (err) => err.code === '23505')
  } finally { await fm.close() }
})

test('bad arguments fail alone', async () => {
  const fm = client()
  try {
    await assert.rejects(fm.consume('x', 'api_calls', 0), RangeError)
    await assert.rejects(fm.consume('x', ['api_calls', 'tokens'], [1]), TypeError)
    await assert.rejects(fm.consume('x', ['api_calls', 'api_calls'], [1, 1]), RangeError)
    await assert.rejects(fm.consume('x', [], []), RangeError)
    assert.equal(fm.stats().consume.calls, 0)
  } finally { await fm.close() }
})

test('check is exact and records nothing', async () => {
  const fm = client()
  try {
    const before = await used('tx', 'api_calls')
    const d = await fm.check('tx', 'api_calls', 100)
    assert.deepEqual([d.granted, d.used, d.remaining], [true, before, 100 - before])
    assert.equal((await fm.check('tx', 'api_calls', 101)).granted, false)
    assert.equal(await used('tx', 'api_calls'), before)
    await assert.rejects(fm.check('tx', 'nope', 1), (err) => err.code === '42704')
  } finally { await fm.close() }
})
