'use strict'
// The event stream of one app instance: README's client protocol, made
// correct whatever the order and the completeness of notifications.
//
// The instance keeps the version of the last quota event it applied (V).
// It applies an event from a notification only when its version is exactly
// V + 1; anything else is either old (<= V: already applied, dropped) or
// shows a gap (a skipped notification under backpressure, a version drawn
// by a transaction that failed, a hint that was overtaken): then it replays
// flagmeter.changes_since(V) first, in order, and so applies the missing
// events before the later ones.  The same replay follows a resync hint, a
// payload shrunk to fit 1 kB, and every reconnect.  Versions are drawn in
// commit order (README, "Versions and the outbox"), so once the
// notification of V + k arrived, everything up to it is in the outbox.
//
// One connection, used for LISTEN and for every read of the stream, so
// reads and notifications are ordered with each other; it must be a
// session of its own on the primary (not a transaction-mode pooler).  All
// work runs one step at a time: cache updates and emitted events follow
// version order.  A lost connection is retried with exponential backoff
// (with jitter); after it, the stream replays what it missed and emits one
// `invalidate` with `all: true` (invalidations are not kept in the outbox).
//
// Reads of other caches that must be ordered with the events (the feature
// cache's loads, src/features.js) run as tasks in the same queue (run()),
// so that no event is applied while one reads.

const { parseJson } = require('./numbers')
const { quotaEvent, isWhole, QUOTA_KINDS } = require('./quota_events')
const { listen } = require('./sql/listen')
const { changesSince } = require('./sql/changesSince')
const { oldestVersion } = require('./sql/oldestVersion')
const { blockedUntil } = require('./sql/blockedUntil')
const { limitsOf } = require('./sql/limits')
const { readState, inSnapshot } = require('./sql/snapshot')
const { planFeatures } = require('./sql/features')
const { FlagMeterClosedError } = require('./errors')

function big (v) {
  return typeof v === 'bigint' ? v : BigInt(v)
}

class EventStream {
  /**
   * @param {object} opts
   * @param {() => import('pg').Client} opts.connect   a new, unconnected client
   * @param {import('./cache').QuotaCache} opts.cache
   * @param {import('./features').FeatureCache} [opts.features]
   * @param {(kind: string, event: object) => void} opts.emit
   * @param {(err: Error) => void} opts.onError
   * @param {(connected: boolean) => void} [opts.onState]  caught up after a connect; lost after that
   * @param {{ initialDelayMs?: number, maxDelayMs?: number }} [opts.reconnect]
   */
  constructor ({ connect, cache, features = null, emit, onError, onState = () => {}, reconnect = {} }) {
    this._connect = connect
    this._cache = cache
    this._features = features
    this._emit = emit
    this._onError = onError
    this._onState = onState
    this._initialDelay = reconnect.initialDelayMs ?? 100
    this._maxDelay = reconnect.maxDelayMs ?? 5000
    this._client = null
    this._closed = false
    this._inbox = []
    this._working = false
    this._synced = false
    this._timer = null
    this._wake = null
    this.reconnects = 0
    this._ready = new Promise((resolve, reject) => {
      this._readyResolve = resolve
      this._readyReject = reject
    })
    this._ready.catch(() => {}) // settled for whoever asks; never unhandled
    this._loop = this._run()
  }

  /** Resolves once the first snapshot is in the cache. */
  ready () {
    return this._ready
  }

  /** Whether the stream is connected and caught up (tasks can run). */
  get synced () {
    return this._synced && !this._closed
  }

  /**
   * Run fn(db) on the stream's connection, between two events: resolves
   * with its result; rejects when the stream is not synced or the
   * connection goes before it ran.
   */
  run (fn) {
    if (!this.synced) return Promise.reject(new Error('flagmeter: the event stream is not connected'))
    return new Promise((resolve, reject) => {
      this._inbox.push({ task: fn, resolve, reject })
      this._kick(this._client)
    })
  }

  /** Empty the queue: tasks not run yet are rejected (their callers fall back). */
  _dropInbox () {
    for (const item of this._inbox) {
      if (typeof item !== 'string') item.reject(new Error('flagmeter: the event stream lost its connection'))
    }
    this._inbox = []
  }

  /** The backend pid of the LISTEN session (null while disconnected). */
  get pid () {
    return this._client && this._synced ? this._client.processID : null
  }

  async close () {
    this._closed = true
    this._readyReject(new FlagMeterClosedError('flagmeter client closed before its first sync'))
    if (this._timer) clearTimeout(this._timer)
    if (this._wake) this._wake()
    const client = this._client
    if (client) await client.end().catch(() => {})
    await this._loop
  }

  async _run () {
    let delay = this._initialDelay
    while (!this._closed) {
      const client = this._connect()
      this._client = client
      const lost = new Promise((resolve) => {
        client.on('error', (err) => { this._report(err); resolve() })
        client.on('end', resolve)
      })
      client.on('notification', (msg) => {
        if (msg.channel !== 'flagmeter' || this._client !== client) return
        this._inbox.push(msg.payload)
        this._kick(client)
      })
      try {
        await client.connect()
        await listen(client) // step 1, before anything is read
        await this._sync(client)
        delay = this._initialDelay
        this._readyResolve()
        this._onState(true)
        this._kick(client)
        await lost
      } catch (err) {
        if (!this._closed) this._report(err)
      }
      const wasSynced = this._synced
      this._synced = false
      if (wasSynced && !this._closed) this._onState(false)
      this._dropInbox()
      this._client = null
      await client.end().catch(() => {})
      if (this._closed) break
      this.reconnects++
      await this._sleep(delay * (0.5 + Math.random() / 2))
      delay = Math.min(delay * 2, this._maxDelay)
    }
  }

