'use strict'
const { test, before, after } = require('node:test')
const assert = require('node:assert/strict')
const pg = require('pg')
const { FlagMeter } = require('..')
const { createDatabase } = require('./helpers')

let db
let fm
before(async () => {
  db = await createDatabase('fm_node_tx', `
    SELECT flagmeter.define_meter('api_calls');
    SELECT flagmeter.define_meter('tokens');
    SELECT flagmeter.define_plan('free');
    SELECT flagmeter.set_limit('free', 'api_calls', 10, 'lifetime');
    SELECT flagmeter.assign_plan('acme', 'free');
    CREATE TABLE orders (id int PRIMARY KEY, tenant text);`)
  fm = new FlagMeter({ connection: db.connection(), listen: false })
})
after(async () => {
  await fm.close()
  await db.drop()
})

async function counts () {
  const { rows } = await db.query(`SELECT flagmeter.used(flagmeter.usage('acme', 'api_calls'))::int AS api,
    flagmeter.used(flagmeter.usage('acme', 'tokens'))::int AS tokens, (SELECT count(*)::int FROM orders) AS orders,
    (SELECT count(*)::int FROM flagmeter.event_keys) AS keys`)
  return rows[0]
}

test('a rollback takes the usage with it, keys included', async () => {
  await assert.rejects(fm.transaction(async (tx) => {
    await tx.client.query("INSERT INTO orders VALUES (1, 'acme')")
    assert.deepEqual(await tx.track('acme', 'tokens', 500, { key: 'order-1' }), { counted: true })
    const d = await tx.consume('acme', 'api_calls', 3)
    assert.deepEqual([d.granted, d.used], [true, 3])
    // the transaction sees its own usage
    assert.equal((await tx.check('acme', 'api_calls', 7)).granted, true)
    assert.equal((await tx.check('acme', 'api_calls', 8)).granted, false)
    throw new Error('payment failed')
  }), /payment failed/)
  assert.deepEqual(await counts(), { api: 0, tokens: 0, orders: 0, keys: 0 })
})

test('a commit keeps it, with the app\'s own writes', async () => {
  const result = await fm.transaction(async (tx) => {
    await tx.client.query("INSERT INTO orders VALUES (2, 'acme')")
    const ds = await tx.consume('acme', ['api_calls', 'tokens'], [2, 40], { key: 'order-2' })
    await tx.track('acme', 'tokens', 1, { key: 'order-2-extra' })
    return ds.map((d) => d.granted)
  })
  assert.deepEqual(result, [true, true])
  assert.deepEqual(await counts(), { api: 2, tokens: 41, orders: 1, keys: 3 })
  // nothing went through the batchers
  assert.deepEqual(fm.stats().track, { calls: 0, groups: 0 })
})

test('on the caller\'s own client, inside the caller\'s transaction', async () => {
  const client = new pg.Client(db.connection())
  await client.connect()
  try {
    await client.query('BEGIN')
    await fm.transaction(client, async (tx) => {
      await tx.track('acme', 'tokens', 1000)
      await assert.rejects(tx.consume('acme', 'nope', 1), (err) => err.code === '42704')
    })
    await client.query('ROLLBACK')
  } finally { await client.end() }
  assert.deepEqual(await counts(), { api: 2, tokens: 41, orders: 1, keys: 3 })
})
