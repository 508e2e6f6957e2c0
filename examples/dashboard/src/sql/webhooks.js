'use strict'
// The webhooks table: add, list (with each cursor's state), remove.
const { types } = require('./types')

async function addWebhook (db, url, tenant) {
  const { rows } = await db.query({
    text: 'INSERT INTO dashboard.webhooks (url, tenant) VALUES ($1, $2) RETURNING id, url, tenant, since_version',
    values: [url, tenant ?? null],
    types
  })
  return rows[0]
}

const listText = `
SELECT w.id, w.url, w.tenant, w.since_version,
       COALESCE(json_agg(json_build_object(
           'tenant', c.tenant, 'delivered_through', c.delivered_through,
           'pending_through', c.pending_through, 'attempts', c.attempts,
           'next_attempt_at', c.next_attempt_at, 'last_error', c.last_error,
           'delivered', c.delivered) ORDER BY c.tenant) FILTER (WHERE c.tenant IS NOT NULL), '[]') AS cursors
FROM dashboard.webhooks w
LEFT JOIN dashboard.webhook_cursors c ON c.webhook_id = w.id
GROUP BY w.id
ORDER BY w.id`

async function listWebhooks (db) {
  return (await db.query({ text: listText, types })).rows
}

async function removeWebhook (db, id) {
  const { rowCount } = await db.query('DELETE FROM dashboard.webhooks WHERE id = $1', [id])
  return rowCount > 0
}

module.exports = { addWebhook, listWebhooks, removeWebhook }
