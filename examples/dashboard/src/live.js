'use strict'
// What the open dashboards see, pushed by server-sent events.
//
// One refresh for all of them, not one per browser: while at least one
// dashboard is connected, the instance reads the state (flagmeter.status,
// top_tenants) every stateMs and each watched (tenant, meter) series (per
// minute, per day for a unique meter) every seriesMs, and sends only what
// changed.  A quota event from the client (threshold, blocked, unblocked,
// limit or plan changed) is pushed at once and brings the next state read
// forward.  With no dashboard open it reads nothing.  The blocked list is
// the client's cache, which every instance keeps from the same event
// sequence.  Whether the database is
// reachable (the client's LISTEN session connected and caught up) is pushed
// as a `database` event when it changes and to every new page: the page
// shows a banner while it is not.  The rate-limited counts are this
// instance's (refusals are not recorded in the database), sent with the
// state.
const { status } = require('./sql/status')
const { topTenants } = require('./sql/topTenants')
const { chartSeries } = require('./sql/chartSeries')
const { recentEvents } = require('./sql/recentEvents')
const { json } = require('./http')
const { SHOWN_KINDS } = require('./kinds')

const RECENT = 20

function eventRow (e) {
  return {
    version: e.version,
    at: e.created_at ?? e.at ?? new Date(),
    kind: e.kind,
    tenant: e.tenant ?? null,
    meter: e.meter ?? null,
    plan: e.plan ?? null,
    threshold: e.threshold ?? null,
    used: e.used ?? null,
    quota: e.quota ?? null
  }
}

/** The tenants of the status rows, each with its plan and meters. */
function tenantsOf (rows) {
  const byTenant = new Map()
  for (const r of rows) {
    let t = byTenant.get(r.tenant)
    if (!t) byTenant.set(r.tenant, (t = { tenant: r.tenant, plan: r.plan, meters: [] }))
    t.meters.push({
      meter: r.meter, aggregation: r.aggregation, unit: r.unit, used: r.used, quota: r.quota, remaining: r.remaining, ratio: r.ratio,
      state: r.state, mode: r.mode, period: r.period, resets_at: r.resets_at
    })
  }
  return [...byTenant.values()]
}

class LiveFeed {
  /**
   * @param {object} opts
   * @param {import('flagmeter').FlagMeter} opts.fm
   * @param {string} opts.instance   shown on the page
   * @param {number} [opts.stateMs]
   * @param {number} [opts.seriesMs]
   * @param {() => Array<{tenant: string, count: number}>} [opts.rateLimited]  consumes refused for their rate, per tenant
   * @param {(err: Error) => void} [opts.onError]
   */
  constructor ({ fm, instance, stateMs = 1000, seriesMs = 2000, rateLimited = () => [], onError = () => {} }) {
    this._fm = fm
    this._rateLimited = rateLimited
    this._instance = instance
    this._stateMs = stateMs
    this._seriesMs = seriesMs
    this._onError = onError
    this._clients = new Set()
    this._events = []
    this._state = null
    this._stateText = ''
    this._series = new Map() // "tenant\0meter" -> last sent text
    this._timers = []
    this._stateRun = null
    this._soon = null
    this._closed = false
    for (const kind of SHOWN_KINDS) fm.on(kind, (e) => this._quotaEvent(e))
    fm.on('connected', () => this._broadcast('database', this._databaseText()))
    fm.on('disconnected', () => this._broadcast('database', this._databaseText()))
  }

  _databaseText () {
    return json({ connected: this._fm.connected })
  }

  /** Fill the latest quota events from the outbox (then the client's events keep it). */
  async start () {
    const rows = await recentEvents(this._fm.pool, RECENT)
    const known = new Set(this._events.map((e) => String(e.version)))
    this._events.push(...rows.map(eventRow).filter((e) => !known.has(String(e.version))))
    this._events.sort((a, b) => (BigInt(b.version) > BigInt(a.version) ? 1 : -1))
    this._events.length = Math.min(this._events.length, RECENT)
  }

  get clients () {
    return this._clients.size
  }

  /** The current state, read now (GET /api/state). */
  async snapshot () {
    const [rows, top] = await Promise.all([status(this._fm.pool), topTenants(this._fm.pool, 5)])
    return {
      instance: this._instance,
      at: new Date(),
      connected: this._fm.connected,
      tenants: tenantsOf(rows),
      blocked: this._fm.cache.blocked().sort((a, b) => (a.tenant + a.meter < b.tenant + b.meter ? -1 : 1)),
      top,
      rate_limited: this._rateLimited(),
      events: this._events
    }
  }

