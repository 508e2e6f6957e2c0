'use strict'
// The minimal ingest app of the end-to-end benchmark (bench/node/run e2e):
// plain node:http, a pg pool of 20, one endpoint per design (the run starts
// one design per process).  A request is a POST whose JSON body names the
// tenant (and for /events the amount); the answer says when it was sent.
//
//   per-request   POST /events   one flagmeter.track per request; 200 once committed
//   client        POST /events   fm.track (grouped by the client); 200 once committed
//   consume-per-request  POST /consume  one flagmeter.consume per request; 200 or 429
//   consume-client       POST /consume  fm.consume (grouped); 200 or 429
//   gcra-consume-client  POST /consume  the rate peer (bench/node/run rate):
//                        the tenant's rate limit in Redis (gcra.js), then
//                        fm.consume of the quota; 200, or 429 for the rate
//                        (without a round trip to PostgreSQL) or the quota
//
// consume-client on tenants whose plan has a rate limit is the flagmeter
// side of the rate designs: the rate and the quota in one consume.
// The queue design is the bench's one queue peer, queue_server.js and
// queue_worker.js.  env: DESIGN, PORT, PGHOST, PGPORT, PGUSER, PGDATABASE;
// for gcra-consume-client REDIS_URL, RATE_LIMIT (units a second) and
// RATE_BURST (default RATE_LIMIT).
const http = require('node:http')
const pg = require('pg')
const { FlagMeter } = require('flagmeter')
const { connectLimiter } = require('./gcra')

const design = process.env.DESIGN
const pool = new pg.Pool({ max: 20 })
let fm = null
let limiter = null
const rate = Number(process.env.RATE_LIMIT || 1000)
const burst = Number(process.env.RATE_BURST || rate)

function body (req) {
  return new Promise((resolve, reject) => {
    let data = ''
    req.setEncoding('utf8')
    req.on('data', (chunk) => { data += chunk })
    req.on('end', () => {
      try { resolve(JSON.parse(data)) } catch (err) { reject(err) }
    })
    req.on('error', reject)
  })
}

const handlers = {
  'per-request': async (e) => {
    await pool.query('SELECT flagmeter.track($1, $2, $3)', [e.tenant, 'api_calls', e.amount ?? 1])
    return 200
  },
  client: async (e) => {
    await fm.track(e.tenant, 'api_calls', e.amount ?? 1)
    return 200
  },
  'consume-per-request': async (e) => {
    const { rows } = await pool.query('SELECT granted FROM flagmeter.consume($1, $2, 1)', [e.tenant, 'api_calls'])
    return rows[0].granted ? 200 : 429
  },
  'consume-client': async (e) => {
    const d = await fm.consume(e.tenant, 'api_calls', 1)
    return d.granted ? 200 : 429
  },
  'gcra-consume-client': async (e) => {
    const r = await limiter.limit(`rate:${e.tenant}:api_calls`, rate, 1, burst)
    if (!r.allowed) return 429
    const d = await fm.consume(e.tenant, 'api_calls', 1)
    return d.granted ? 200 : 429
  }
}

async function main () {
  const handle = handlers[design]
  if (!handle) throw new Error(`unknown DESIGN ${design}`)
  if (design.includes('client')) {
    const knobs = {}
    if (process.env.FM_MAX_IN_FLIGHT) knobs.maxInFlight = Number(process.env.FM_MAX_IN_FLIGHT)
    if (process.env.FM_MAX_GROUP) knobs.maxGroup = Number(process.env.FM_MAX_GROUP)
    fm = new FlagMeter({ pool, ...knobs })
  }
  if (design.startsWith('gcra-')) limiter = await connectLimiter(process.env.REDIS_URL)
  const server = http.createServer(async (req, res) => {
    let status = 500
    try {
      status = await handle(await body(req))
    } catch (err) {
      status = 500
    }
    res.writeHead(status, { 'content-type': 'text/plain' })
    res.end(String(status))
  })
  server.keepAliveTimeout = 60000
  server.listen(Number(process.env.PORT), '127.0.0.1', () => process.send && process.send('listening'))
  process.on('SIGTERM', () => {
    server.close()
    server.closeAllConnections()
    Promise.resolve(fm && fm.close()).then(() => (fm ? null : pool.end()))
      .then(() => limiter && limiter.redis.quit())
      .finally(() => process.exit(0))
  })
}

main().catch((err) => {
  console.error(err)
  process.exit(1)
})
