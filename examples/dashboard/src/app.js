'use strict'
// The app: one node:http server on the flagmeter client.
//
//   POST /api/events        {tenant, meter, amount, id}  200 | 409 duplicate | 400 {sqlstate}
//   POST /api/consume       {tenant, meter, amount, id}  200 | 429, X-RateLimit-* headers
//   GET  /api/usage/:tenant every meter: used, quota, remaining, state, resets_at
//   GET  /api/state         what the dashboard shows, read now
//   GET  /api/stream        server-sent events for the dashboard (?tenant=&meter= for its chart)
//   GET/POST /api/webhooks, DELETE /api/webhooks/:id
//   GET  /metrics           Prometheus
//   GET  /healthz           200 while the process runs (liveness: reads nothing)
//   GET  /readyz            200 when the database answers within 1 s, else 503 (readiness)
//   GET  /                  the dashboard (public/, uPlot from node_modules: works offline)
// While the database is away, what needs it answers 503 with Retry-After
// (the client's calls fail within their deadline: FLAGMETER_TIMEOUT_MS).
const fs = require('node:fs')
const http = require('node:http')
const path = require('node:path')
const { FlagMeter } = require('flagmeter')

const { send, readJson, HttpError } = require('./http')
const { performance } = require('node:perf_hooks')
const { createApi } = require('./api')
const { createMetrics } = require('./metrics')
const { LiveFeed } = require('./live')
const { WebhookDeliverer } = require('./webhooks')
const { applySchema } = require('./sql/schema')

const PUBLIC = path.join(__dirname, '..', 'public')
const UPLOT = path.dirname(require.resolve('uplot/dist/uPlot.iife.min.js'))

// Every file the page loads, by URL: nothing else is served from disk.
const STATIC = {
  '/': [path.join(PUBLIC, 'index.html'), 'text/html; charset=utf-8'],
  '/static/dashboard.js': [path.join(PUBLIC, 'dashboard.js'), 'text/javascript; charset=utf-8'],
  '/static/dashboard.css': [path.join(PUBLIC, 'dashboard.css'), 'text/css; charset=utf-8'],
  '/static/uPlot.iife.min.js': [path.join(UPLOT, 'uPlot.iife.min.js'), 'text/javascript; charset=utf-8'],
  '/static/uPlot.min.css': [path.join(UPLOT, 'uPlot.min.css'), 'text/css; charset=utf-8']
}

/**
 * @param {object} opts
 * @param {string} opts.databaseUrl  the request path and the LISTEN session (a direct connection)
 * @param {string} [opts.instance]   a name shown on the page and in /api/state
 * @param {number} [opts.poolSize]   the client's pool (20)
 * @param {number} [opts.maxInFlight]  the client's groups in flight per kind (its default, 4)
 * @param {number} [opts.maxGroup]   the client's largest group (its default, 500)
 * @param {number} [opts.timeoutMs]  the client's deadline per call (its default, 5000)
 * @param {object} [opts.webhooks]   WebhookDeliverer options (timeoutMs, retryMs, ...)
 * @param {object} [opts.live]       LiveFeed options (stateMs, seriesMs)
 * @param {(msg: string) => void} [opts.log]
 */
