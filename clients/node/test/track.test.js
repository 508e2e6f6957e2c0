'use strict'
const { test, before, after } = require('node:test')
const assert = require('node:assert/strict')
const { FlagMeter, FlagMeterClosedError } = require('..')
const { createDatabase } = require('./helpers')

let db
before(async () => {
  // The tenants here have no plan (what is tested is how the client groups
  // tracks, not limits), and occurredAt goes back to 2001.
  db = await createDatabase('fm_node_track', `
    SELECT flagmeter.configure(unassigned_tenants => 'unlimited', late_events => '100 years');
    SELECT flagmeter.define_meter('api_calls');
    SELECT flagmeter.define_meter('tokens');`)
})
after(async () => { await db.drop() })

async function scalar (sql, values) {
  const { rows } = await db.query(sql, values)
  return Object.values(rows[0])[0]
}

function client (extra = {}) {
  return new FlagMeter({ connection: db.connection(), listen: false, ...extra })
}

test('a lone call goes at once, alone, and is durable when it resolves', async () => {
  const fm = client()
  try {
    assert.deepEqual(await fm.track('lone', 'api_calls', 3), { counted: true })
    assert.deepEqual(fm.stats().track, { calls: 1, groups: 1 })
    // seen from another session: committed
    assert.equal(await scalar("SELECT flagmeter.used(flagmeter.usage('lone', 'api_calls'))::int"), 3)
  } finally { await fm.close() }
})

test('concurrent calls share transactions: one per group', async () => {
  const fm = client({ maxInFlight: 2 })
  try {
    const n = 300
    const results = await Promise.all(Array.from({ length: n }, (_, i) => fm.track(`t${i % 7}`, 'api_calls', 1)))
    assert.ok(results.every((r) => r.counted === true))
    const { calls, groups } = fm.stats().track
    assert.equal(calls, n)
    assert.ok(groups < n / 10, `300 calls in ${groups} groups`)
    // every event of a group was written by the group's one transaction
    const xacts = await scalar("SELECT count(DISTINCT xid)::int FROM flagmeter.events WHERE tenant LIKE 't_'")
    assert.equal(xacts, groups)
    assert.equal(await scalar("SELECT sum(amount)::int FROM flagmeter.events WHERE tenant LIKE 't_'"), n)
  } finally { await fm.close() }
})

test('maxGroup bounds a group', async () => {
  const fm = client({ maxInFlight: 1, maxGroup: 10 })
  try {
    await Promise.all(Array.from({ length: 101 }, () => fm.track('bounded', 'api_calls')))
    // the first goes alone, the other 100 wait for the one slot, 10 at a time
    assert.deepEqual(fm.stats().track, { calls: 101, groups: 11 })
  } finally { await fm.close() }
})

test('duplicates: counted is false per event, within a group and across groups', async () => {
  const fm = client({ maxInFlight: 1 })
  try {
    const first = fm.track('dup', 'api_calls', 1, { key: 'k-0' }) // alone
    const rest = ['k-0', 'k-1', 'k-1', 'k-2', 'k-0'].map((key) => fm.track('dup', 'api_calls', 1, { key }))
    const counted = (await Promise.all([first, ...rest])).map((r) => r.counted)
    assert.deepEqual(counted, [true, false, true, false, true, false])
    assert.equal(fm.stats().track.groups, 2)
    assert.deepEqual(await fm.track('dup', 'api_calls', 1, { key: 'k-2' }), { counted: false })
    assert.equal(await scalar("SELECT flagmeter.used(flagmeter.usage('dup', 'api_calls'))::int"), 3)
  } finally { await fm.close() }
})

test('occurredAt places the event in its period', async () => {
  const fm = client()
  try {
    const at = new Date('2001-02-03T04:05:06Z')
    await Promise.all([fm.track('late', 'tokens', 5, { occurredAt: at }), fm.track('late', 'tokens', 7)])
    const rows = (await db.query("SELECT amount::int, occurred_at FROM flagmeter.events WHERE tenant = 'late' ORDER BY occurred_at")).rows
    assert.equal(rows.length, 2)
    assert.deepEqual([rows[0].amount, rows[0].occurred_at.toISOString()], [5, at.toISOString()])
  } finally { await fm.close() }
})

test('a call refused for its own input fails alone, SQLSTATE kept; the rest of its group is recorded', async () => {
  const fm = client({ maxInFlight: 1 })
  try {
    const alone = fm.track('g', 'api_calls') // takes the only slot
    const group = [fm.track('g', 'api_calls'), fm.track('g', 'nope'), fm.track('g2', 'tokens', 2)]
    const settled = await Promise.allSettled([alone, ...group])
    assert.deepEqual(settled.map((s) => s.status), ['fulfilled', 'fulfilled', 'rejected', 'fulfilled'])
    const refused = /** @type {PromiseRejectedResult} */ (settled[2]).reason
    assert.equal(refused.code, '42704')
    assert.match(refused.message, /meter "nope" does not exist/)
    // the group was split, and each of the others recorded once
    assert.ok(fm.stats().splits >= 1)
    assert.equal(await scalar("SELECT count(*)::int FROM flagmeter.events WHERE tenant IN ('g', 'g2')"), 3)
  } finally { await fm.close() }
})

test('bad arguments fail alone, before they can join a group', async () => {
  const fm = client()
  try {
    await assert.rejects(fm.track('', 'api_calls'), TypeError)
    await assert.rejects(fm.track('x', 'api_calls', -1), RangeError)
    await assert.rejects(fm.track('x', 'api_calls', 1.5), TypeError)
    await assert.rejects(fm.track('x', 'api_calls', 2 ** 53), TypeError) // not safe: use a BigInt
    await assert.rejects(fm.track('x', 'api_calls', '1'), TypeError)
    await assert.rejects(fm.track('x', 'api_calls', 1, { occurredAt: 'yesterday' }), TypeError)
    assert.equal(fm.stats().track.calls, 0)
  } finally { await fm.close() }
})

test('close() flushes what is pending, then refuses calls, leaving no handles', async () => {
  const baseline = process.getActiveResourcesInfo().filter((r) => r !== 'TTYWrap').length
  const fm = client({ maxInFlight: 1, maxGroup: 7 })
  const pending = Array.from({ length: 50 }, (_, i) => fm.track('flush', 'api_calls', 1, { key: `f-${i}` }))
  await fm.close()
  const settled = await Promise.allSettled(pending)
  assert.ok(settled.every((s) => s.status === 'fulfilled' && s.value.counted))
  assert.equal(await scalar("SELECT count(*)::int FROM flagmeter.events WHERE tenant = 'flush'"), 50)
  await assert.rejects(fm.track('flush', 'api_calls'), FlagMeterClosedError)
  await assert.rejects(fm.consume('flush', 'api_calls'), (err) => err.code === 'FLAGMETER_CLOSED')
  await fm.close() // idempotent
  const left = process.getActiveResourcesInfo().filter((r) => r !== 'TTYWrap').length
  assert.ok(left <= baseline, `handles after close: ${process.getActiveResourcesInfo()}`)
})

test('the app\'s own pool is used and left open', async () => {
  const pg = require('pg')
  const pool = new pg.Pool(db.connection({ max: 3 }))
  const fm = new FlagMeter({ pool, listen: false })
  await fm.track('own-pool', 'api_calls')
  await fm.close()
  const { rows } = await pool.query("SELECT flagmeter.used(flagmeter.usage('own-pool', 'api_calls'))::int AS u")
  assert.equal(rows[0].u, 1)
  await pool.end()
})
