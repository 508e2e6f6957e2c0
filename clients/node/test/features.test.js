'use strict'
// Entitlements from the local cache: hasFeature and featureConfig load a
// tenant on first use and then follow feature_changed and plan_changed,
// made by other connections: a plan's row reaches every cached tenant of
// the plan that does not override it, a tenant's override only that one;
// a gap (a skipped notification, a payload shrunk past 1 kB) and a
// reconnect are caught up from the outbox.
const { test, before, after } = require('node:test')
const assert = require('node:assert/strict')
const pg = require('pg')
const { FlagMeter } = require('..')
const { createDatabase, until } = require('./helpers')

let db
before(async () => {
  db = await createDatabase('fm_node_features', `
    SELECT flagmeter.define_plan('free');
    SELECT flagmeter.define_plan('pro');
    SELECT flagmeter.define_plan('team');
    SELECT flagmeter.define_feature('sso');
    SELECT flagmeter.define_feature('exports');
    SELECT flagmeter.define_feature('max_projects');
    SELECT flagmeter.set_feature('free', 'max_projects', config => '3');
    SELECT flagmeter.set_feature('free', 'sso', false);
    SELECT flagmeter.set_feature('pro', 'sso', config => '{"idp": "okta"}');
    SELECT flagmeter.set_feature('pro', 'max_projects', config => '100');
    SELECT flagmeter.set_feature('team', 'exports');
    SELECT flagmeter.assign_plan('p' || i, 'pro') FROM generate_series(0, 4) i;
    SELECT flagmeter.assign_plan('acme', 'free');`)
})
after(async () => { await db.drop() })

async function withApp (fn, options = {}) {
  const fm = new FlagMeter({ connection: db.connection(), ...options })
  const admin = new pg.Client(db.connection())
  await admin.connect()
  const events = []
  fm.on('feature_changed', (e) => events.push(e))
  fm.on('error', () => {}) // a terminated LISTEN session: the stream reconnects
  try {
    if (options.listen !== false) await fm.ready()
    await fn(fm, admin, events)
  } finally {
    await admin.end()
    await fm.close()
  }
}

/** The answers of the cache alone (undefined: not cached), no round trip. */
function cached (fm, tenant, feature) {
  return fm.features.answer(tenant, feature)
}

/** What the database answers, for comparison. */
async function truth (admin, tenant, feature) {
  const { rows } = await admin.query('SELECT flagmeter.has_feature($1, $2) AS enabled, flagmeter.feature_config($1, $2) AS config',
    [tenant, feature])
  return { enabled: rows[0].enabled, config: rows[0].config }
}

test('first use loads the tenant; a change made by another connection reaches the cache', async () => {
  await withApp(async (fm, admin, events) => {
    assert.equal(cached(fm, 'acme', 'sso'), undefined)
    assert.equal(await fm.hasFeature('acme', 'sso'), false) // free denies it
    assert.equal(await fm.featureConfig('acme', 'max_projects'), 3)
    assert.deepEqual(cached(fm, 'acme', 'max_projects'), { enabled: true, config: 3 })

    await admin.query("SELECT flagmeter.override_feature('acme', 'sso', true, '{\"idp\": \"azure\", \"n\": 12345678901234567890}')")
    await until(() => events.length === 1, 10000, 'the override to arrive')
    assert.deepEqual(cached(fm, 'acme', 'sso'), { enabled: true, config: { idp: 'azure', n: 12345678901234567890n } })
    assert.equal(await fm.hasFeature('acme', 'sso'), true)
    const e = events[0]
    assert.deepEqual([e.kind, e.tenant, e.plan, e.feature, e.enabled, e.source], ['feature_changed', 'acme', undefined, 'sso', true, 'notification'])

    // dropped: the plan decides again
    await admin.query("SELECT flagmeter.drop_feature_override('acme', 'sso')")
    await until(() => events.length === 2, 10000, 'the drop to arrive')
    assert.equal(events[1].enabled, null)
    assert.deepEqual(cached(fm, 'acme', 'sso'), { enabled: false, config: null })

    // a rolled-back change announces nothing; the next one comes in order
    await admin.query('BEGIN')
    await admin.query("SELECT flagmeter.override_feature('acme', 'exports', true)")
    await admin.query('ROLLBACK')
    await admin.query("SELECT flagmeter.override_feature('acme', 'max_projects', true, '7')")
    await until(() => events.length === 3, 10000, 'the next override')
    assert.equal(events[2].feature, 'max_projects')
    assert.equal(await fm.featureConfig('acme', 'max_projects'), 7)
    assert.equal(await fm.hasFeature('acme', 'exports'), false)
    for (const f of ['sso', 'exports', 'max_projects']) assert.deepEqual(cached(fm, 'acme', f), await truth(admin, 'acme', f))
  })
})

