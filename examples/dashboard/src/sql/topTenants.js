'use strict'
// The n tenants closest to (or past) their quota on each limited meter.
const { types } = require('./types')

const text = `
SELECT m.meter, t.tenant, t.used, t.quota, t.ratio, t.state
FROM (SELECT DISTINCT l.meter FROM flagmeter.effective_limits l) m
CROSS JOIN LATERAL flagmeter.top_tenants(m.meter, $1, by => 'ratio') t
ORDER BY m.meter, t.ratio DESC, t.tenant`

async function topTenants (db, n) {
  return (await db.query({ text, values: [n], types })).rows
}

module.exports = { topTenants }
