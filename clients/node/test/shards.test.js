'use strict'
// Sharded (README "Scale-out"): one client listening to several shards.
// Each shard is a database of its own with flagmeter, as behind a PL/Proxy
// proxy; here the two shards are two databases of the test cluster, which
// is all the client sees of them (NOTIFY is per database, like per server).
// Each shard's events reach the client in that shard's version order,
// tagged with the shard; the cache answers for the tenants of both; a
// shard whose LISTEN session is lost catches up on its own, the other
// shard's stream does not notice.
const { test, before, after } = require('node:test')
const assert = require('node:assert/strict')
const { FlagMeter } = require('..')
const { createDatabase, until } = require('./helpers')

const CATALOG = `
  SELECT flagmeter.define_meter('calls');
  SELECT flagmeter.define_plan('small');
  SELECT flagmeter.set_limit('small', 'calls', 10, 'lifetime', 'hard', '{50,100}');`

let shards
before(async () => {
  shards = [
    await createDatabase('fm_node_shard_a', CATALOG + "SELECT flagmeter.assign_plan('a' || i, 'small') FROM generate_series(1, 3) i;"),
    await createDatabase('fm_node_shard_b', CATALOG + "SELECT flagmeter.assign_plan('b' || i, 'small') FROM generate_series(1, 3) i;")
  ]
})
after(async () => { for (const s of shards) await s.drop() })

/** The events of one shard's outbox after a version, as the client shows them. */
async function outbox (shard, after) {
  const { rows } = await shard.query(
    'SELECT version::text, kind, tenant, meter FROM flagmeter.changes_since($1::bigint)', [after])
  return rows.map((r) => `${r.version}:${r.kind}:${r.tenant ?? ''}:${r.meter ?? ''}`)
}

const line = (e) => `${e.version}:${e.kind}:${e.tenant ?? ''}:${e.meter ?? ''}`

test('listen to two shards: each one\'s events in its own order, one cache for the tenants of both, catch-up per shard', async () => {
  const fm = new FlagMeter({
    connection: shards[0].connection(),
    listen: shards.map((s) => s.connection()),
    // B stays away (0.5 to 1 s) while the changes below are made
    reconnect: { initialDelayMs: 1000, maxDelayMs: 2000 }
  })
  const seen = [[], []]
  for (const kind of ['threshold', 'blocked', 'limit_changed']) {
    fm.on(kind, (e) => seen[e.shard].push(e))
  }
  try {
    await fm.ready()
    const [fromA, fromB] = fm.versions.map(String)
    assert.equal(fm.versions.length, 2)
    assert.equal(fm.listenerPids.length, 2)
    assert.ok(fm.listenerPids.every((pid) => typeof pid === 'number'))
    assert.equal(fm.limit('a1', 'calls').quota, 10)
    assert.equal(fm.limit('b1', 'calls').quota, 10)

    // Both shards announce; versions of the two overlap, as they are per shard.
    await shards[0].query("SELECT flagmeter.consume('a1', 'calls', 10)")
    await shards[1].query("SELECT flagmeter.consume('b2', 'calls', 6)")
    await shards[1].query("SELECT flagmeter.consume('b2', 'calls', 4)")
    await until(async () => fm.isBlocked('a1', 'calls') && fm.isBlocked('b2', 'calls'), 10000, 'both blocks')
    assert.equal(fm.isBlocked('b1', 'calls'), false)

    // Shard B's LISTEN session goes away; B announces meanwhile; A too.
    const [pidA, pidB] = fm.listenerPids
    await shards[1].query('SELECT pg_terminate_backend($1)', [pidB])
    await shards[1].query("SELECT flagmeter.consume('b3', 'calls', 10)")
    await shards[1].query("SELECT flagmeter.override_limit('b1', 'calls', 50)")
    await shards[0].query("SELECT flagmeter.consume('a2', 'calls', 5)")
    const expectedA = await outbox(shards[0], fromA)
    const expectedB = await outbox(shards[1], fromB)
    const lastOf = (list) => list[list.length - 1].split(':')[0]
    await until(async () => String(fm.versions[0]) === lastOf(expectedA) &&
      String(fm.versions[1]) === lastOf(expectedB), 20000, 'both shards caught up')

    assert.deepEqual(seen[0].map(line), expectedA.filter((l) => !l.includes(':unblocked:')))
    assert.deepEqual(seen[1].map(line), expectedB.filter((l) => !l.includes(':unblocked:')))
    assert.ok(seen[1].some((e) => e.source === 'outbox'), 'B replayed what it missed')
    assert.ok(seen[0].every((e) => e.source === 'notification'), 'A missed nothing')
    assert.equal(fm.listenerPids[0], pidA, 'A kept its session')
    assert.notEqual(fm.listenerPids[1], pidB, 'B has a new one')
    assert.equal(fm.stats().reconnects, 1)
    assert.ok(fm.isBlocked('b3', 'calls'))
    assert.equal(fm.limit('b1', 'calls').quota, 50)
    assert.equal(fm.limit('a2', 'calls').quota, 10)
    assert.equal(fm.limit('nobody', 'calls'), undefined)
  } finally {
    await fm.close()
  }
})

test('an empty shard list is refused', () => {
  assert.throws(() => new FlagMeter({ connection: shards[0].connection(), listen: [] }), TypeError)
})

test('a shard that is down at start delays ready() for that shard only', async () => {
  const bad = { ...shards[1].connection(), database: 'fm_node_no_such_shard' }
  const fm = new FlagMeter({
    connection: shards[0].connection(),
    listen: [shards[0].connection(), bad],
    reconnect: { initialDelayMs: 20, maxDelayMs: 50 }
  })
  const errors = []
  fm.on('error', (err) => errors.push(err))
  try {
    await until(async () => fm.versions[0] !== null && errors.length > 0, 10000, 'shard A synced, shard B failing')
    assert.equal(fm.versions[1], null)
    assert.ok(errors.every((err) => err.shard === 1), 'errors name the shard')
    let settled = false
    fm.ready().then(() => { settled = true }, () => { settled = true })
    await new Promise((resolve) => setTimeout(resolve, 200))
    assert.equal(settled, false, 'ready() waits for every shard')
  } finally {
    await fm.close()
  }
})
