'use strict'
// Webhook alerts: every threshold, blocked and unblocked event of a tenant
// is POSTed as JSON (Slack-compatible: {"text": ...} plus the fields) to
// the webhooks configured for that tenant or for every tenant.
//
// Guarantees, and how:
// - At least once: the cursor of a (webhook, tenant) pair moves past an
//   event only after its URL answered 2xx, in PostgreSQL
//   (dashboard.webhook_cursors); a crash between the answer and that
//   UPDATE sends the event again.  Receivers dedupe on `version`.
// - In version order per tenant: only the head event of a pair is sent,
//   and the next one only once it was delivered.
// - No loss, no flood on restart: the scan position (webhook_scan) and the
//   cursors are in the database; a new webhook starts at the version of its
//   creation.
// - One deliverer across app instances: the instance that holds a session
//   advisory lock on its own connection delivers; the others try again
//   every lockRetryMs.  All of the deliverer's statements run on that
//   connection, so when it drops the lock is gone and so is its ability to
//   move cursors.
// - Retries with backoff: a non-2xx answer, a network error or no answer
//   within timeoutMs is a failure; the pair waits retryMs x 2^(attempts-1)
//   (with jitter, at most retryMaxMs) and tries the same event again,
//   forever (at least once means never giving up).
// - A dead URL does not hold up other pairs: up to `concurrency` pairs are
//   in flight at once, each waiting only for its own answer.
const pg = require('pg')
const { scanOutbox } = require('./sql/scanOutbox')
const { dueDeliveries, nextDueIn } = require('./sql/dueDeliveries')
const { delivered, failed, skipped } = require('./sql/recordDelivery')
const { ALERT_KINDS } = require('./kinds')

const LOCK_KEY = "hashtext('flagmeter dashboard webhooks')"

function figure (v) {
  return v === null || v === undefined ? '?' : String(v)
}

/** The JSON body of one alert: Slack's text, then the event's fields. */
function alertBody (e) {
  const used = `${figure(e.used)} of ${figure(e.quota)}`
  const text = e.kind === 'threshold'
    ? `:warning: ${e.tenant} reached ${e.threshold} % of its ${e.meter} quota (${used} used)`
    : e.kind === 'blocked'
      ? `:no_entry: ${e.tenant} is blocked on ${e.meter}: ${used} used`
      : `:white_check_mark: ${e.tenant} is no longer blocked on ${e.meter}`
  return {
    text,
    kind: e.kind,
    version: e.version,
    tenant: e.tenant,
    meter: e.meter,
    threshold: e.threshold ?? undefined,
    used: e.used ?? undefined,
    quota: e.quota ?? undefined,
    period_start: e.period_start,
    created_at: e.created_at
  }
}

class WebhookDeliverer {
  /**
   * @param {object} opts
   * @param {import('pg').ClientConfig} opts.connection  the lock session's connection
   * @param {number} [opts.timeoutMs]     answer within this, or the attempt failed (5 s)
   * @param {number} [opts.retryMs]       first retry delay (1 s)
   * @param {number} [opts.retryMaxMs]    longest retry delay (5 min)
   * @param {number} [opts.concurrency]   pairs in flight at once (8)
   * @param {number} [opts.pollMs]        look for work at least this often (1 s)
   * @param {number} [opts.lockRetryMs]   a standby tries to become the deliverer (2 s)
   * @param {(result: string) => void} [opts.onAttempt]  'delivered' | 'failed'
   * @param {(err: Error) => void} [opts.onError]
   */
  constructor (opts) {
    this._connection = opts.connection
    this._timeoutMs = opts.timeoutMs ?? 5000
    this._retryMs = opts.retryMs ?? 1000
    this._retryMaxMs = opts.retryMaxMs ?? 300000
    this._concurrency = opts.concurrency ?? 8
    this._pollMs = opts.pollMs ?? 1000
    this._lockRetryMs = opts.lockRetryMs ?? 2000
    this._onAttempt = opts.onAttempt ?? (() => {})
    this._onError = opts.onError ?? (() => {})
    this._client = null
    this._leader = false
    this._closed = false
    this._busy = new Map() // "webhook/tenant" -> promise of its attempt
    this._aborts = new Set()
    this._sleepers = new Map() // wake -> whether a kick wakes it
    this._kicked = false
    this._loop = null
  }

  /** Begin: connect, and deliver once this instance holds the lock (the app's schema must exist). */
  start () {
    if (!this._loop && !this._closed) this._loop = this._run()
  }

  /** Whether this instance holds the lock and delivers. */
  get leader () {
    return this._leader
  }

  /** New quota events may be in the outbox: look now rather than at the next poll. */
  kick () {
    this._kicked = true
    this._wakeAll(true)
  }

  async close () {
    this._closed = true
    for (const a of this._aborts) a.abort()
    this._wakeAll()
    if (this._loop) await this._loop
  }

