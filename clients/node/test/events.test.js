'use strict'
// Quota events: delivered once per instance, in version order, including
// those announced while an instance was disconnected or while
// notifications were skipped; the cache follows them.
const { test, before, after } = require('node:test')
const assert = require('node:assert/strict')
const path = require('node:path')
const { fork } = require('node:child_process')
const pg = require('pg')
const { FlagMeter } = require('..')
const { createDatabase, until } = require('./helpers')

let db
before(async () => {
  db = await createDatabase('fm_node_events', `
    SELECT flagmeter.define_meter('calls');
    SELECT flagmeter.define_meter('tokens');
    SELECT flagmeter.define_plan('small');
    SELECT flagmeter.define_plan('big');
    SELECT flagmeter.set_limit('small', 'calls', 20, 'lifetime', 'hard', '{50,80,100}');
    SELECT flagmeter.set_limit('small', 'tokens', 60, 'lifetime', 'soft', '{50,100}');
    SELECT flagmeter.set_limit('big', 'calls', 500, 'lifetime');
    SELECT flagmeter.assign_plan('t' || i, 'small') FROM generate_series(0, 29) i;`)
})
after(async () => { await db.drop() })

function start (script, args) {
  const child = fork(path.join(__dirname, 'fixtures', script), args, { stdio: ['ignore', 'inherit', 'inherit', 'ipc'] })
  const messages = []
  const waiters = []
  child.on('message', (m) => {
    messages.push(m)
    for (const w of waiters.splice(0)) w()
  })
  const next = async (pred) => {
    for (;;) {
      const found = messages.find(pred)
      if (found) {
        messages.splice(messages.indexOf(found), 1)
        return found
      }
      await new Promise((resolve) => waiters.push(resolve))
    }
  }
  return { child, messages, next }
}

async function ask (app) {
  app.child.send('state')
  return app.next((m) => m.type === 'state')
}

test('two app processes see the same events, also when one LISTEN backend is terminated mid-load', async () => {
  const a = start('app.js', [db.name, '300'])
  const b = start('app.js', [db.name, '100'])
  const readyA = await a.next((m) => m.type === 'ready')
  await b.next((m) => m.type === 'ready')
  const from = readyA.version

  const driver = start('driver.js', [db.name])
  await driver.next((m) => m === 'half')
  const { rows: killed } = await db.query('SELECT pg_terminate_backend($1) AS ok', [readyA.pid])
  assert.equal(killed[0].ok, true)
  driver.child.send('go') // the second half runs while a is away (it waits 150-300 ms)
  await driver.next((m) => m === 'done')

  const { rows } = await db.query('SELECT version::text, kind, tenant, meter FROM flagmeter.changes_since($1::bigint)', [from])
  assert.ok(rows.length > 100, `the driver made ${rows.length} events`)
  const latest = rows[rows.length - 1].version
  for (const app of [a, b]) await until(async () => (await ask(app)).version === latest, 20000, 'the apps to catch up')

  const expected = rows.map((r) => `${r.version}:${r.kind}:${r.tenant ?? ''}:${r.meter ?? ''}`)
  const seen = (app) => app.messages.filter((m) => m.type === 'event').map((m) => m.event)
  const line = (e) => `${e.version}:${e.kind}:${e.tenant ?? ''}:${e.meter ?? ''}`
  assert.deepEqual(seen(a).map(line), expected)
  assert.deepEqual(seen(b).map(line), expected)
  for (const kind of ['threshold', 'blocked', 'unblocked', 'limit_changed', 'plan_changed']) {
    assert.ok(rows.some((r) => r.kind === kind), `the driver made a ${kind} event`)
  }

  const stateA = await ask(a)
  const stateB = await ask(b)
  assert.ok(stateA.stats.reconnects >= 1, 'a reconnected')
  assert.notEqual(stateA.pid, readyA.pid)
  assert.ok(seen(a).some((e) => e.source === 'outbox'), 'a replayed what it missed from the outbox')
  assert.ok(a.messages.some((m) => m.type === 'invalidate' && m.event.all && m.event.reason === 'reconnect'))
  // both caches agree with the database
  const { rows: blocked } = await db.query("SELECT tenant || '/' || meter AS k FROM flagmeter.blocked ORDER BY 1")
  assert.deepEqual(stateA.blocked, blocked.map((r) => r.k).sort())
  assert.deepEqual(stateB.blocked, stateA.blocked)

  for (const app of [a, b]) {
    app.child.send('close')
    await app.next((m) => m.type === 'closed')
  }
})

