'use strict'
// The live chart: usage per minute over the last hour (usage_series with
// minute buckets counts the raw events, so it is exact up to now).
const { types } = require('./types')

const text = `
SELECT extract(epoch FROM s.bucket_start)::bigint AS t, s.used
FROM flagmeter.usage_series($1, $2, now() - interval '59 minutes', now(), 'minute') s`

async function minuteSeries (db, tenant, meter) {
  return (await db.query({ text, values: [tenant, meter], types })).rows
}

module.exports = { minuteSeries }
