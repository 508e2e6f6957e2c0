'use strict'
// Every tenant with a plan and its limited meters: the quota bars.  One
// flagmeter.status read (exact: every committed event, folded or not).
const { types } = require('./types')

const text = `
SELECT s.tenant, s.plan, s.meter, s.used, s.quota, s.remaining, s.ratio, s.state, s.mode,
       s.period, s.period_end AS resets_at
FROM flagmeter.status s
ORDER BY s.tenant, s.meter`

async function status (db) {
  return (await db.query({ text, types })).rows
}

module.exports = { status }
