'use strict'
// The JSON API: usage events, consume with rate-limit headers, a tenant's
// usage, webhooks.  Answers say what happened in PostgreSQL: 200 once the
// event is committed (durable), 409 for a key recorded before, 429 when a
// consume is refused (for its quota, or for its rate: src/rateLimits.js),
// 400 with the SQLSTATE when the database refuses the input (a tenant never
// assigned a plan among it: QT001).  An event or consume of a unique meter
// carries a value instead of an amount (src/values.js).
const { checkAmount } = require('flagmeter')
const { HttpError } = require('./http')
const { rateLimitedHeaders } = require('./rateLimits')
const { tenantUsage } = require('./sql/tenantUsage')
const { addWebhook, listWebhooks, removeWebhook } = require('./sql/webhooks')

/**
 * SQLSTATEs that mean "this input is wrong": data exceptions, integrity,
 * unknown objects, a tenant never assigned a plan (QT001) and an event time
 * outside the window the database accepts (QT002).
 */
function badInput (err) {
  return /^(22|23|42|QT001|QT002)/.test(err.code ?? '')
}

/**
 * Whether err says the database is away rather than that the request is
 * wrong: a call of the client that was not applied or whose outcome is
 * unknown (it retried until its deadline), the client closing, or, for
 * the app's own reads on the client's pool, a connection that could not be
 * had or was lost (the server starting, stopping, out of connections).
 */
function unavailable (err) {
  if (err.outcome === 'not_applied' || err.outcome === 'unknown') return true
  const code = err.code ?? ''
  return /^(08|53|57P0)/.test(code) || ['ECONNREFUSED', 'ECONNRESET', 'ETIMEDOUT', 'EPIPE'].includes(code) ||
    /^Connection terminated|timeout exceeded when trying to connect/.test(err.message ?? '')
}

function field (body, name, { required = true, type = 'string' } = {}) {
  const v = body[name]
  if (v === undefined || v === null) {
    if (required) throw new HttpError(400, `${name} is required`)
    return undefined
  }
  if (type === 'amount') {
    // the client's rule for amounts (a JSON body has no BigInt: a safe integer)
    try {
      return checkAmount(v, name, false)
    } catch {
      throw new HttpError(400, `${name} must be a non-negative integer`)
    }
  }
  if (typeof v !== 'string' || v === '') throw new HttpError(400, `${name} must be a non-empty string`)
  return v
}

const given = (body, name) => body[name] !== undefined && body[name] !== null

/**
 * The body of /api/events and /api/consume: {tenant, meter, amount = 1, id},
 * or {tenant, meter, value} for a unique meter.  A value is counted once
 * per period however often it is sent, so it takes no id (it has no
 * idempotency key to record it under).
 */
function usageBody (body) {
  if (body.value !== undefined) {
    if (given(body, 'amount')) throw new HttpError(400, 'give an amount or a value, not both (a value is for a unique meter)')
    if (given(body, 'id')) throw new HttpError(400, 'a value takes no id: it is counted once per period however often it is sent')
    const tenant = field(body, 'tenant')
    const meter = field(body, 'meter')
    if (typeof body.value !== 'string' || body.value === '') throw new HttpError(400, 'value must be a non-empty string')
    // its length (at most 1024 bytes) is the database's to check: 22001
    return { tenant, meter, value: body.value }
  }
  const id = field(body, 'id', { required: false })
  return {
    tenant: field(body, 'tenant'),
    meter: field(body, 'meter'),
    amount: field(body, 'amount', { required: false, type: 'amount' }) ?? 1,
    id,
    opts: { key: id }
  }
}

/**
 * The quota's X-RateLimit-* headers, and on a refusal for the quota a
 * Retry-After at the end of its period.  A refusal for the rate keeps the
 * quota's figures (unchanged) but gets its own Retry-After.
 */
