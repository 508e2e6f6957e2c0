'use strict'
// Credit grants and reservations through the client, against a real
// cluster: decisions report what came from grants and the balance left;
// a reservation holds units for others until settled or released.
const { test, before, after } = require('node:test')
const assert = require('node:assert/strict')
const { FlagMeter } = require('..')
const { createDatabase } = require('./helpers')

let db
let fm
before(async () => {
  db = await createDatabase('fm_node_credits', `
    SELECT flagmeter.define_meter('tokens');
    SELECT flagmeter.define_plan('small');
    SELECT flagmeter.set_limit('small', 'tokens', 100, 'lifetime');
    SELECT flagmeter.assign_plan(t, 'small') FROM unnest(ARRAY['acme', 'hooli']) t;
    SELECT flagmeter.grant_credits('acme', 'tokens', 50);`)
  fm = new FlagMeter({ connection: db.connection(), listen: false })
})
after(async () => {
  await fm.close()
  await db.drop()
})

test('consume past the quota draws the grant; the decision says how much and what is left', async () => {
  const d = await fm.consume('acme', 'tokens', 120)
  assert.equal(d.granted, true)
  assert.equal(d.fromGrants, 20)
  assert.equal(d.balance, 30)
  assert.equal(await fm.balance('acme', 'tokens'), 30)
  const refused = await fm.consume('acme', 'tokens', 31)
  assert.equal(refused.granted, false)
  assert.equal(refused.fromGrants, 0)
  const without = await fm.check('hooli', 'tokens', 1)
  assert.equal(without.fromGrants, 0)
  assert.equal(without.balance, 100)
})

test('a reservation holds units until it is settled or released', async () => {
  const r = await fm.reserve('hooli', 'tokens', 80, { ttl: 60, key: 'r-1' })
  assert.equal(r.granted, true)
  assert.ok(r.reservationId !== null)
  assert.equal(r.balance, 20)
  assert.deepEqual(await fm.reserve('hooli', 'tokens', 80, { ttl: 60, key: 'r-1' }), r, 'a retried key returns the same reservation')
  assert.equal((await fm.consume('hooli', 'tokens', 30)).granted, false, 'the hold counts as used for others')
  const settled = await fm.settle(r.reservationId, 50)
  assert.equal(settled.used, 50)
  assert.equal((await fm.consume('hooli', 'tokens', 30)).granted, true, 'the rest of the hold is free again')
  await assert.rejects(fm.settle(r.reservationId, 1), (err) => typeof err.code === 'string', 'settled twice')

  const r2 = await fm.reserve('hooli', 'tokens', 20, { ttl: '1 minute' })
  assert.equal(r2.granted, true)
  assert.equal(await fm.release(r2.reservationId), true)
  assert.equal(await fm.release(r2.reservationId), false)
  assert.equal((await fm.reserve('hooli', 'tokens', 21)).granted, false, 'all or nothing at the limit')
})

test('bad arguments are refused before anything is sent', async () => {
  await assert.rejects(fm.reserve('hooli', 'tokens', 0), RangeError)
  await assert.rejects(fm.reserve('hooli', 'tokens', 1, { ttl: -1 }), RangeError)
  await assert.rejects(fm.settle(1, -1), RangeError)
  await assert.rejects(fm.balance('', 'tokens'), TypeError)
})
