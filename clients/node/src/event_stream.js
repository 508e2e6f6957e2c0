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

const { parseJson, big } = require('./numbers')
const { quotaEvent, isWhole, QUOTA_KINDS } = require('./quota_events')
const { listen } = require('./sql/listen')
const { changesSince } = require('./sql/changesSince')
const { oldestVersion } = require('./sql/oldestVersion')
const { blockedUntil } = require('./sql/blockedUntil')
const { limitsOf } = require('./sql/limits')
const { readState, inSnapshot } = require('./sql/snapshot')
const { planFeatures } = require('./sql/features')
const { FlagMeterClosedError } = require('./errors')
const { DEFAULTS } = require('./defaults')

/** @typedef {import('./interfaces').Int} Int */
/** @typedef {import('pg').ClientBase} Db */
/** A LISTEN session (processID: node-postgres sets it at login; its types lack it). */
/** @typedef {import('pg').Client & { processID?: number }} ListenClient */
/** @typedef {{ task: (db: Db) => Promise<unknown>, resolve: (value: unknown) => void, reject: (err: unknown) => void }} Task */

class EventStream {
  /**
   * @param {object} opts
   * @param {() => ListenClient} opts.connect   a new, unconnected client
   * @param {import('./cache').QuotaCache} opts.cache
   * @param {import('./features').FeatureCache | null} [opts.features]
   * @param {(kind: string, event: object) => void} opts.emit
   * @param {(err: unknown) => void} opts.onError
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
    this._initialDelay = reconnect.initialDelayMs ?? DEFAULTS.reconnect.initialDelayMs
    this._maxDelay = reconnect.maxDelayMs ?? DEFAULTS.reconnect.maxDelayMs
    /** @type {ListenClient | null} */
    this._client = null
    this._closed = false
    /** @type {Array<string | Task>} notification payloads, and tasks of run() */
    this._inbox = []
    this._working = false
    this._synced = false
    /** @type {NodeJS.Timeout | null} */
    this._timer = null
    /** @type {(() => void) | null} */
    this._wake = null
    this.reconnects = 0
    /** @type {Promise<void>} */
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
   * @template T
   * @param {(db: Db) => Promise<T>} fn
   * @returns {Promise<T>}
   */
  run (fn) {
    if (!this.synced) return Promise.reject(new Error('flagmeter: the event stream is not connected'))
    return new Promise((resolve, reject) => {
      this._inbox.push({ task: fn, resolve: /** @type {(value: unknown) => void} */ (resolve), reject })
      this._kick(/** @type {ListenClient} synced: connected */ (this._client))
    })
  }

  /** Empty the queue: tasks not run yet are rejected (their callers fall back). */
  _dropInbox () {
    for (const item of this._inbox) {
      if (typeof item !== 'string') item.reject(new Error('flagmeter: the event stream lost its connection'))
    }
    this._inbox = []
  }

  /**
   * The backend pid of the LISTEN session (null while disconnected).
   * @returns {number | null}
   */
  get pid () {
    return this._client && this._synced ? this._client.processID ?? null : null
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
      /** @type {Promise<void>} */
      const lost = new Promise((resolve) => {
        client.on('error', (err) => { this._report(err); resolve() })
        client.on('end', resolve)
      })
      client.on('notification', (msg) => {
        if (msg.channel !== 'flagmeter' || this._client !== client) return
        this._inbox.push(/** @type {string} pg sets it, '' when empty */ (msg.payload))
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

  /** @param {number} ms */
  _sleep (ms) {
    return /** @type {Promise<void>} */ (new Promise((resolve) => {
      this._wake = resolve
      this._timer = setTimeout(resolve, ms)
    })).finally(() => {
      clearTimeout(this._timer ?? undefined)
      this._timer = null
      this._wake = null
    })
  }

  /** @param {unknown} err */
  _report (err) {
    if (!this._closed) this._onError(err)
  }

  /**
   * V, the version of the last quota event applied, as a BigInt: the cache
   * holds its snapshot by the time the stream reads events.
   */
  get _applied () {
    return big(/** @type {Int} */ (this._cache.version))
  }

  /**
   * Step 2 the first time; after a reconnect, the replay (step 4).
   * @param {Db} client
   */
  async _sync (client) {
    if (this._cache.version === null) {
      const state = await inSnapshot(client, readState)
      this._cache.load(state)
    } else {
      await inSnapshot(client, async (db) => {
        const from = this._applied
        const oldest = await oldestVersion(db)
        await this._replay(db)
        // older than the retention: what maintain() deleted is gone, so the
        // state is read again (in the same snapshot as the replay)
        if (oldest !== null && big(oldest) > from + 1n) {
          const state = await readState(db)
          if (big(state.version) >= this._applied) this._cache.load(state)
          // features are loaded per tenant on use: loaded again then
          if (this._features) this._features.clear()
        }
      })
      this._emit('invalidate', { kind: 'invalidate', all: true, reason: 'reconnect' })
    }
    this._synced = true
  }

  /** @param {ListenClient} client  the session the work is for: nothing is done once it is replaced */
  _kick (client) {
    if (this._working || !this._synced || this._client !== client) return
    this._working = true
    // what arrived while the last round was ending gets a round of its own
    this._work(client).finally(() => {
      this._working = false
      if (this._inbox.length > 0) this._kick(client)
    })
  }

  /** @param {Db} client */
  async _work (client) {
    try {
      while (this._inbox.length > 0 && this._client === client && !this._closed) {
        const item = /** @type {string | Task} not empty */ (this._inbox.shift())
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

  /**
   * @param {Db} client
   * @param {string} payload
   */
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
      const last = this._applied
      if (v <= last) continue // applied already (in the snapshot or a replay)
      if (v === last + 1n && isWhole(raw)) {
        await this._apply(client, quotaEvent(raw, 'notification'))
      } else {
        await this._replay(client) // a gap, or a shrunk payload
      }
    }
  }

  /**
   * Apply changes_since(V), in order.
   * @param {Db} db
   */
  async _replay (db) {
    const rows = await changesSince(db, this._cache.version)
    for (const row of rows) {
      if (big(row.version) <= this._applied) continue
      await this._apply(db, quotaEvent(row, 'outbox'))
    }
  }

  /**
   * Update the cache, then tell the app; V moves to the event's version.
   * @param {Db} db
   * @param {import('./quota_events').ReceivedEvent} e
   */
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
