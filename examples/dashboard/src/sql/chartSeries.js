'use strict'
// The live chart of a tenant and meter, in one statement.  A meter that
// sums (or counts, or keeps a max or the latest amount): usage per minute
// over the last hour (usage_series with minute buckets counts the raw
// events, so it is exact up to now).  A unique meter: distinct values per
// UTC day over the last 30 days, today included (usage_series counts a
// unique meter's values in day, week or month buckets in UTC only, and
// only as far back as the retention keeps which values were seen on which
// day: a shorter retention gives fewer days).  A meter that does not exist
// takes the minute path, which refuses it (42704).
const { types } = require('./types')

const text = `
SELECT k.bucket, extract(epoch FROM s.bucket_start)::bigint AS t, s.used
FROM (SELECT CASE WHEN m.aggregation = 'unique' THEN 'day' ELSE 'minute' END AS bucket
      FROM (SELECT) one LEFT JOIN flagmeter.meters m ON m.meter = $2) k
CROSS JOIN LATERAL flagmeter.usage_series($1, $2,
    CASE k.bucket
        WHEN 'minute' THEN now() - interval '59 minutes'
        ELSE GREATEST(date_trunc('day', now(), 'UTC') - interval '29 days',
                      date_trunc('day', now() - (SELECT c.retention FROM flagmeter.current_settings c), 'UTC') + interval '1 day')
    END,
    now(), k.bucket, 'UTC') s
ORDER BY s.bucket_start`

/** @returns {Promise<{bucket: 'minute' | 'day', points: Array<[number, number | bigint]>}>} */
async function chartSeries (db, tenant, meter) {
  const { rows } = await db.query({ text, values: [tenant, meter], types })
  return { bucket: rows.length ? rows[0].bucket : 'minute', points: rows.map((r) => [r.t, r.used]) }
}

module.exports = { chartSeries }
