'use strict'
// The outcome of one delivery attempt, on the cursor of its pair.  Both
// statements only apply while the cursor is still where the attempt found
// it (delivered_through = $3), so an attempt that was overtaken (another
// deliverer after a lost lock) changes nothing.

async function delivered (db, webhookId, tenant, from, version) {
  const { rowCount } = await db.query(
    `UPDATE dashboard.webhook_cursors
     SET delivered_through = $4, attempts = 0, next_attempt_at = now(), last_attempt_at = now(),
         last_error = NULL, delivered = delivered + 1
     WHERE webhook_id = $1 AND tenant = $2 AND delivered_through = $3`,
    [webhookId, tenant, from, version])
  return rowCount > 0
}

async function failed (db, webhookId, tenant, from, delayMs, error) {
  const { rowCount } = await db.query(
    `UPDATE dashboard.webhook_cursors
     SET attempts = attempts + 1, next_attempt_at = now() + $4 * interval '1 millisecond',
         last_attempt_at = now(), last_error = left($5, 500)
     WHERE webhook_id = $1 AND tenant = $2 AND delivered_through = $3`,
    [webhookId, tenant, from, delayMs, error])
  return rowCount > 0
}

/** The outbox no longer holds the pair's events: skip to what the scan saw. */
async function skipped (db, webhookId, tenant, from, through) {
  await db.query(
    `UPDATE dashboard.webhook_cursors SET delivered_through = $4, attempts = 0,
         last_error = 'events older than the outbox retention were skipped'
     WHERE webhook_id = $1 AND tenant = $2 AND delivered_through = $3`,
    [webhookId, tenant, from, through])
}

module.exports = { delivered, failed, skipped }
