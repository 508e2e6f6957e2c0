'use strict'
// The Redis-queue peer's worker: pops up to 500 events at a time and
// records them with one track_batch (one transaction), as the reference
// stack does; the ids as idempotency keys when the events carry any.  The
// HTTP answer was sent before this runs, so those acknowledgements are not
// durable.  On SIGTERM it finishes the list, then exits (bench/node/run
// counts the events after it).  env: REDIS_URL, PG*.
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
    const ids = events.map((e) => e.id)
    await db.query('SELECT flagmeter.track_batch($1::text[], $2::text[], $3::bigint[], NULL, $4::text[])',
      [events.map((e) => e.tenant), events.map((e) => e.meter), events.map((e) => e.amount),
        ids.some((id) => id !== null) ? ids : null])
  }
  await db.end()
  await redis.quit()
}

main().catch((err) => { console.error(err); process.exit(1) })
