'use strict'
// Least privilege: the client runs as two roles with exactly the grants
// README's "Node.js client" section lists, and each gets permission denied
// for what it does not need.
const { test, before, after } = require('node:test')
const assert = require('node:assert/strict')
const pg = require('pg')
const { FlagMeter } = require('..')
const { createDatabase, until } = require('./helpers')

// The grants, as README documents them (keep the two in step).
const GRANTS = `
  CREATE ROLE fm_node_request LOGIN;
  GRANT USAGE ON SCHEMA flagmeter TO fm_node_request;
  GRANT EXECUTE ON FUNCTION
      flagmeter.track_events(text[], text[], bigint[], timestamptz[], text[]),
      flagmeter.consume_batch(text[], text[], bigint[], text[], integer[]),
      flagmeter.limit_batch(text[], bigint[], interval[], bigint[], bigint[]),
      flagmeter.check(text, text, bigint),
      flagmeter.track_value(text, text, text, timestamptz),
      flagmeter.consume_value(text, text, text),
      flagmeter.forget_value(text, text, text),
      flagmeter.track(text, text, bigint, timestamptz, text),
      flagmeter.consume(text, text, bigint, text),
      flagmeter.consume(text, text[], bigint[], text),
      flagmeter.has_feature(text, text),
      flagmeter.feature_config(text, text) TO fm_node_request;

  CREATE ROLE fm_node_listener LOGIN;
  GRANT USAGE ON SCHEMA flagmeter TO fm_node_listener;
  GRANT SELECT ON flagmeter.outbox, flagmeter.blocked, flagmeter.effective_limits,
      flagmeter.meters, flagmeter.tenants, flagmeter.limits, flagmeter.overrides,
      flagmeter.features, flagmeter.plan_features, flagmeter.feature_overrides
      TO fm_node_listener;`

let db
before(async () => {
  db = await createDatabase('fm_node_roles', `
    DROP ROLE IF EXISTS fm_node_request;
    DROP ROLE IF EXISTS fm_node_listener;
    SELECT flagmeter.define_meter('calls');
    SELECT flagmeter.define_meter('seats', aggregation => 'unique');
    SELECT flagmeter.define_plan('small');
    SELECT flagmeter.set_limit('small', 'calls', 3, 'month');
    -- a rate limit that never refuses here: consume and check read it as the request role
    SELECT flagmeter.set_rate_limit('small', 'calls', 1000, '1 second');
    SELECT flagmeter.assign_plan('acme', 'small');
    SELECT flagmeter.define_feature('sso');
    SELECT flagmeter.set_feature('small', 'sso', config => '{"idp": "okta"}');
    ${GRANTS}`)
})
after(async () => {
  await db.drop()
  await db.query('SELECT 1').catch(() => {})
  const admin = new pg.Client({ ...db.connection(), database: 'postgres' })
  await admin.connect()
  await admin.query('DROP ROLE IF EXISTS fm_node_request')
  await admin.query('DROP ROLE IF EXISTS fm_node_listener')
  await admin.end()
})

test('the request role and the listener role are enough, and no more', async () => {
  const fm = new FlagMeter({
    connection: db.connection({ user: 'fm_node_request' }),
    listen: db.connection({ user: 'fm_node_listener' })
  })
  const errors = []
  fm.on('error', (err) => errors.push(err))
  try {
    await fm.ready()
    assert.equal(fm.limit('acme', 'calls').quota, 3)
    assert.deepEqual(await fm.track('acme', 'calls', 1, { key: 'a' }), { counted: true })
    assert.deepEqual(await fm.track('acme', 'calls', 1, { key: 'a' }), { counted: false })
    const blocked = new Promise((resolve) => fm.once('blocked', resolve))
    const [d1, d2] = await Promise.all([fm.consume('acme', 'calls', 2), fm.consume('acme', 'calls', 1)])
    assert.deepEqual([d1.granted, d2.granted], [true, false])
    await blocked // the listener read the period's end for it (limit_config, period_bounds)
    assert.equal(fm.isBlocked('acme', 'calls'), true)
    assert.equal((await fm.check('acme', 'calls', 0)).used, 3)
    assert.equal((await fm.rateLimit('login:acme', { rate: 5, per: 60 })).allowed, true)
    assert.equal(await fm.trackValue('acme', 'seats', 'ann'), true)
    assert.equal((await fm.consumeValue('acme', 'seats', 'bob')).used, 2)
    assert.equal(await fm.forgetValue('acme', 'seats', 'ann'), true)
    await fm.transaction(async (tx) => {
      await tx.track('acme', 'calls', 1)
      await tx.consume('acme', ['calls'], [1])
    })
    // features: loaded as the listener, kept by its events
    assert.equal(await fm.hasFeature('acme', 'sso'), true)
    assert.notEqual(fm.features.answer('acme', 'sso'), undefined, 'loaded into the cache, not asked of the pool')
    // a catch-up as the listener: a reconnect replays changes_since
    await db.query('SELECT pg_terminate_backend($1)', [fm.listenerPid])
    await db.query("SELECT flagmeter.override_limit('acme', 'calls', 100)") // unblocked, limit_changed
    await db.query("SELECT flagmeter.override_feature('acme', 'sso', false)")
    await until(() => !fm.isBlocked('acme', 'calls') && fm.limit('acme', 'calls').quota === 100, 15000, 'the replay')
    await until(() => fm.features.answer('acme', 'sso')?.enabled === false, 15000, 'the feature replay')
    assert.ok(errors.every((e) => e.code === '57P01'), errors.map(String).join('; ')) // only the termination
  } finally { await fm.close() }
})

test('each role is refused what the other, or an admin, may do', async () => {
  const as = async (user, sql) => {
    const c = new pg.Client(db.connection({ user }))
    await c.connect()
    try {
      await c.query(sql)
      return 'ok'
    } catch (err) {
      return err.code
    } finally { await c.end() }
  }
  // the request role: no catalog changes, no tables, no outbox
  assert.equal(await as('fm_node_request', "SELECT flagmeter.set_limit('small', 'calls', 1000)"), '42501')
  assert.equal(await as('fm_node_request', 'SELECT * FROM flagmeter.counters'), '42501')
  assert.equal(await as('fm_node_request', 'SELECT * FROM flagmeter.changes_since(0)'), '42501')
  assert.equal(await as('fm_node_request', "SELECT flagmeter.void('acme', 'a')"), '42501')
  // the listener: reads, never records
  assert.equal(await as('fm_node_listener', "SELECT flagmeter.track_events('{acme}', '{calls}', '{1}')"), '42501')
  assert.equal(await as('fm_node_listener', "SELECT * FROM flagmeter.consume_batch('{acme}', '{calls}', '{1}')"), '42501')
  assert.equal(await as('fm_node_listener', "SELECT flagmeter.announce('blocked', 'acme', 'calls')"), '42501')
  assert.equal(await as('fm_node_listener', "SELECT * FROM flagmeter.limit_batch('{k}', '{1}', '{1 second}', '{NULL}', '{NULL}')"), '42501')
  // the request role spends from limiters, it does not set them
  assert.equal(await as('fm_node_request', "SELECT flagmeter.set_rate_limit('small', 'calls', 1, '1 second')"), '42501')
  assert.equal(await as('fm_node_listener', 'DELETE FROM flagmeter.blocked'), '42501')
})
