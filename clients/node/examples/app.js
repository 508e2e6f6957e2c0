'use strict'
// A complete small app on the flagmeter client (README, "Node.js client").
//
//   POST /api/events   {"tenant":"acme","meter":"api_calls","amount":1,"key":"evt-1"}
//                      -> 200 {"counted":true} once the event is durable
//   POST /api/requests {"tenant":"acme"}  -> 200, or 429 at the hard limit,
//                      with X-RateLimit-Limit / -Remaining / -Reset
//   GET  /api/usage?tenant=acme&meter=api_calls  -> the exact decision (check)
//
// A tenant the cache knows is blocked is refused without a database round
// trip; threshold and blocked events are logged (send them to Slack here).
// While the database is away (a restart, a failover) calls fail within the
// client's deadline and the app answers 503 with Retry-After: a caller that
// sends its event again with the same key is counted once (README, "Faults
// and retries").
//
// DATABASE_URL: the request path (may go through pgbouncer in transaction
// mode); LISTEN_URL: a direct session on the primary for notifications.
const http = require('node:http')
const { FlagMeter } = require('flagmeter')

const fm = new FlagMeter({
  connectionString: process.env.DATABASE_URL,
  listen: process.env.LISTEN_URL ?? process.env.DATABASE_URL
})
fm.on('threshold', (e) => console.log(`${e.tenant} reached ${e.threshold}% of ${e.meter} (${e.used}/${e.quota})`))
fm.on('blocked', (e) => console.log(`${e.tenant} is blocked on ${e.meter} until the period ends`))
// errors no call waits for (an idle connection the server ended, the LISTEN
// session, which reconnects by itself): heard here, they cannot end the process
fm.on('error', (err) => console.error(`flagmeter ${err.source}:`, err.message))

// JSON that can carry BigInt figures (usage past 2^53)
const json = (value) => JSON.stringify(value, (k, v) => (typeof v === 'bigint' ? v.toString() : v))

function readBody (req) {
  return new Promise((resolve, reject) => {
    let data = ''
    req.on('data', (chunk) => { data += chunk })
    req.on('end', () => { try { resolve(data ? JSON.parse(data) : {}) } catch (err) { reject(err) } })
    req.on('error', reject)
  })
}

async function route (req, url) {
  if (req.method === 'POST' && url.pathname === '/api/events') {
    const { tenant, meter, amount = 1, key } = await readBody(req)
    return [200, {}, await fm.track(tenant, meter, amount, { key })]
  }
  if (req.method === 'POST' && url.pathname === '/api/requests') {
    const { tenant } = await readBody(req)
    if (fm.isBlocked(tenant, 'api_calls')) return [429, {}, { error: 'quota exceeded' }]
    const d = await fm.consume(tenant, 'api_calls', 1)
    const headers = d.quota === null ? {} : {
      'X-RateLimit-Limit': String(d.quota),
      'X-RateLimit-Remaining': String(d.remaining),
      ...(d.resetsAt ? { 'X-RateLimit-Reset': String(Math.ceil(d.resetsAt.getTime() / 1000)) } : {})
    }
    return d.granted ? [200, headers, d] : [429, headers, { error: 'quota exceeded', ...d }]
  }
  if (req.method === 'GET' && url.pathname === '/api/usage') {
    return [200, {}, await fm.check(url.searchParams.get('tenant'), url.searchParams.get('meter'), 0)]
  }
  return [404, {}, { error: 'not found' }]
}

const server = http.createServer(async (req, res) => {
  let status, headers, body
  try {
    [status, headers, body] = await route(req, new URL(req.url, 'http://app'))
  } catch (err) {
    if (err.outcome === 'not_applied' || err.outcome === 'unknown') {
      // the database is away: try again soon (with the same key: counted once)
      ;[status, headers, body] = [503, { 'Retry-After': '1' }, { error: err.message, outcome: err.outcome }]
    } else {
      // SQLSTATEs of bad input (22xxx, 42704 unknown meter, QT002 event time
      // outside the accepted window) are the client's fault; QT001: the
      // tenant was never assigned a plan, so it may not use the API
      const bad = err instanceof TypeError || err instanceof RangeError || /^(22|42704|QT002)/.test(err.code ?? '')
      ;[status, headers, body] = [err.code === 'QT001' ? 403 : bad ? 400 : 500, {}, { error: err.message }]
    }
  }
  res.writeHead(status, { 'content-type': 'application/json', ...headers })
  res.end(json(body))
})

fm.ready().then(() => server.listen(Number(process.env.PORT ?? 3000), () => {
  console.log(`listening on ${server.address().port}`)
}))

// Graceful stop: stop taking requests, let the pending ones get durable, close.
process.on('SIGTERM', () => server.close(() => fm.close().then(() => process.exit(0))))