  /**
   * Resolves after ms, or at once on close() and, when wakeOnKick, on
   * kick(); its timer never outlives it.  Only the deliverer's loop wakes on
   * a kick (and clears it): a standby or a reconnect cannot act on new
   * events, and one that woke would find the kick still set and spin.
   */
  _sleep (ms, wakeOnKick = true) {
    if (this._closed || (wakeOnKick && this._kicked)) return Promise.resolve()
    let timer
    let wake
    return new Promise((resolve) => {
      wake = resolve
      timer = setTimeout(resolve, ms)
      this._sleepers.set(wake, wakeOnKick)
    }).finally(() => {
      clearTimeout(timer)
      this._sleepers.delete(wake)
    })
  }

  _wakeAll (kick = false) {
    for (const [wake, wakeOnKick] of this._sleepers) if (!kick || wakeOnKick) wake()
  }

  async _run () {
    while (!this._closed) {
      try {
        await this._session()
      } catch (err) {
        if (!this._closed) this._onError(err)
      }
      this._leader = false
      await Promise.allSettled(this._busy.values())
      if (this._client) {
        await this._client.end().catch(() => {})
        this._client = null
      }
      await this._sleep(this._lockRetryMs, false)
    }
  }

  /** One session: connect, wait to be the deliverer, deliver until closed or the connection fails. */
  async _session () {
    const client = new pg.Client(this._connection)
    this._client = client
    let lost = null
    const gone = new Promise((resolve, reject) => {
      client.on('error', (err) => { lost = err; reject(err) })
      client.on('end', () => { lost = lost ?? new Error('webhook deliverer: connection ended'); reject(lost) })
    })
    gone.catch(() => {})
    await client.connect()
    while (!this._closed && !this._leader) {
      const { rows } = await client.query(`SELECT pg_try_advisory_lock(${LOCK_KEY}) AS ok`)
      this._leader = rows[0].ok
      if (!this._leader) await Promise.race([this._sleep(this._lockRetryMs, false), gone])
    }
    while (!this._closed) {
      if (lost) throw lost
      this._kicked = false
      await this._scan(client)
      const started = await this._fill(client)
      let wait = this._pollMs
      if (started === 0) {
        const due = await nextDueIn(client)
        if (due !== null) wait = Math.min(wait, Math.max(due, 10))
      }
      const attempts = [...this._busy.values()]
      // wake on a kick, on the first attempt that ends, or after `wait`
      await Promise.race([this._sleep(wait), gone, ...(attempts.length ? [Promise.race(attempts)] : [])])
    }
    // the attempts in flight record their outcome before another instance may take over
    await Promise.allSettled(this._busy.values())
    if (this._leader) await client.query(`SELECT pg_advisory_unlock(${LOCK_KEY})`).catch(() => {})
  }

  async _scan (client) {
    for (;;) {
      const r = await scanOutbox(client, ALERT_KINDS, 1000)
      if (Number(r.events) < 1000) return
    }
  }

  /** Start attempts for due pairs while slots are free; how many started. */
  async _fill (client) {
    const free = this._concurrency - this._busy.size
    if (free <= 0) return 0
    const rows = await dueDeliveries(client, free, [...this._busy.keys()], ALERT_KINDS)
    for (const row of rows) {
      const key = `${row.webhook_id}/${row.tenant}`
      const attempt = this._attempt(client, row).catch((err) => this._onError(err))
        .finally(() => this._busy.delete(key))
      this._busy.set(key, attempt)
    }
    return rows.length
  }

  async _attempt (client, row) {
    if (row.event === null) {
      await skipped(client, row.webhook_id, row.tenant, row.delivered_through, row.pending_through)
      return
    }
    const e = row.event
    const abort = new AbortController()
    this._aborts.add(abort)
    const timer = setTimeout(() => abort.abort(new Error(`no answer within ${this._timeoutMs} ms`)), this._timeoutMs)
    let error = null
    try {
      const res = await fetch(row.url, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify(alertBody(e)),
        signal: abort.signal,
        redirect: 'manual'
      })
      await res.arrayBuffer().catch(() => {})
      if (res.status < 200 || res.status > 299) error = `HTTP ${res.status}`
    } catch (err) {
      error = abort.signal.aborted && abort.signal.reason instanceof Error ? abort.signal.reason.message : String(err.cause?.message ?? err.message)
    } finally {
      clearTimeout(timer)
      this._aborts.delete(abort)
    }
    if (this._closed && error !== null) return // shutting down: the cursor stays, the event goes again later
    if (error === null) {
      await delivered(client, row.webhook_id, row.tenant, row.delivered_through, e.version)
      this._onAttempt('delivered')
    } else {
      const base = Math.min(this._retryMaxMs, this._retryMs * 2 ** Math.min(row.attempts, 30))
      await failed(client, row.webhook_id, row.tenant, row.delivered_through,
        Math.round(base * (0.5 + Math.random() / 2)), error)
      this._onAttempt('failed')
    }
  }
}

module.exports = { WebhookDeliverer, alertBody, ALERT_KINDS }
