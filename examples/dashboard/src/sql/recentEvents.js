'use strict'
// The latest quota events, newest first, to fill the dashboard's list when
// an instance starts; after that it is fed by the client's events.
const { types } = require('./types')

const text = `
SELECT o.version, o.created_at, o.kind, o.tenant, o.meter, o.plan, o.threshold, o.used, o.quota
FROM flagmeter.outbox o
ORDER BY o.version DESC
LIMIT $1`

async function recentEvents (db, n) {
  return (await db.query({ text, values: [n], types })).rows
}

module.exports = { recentEvents }
