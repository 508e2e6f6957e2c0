'use strict'
// The rate peer of the reference app (bench/node/run rate, design
// app/redis): examples/dashboard as its server.js starts it, with the rate
// limit in Redis in front of POST /api/consume, where an app without
// flagmeter's rate limits checks it: a middleware that reads the body,
// asks Redis's GCRA (gcra.js) for the tenant's key, answers 429 with
// Retry-After when refused (without a round trip to PostgreSQL), and hands
// the request on to the app otherwise, whose consume then applies the
// quota (its tenants' plan has no rate limit).  Every other route is the
// app's, untouched.
//
// env: as examples/dashboard/server.js (DATABASE_URL, PORT, HOST), plus
// REDIS_URL, RATE_LIMIT (units a second) and RATE_BURST (default
// RATE_LIMIT).
const { Readable } = require('node:stream')
const { createApp } = require('../../examples/dashboard/src/app')
const { connectLimiter } = require('./gcra')

const rate = Number(process.env.RATE_LIMIT || 1000)
const burst = Number(process.env.RATE_BURST || rate)

/** The body as read (the app's own reading, on the replay, refuses one too long). */
function readBody (req) {
  return new Promise((resolve, reject) => {
    const chunks = []
    req.on('data', (c) => chunks.push(c))
    req.on('end', () => resolve(Buffer.concat(chunks)))
    req.on('error', reject)
  })
}

/** The request again, its body still to read: what the app's handler takes. */
function replay (req, body) {
  const r = Readable.from([body], { objectMode: false })
  r.method = req.method
  r.url = req.url
  r.headers = req.headers
  r.socket = req.socket
  return r
}

function tooMany (res, retryAfterMs) {
  const text = JSON.stringify({ error: 'rate limited', retry_after_ms: retryAfterMs })
  const headers = { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text) }
  if (retryAfterMs !== null) headers['Retry-After'] = String(Math.ceil(retryAfterMs / 1000))
  res.writeHead(429, headers)
  res.end(text)
}

async function main () {
  const databaseUrl = process.env.DATABASE_URL
  if (!databaseUrl) throw new Error('DATABASE_URL is required')
  const port = Number(process.env.PORT ?? 3000)
  const limiter = await connectLimiter(process.env.REDIS_URL)
  const app = createApp({ databaseUrl, instance: `port ${port}` })
  const [appHandler] = app.server.listeners('request')
  app.server.removeAllListeners('request')
  app.server.on('request', (req, res) => {
    if (req.method !== 'POST' || req.url !== '/api/consume') return appHandler(req, res)
    readBody(req).then(async (body) => {
      let tenant = null
      let meter = null
      try {
        const e = JSON.parse(body)
        tenant = e.tenant
        meter = e.meter
      } catch {}
      // what the app refuses as input it answers itself
      if (typeof tenant === 'string' && typeof meter === 'string') {
        const r = await limiter.limit(`rate:${tenant}:${meter}`, rate, 1, burst)
        if (!r.allowed) return tooMany(res, r.retryAfterMs)
      }
      appHandler(replay(req, body), res)
    }).catch((err) => {
      console.error(err)
      if (!res.headersSent) res.writeHead(500)
      res.end()
    })
  })
  let stopping = false
  const stop = () => {
    if (stopping) return
    stopping = true
    app.close().then(() => limiter.redis.quit()).then(() => process.exit(0), (err) => {
      console.error(err)
      process.exit(1)
    })
  }
  process.on('SIGINT', stop)
  process.on('SIGTERM', stop)
  await app.listen(port, process.env.HOST ?? '127.0.0.1')
  console.log(`dashboard with a Redis rate limit listening on ${port}`)
}

main().catch((err) => {
  console.error(err)
  process.exit(1)
})
