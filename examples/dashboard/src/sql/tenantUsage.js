'use strict'
// GET /api/usage/:tenant: every meter, limited or not.  Limited meters come
// from flagmeter.status; the others have no quota and count in calendar
// months (README, "Concepts"), read with flagmeter.usage.  A unique
// meter's used is its number of distinct values.
const { types } = require('./types')

const text = `
SELECT m.meter, m.aggregation, m.unit, t.plan,
       COALESCE(s.used, flagmeter.used_by(flagmeter.usage($1, m.meter), m.aggregation)) AS used,
       s.quota, s.remaining, COALESCE(s.state, 'ok') AS state, s.mode, s.period,
       s.period_end AS resets_at
FROM flagmeter.meters m
LEFT JOIN flagmeter.tenants t ON t.tenant = $1
LEFT JOIN flagmeter.status s ON s.tenant = $1 AND s.meter = m.meter
ORDER BY m.meter`

async function tenantUsage (db, tenant) {
  return (await db.query({ text, values: [tenant], types })).rows
}

module.exports = { tenantUsage }
