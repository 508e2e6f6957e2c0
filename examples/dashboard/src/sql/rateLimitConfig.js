'use strict'
// The rate limit in force for a tenant and meter, as consume applies it
// (the tenant's override, else its plan's): flagmeter.rate_limit_config.
// per in seconds (a float: an interval need not be whole seconds); null
// when no rate limit applies (dropped since the refusal).
const { types } = require('./types')

const text = `
SELECT c.rate, extract(epoch FROM c.per)::float8 AS per, c.burst
FROM flagmeter.rate_limit_config($1, $2) c`

/** @returns {Promise<{rate: number, per: number, burst: number | bigint} | null>} */
async function rateLimitConfig (db, tenant, meter) {
  const { rows } = await db.query({ text, values: [tenant, meter], types })
  return rows[0] ?? null
}

module.exports = { rateLimitConfig }