test("a plan's change reaches every cached tenant of the plan, but not an override", async () => {
  await withApp(async (fm, admin, events) => {
    await admin.query("SELECT flagmeter.override_feature('p0', 'exports', false)")
    for (let i = 0; i < 5; i++) assert.equal(await fm.hasFeature(`p${i}`, 'exports'), false)
    const before = events.length
    await admin.query("SELECT flagmeter.set_feature('pro', 'exports', true, '{\"formats\": [\"csv\"]}')")
    await until(() => events.length === before + 1, 10000, "the plan's row to arrive")
    const e = events[before]
    assert.deepEqual([e.plan, e.tenant, e.feature, e.enabled], ['pro', undefined, 'exports', true])
    assert.deepEqual(cached(fm, 'p0', 'exports'), { enabled: false, config: null }) // its override wins
    for (let i = 1; i < 5; i++) assert.deepEqual(cached(fm, `p${i}`, 'exports'), { enabled: true, config: { formats: ['csv'] } })
    // a tenant first used after the change loads it with the plan
    await admin.query("SELECT flagmeter.assign_plan('p9', 'pro')")
    assert.equal(await fm.hasFeature('p9', 'exports'), true)
    for (let i = 0; i < 5; i++) assert.deepEqual(cached(fm, `p${i}`, 'exports'), await truth(admin, `p${i}`, 'exports'))
  })
})

test('plan_changed moves a cached tenant onto its new plan; unassigned, it has nothing', async () => {
  await withApp(async (fm, admin) => {
    assert.equal(await fm.hasFeature('p1', 'sso'), true)
    await admin.query("SELECT flagmeter.override_feature('p1', 'max_projects', true, '42')")
    await admin.query("SELECT flagmeter.assign_plan('p1', 'team')") // team is not cached yet
    await until(() => cached(fm, 'p1', 'sso')?.enabled === false, 10000, 'the plan change')
    assert.equal(await fm.hasFeature('p1', 'exports'), true)
    assert.equal(await fm.featureConfig('p1', 'max_projects'), 42) // the override stays
    await admin.query("SELECT flagmeter.unassign_tenant('p1')")
    await until(() => cached(fm, 'p1', 'exports')?.enabled === false, 10000, 'the unassignment')
    assert.deepEqual(cached(fm, 'p1', 'max_projects'), { enabled: false, config: null }) // the override went with it
    for (const f of ['sso', 'exports', 'max_projects']) assert.deepEqual(cached(fm, 'p1', f), await truth(admin, 'p1', f))
  })
})

test('what changed while the LISTEN session was away is replayed after the reconnect', async () => {
  await withApp(async (fm, admin, events) => {
    assert.equal(await fm.hasFeature('p2', 'sso'), true)
    assert.equal(await fm.hasFeature('acme', 'exports'), false)
    const pid = fm.listenerPid
    await admin.query('SELECT pg_terminate_backend($1)', [pid])
    // made at once, while the client waits to reconnect (100-200 ms)
    await admin.query("SELECT flagmeter.set_feature('pro', 'sso', false)")
    await admin.query("SELECT flagmeter.override_feature('acme', 'exports', true, '\"all\"')")
    await until(() => fm.listenerPid !== null && fm.listenerPid !== pid, 10000, 'the reconnect')
    await until(() => cached(fm, 'acme', 'exports')?.enabled === true, 10000, 'the replay')
    assert.equal(fm.stats().reconnects, 1)
    assert.deepEqual(cached(fm, 'p2', 'sso'), { enabled: false, config: null })
    assert.equal(await fm.featureConfig('acme', 'exports'), 'all')
    assert.ok(events.slice(-2).every((e) => e.source === 'outbox'), 'replayed from the outbox')
  })
})

