'use strict'
// The load generator of `make dashboard`: POSTs usage events and consumes
// to the app, a few tenants much busier than the others, so that the
// dashboard moves: bars fill, thresholds are crossed, tenants get blocked.
//
//   node load.js http://127.0.0.1:54370 [requests per second, default 40]
//
// LOAD_SECONDS bounds the run; SIGINT or SIGTERM stops it.  Prints a line
// of status counts every 5 seconds.
const http = require('node:http')

const base = process.argv[2]
const rate = Number(process.argv[3] ?? 40)
if (!base || !(rate > 0)) {
  console.error('usage: node load.js BASE_URL [requests per second]')
  process.exit(2)
}
const seconds = Number(process.env.LOAD_SECONDS ?? 0)
// share of the requests per tenant (acme and globex are the busy ones)
const TENANTS = [['acme', 30], ['globex', 20], ['initech', 10], ['umbrella', 8], ['hooli', 14], ['stark', 10], ['wayne', 5], ['wonka', 3]]
const TOTAL = TENANTS.reduce((s, [, w]) => s + w, 0)
const agent = new http.Agent({ keepAlive: true, maxSockets: 16 })
const counts = {}
let n = 0
let stopping = false
let inFlight = 0

function pick () {
  let r = Math.random() * TOTAL
  for (const [t, w] of TENANTS) if ((r -= w) < 0) return t
  return TENANTS[0][0]
}

function post (path, body) {
  inFlight++
  const data = JSON.stringify(body)
  const req = http.request(base + path, { method: 'POST', agent, headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(data) } }, (res) => {
    res.resume()
    res.on('end', () => { counts[`${path} ${res.statusCode}`] = (counts[`${path} ${res.statusCode}`] ?? 0) + 1; inFlight-- })
  })
  req.on('error', (err) => { counts[`${path} ${err.code}`] = (counts[`${path} ${err.code}`] ?? 0) + 1; inFlight-- })
  req.end(data)
}

function one () {
  const tenant = pick()
  n++
  // every request is an API call (consume, refused at the hard limit);
  // every third also records the tokens it used (track)
  post('/api/consume', { tenant, meter: 'api_calls', amount: 1 })
  if (n % 3 === 0) post('/api/events', { tenant, meter: 'tokens', amount: 50 + Math.floor(Math.random() * 400), id: `load-${process.pid}-${n}` })
}

const tick = setInterval(() => { for (let i = 0; i < rate / 10; i++) one() }, 100)
const report = setInterval(() => {
  console.log(`load: ${Object.entries(counts).sort().map(([k, v]) => `${k}: ${v}`).join(', ')}`)
}, 5000)
const stop = () => {
  if (stopping) return
  stopping = true
  clearInterval(tick)
  clearInterval(report)
  const wait = setInterval(() => {
    if (inFlight > 0) return
    clearInterval(wait)
    agent.destroy()
    console.log(`load: stopped; ${Object.entries(counts).sort().map(([k, v]) => `${k}: ${v}`).join(', ')}`)
  }, 50)
}
process.on('SIGINT', stop)
process.on('SIGTERM', stop)
if (seconds > 0) setTimeout(stop, seconds * 1000).unref()
