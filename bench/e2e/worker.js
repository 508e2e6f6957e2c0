'use strict'
// The queue design's worker: drains the Redis list in batches of up to
// 500 into PostgreSQL, one track_batch (one transaction) per batch, as the
// issue's reference stack does.  The HTTP answer was sent before this runs,
// so those acknowledgements are not durable.  On SIGTERM it finishes the
// list, then exits (bench/e2e/run counts the events after it).
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
    await db.query('SELECT flagmeter.track_batch($1::text[], $2::text[], $3::bigint[])',
      [events.map((e) => e.tenant), events.map(() => 'api_calls'), events.map((e) => e.amount ?? 1)])
  }
  await db.end()
  await redis.quit()
}

main().catch((err) => {
  console.error(err)
  process.exit(1)
})
