'use strict'
// The queue design's worker: pops up to 500 events at a time and records
// them with one track_batch (one transaction), ids as idempotency keys.
// On SIGTERM it finishes the list, then exits.  env: REDIS_URL, PG*.
const pg = require('pg')
const { createClient } = require('redis')

async function main () {
  const redis = createClient({ url: process.env.REDIS_URL })
  await redis.connect()
  const db = new pg.Client()
  await db.connect()
  let stopping = false
  process.on('SIGTERM', () => { stopping = true })
  for (;;) {
    const items = await redis.lPopCount('events', 500)
    if (!items || items.length === 0) {
      if (stopping) break
      await new Promise((resolve) => setTimeout(resolve, 2))
      continue
    }
    const events = items.map((s) => JSON.parse(s))
    await db.query('SELECT flagmeter.track_batch($1::text[], $2::text[], $3::bigint[], NULL, $4::text[])',
      [events.map((e) => e.tenant), events.map((e) => e.meter), events.map((e) => e.amount), events.map((e) => e.id)])
  }
  await db.end()
  await redis.quit()
}

main().catch((err) => { console.error(err); process.exit(1) })