test('a skipped notification and a payload too large for one are read from the outbox', async () => {
  await withApp(async (fm, admin, events) => {
    assert.equal(await fm.hasFeature('p3', 'exports'), true)
    assert.equal(await fm.hasFeature('acme', 'sso'), false)
    // A commit whose notification was skipped under backpressure leaves its
    // row with notified = false and sends nothing: written as such.
    await admin.query('BEGIN')
    await admin.query("UPDATE flagmeter.plan_features SET enabled = false WHERE plan = 'pro' AND feature = 'exports'")
    await admin.query(`INSERT INTO flagmeter.outbox (version, kind, plan, feature, enabled, notified)
      VALUES (nextval('flagmeter.outbox_version'), 'feature_changed', 'pro', 'exports', false, false)`)
    await admin.query('COMMIT')
    const big = 'x'.repeat(1500)
    await admin.query("SELECT flagmeter.override_feature('acme', 'sso', true, jsonb_build_object('blob', $1::text))", [big])
    await until(() => cached(fm, 'acme', 'sso')?.enabled === true, 10000, 'the gap and the large row')
    assert.deepEqual(cached(fm, 'p3', 'exports'), { enabled: false, config: null })
    assert.deepEqual(await fm.featureConfig('acme', 'sso'), { blob: big })
    assert.deepEqual(events.slice(-2).map((e) => [e.plan ?? e.tenant, e.source]), [['pro', 'outbox'], ['acme', 'outbox']])
  })
})

test('unknown features reject as in SQL; without an event stream the database answers', async () => {
  await withApp(async (fm) => {
    await assert.rejects(fm.hasFeature('acme', 'teleport'), (err) => err.code === '42704')
    await assert.rejects(fm.hasFeature('', 'sso'), TypeError)
    // a feature defined after the tenant was loaded is asked once, then cached
    assert.equal(await fm.hasFeature('p4', 'sso'), false)
    await db.query("SELECT flagmeter.define_feature('audit_log')")
    assert.equal(await fm.hasFeature('p4', 'audit_log'), false)
    assert.deepEqual(cached(fm, 'p4', 'audit_log'), { enabled: false, config: null })
  })
  await withApp(async (fm) => {
    assert.equal(await fm.hasFeature('p4', 'max_projects'), true)
    assert.equal(await fm.featureConfig('p4', 'max_projects'), 100)
    assert.equal(cached(fm, 'p4', 'max_projects'), undefined)
  }, { listen: false })
})

test('FeatureCache: events at or below a load are passed over; the oldest tenants go past the size', () => {
  const { FeatureCache } = require('../src/features')
  const f = new FeatureCache({ maxTenants: 2 })
  const names = ['sso', 'exports']
  f.loadTenant('a', { version: 10, plan: 'pro', overrides: [], planRows: [{ feature: 'sso', enabled: true, config: null }], names })
  f.applyFeature({ version: 9, plan: 'pro', feature: 'sso', enabled: false, config: null }) // in the load already
  assert.deepEqual(f.answer('a', 'sso'), { enabled: true, config: null })
  f.applyFeature({ version: 11, plan: 'pro', feature: 'exports', enabled: true, config: { n: 1 } })
  f.applyFeature({ version: 12, tenant: 'a', feature: 'sso', enabled: false, config: null })
  assert.deepEqual(f.answer('a', 'exports'), { enabled: true, config: { n: 1 } })
  assert.deepEqual(f.answer('a', 'sso'), { enabled: false, config: null })
  f.applyFeature({ version: 13, tenant: 'a', feature: 'sso', enabled: null, config: null }) // dropped
  assert.deepEqual(f.answer('a', 'sso'), { enabled: true, config: null })
  assert.equal(f.answer('a', 'unheard_of'), undefined)
  assert.equal(f.planToLoad('a', 'team', 14), 'team') // to be read first
  assert.deepEqual(f.answer('a', 'sso'), { enabled: true, config: null }) // still on pro meanwhile
  f.loadPlan('team', [], 14)
  f.applyPlan('a', 'team', 14)
  assert.deepEqual(f.answer('a', 'exports'), { enabled: false, config: null })
  assert.equal(f.hasTenant('a'), true)
  assert.equal(f.planToLoad('a', 'team', 14), null) // applied already
  f.loadTenant('b', { version: 15, plan: null, overrides: [], names })
  f.loadTenant('c', { version: 16, plan: null, overrides: [], names })
  assert.equal(f.hasTenant('a'), false)
  assert.deepEqual(f.answer('c', 'sso'), { enabled: false, config: null })
})