test('notifications skipped under backpressure, a resync hint and a shrunk payload: replayed in order', async () => {
  const fm = new FlagMeter({ connection: db.connection() })
  const admin = new pg.Client(db.connection())
  await admin.connect()
  try {
    await fm.ready()
    const seen = []
    for (const kind of ['threshold', 'blocked', 'limit_changed']) fm.on(kind, (e) => seen.push(e))
    const start = BigInt(fm.version)

    // An event whose notification was skipped under backpressure is an
    // outbox row with notified = false and no NOTIFY (filling the real
    // queue takes gigabytes): write one as such a commit leaves it.
    const skipped = (tenant) => admin.query(`INSERT INTO flagmeter.outbox (version, kind, tenant, meter, notified)
      VALUES (nextval('flagmeter.outbox_version'), 'limit_changed', $1, 'calls', false)`, [tenant])

    // 1. skipped, then a later event: a gap, replayed before it (a quota
    // far above the tenant's usage, so that the change blocks nothing)
    await skipped('t20')
    await admin.query("SELECT flagmeter.override_limit('t21', 'calls', 1000000)")
    await until(() => seen.length === 2, 10000, 'the gap to be replayed')
    // the replay reads both from the outbox: t21's own row is committed too
    assert.deepEqual(seen.map((e) => [e.tenant, e.source]), [['t20', 'outbox'], ['t21', 'outbox']])

    // 2. skipped with nothing after it: maintain()'s resync hint brings it
    await skipped('t22')
    assert.equal((await admin.query('SELECT flagmeter.send_resync_hint() AS sent')).rows[0].sent, true)
    await until(() => seen.length === 3, 10000, 'the resync hint')
    assert.deepEqual([seen[2].tenant, seen[2].source], ['t22', 'outbox'])

    // 3. a payload shrunk to fit 1 kB (kind, version, tenant, meter only): read whole from the outbox
    await skipped('t23')
    const v = (await admin.query('SELECT flagmeter.latest_version()::text AS v')).rows[0].v
    await admin.query("SELECT pg_notify('flagmeter', format('{\"kind\":\"limit_changed\",\"version\":%s,\"tenant\":\"t23\"}', $1::text))", [v])
    await until(() => seen.length === 4, 10000, 'the shrunk payload')
    assert.deepEqual([seen[3].tenant, seen[3].meter, seen[3].source], ['t23', 'calls', 'outbox'])

    // 4. an old or repeated payload is dropped: nothing is delivered twice
    await admin.query(`SELECT pg_notify('flagmeter', '{"kind":"limit_changed","version":${v},"tenant":"t23","meter":"calls"}')`)
    await admin.query("SELECT flagmeter.override_limit('t24', 'calls', 1000000)")
    await until(() => seen.length === 5, 10000, 'the next event')
    assert.equal(seen[4].tenant, 't24')
    const versions = seen.map((e) => BigInt(e.version))
    assert.ok(versions.every((x, i) => x > (i === 0 ? start : versions[i - 1])), 'increasing versions')
    // the cache followed: the overrides are the limits in force
    assert.equal(fm.limit('t21', 'calls').quota, 1000000)
    assert.equal(fm.limit('t24', 'calls').quota, 1000000)
  } finally {
    await admin.end()
    await fm.close()
  }
})