  /** GET /api/stream?tenant=&meter=: one dashboard, until it goes away. */
  attach (req, res, tenant, meter) {
    res.writeHead(200, {
      'content-type': 'text/event-stream',
      'cache-control': 'no-store',
      connection: 'keep-alive'
    })
    res.write(': flagmeter dashboard\n\n')
    const c = { res, tenant, meter }
    this._clients.add(c)
    req.on('close', () => this._detach(c))
    this._send(c, 'database', this._databaseText())
    if (this._state) this._send(c, 'state', this._stateText)
    if (tenant && meter) this._refreshSeries([[tenant, meter]], c).catch((err) => this._onError(err))
    if (this._clients.size === 1) this._startTimers()
    return c
  }

  _detach (c) {
    if (!this._clients.delete(c)) return
    if (this._clients.size === 0) this._stopTimers()
  }

  _send (c, event, text) {
    c.res.write(`event: ${event}\ndata: ${text}\n\n`)
  }

  _broadcast (event, text, filter = () => true) {
    for (const c of this._clients) if (filter(c)) this._send(c, event, text)
  }

  _startTimers () {
    this._refreshState()
    this._timers.push(setInterval(() => this._refreshState(), this._stateMs))
    this._timers.push(setInterval(() => {
      this._refreshSeries().catch((err) => this._onError(err))
    }, this._seriesMs))
    // a comment now and then keeps proxies from closing an idle stream
    this._timers.push(setInterval(() => this._broadcast('ping', '{}'), 15000))
  }

  _stopTimers () {
    for (const t of this._timers) clearInterval(t)
    this._timers = []
    if (this._soon) clearTimeout(this._soon)
    this._soon = null
  }

  /** One state read at a time; sent when it changed. */
  _refreshState () {
    if (this._stateRun || this._closed) return this._stateRun
    this._stateRun = (async () => {
      try {
        const s = await this.snapshot()
        const { at, ...rest } = s
        const text = json(rest)
        if (text !== this._stateText) {
          this._state = s
          this._stateText = text
          this._broadcast('state', text)
        }
      } catch (err) {
        if (!this._closed) this._onError(err)
      } finally {
        this._stateRun = null
      }
    })()
    return this._stateRun
  }

  /** The watched series (or the given pairs), each read once, sent to its watchers when changed. */
  async _refreshSeries (pairs, only) {
    if (!pairs) {
      const watched = new Map()
      for (const c of this._clients) if (c.tenant && c.meter) watched.set(c.tenant + '\u0000' + c.meter, [c.tenant, c.meter])
      pairs = [...watched.values()]
      for (const k of this._series.keys()) if (!watched.has(k)) this._series.delete(k)
    }
    for (const [tenant, meter] of pairs) {
      if (this._closed) return
      let series
      try {
        series = await chartSeries(this._fm.pool, tenant, meter)
      } catch (err) {
        // an unknown meter, a bad tenant id or a tenant never assigned a
        // plan (QT001): tell that page, nothing else
        if (!/^(22|42|QT001)/.test(err.code ?? '')) throw err
        const text = json({ tenant, meter, error: err.message, sqlstate: err.code })
        this._broadcast('series', text, (c) => c === only || (!only && c.tenant === tenant && c.meter === meter))
        continue
      }
      // bucket: 'minute' (the last hour), or 'day' for a unique meter (distinct values per UTC day)
      const text = json({ tenant, meter, bucket: series.bucket, points: series.points })
      const k = tenant + '\u0000' + meter
      if (only) this._send(only, 'series', text)
      else if (this._series.get(k) !== text) this._broadcast('series', text, (c) => c.tenant === tenant && c.meter === meter)
      this._series.set(k, text)
    }
  }

  _quotaEvent (e) {
    if (this._events.some((x) => String(x.version) === String(e.version))) return
    const row = eventRow({ ...e, at: new Date() })
    this._events.unshift(row)
    this._events.length = Math.min(this._events.length, RECENT)
    this._broadcast('quota', json(row))
    if (this._clients.size > 0 && !this._soon) {
      // a few events often come together (a batch): one read after them
      this._soon = setTimeout(() => { this._soon = null; this._refreshState() }, 50)
    }
  }

  /** End every stream and stop reading; waits for a read in flight. */
  async close () {
    this._closed = true
    this._stopTimers()
    for (const c of this._clients) c.res.end()
    this._clients.clear()
    await this._stateRun
  }
}

module.exports = { LiveFeed }
