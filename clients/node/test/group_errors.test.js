'use strict'
// A group is one statement: when the database refuses one call's input (a
// tenant never assigned a plan, an event time outside the window, an
// unknown meter), the statement wrote nothing for any call.  The client
// splits the group until the refused calls fail alone; their neighbours
// are answered as if they had come alone.
const { test, before, after } = require('node:test')
const assert = require('node:assert/strict')
const { FlagMeter } = require('..')
const { createDatabase } = require('./helpers')

const TENANTS = Array.from({ length: 40 }, (_, i) => `t${i}`)

let db
before(async () => {
  db = await createDatabase('fm_node_group_errors', `
    SELECT flagmeter.define_meter('api_calls');
    SELECT flagmeter.define_plan('free');
    SELECT flagmeter.set_limit('free', 'api_calls', 1000, 'lifetime');
    SELECT flagmeter.assign_plan(t, 'free') FROM unnest(ARRAY[${TENANTS.map((t) => `'${t}'`).join(', ')}]) t;`)
})
after(async () => { await db.drop() })

// maxInFlight 1: the first call goes alone, the others queue behind it and
// go as one group
function client () {
  return new FlagMeter({ connection: db.connection(), listen: false, maxInFlight: 1 })
}

async function usedBy (tenants) {
  const { rows } = await db.query(
    'SELECT coalesce(sum(flagmeter.used(flagmeter.usage(t, \'api_calls\'))), 0)::int AS u FROM unnest($1::text[]) t', [tenants])
  return rows[0].u
}

test('track: a tenant never assigned a plan fails alone; the rest of its group is counted', async () => {
  const fm = client()
  try {
    const calls = TENANTS.map((t) => fm.track(t, 'api_calls', 1, { key: `k-${t}` }))
    calls.splice(20, 0, fm.track('typo', 'api_calls', 1, { key: 'k-typo' }))
    const results = await Promise.allSettled(calls)
    const refused = results.filter((r) => r.status === 'rejected')
    assert.equal(refused.length, 1)
    assert.equal(/** @type {any} */ (refused[0]).reason.code, 'QT001')
    assert.ok(results.filter((r) => r.status === 'fulfilled').every((r) => r.value.counted === true))
    assert.equal(await usedBy(TENANTS), TENANTS.length, 'every other call counted once')
    const stats = fm.stats()
    assert.ok(stats.track.groups < stats.track.calls, `grouped: ${stats.track.groups} groups for ${stats.track.calls} calls`)
    assert.ok(stats.splits >= 1, 'the refused group was split')
  } finally { await fm.close() }
})

test('track: an event outside the time window and an unknown meter fail alone', async () => {
  const fm = client()
  try {
    const old = new Date(Date.now() - 400 * 24 * 3600 * 1000)
    const calls = TENANTS.map((t) => fm.track(t, 'api_calls', 1))
    calls.splice(5, 0, fm.track('t1', 'api_calls', 1, { occurredAt: old }))
    calls.splice(30, 0, fm.track('t2', 'no_such_meter', 1))
    const results = await Promise.allSettled(calls)
    const codes = results.filter((r) => r.status === 'rejected').map((r) => /** @type {any} */ (r).reason.code).sort()
    assert.deepEqual(codes, ['42704', 'QT002'])
    assert.equal(await usedBy(TENANTS), 2 * TENANTS.length)
  } finally { await fm.close() }
})

test('consume: an unassigned tenant fails alone, its neighbours are decided', async () => {
  const fm = client()
  try {
    const calls = TENANTS.map((t) => fm.consume(t, 'api_calls', 1))
    calls.splice(10, 0, fm.consume('nobody', 'api_calls', 1))
    const results = await Promise.allSettled(calls)
    const refused = results.filter((r) => r.status === 'rejected')
    assert.equal(refused.length, 1)
    assert.equal(/** @type {any} */ (refused[0]).reason.code, 'QT001')
    assert.ok(results.filter((r) => r.status === 'fulfilled').every((r) => r.value.granted === true))
    assert.equal(await usedBy(TENANTS), 3 * TENANTS.length)
  } finally { await fm.close() }
})

test('an error that meets every call (no privilege) fails the whole group at once, unsplit', async () => {
  const role = `fm_nopriv_${process.pid}`
  await db.query(`CREATE ROLE ${role} LOGIN`)
  const fm = new FlagMeter({ connection: { ...db.connection(), user: role }, listen: false, maxInFlight: 1 })
  try {
    const results = await Promise.allSettled(TENANTS.slice(0, 10).map((t) => fm.track(t, 'api_calls', 1)))
    assert.ok(results.every((r) => r.status === 'rejected' && r.reason.code === '42501'))
    assert.equal(fm.stats().splits, 0)
  } finally {
    await fm.close()
    await db.query(`DROP ROLE ${role}`)
  }
})