function createApp (opts) {
  const log = opts.log ?? ((msg) => console.error(msg))
  const fm = new FlagMeter({
    // jit off: the dashboard's read of the status view covers every tenant,
    // is estimated past jit_above_cost, and compiled longer than it ran
    // (10 000 tenants: 223 ms against 133-145 without JIT, 477 against 99
    // before the tables were analyzed); the app's other statements are small
    connection: { connectionString: opts.databaseUrl, options: '-c jit=off' },
    poolSize: opts.poolSize ?? 20,
    ...(opts.timeoutMs ? { timeoutMs: opts.timeoutMs } : {}),
    ...(opts.maxInFlight ? { maxInFlight: opts.maxInFlight } : {}),
    ...(opts.maxGroup ? { maxGroup: opts.maxGroup } : {})
  })
  // the client's pool and LISTEN session: an idle connection the server
  // ended, a LISTEN session lost (it reconnects by itself)
  fm.on('error', (err) => log(`flagmeter ${err.source}: ${err.message}`))
  const metrics = createMetrics(fm)
  for (const kind of ['threshold', 'blocked', 'unblocked', 'limit_changed', 'plan_changed']) {
    fm.on(kind, () => metrics.quotaEvents.inc({ kind }))
  }
  const deliverer = new WebhookDeliverer({
    connection: { connectionString: opts.databaseUrl },
    ...opts.webhooks,
    onAttempt: (result) => metrics.webhookAttempts.inc({ result }),
    onError: (err) => log(`webhooks: ${err.message}`)
  })
  for (const kind of ['threshold', 'blocked', 'unblocked']) fm.on(kind, () => deliverer.kick())
  const live = new LiveFeed({ fm, instance: opts.instance ?? `pid ${process.pid}`, ...opts.live, onError: (err) => log(`dashboard: ${err.message}`) })
  metrics.state.streamClients = () => live.clients
  const api = createApi({ fm, metrics, deliverer })

  async function route (req, url) {
    const p = url.pathname
    const m = req.method
    if (m === 'POST' && p === '/api/events') return api.postEvent(await readJson(req))
    if (m === 'POST' && p === '/api/consume') return api.postConsume(await readJson(req))
    if (m === 'GET' && p.startsWith('/api/usage/')) return api.getUsage(decodeURIComponent(p.slice('/api/usage/'.length)))
    if (m === 'GET' && p === '/api/state') return [200, await live.snapshot()]
    if (m === 'GET' && p === '/api/webhooks') return api.listWebhooks()
    if (m === 'POST' && p === '/api/webhooks') return api.postWebhook(await readJson(req))
    if (m === 'DELETE' && /^\/api\/webhooks\/\d+$/.test(p)) return api.removeWebhook(p.split('/').pop())
    throw new HttpError(404, 'not found')
  }

  function routeName (req, url) {
    const p = url.pathname
    if (p.startsWith('/api/usage/')) return '/api/usage/:tenant'
    if (p === '/healthz' || p === '/readyz') return p
    if (/^\/api\/webhooks\/\d+$/.test(p)) return '/api/webhooks/:id'
    if (STATIC[p] || p.startsWith('/api/') || p === '/metrics') return p
    return 'other'
  }

  const server = http.createServer((req, res) => {
    // the path without a URL object: this runs for every request
    const q = req.url.indexOf('?')
    const url = { pathname: q < 0 ? req.url : req.url.slice(0, q), search: q < 0 ? '' : req.url.slice(q) }
    const name = routeName(req, url)
    const started = performance.now()
    res.on('finish', () => metrics.observe(req.method, name, res.statusCode, (performance.now() - started) / 1000))
    if (req.method === 'GET' && STATIC[url.pathname]) {
      const [file, type] = STATIC[url.pathname]
      res.writeHead(200, { 'content-type': type, 'cache-control': 'no-cache' })
      fs.createReadStream(file).pipe(res)
      return
    }
    if (req.method === 'GET' && url.pathname === '/favicon.ico') {
      res.writeHead(204)
      res.end()
      return
    }
    if (req.method === 'GET' && url.pathname === '/healthz') {
      send(res, 200, { status: 'ok' })
      return
    }
    if (req.method === 'GET' && url.pathname === '/readyz') {
      fm.ping({ timeoutMs: 1000 }).then(() => send(res, 200, { ready: true }),
        (err) => send(res, 503, { ready: false, error: err.message }, { 'Retry-After': '1' }))
      return
    }
    if (req.method === 'GET' && url.pathname === '/api/stream') {
      const params = new URLSearchParams(url.search)
      live.attach(req, res, params.get('tenant'), params.get('meter'))
      return
    }
    if (req.method === 'GET' && url.pathname === '/metrics') {
      metrics.register.metrics().then((text) => {
        res.writeHead(200, { 'content-type': metrics.register.contentType })
        res.end(text)
      }, (err) => send(res, 500, { error: err.message }))
      return
    }
    route(req, url).then(([status, body, headers]) => {
      if (status === 204) { res.writeHead(204); res.end(); return }
      send(res, status, body, headers)
    }, (err) => {
      if (url.pathname === '/api/events') metrics.usageEvents.inc({ result: 'rejected' })
      if (url.pathname === '/api/consume') metrics.consumes.inc({ result: 'rejected' })
      if (err instanceof HttpError) return send(res, err.status, { error: err.message, ...err.extra })
      // arguments the client checks itself, and input the database refused
      if (err instanceof TypeError || err instanceof RangeError) return send(res, 400, { error: err.message })
      if (api.badInput(err)) return send(res, 400, { error: err.message, sqlstate: err.code })
      if (err.code === 'FLAGMETER_CLOSED') return send(res, 503, { error: 'shutting down' })
      if (api.unavailable(err)) {
        return send(res, 503, { error: `the database is unavailable: ${err.message}`, outcome: err.outcome ?? 'not_applied', code: err.code },
          { 'Retry-After': '1' })
      }
      log(`${req.method} ${url.pathname}: ${err.stack ?? err.message}`)
      send(res, 500, { error: 'internal error', sqlstate: err.code })
    })
  })
  server.keepAliveTimeout = 60000

  let closing = null
  return {
    server,
    fm,
    live,
    deliverer,
    metrics,
    /** Schema, first snapshot of the cache, the dashboard's event list; then listen. */
    async listen (port, host) {
      await applySchema(fm.pool)
      await fm.ready()
      await live.start()
      deliverer.start()
      await new Promise((resolve, reject) => {
        server.once('error', reject)
        server.listen(port, host, () => { server.off('error', reject); resolve() })
      })
      return server.address()
    },
    /**
     * Stop taking requests, end the dashboards' streams, let pending
     * events become durable, stop the deliverer, close the client.
     */
    close () {
      if (!closing) {
        closing = (async () => {
          const stopped = new Promise((resolve) => server.close(resolve))
          server.closeIdleConnections()
          await live.close()
          await stopped
          await deliverer.close()
          await fm.close()
        })()
      }
      return closing
    }
  }
}

module.exports = { createApp }
