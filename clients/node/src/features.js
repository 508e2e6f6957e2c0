'use strict'
// The local cache of entitlements: what hasFeature and featureConfig answer
// without a round trip.  It holds the rows the database decides from, not
// answers: per tenant its plan and its overrides, per plan its rows, so
// that one feature_changed event of a plan reaches every cached tenant on
// it (README, "Entitlements in the Node client").  The answer is the one
// flagmeter.has_feature gives: the tenant's override, else its plan's row,
// else not granted; a configuration only with a grant.
//
// A tenant is loaded on first use (src/sql/features.js), with its plan's
// rows unless the plan is cached already, together with the version its
// snapshot had (loadedAt).  Events come in version order (the event
// stream); one at or below the loadedAt of what it changes is already in
// the loaded rows and is passed over, so the cache only moves forward.

const { DEFAULTS } = require('./defaults')
const { big } = require('./numbers')

/** @typedef {import('./interfaces').Int} Int */
/** @typedef {import('./interfaces').FeatureConfig} FeatureConfig */
/** @typedef {{ enabled: boolean, config: FeatureConfig }} Row */
/** @typedef {{ plan: string | null, overrides: Map<string, Row>, loadedAt: bigint }} CachedTenant */
/** @typedef {{ rows: Map<string, Row>, loadedAt: bigint }} CachedPlan */

/** { enabled, config } of a row (config only parsed JSON, null when none). */
/**
 * @param {boolean} enabled
 * @param {FeatureConfig | undefined} config
 * @returns {Row}
 */
function rowOf (enabled, config) {
  return { enabled, config: config ?? null }
}

class FeatureCache {
  /** @param {{ maxTenants?: number }} [opts]  maxTenants: the oldest loaded go past it */
  constructor ({ maxTenants = DEFAULTS.featureCacheSize } = {}) {
    this._max = maxTenants
    /** @type {Map<string, CachedTenant>} */
    this._tenants = new Map() // tenant -> { plan, overrides: Map, loadedAt }
    /** @type {Map<string, CachedPlan>} */
    this._plans = new Map() // plan -> { rows: Map, loadedAt }
    /** @type {Set<string>} */
    this._names = new Set() // features known to be defined
  }

  /** @param {string} tenant */
  hasTenant (tenant) {
    return this._tenants.has(tenant)
  }

  /** @param {string} plan */
  hasPlan (plan) {
    return this._plans.has(plan)
  }

  /**
   * A feature is defined (the database said so).
   * @param {string} feature
   */
  know (feature) {
    this._names.add(feature)
  }

  /**
   * { enabled, config } for a cached tenant and a known feature; undefined
   * when the cache cannot say (the tenant is not loaded, the feature unknown).
   * @param {string} tenant
   * @param {string} feature
   * @returns {{ enabled: boolean, config: FeatureConfig } | undefined}
   */
  answer (tenant, feature) {
    const t = this._tenants.get(tenant)
    if (t === undefined || !this._names.has(feature)) return undefined
    const p = t.plan === null ? undefined : this._plans.get(t.plan)
    if (t.plan !== null && p === undefined) {
      // its new plan's rows could not be read (plan_changed): load it again
      this._tenants.delete(tenant)
      return undefined
    }
    const row = t.overrides.get(feature) ?? p?.rows.get(feature)
    if (row === undefined || !row.enabled) return { enabled: false, config: null }
    return { enabled: true, config: row.config }
  }

  /**
   * What a tenant's load read in one snapshot of version: { plan,
   * overrides, planRows (absent when its plan is cached), names }, rows as
   * { feature, enabled, config }.
   * @param {string} tenant
   * @param {import('./sql/rows').TenantFeatures} loaded
   */
  loadTenant (tenant, { version, plan, overrides, planRows, names }) {
    for (const n of names) this._names.add(n)
    if (planRows !== undefined && plan !== null) this.loadPlan(plan, planRows, version)
    const map = new Map()
    for (const o of overrides) map.set(o.feature, rowOf(o.enabled, o.config))
    this._tenants.delete(tenant)
    this._tenants.set(tenant, { plan, overrides: map, loadedAt: big(version) })
    // Map order is load order: the oldest load goes first
    while (this._tenants.size > this._max) this._tenants.delete(/** @type {string} */ (this._tenants.keys().next().value))
  }

  /**
   * @param {string} plan
   * @param {import('./sql/rows').FeatureRow[]} rows
   * @param {Int} version  of the snapshot they were read in
   */
  loadPlan (plan, rows, version) {
    const map = new Map()
    for (const r of rows) map.set(r.feature, rowOf(r.enabled, r.config))
    this._plans.set(plan, { rows: map, loadedAt: big(version) })
  }

  /**
   * A feature_changed event: a plan's row or a tenant's override, null enabled: gone.
   * @param {Omit<import('./interfaces').FeatureChangedEvent, 'shard'>} e
   */
  applyFeature (e) {
    const v = big(e.version)
    this._names.add(e.feature)
    const row = e.enabled === null ? null : rowOf(e.enabled, e.config)
    const holder = e.tenant !== undefined ? this._tenants.get(e.tenant) : e.plan !== undefined ? this._plans.get(e.plan) : undefined
    if (holder === undefined || v <= holder.loadedAt) return
    const rows = 'overrides' in holder ? holder.overrides : holder.rows
    if (row === null) rows.delete(e.feature)
    else rows.set(e.feature, row)
  }

  /**
   * Before a plan_changed event is applied: the plan whose rows must be
   * loaded first for the tenant to be answered after it, or null.  Loaded
   * before the tenant moves, so that no answer in between finds the tenant
   * on a plan without rows (answer() would drop the tenant).
   * @param {string} tenant
   * @param {string | null} plan
   * @param {Int} version  the event's
   * @returns {string | null}
   */
  planToLoad (tenant, plan, version) {
    const t = this._tenants.get(tenant)
    if (t === undefined || big(version) <= t.loadedAt) return null
    return plan !== null && !this._plans.has(plan) ? plan : null
  }

  /**
   * A plan_changed event: the tenant is on plan now (null: unassigned, its overrides gone with it).
   * @param {string} tenant
   * @param {string | null} plan
   * @param {Int} version  the event's
   */
  applyPlan (tenant, plan, version) {
    const t = this._tenants.get(tenant)
    if (t === undefined || big(version) <= t.loadedAt) return
    t.plan = plan
    if (plan === null) t.overrides.clear()
  }

  /** Forget everything (the outbox no longer holds what was missed). */
  clear () {
    this._tenants.clear()
    this._plans.clear()
  }
}

module.exports = { FeatureCache }