  _sleep (ms) {
    return new Promise((resolve) => {
      this._wake = resolve
      this._timer = setTimeout(resolve, ms)
    }).finally(() => {
      clearTimeout(this._timer)
      this._timer = null
      this._wake = null
    })
  }

  _report (err) {
    if (!this._closed) this._onError(err)
  }

  /** Step 2 the first time; after a reconnect, the replay (step 4). */
  async _sync (client) {
    if (this._cache.version === null) {
      const state = await inSnapshot(client, readState)
      this._cache.load(state)
    } else {
      await inSnapshot(client, async (db) => {
        const from = this._cache.version
        const oldest = await oldestVersion(db)
        await this._replay(db)
        // older than the retention: what maintain() deleted is gone, so the
        // state is read again (in the same snapshot as the replay)
        if (oldest !== null && big(oldest) > big(from) + 1n) {
          const state = await readState(db)
          if (big(state.version) >= big(this._cache.version)) this._cache.load(state)
          // features are loaded per tenant on use: loaded again then
          if (this._features) this._features.clear()
        }
      })
      this._emit('invalidate', { kind: 'invalidate', all: true, reason: 'reconnect' })
    }
    this._synced = true
  }

  _kick (client) {
    if (this._working || !this._synced || this._client !== client) return
    this._working = true
    // what arrived while the last round was ending gets a round of its own
    this._work(client).finally(() => {
      this._working = false
      if (this._inbox.length > 0) this._kick(client)
    })
  }

  async _work (client) {
    try {
      while (this._inbox.length > 0 && this._client === client && !this._closed) {
        const item = this._inbox.shift()
        if (typeof item === 'string') {
          await this._handle(client, item)
          continue
        }
        // a task's failure is its caller's, not the stream's
        try {
          item.resolve(await item.task(client))
        } catch (err) {
          item.reject(err)
        }
      }
    } catch (err) {
      // a read failed: the connection is going; the reconnect replays
      this._report(err)
    }
  }

  async _handle (client, payload) {
    let msg
    try {
      msg = parseJson(payload)
    } catch (err) {
      this._report(new Error(`flagmeter: unreadable notification payload: ${payload}`))
      return
    }
    if (msg.kind === 'invalidate') {
      this._emit('invalidate', msg)
      return
    }
    if (msg.resync === true || msg.kind === 'resync') {
      await this._replay(client)
      return
    }
    const events = msg.kind === 'batch' ? msg.events : [msg]
    for (const raw of events) {
      if (!QUOTA_KINDS.has(raw.kind) || raw.version === undefined) continue
      const v = big(raw.version)
      const last = big(this._cache.version)
      if (v <= last) continue // applied already (in the snapshot or a replay)
      if (v === last + 1n && isWhole(raw)) {
        await this._apply(client, quotaEvent(raw, 'notification'))
      } else {
        await this._replay(client) // a gap, or a shrunk payload
      }
    }
  }

  /** Apply changes_since(V), in order. */
  async _replay (db) {
    const rows = await changesSince(db, this._cache.version)
    for (const row of rows) {
      if (big(row.version) <= big(this._cache.version)) continue
      await this._apply(db, quotaEvent(row, 'outbox'))
    }
  }

  /** Update the cache, then tell the app; V moves to the event's version. */
  async _apply (db, e) {
    const c = this._cache
    switch (e.kind) {
      case 'blocked': {
        const until = e.periodStart === null ? null
          : await blockedUntil(db, e.tenant, e.meter, e.periodStart)
        c.block(e.tenant, e.meter, e.periodStart, until)
        break
      }
      case 'unblocked':
        c.unblock(e.tenant, e.meter, e.periodStart)
        break
      case 'limit_changed':
        if (e.tenant !== undefined) {
          c.replaceLimits({ tenant: e.tenant, meter: e.meter },
            await limitsOf(db, { tenant: e.tenant, meter: e.meter }))
        } else {
          c.replaceLimits({ plan: e.plan, meter: e.meter },
            await limitsOf(db, { plan: e.plan, meter: e.meter }))
        }
        break
      case 'plan_changed': {
        c.replaceLimits({ tenant: e.tenant }, await limitsOf(db, { tenant: e.tenant }))
        // a cached tenant moves onto its new plan's rows, read first if not cached
        if (this._features) {
          const missing = this._features.planToLoad(e.tenant, e.plan ?? null, e.version)
          if (missing !== null) {
            const { version, rows } = await planFeatures(db, missing)
            this._features.loadPlan(missing, rows, version)
          }
          this._features.applyPlan(e.tenant, e.plan ?? null, e.version)
        }
        break
      }
      case 'feature_changed':
        if (this._features) this._features.applyFeature(e)
        break
    }
    c.version = e.version
    this._emit(e.kind, e)
  }
}

module.exports = { EventStream }
