'use strict'
// One step of the deliverer's scan, in one statement (one transaction):
// read the outbox after the scan position (at most `limit` events), make
// sure every (webhook, tenant) pair that has an alert among them has a
// cursor, raise each pair's pending_through to its last such event, and
// move the scan position.  Versions are drawn in commit order (README,
// "Versions and the outbox"), so nothing committed later can appear below
// the position: the scan never skips an event.
const { types } = require('./types')

const text = `
WITH pos AS (
	SELECT s.scanned_through FROM dashboard.webhook_scan s FOR UPDATE
), batch AS (
	SELECT o.version, o.kind, o.tenant
	FROM flagmeter.outbox o, pos
	WHERE o.version > pos.scanned_through
	ORDER BY o.version
	LIMIT $1
), pairs AS (
	SELECT w.id, b.tenant, max(b.version) AS last, GREATEST(min(p.scanned_through), min(w.since_version)) AS start
	FROM batch b
	CROSS JOIN pos p
	JOIN dashboard.webhooks w ON (w.tenant IS NULL OR w.tenant = b.tenant) AND b.version > w.since_version
	WHERE b.kind = ANY ($2::text[]) AND b.tenant IS NOT NULL
	GROUP BY w.id, b.tenant
), cursors AS (
	INSERT INTO dashboard.webhook_cursors AS c (webhook_id, tenant, delivered_through, pending_through)
	SELECT id, tenant, start, last FROM pairs
	ON CONFLICT (webhook_id, tenant) DO UPDATE
	SET pending_through = GREATEST(c.pending_through, EXCLUDED.pending_through)
	RETURNING 1
), moved AS (
	UPDATE dashboard.webhook_scan s SET scanned_through = b.last
	FROM (SELECT max(version) AS last FROM batch) b
	WHERE b.last IS NOT NULL
	RETURNING s.scanned_through
)
SELECT (SELECT count(*) FROM batch) AS events, (SELECT count(*) FROM cursors) AS pairs,
       (SELECT scanned_through FROM moved) AS scanned_through`

/** @returns {Promise<{events: number, pairs: number}>} */
async function scanOutbox (db, kinds, limit) {
  const { rows } = await db.query({ text, values: [limit, kinds], types })
  return rows[0]
}

module.exports = { scanOutbox }
