'use strict'
// GET /metrics: Prometheus text format (prom-client), one registry per app
// instance.  The client's own figures (calls and groups per kind) are read
// from fm.stats() at scrape time.  Refused consumes are counted by reason;
// the rate-limited ones also per tenant, for the dashboard, not as a label
// (one series per tenant would grow with the tenants).
const client = require('prom-client')

function createMetrics (fm) {
  const register = new client.Registry()
  client.collectDefaultMetrics({ register })
  const requests = new client.Counter({
    name: 'http_requests_total', help: 'HTTP requests answered, by route and status', labelNames: ['method', 'route', 'status'], registers: [register]
  })
  const latency = new client.Histogram({
    name: 'http_request_duration_seconds', help: 'time from request to answer, by route', labelNames: ['method', 'route'],
    buckets: [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5], registers: [register]
  })
  const usageEvents = new client.Counter({
    name: 'dashboard_usage_events_total', help: 'POST /api/events outcomes: counted, duplicate, rejected (bad input); of values: new_value (new in its period), known_value (counted already)', labelNames: ['result'], registers: [register]
  })
  const consumes = new client.Counter({
    name: 'dashboard_consumes_total', help: 'POST /api/consume outcomes: granted, refused, rejected', labelNames: ['result'], registers: [register]
  })
  const refusals = new client.Counter({
    name: 'dashboard_consume_refusals_total', help: 'POST /api/consume refusals, by the decision\'s reason: quota_exceeded, rate_limited, ...', labelNames: ['reason'], registers: [register]
  })
  // the two reasons this app's consumes are refused for, at 0 from the
  // start: a series that appears only at its first refusal hides that first
  // refusal from rate() and increase()
  for (const reason of ['quota_exceeded', 'rate_limited']) refusals.inc({ reason }, 0)
  const rateLimitedTenants = new Map() // tenant -> count
  /** A consume refused for reason: counted, and per tenant when for its rate. */
  function refused (tenant, reason) {
    refusals.inc({ reason })
    if (reason === 'rate_limited') rateLimitedTenants.set(tenant, (rateLimitedTenants.get(tenant) ?? 0) + 1)
  }
  /** The tenants refused for their rate by this instance since it started, most first. */
  function rateLimited () {
    return [...rateLimitedTenants].map(([tenant, count]) => ({ tenant, count }))
      .sort((a, b) => b.count - a.count || (a.tenant < b.tenant ? -1 : 1))
  }
  const quotaEvents = new client.Counter({
    name: 'dashboard_quota_events_total', help: 'quota events this instance received from the client, by kind', labelNames: ['kind'], registers: [register]
  })
  const webhookAttempts = new client.Counter({
    name: 'dashboard_webhook_attempts_total', help: 'webhook deliveries attempted by this instance: delivered, failed', labelNames: ['result'], registers: [register]
  })
  new client.Gauge({ // eslint-disable-line no-new
    name: 'dashboard_stream_clients', help: 'dashboards connected to this instance (server-sent events)', registers: [register],
    collect () { this.set(metricsState.streamClients()) }
  })
  // labelled children, looked up once per (method, route[, status]): the
  // request path calls observe for every request
  const children = new Map()
  function observe (method, route, status, seconds) {
    const k = method + ' ' + route + ' ' + status
    let c = children.get(k)
    if (!c) children.set(k, (c = [latency.labels(method, route), requests.labels(method, route, String(status))]))
    c[0].observe(seconds)
    c[1].inc()
  }
  const seen = { track: { calls: 0, groups: 0 }, consume: { calls: 0, groups: 0 } }
  for (const [name, field, help] of [
    ['flagmeter_client_calls_total', 'calls', 'calls made through the flagmeter client, by kind'],
    ['flagmeter_client_batches_total', 'groups', 'batches (server calls, one transaction each) the client sent, by kind']
  ]) {
    new client.Counter({ // eslint-disable-line no-new
      name, help, labelNames: ['kind'], registers: [register],
      collect () {
        const now = fm.stats()
        for (const kind of ['track', 'consume']) {
          const delta = now[kind][field] - seen[kind][field]
          if (delta > 0) this.inc({ kind }, delta)
          seen[kind][field] = now[kind][field]
        }
      }
    })
  }
  const metricsState = { streamClients: () => 0 }
  return { register, observe, usageEvents, consumes, refused, rateLimited, quotaEvents, webhookAttempts, state: metricsState }
}

module.exports = { createMetrics }
