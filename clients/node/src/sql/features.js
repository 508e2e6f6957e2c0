'use strict'
// The rows the feature cache holds (src/features.js), read on the event
// stream's connection: a tenant on first use, with its plan's rows, in one
// snapshot with its version; a plan's rows when a cached tenant moves to a
// plan not cached, in one statement (one snapshot) with its version.  The
// listener layout can read them (README, "Roles").  And the answer of the
// database itself, on the request path, when the cache cannot give one.
const { types, parseJson } = require('../numbers')
const { inSnapshot } = require('./snapshot')

const rowsText = 'SELECT feature, enabled, config::text AS config FROM flagmeter.'

/** @typedef {import('./rows').FeatureRow} FeatureRow */

/**
 * Rows with their config as text, config parsed.
 * @param {Array<{ feature: string, enabled: boolean, config: string | null }>} rows
 * @returns {FeatureRow[]}
 */
function rowsOf (rows) {
  return rows.map((r) => ({ feature: r.feature, enabled: r.enabled, config: r.config === null ? null : parseJson(r.config) }))
}

/**
 * { version, plan, overrides, planRows?, names }; planRows unless hasPlan(plan).
 * @param {import('pg').ClientBase} db
 * @param {string} tenant
 * @param {(plan: string) => boolean} hasPlan
 * @returns {Promise<import('./rows').TenantFeatures>}
 */
async function tenantFeatures (db, tenant, hasPlan) {
  return inSnapshot(db, async (tx) => {
    const head = await tx.query({
      text: 'SELECT flagmeter.latest_version() AS version,' +
        ' (SELECT t.plan FROM flagmeter.tenants t WHERE t.tenant = $1) AS plan',
      values: [tenant],
      types
    })
    const { version, plan } = head.rows[0]
    const overrides = await tx.query({ text: rowsText + 'feature_overrides WHERE tenant = $1', values: [tenant], types })
    const names = await tx.query({ text: 'SELECT feature FROM flagmeter.features', types })
    /** @type {import('./rows').TenantFeatures} */
    const state = { version, plan, overrides: rowsOf(overrides.rows), names: names.rows.map((r) => r.feature) }
    if (plan !== null && !hasPlan(plan)) {
      const rows = await tx.query({ text: rowsText + 'plan_features WHERE plan = $1', values: [plan], types })
      state.planRows = rowsOf(rows.rows)
    }
    return state
  })
}

const planText = 'SELECT flagmeter.latest_version() AS version,' +
  ' (SELECT COALESCE(pg_catalog.json_agg(json_build_object(\'feature\', f.feature, \'enabled\', f.enabled,' +
  ' \'config\', f.config::text)), \'[]\')::text FROM flagmeter.plan_features f WHERE f.plan = $1) AS rows'

/**
 * { version, rows } of a plan, from one snapshot.
 * @param {import('pg').ClientBase} db
 * @param {string} plan
 * @returns {Promise<{ version: import('../interfaces').Int, rows: FeatureRow[] }>}
 */
async function planFeatures (db, plan) {
  const { rows } = await db.query({ text: planText, values: [plan], types })
  return { version: rows[0].version, rows: rowsOf(JSON.parse(rows[0].rows)) }
}

const answerText = 'SELECT flagmeter.has_feature($1, $2) AS enabled, flagmeter.feature_config($1, $2)::text AS config'

/**
 * The database's answer (raises for an unknown feature, as SQL does).
 * @param {import('pg').ClientBase} db
 * @param {string} tenant
 * @param {string} feature
 * @returns {Promise<{ enabled: boolean, config: import('../interfaces').FeatureConfig }>}
 */
async function featureAnswer (db, tenant, feature) {
  const { rows } = await db.query({ text: answerText, values: [tenant, feature], types })
  return { enabled: rows[0].enabled, config: rows[0].config === null ? null : parseJson(rows[0].config) }
}

module.exports = { tenantFeatures, planFeatures, featureAnswer }
