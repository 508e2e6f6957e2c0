'use strict'
// The flagmeter reference app (examples/dashboard, README "The dashboard app").
//
//   DATABASE_URL=postgres://app@db/app PORT=3000 node examples/dashboard/server.js
//
// DATABASE_URL must reach the primary directly (it is also the LISTEN
// session) and the database must have the extension; the app creates its
// own schema, `dashboard`, for webhooks.  HOST (default 127.0.0.1) is the
// address to listen on.  WEBHOOK_TIMEOUT_MS, WEBHOOK_RETRY_MS and
// WEBHOOK_RETRY_MAX_MS tune deliveries; POOL_SIZE, FLAGMETER_TIMEOUT_MS (a
// call's deadline), FLAGMETER_MAX_IN_FLIGHT and FLAGMETER_MAX_GROUP the client (see README, Node.js client, Options).  SIGINT or SIGTERM: stop taking
// requests, finish the pending ones, exit.
const { createApp } = require('./src/app')

function num (name) {
  const v = process.env[name]
  if (v === undefined || v === '') return undefined
  const n = Number(v)
  if (!Number.isFinite(n) || n < 0) throw new Error(`${name} must be a number of milliseconds: ${v}`)
  return n
}

async function main () {
  const databaseUrl = process.env.DATABASE_URL
  if (!databaseUrl) throw new Error('DATABASE_URL is required (a database with CREATE EXTENSION flagmeter)')
  const port = Number(process.env.PORT ?? 3000)
  const app = createApp({
    databaseUrl,
    instance: process.env.INSTANCE_NAME || `port ${port}`,
    poolSize: num('POOL_SIZE'),
    timeoutMs: num('FLAGMETER_TIMEOUT_MS'),
    maxInFlight: num('FLAGMETER_MAX_IN_FLIGHT'),
    maxGroup: num('FLAGMETER_MAX_GROUP'),
    webhooks: { timeoutMs: num('WEBHOOK_TIMEOUT_MS'), retryMs: num('WEBHOOK_RETRY_MS'), retryMaxMs: num('WEBHOOK_RETRY_MAX_MS') },
    live: { stateMs: num('DASHBOARD_STATE_MS'), seriesMs: num('DASHBOARD_SERIES_MS') }
  })
  let stopping = false
  const stop = (sig) => {
    if (stopping) return
    stopping = true
    console.error(`${sig}: stopping`)
    app.close().then(() => process.exit(0), (err) => { console.error(err); process.exit(1) })
  }
  process.on('SIGINT', () => stop('SIGINT'))
  process.on('SIGTERM', () => stop('SIGTERM'))
  const addr = await app.listen(port, process.env.HOST ?? '127.0.0.1')
  console.log(`flagmeter dashboard listening on http://${addr.address}:${addr.port}/`)
}

main().catch((err) => {
  console.error(err)
  process.exit(1)
})
