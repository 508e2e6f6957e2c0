'use strict'
// The cursors whose next event is due, with that event: only the head of
// each (webhook, tenant) pair, so a pair's events go out one at a time, in
// version order.  Pairs already being delivered are skipped ($2).  When
// the outbox no longer holds the pair's next event (older than flagmeter's
// retention), event is NULL.
const { types } = require('./types')

const text = `
SELECT c.webhook_id, c.tenant, c.delivered_through, c.pending_through, c.attempts, w.url,
       (SELECT row_to_json(e) FROM (
            SELECT o.version, o.created_at, o.kind, o.tenant, o.meter, o.period_start,
                   o.threshold, o.used, o.quota
            FROM flagmeter.outbox o
            WHERE o.tenant = c.tenant AND o.version > c.delivered_through
              AND o.version <= c.pending_through AND o.kind = ANY ($3::text[])
            ORDER BY o.version
            LIMIT 1) e) AS event
FROM dashboard.webhook_cursors c
JOIN dashboard.webhooks w ON w.id = c.webhook_id
WHERE c.delivered_through < c.pending_through AND c.next_attempt_at <= now()
  AND NOT (c.webhook_id::text || '/' || c.tenant = ANY ($2::text[]))
ORDER BY c.next_attempt_at, c.webhook_id, c.tenant
LIMIT $1`

async function dueDeliveries (db, limit, busy, kinds) {
  return (await db.query({ text, values: [limit, busy, kinds], types })).rows
}

/** Milliseconds until the next retry is due, 0 when overdue (null: nothing pending). */
async function nextDueIn (db) {
  // min() of no rows is NULL, which GREATEST would turn into 0 (due now)
  const { rows } = await db.query({
    text: `SELECT (extract(epoch FROM min(next_attempt_at) - now()) * 1000)::float8 AS ms
           FROM dashboard.webhook_cursors WHERE delivered_through < pending_through`,
    types
  })
  return rows[0].ms === null ? null : Math.max(0, rows[0].ms)
}

module.exports = { dueDeliveries, nextDueIn }
