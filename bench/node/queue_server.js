'use strict'
// The Redis-queue peer's request path, as the published stack has it:
// node:http, POST {tenant, meter, amount, id} (any path): validated,
// RPUSHed to a Redis list, answered 202 at once (before anything is in
// PostgreSQL).  queue_worker.js drains the list.  Both modes of
// bench/node/run measure against it.  env: PORT, REDIS_URL.
const http = require('node:http')
const { createClient } = require('redis')

async function main () {
  const redis = createClient({ url: process.env.REDIS_URL })
  await redis.connect()
  const server = http.createServer((req, res) => {
    let data = ''
    req.setEncoding('utf8')
    req.on('data', (d) => { data += d })
    req.on('end', async () => {
      let status = 202
      try {
        const e = JSON.parse(data)
        if (typeof e.tenant !== 'string' || typeof e.meter !== 'string' || !Number.isSafeInteger(e.amount ?? 1)) status = 400
        else await redis.rPush('events', JSON.stringify({ tenant: e.tenant, meter: e.meter, amount: e.amount ?? 1, id: e.id ?? null }))
      } catch (err) {
        status = err instanceof SyntaxError ? 400 : 500
      }
      res.writeHead(status, { 'content-type': 'application/json' })
      res.end(status === 202 ? '{"queued":true}' : '{"error":true}')
    })
  })
  server.keepAliveTimeout = 60000
  server.listen(Number(process.env.PORT), '127.0.0.1', () => console.log('listening on', process.env.PORT))
  process.on('SIGTERM', () => {
    server.close()
    server.closeAllConnections()
    redis.quit().finally(() => process.exit(0))
  })
}

main().catch((err) => { console.error(err); process.exit(1) })
