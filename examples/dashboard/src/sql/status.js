'use strict'
// Every tenant with a plan and its limited meters: the quota bars.  One
// flagmeter.status read (exact: every committed event, folded or not),
// with each meter's aggregation and unit (a unique meter's used is its
// number of distinct values).
const { types } = require('./types')

const text = `
SELECT s.tenant, s.plan, s.meter, m.aggregation, m.unit, s.used, s.quota, s.remaining, s.ratio,
       s.state, s.mode, s.period, s.period_end AS resets_at
FROM flagmeter.status s
JOIN flagmeter.meters m ON m.meter = s.meter
ORDER BY s.tenant, s.meter`

async function status (db) {
  return (await db.query({ text, types })).rows
}

module.exports = { status }
