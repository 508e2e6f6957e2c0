'use strict'
// The app: one node:http server on the flagmeter client.
//
//   POST /api/events        {tenant, meter, amount, id}  200 | 409 duplicate | 400 {sqlstate}
//                           {tenant, meter, value}       200 {new} (a unique meter)
//   POST /api/consume       {tenant, meter, amount, id}  200 | 429, X-RateLimit-* headers
//                           (a 429 for the rate: Retry-After, RateLimit-Policy, RateLimit)
//                           {tenant, meter, value}       the same answers (a unique meter)
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
const { performance } = require('node:perf_hooks')
const { FlagMeter, DEFAULTS } = require('flagmeter')

const { send, readJson, HttpError } = require('./http')
const { createApi } = require('./api')
const { createValueCalls } = require('./values')
const { createMetrics } = require('./metrics')
const { LiveFeed } = require('./live')
const { RatePolicies } = require('./rateLimits')
const { WebhookDeliverer } = require('./webhooks')
const { SHOWN_KINDS, ALERT_KINDS } = require('./kinds')
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

const USAGE = '/api/usage/'
const WEBHOOK = /^\/api\/webhooks\/\d+$/

/**
 * The routes, tried in order: a method, a path (a string, or a test of the
 * path), a name for the metrics when it is not the path itself, and either
 * `answer(req, res, url)`, which writes the response itself (files, probes,
 * the stream, metrics), or `api(req, url)`, which resolves with [status,
 * body, headers] and shares the error answers of answerError().  What no
 * route takes is a 404.
 */
function routeTable ({ fm, api, live, metrics }) {
  return [
    ...Object.entries(STATIC).map(([p, [file, type]]) => ({ method: 'GET', path: p, answer: (req, res) => sendFile(res, file, type) })),
    // not a page of the app: counted with the paths it does not know
    { method: 'GET', path: '/favicon.ico', name: 'other', answer: (req, res) => noContent(res) },
    { method: 'GET', path: '/healthz', answer: (req, res) => send(res, 200, { status: 'ok' }) },
    { method: 'GET', path: '/readyz', answer: (req, res) => readiness(fm, res) },
    { method: 'GET', path: '/api/stream', answer: (req, res, url) => stream(live, req, res, url) },
    { method: 'GET', path: '/metrics', answer: (req, res) => scrape(metrics, res) },
    { method: 'POST', path: '/api/events', api: async (req) => api.postEvent(await readJson(req)) },
    { method: 'POST', path: '/api/consume', api: async (req) => api.postConsume(await readJson(req)) },
    {
      method: 'GET',
      path: (p) => p.startsWith(USAGE),
      name: '/api/usage/:tenant',
      api: async (req, url) => api.getUsage(decodeURIComponent(url.pathname.slice(USAGE.length)))
    },
    { method: 'GET', path: '/api/state', api: async () => [200, await live.snapshot()] },
    { method: 'GET', path: '/api/webhooks', api: async () => api.listWebhooks() },
    { method: 'POST', path: '/api/webhooks', api: async (req) => api.postWebhook(await readJson(req)) },
    {
      method: 'DELETE',
      path: (p) => WEBHOOK.test(p),
      name: '/api/webhooks/:id',
      api: async (req, url) => api.removeWebhook(url.pathname.split('/').pop())
    }
  ]
}

function pathMatches (route, pathname) {
  return typeof route.path === 'string' ? route.path === pathname : route.path(pathname)
}

/** The route label of the request metrics: a route's, else the path under /api/, else 'other'. */
function routeName (routes, pathname) {
  const route = routes.find((r) => pathMatches(r, pathname))
  if (route) return route.name ?? pathname
  return pathname.startsWith('/api/') ? pathname : 'other'
}

function sendFile (res, file, type) {
  res.writeHead(200, { 'content-type': type, 'cache-control': 'no-cache' })
  fs.createReadStream(file).pipe(res)
}

function noContent (res) {
  res.writeHead(204)
  res.end()
}

/** 200 when the database answers within 1 s, else 503 with Retry-After. */
function readiness (fm, res) {
  fm.ping({ timeoutMs: 1000 }).then(() => send(res, 200, { ready: true }),
    (err) => send(res, 503, { ready: false, error: err.message }, { 'Retry-After': '1' }))
}

/** Server-sent events for one dashboard (?tenant=&meter= for its chart). */
function stream (live, req, res, url) {
  const params = new URLSearchParams(url.search)
  live.attach(req, res, params.get('tenant'), params.get('meter'))
}

function scrape (metrics, res) {
  metrics.register.metrics().then((text) => {
    res.writeHead(200, { 'content-type': metrics.register.contentType })
    res.end(text)
  }, (err) => send(res, 500, { error: err.message }))
}

