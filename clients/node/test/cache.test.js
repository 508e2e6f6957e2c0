'use strict'
// The local cache: blocked state and limits, from the snapshot and then
// only from events applied in version order; a blocked entry ends with
// its period.
const { test, before, after } = require('node:test')
const assert = require('node:assert/strict')
const { FlagMeter } = require('..')
const { QuotaCache } = require('../src/cache')
const { createDatabase, until } = require('./helpers')

let db
before(async () => {
  db = await createDatabase('fm_node_cache', `
    SELECT flagmeter.define_meter('calls');
    SELECT flagmeter.define_plan('small');
    SELECT flagmeter.define_plan('hourly');
    SELECT flagmeter.set_limit('small', 'calls', 5, 'lifetime');
    SELECT flagmeter.set_limit('hourly', 'calls', 5, 'hour');
    SELECT flagmeter.assign_plan('early', 'small');
    SELECT flagmeter.assign_plan('late', 'small');
    SELECT flagmeter.assign_plan('hour', 'hourly', now(), 'Asia/Kolkata');
    SELECT flagmeter.track('early', 'calls', 5);     -- blocked before the client starts`)
})
after(async () => { await db.drop() })

test('blocked state: from the snapshot, then from events, without a round trip', async () => {
  const fm = new FlagMeter({ connection: db.connection() })
  try {
    await fm.ready()
    assert.equal(fm.isBlocked('early', 'calls'), true) // in the snapshot
    assert.equal(fm.isBlocked('late', 'calls'), false)
    assert.equal(fm.limit('late', 'calls').quota, 5)
    assert.equal(fm.limit('nobody', 'calls'), undefined)

    const blocked = new Promise((resolve) => fm.once('blocked', resolve))
    const d = await fm.consume('late', 'calls', 5)
    assert.equal(d.granted, true)
    assert.equal((await blocked).tenant, 'late')
    assert.equal(fm.isBlocked('late', 'calls'), true) // the cache moved before the event was emitted

    // raising the limit unblocks, and the cache has the new limit
    const unblocked = new Promise((resolve) => fm.once('unblocked', resolve))
    await db.query("SELECT flagmeter.override_limit('late', 'calls', 50)")
    assert.equal((await unblocked).quota, 50)
    assert.equal(fm.isBlocked('late', 'calls'), false)
    assert.equal(fm.limit('late', 'calls').quota, 50)

    // a plan change reloads the tenant's limits
    await db.query("SELECT flagmeter.assign_plan('early', 'hourly')")
    await until(() => fm.limit('early', 'calls')?.period === 'hour', 10000, 'the plan change')
    // a plan's limit change reloads its tenants
    await db.query("SELECT flagmeter.set_limit('hourly', 'calls', 9, 'hour')")
    await until(() => fm.limit('hour', 'calls')?.quota === 9, 10000, 'the limit change')
    assert.equal(fm.limit('early', 'calls').quota, 9)
  } finally { await fm.close() }
})

test('a blocked entry ends with its period (hour, in the tenant\'s zone)', async () => {
  const fm = new FlagMeter({ connection: db.connection() })
  try {
    await fm.ready()
    const blocked = new Promise((resolve) => fm.once('blocked', (e) => e.tenant === 'hour' && resolve(e)))
    await fm.track('hour', 'calls', 9)
    await blocked
    const entry = fm.cache.blocked().find((b) => b.tenant === 'hour')
    const { rows } = await db.query(`SELECT b.period_end FROM flagmeter.limit_config('hour', 'calls') c,
      flagmeter.period_bounds(now(), c.period, c.anchor, c.timezone) b`)
    assert.equal(entry.until.getTime(), rows[0].period_end.getTime())
  } finally { await fm.close() }
})

test('QuotaCache: expiry at the period end, and no step backwards', () => {
  let now = Date.parse('2026-01-01T10:30:00Z')
  const cache = new QuotaCache({ now: () => now })
  cache.load({ version: 3, blocked: [], limits: [] })
  cache.block('a', 'calls', new Date('2026-01-01T10:00:00Z'), new Date('2026-01-01T11:00:00Z'))
  cache.block('b', 'calls', null, null) // lifetime
  assert.equal(cache.isBlocked('a', 'calls'), true)
  now = Date.parse('2026-01-01T10:59:59.999Z')
  assert.equal(cache.isBlocked('a', 'calls'), true)
  now = Date.parse('2026-01-01T11:00:00Z')
  assert.equal(cache.isBlocked('a', 'calls'), false) // maintain() has not run: no event needed
  assert.equal(cache.isBlocked('b', 'calls'), true)
  // an unblocked event of an earlier period does not clear a later block
  cache.block('a', 'calls', new Date('2026-01-01T11:00:00Z'), new Date('2026-01-01T12:00:00Z'))
  cache.unblock('a', 'calls', new Date('2026-01-01T10:00:00Z'))
  assert.equal(cache.isBlocked('a', 'calls'), true)
  cache.unblock('a', 'calls', new Date('2026-01-01T11:00:00Z'))
  assert.equal(cache.isBlocked('a', 'calls'), false)
})