function quotaHeaders (d) {
  if (d.quota === null) return {}
  const h = { 'X-RateLimit-Limit': String(d.quota), 'X-RateLimit-Remaining': String(d.remaining) }
  if (d.resetsAt) {
    const reset = Math.ceil(d.resetsAt.getTime() / 1000)
    h['X-RateLimit-Reset'] = String(reset)
    if (!d.granted && d.reason !== 'rate_limited') h['Retry-After'] = String(Math.max(0, reset - Math.floor(Date.now() / 1000)))
  }
  return h
}

function createApi ({ fm, values, metrics, deliverer, ratePolicies }) {
  async function postEvent (body) {
    const { tenant, meter, value, amount, id, opts } = usageBody(body)
    if (value !== undefined) {
      // true when new in its period (the distinct count went up by one)
      const isNew = await values.trackValue(tenant, meter, value)
      metrics.usageEvents.inc({ result: isNew ? 'new_value' : 'known_value' })
      return [200, { counted: true, new: isNew }]
    }
    // a call refused for its own input fails alone: the client splits its group
    const { counted } = await fm.track(tenant, meter, amount, opts)
    metrics.usageEvents.inc({ result: counted ? 'counted' : 'duplicate' })
    if (!counted) return [409, { error: 'duplicate: this id was recorded before', id, counted }]
    return [200, { counted, id: id ?? null }]
  }

  async function postConsume (body) {
    const { tenant, meter, value, amount, opts } = usageBody(body)
    const d = value !== undefined ? await values.consumeValue(tenant, meter, value) : await fm.consume(tenant, meter, amount, opts)
    metrics.consumes.inc({ result: d.granted ? 'granted' : 'refused' })
    const body2 = { granted: d.granted, reason: d.reason, used: d.used, quota: d.quota, remaining: d.remaining, resets_at: d.resetsAt, overage: d.overage, meter }
    if (d.granted) return [200, body2, quotaHeaders(d)]
    metrics.refused(tenant, d.reason)
    if (d.reason !== 'rate_limited') return [429, { error: 'quota exceeded', ...body2 }, quotaHeaders(d)]
    // not remembered under its key: the same id after Retry-After decides again
    const retryAfterMs = d.retryAfterMs ?? null
    const policy = await ratePolicies.get(tenant, meter)
    return [429, { error: 'rate limited', ...body2, retry_after_ms: retryAfterMs },
      { ...quotaHeaders(d), ...rateLimitedHeaders(policy, retryAfterMs) }]
  }

  async function getUsage (tenant) {
    const rows = await tenantUsage(fm.pool, tenant).catch((err) => {
      // a tenant never assigned a plan has no usage to show: not found
      if (err.code === 'QT001') throw new HttpError(404, err.message, { sqlstate: err.code })
      throw err
    })
    return [200, {
      tenant,
      plan: rows.length ? rows[0].plan : null,
      meters: rows.map((r) => ({
        meter: r.meter,
        aggregation: r.aggregation,
        unit: r.unit,
        used: r.used,
        quota: r.quota,
        remaining: r.remaining,
        state: r.state,
        mode: r.mode,
        period: r.period,
        resets_at: r.resets_at,
        blocked: fm.isBlocked(tenant, r.meter)
      }))
    }]
  }

  async function postWebhook (body) {
    const url = field(body, 'url')
    const tenant = field(body, 'tenant', { required: false })
    let parsed
    try { parsed = new URL(url) } catch { throw new HttpError(400, 'url is not a URL') }
    if (!/^https?:$/.test(parsed.protocol)) throw new HttpError(400, 'url must be http or https')
    const w = await addWebhook(fm.pool, url, tenant)
    deliverer.kick()
    return [201, w]
  }

  return {
    postEvent,
    postConsume,
    getUsage,
    postWebhook,
    listWebhooks: async () => [200, await listWebhooks(fm.pool)],
    removeWebhook: async (id) => (await removeWebhook(fm.pool, id)) ? [204, null] : [404, { error: 'no such webhook' }],
    badInput,
    unavailable
  }
}

module.exports = { createApi }