/** An API handler's [status, body, headers] as the response. */
function answerApi (res, [status, body, headers]) {
  if (status === 204) return noContent(res)
  send(res, status, body, headers)
}

/**
 * What an API request that failed answers: 400 for input the app, the
 * client or the database refused, 503 (with Retry-After while the database
 * is away) for a client closing or a database away, else 500, logged.
 */
function answerError ({ api, metrics, log }, req, res, url, err) {
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
}

/** The request's path and query, without a URL object: this runs for every request. */
function splitUrl (reqUrl) {
  const q = reqUrl.indexOf('?')
  return { pathname: q < 0 ? reqUrl : reqUrl.slice(0, q), search: q < 0 ? '' : reqUrl.slice(q) }
}

/** The request handler of the server: measured, then routed. */
function handler (deps) {
  const routes = routeTable(deps)
  return (req, res) => {
    const url = splitUrl(req.url)
    const name = routeName(routes, url.pathname)
    const started = performance.now()
    res.on('finish', () => deps.metrics.observe(req.method, name, res.statusCode, (performance.now() - started) / 1000))
    const route = routes.find((r) => r.method === req.method && pathMatches(r, url.pathname))
    if (route?.answer) return route.answer(req, res, url)
    const answer = route ? route.api(req, url) : Promise.reject(new HttpError(404, 'not found'))
    answer.then((result) => answerApi(res, result), (err) => answerError(deps, req, res, url, err))
  }
}

/** The client on the app's database, with the app's options (else the client's DEFAULTS). */
function createClient (opts) {
  return new FlagMeter({
    // jit off: the dashboard's read of the status view covers every tenant,
    // is estimated past jit_above_cost, and compiled longer than it ran
    // (10 000 tenants: 223 ms against 133-145 without JIT, 477 against 99
    // before the tables were analyzed); the app's other statements are small
    connection: { connectionString: opts.databaseUrl, options: '-c jit=off' },
    poolSize: opts.poolSize ?? DEFAULTS.poolSize,
    ...(opts.timeoutMs ? { timeoutMs: opts.timeoutMs } : {}),
    ...(opts.maxInFlight ? { maxInFlight: opts.maxInFlight } : {}),
    ...(opts.maxGroup ? { maxGroup: opts.maxGroup } : {})
  })
}

/**
 * @param {object} opts
 * @param {string} opts.databaseUrl  the request path and the LISTEN session (a direct connection)
 * @param {string} [opts.instance]   a name shown on the page and in /api/state
 * @param {number} [opts.poolSize]   the client's pool (default: the client's DEFAULTS.poolSize)
 * @param {number} [opts.maxInFlight]  the client's groups in flight per kind (default: DEFAULTS.maxInFlight)
 * @param {number} [opts.maxGroup]   the client's largest group (default: DEFAULTS.maxGroup)
 * @param {number} [opts.timeoutMs]  the client's deadline per call (default: DEFAULTS.timeoutMs)
 * @param {object} [opts.webhooks]   WebhookDeliverer options (timeoutMs, retryMs, ...)
 * @param {object} [opts.live]       LiveFeed options (stateMs, seriesMs)
 * @param {(msg: string) => void} [opts.log]
 */
function createApp (opts) {
  const log = opts.log ?? ((msg) => console.error(msg))
  const fm = createClient(opts)
  // the client's pool and LISTEN session: an idle connection the server
  // ended, a LISTEN session lost (it reconnects by itself)
  fm.on('error', (err) => log(`flagmeter ${err.source}: ${err.message}`))
  const metrics = createMetrics(fm)
  for (const kind of SHOWN_KINDS) fm.on(kind, () => metrics.quotaEvents.inc({ kind }))
  const deliverer = new WebhookDeliverer({
    connection: { connectionString: opts.databaseUrl },
    ...opts.webhooks,
    onAttempt: (result) => metrics.webhookAttempts.inc({ result }),
    onError: (err) => log(`webhooks: ${err.message}`)
  })
  for (const kind of ALERT_KINDS) fm.on(kind, () => deliverer.kick())
  const live = new LiveFeed({
    fm, instance: opts.instance ?? `pid ${process.pid}`, ...opts.live,
    rateLimited: () => metrics.rateLimited(), onError: (err) => log(`dashboard: ${err.message}`)
  })
  metrics.state.streamClients = () => live.clients
  const api = createApi({ fm, values: createValueCalls(fm), metrics, deliverer, ratePolicies: new RatePolicies(fm) })
  const server = http.createServer(handler({ fm, api, live, metrics, log }))
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
