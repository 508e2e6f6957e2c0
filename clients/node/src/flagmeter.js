'use strict'
// FlagMeter: the client an app instance keeps for its life.  It wires the
// pieces together and owns what it opened:
//   - the request path: a pg Pool (the app's, or one it creates), used by
//     a Batcher per kind of grouped call: track, consume, rateLimit and the
//     value calls of unique meters, trackValue, consumeValue and
//     forgetValue (src/batcher.js), and by check and transaction();
//   - the event streams, one per shard (one without sharding): each a
//     connection of its own for LISTEN, its catch-up and the QuotaCache it
//     keeps (src/event_stream.js, src/cache.js); with one database, also
//     the FeatureCache, loaded per tenant on the stream's connection and
//     kept by its events (src/features.js).
// Faults (README "Faults and retries"): every call has a deadline and runs
// in attempts on the request path (src/request_path.js), grouped ones
// through the batchers; an attempt that was not applied, or whose outcome
// is unknown and which carries an idempotency key, is made again until the
// deadline.  Errors of connections no call is waiting on (idle pool
// connections, the LISTEN sessions) go to fm.on('error'), or are logged
// once per kind when nothing listens: none can end the process.

const { EventEmitter } = require('node:events')
const pg = require('pg')

const { Batcher } = require('./batcher')
const { QuotaCache } = require('./cache')
const { FeatureCache } = require('./features')
const { tenantFeatures, featureAnswer } = require('./sql/features')
const { EventStream } = require('./event_stream')
const { FlagMeterClosedError } = require('./errors')
const { outcomeOf, spendingOutcomeOf } = require('./outcome')
const { RequestPath } = require('./request_path')
const calls = require('./calls')
const { check } = require('./sql/check')
const { track } = require('./sql/track')
const { consume } = require('./sql/consume')
const { consumeMeters } = require('./sql/consumeMeters')
const credits = require('./sql/credits')
const { QUOTA_EVENT_KINDS } = require('./quota_events')
const { DEFAULTS } = require('./defaults')

// The methods are typed by the published declarations (src/interfaces.d.ts);
// src/index.js checks the classes against them (npm run typecheck).
/** @typedef {import('./interfaces').FlagMeterOptions} FlagMeterOptions */
/** @typedef {import('./interfaces').Int} Int */
/** @typedef {import('./interfaces').Decision} Decision */
/** @typedef {import('./interfaces').ConsumeOptions} ConsumeOptions */
/** @typedef {import('./interfaces').Transaction} PublishedTransaction */
/** @typedef {import('./interfaces').FlagMeter} PublishedFlagMeter */
/** @typedef {import('./request_path').LentClient} LentClient */
/**
 * @template T
 * @typedef {(tx: PublishedTransaction) => Promise<T>} TransactionFn
 */

/** Calls that run in one transaction the caller holds: unbatched. */
class Transaction {
  /** @param {import('pg').ClientBase} client */
  constructor (client) {
    this.client = client
  }

  /** @type {PublishedTransaction['track']} */
  async track (tenant, meter, amount = 1, options = {}) {
    const c = calls.trackCall(tenant, meter, amount, options)
    return { counted: await track(this.client, c.tenant, c.meter, c.amount, c.occurredAt, c.key) }
  }

  /**
   * @overload
   * @param {string} tenant
   * @param {string} meter
   * @param {Int} [amount]
   * @param {ConsumeOptions} [options]
   * @returns {Promise<Decision>}
   */
  /**
   * @overload
   * @param {string} tenant
   * @param {string[]} meters
   * @param {Int[]} amounts
   * @param {ConsumeOptions} [options]
   * @returns {Promise<Decision[]>}
   */
  /**
   * One meter, or several all or nothing.
   * @param {string} tenant
   * @param {string | string[]} meter  several: all or nothing
   * @param {Int | Int[]} [amount]
   * @param {ConsumeOptions} [options]
   * @returns {Promise<Decision | Decision[]>}
   */
  async consume (tenant, meter, amount = 1, options = {}) {
    const c = calls.consumeCall(tenant, meter, amount, options)
    if (!c.multi) return calls.decision(await consume(this.client, c.tenant, c.meters[0], c.amounts[0], c.key))
    return (await consumeMeters(this.client, c.tenant, c.meters, c.amounts, c.key)).map(calls.decision)
  }

  /** @type {PublishedTransaction['trackValue']} */
  async trackValue (tenant, meter, value, options = {}) {
    return (await calls.runTrackValueGroup(this.client, [calls.valueCall(tenant, meter, value, options)]))[0]
  }

  /** @type {PublishedTransaction['consumeValue']} */
  async consumeValue (tenant, meter, value) {
    return (await calls.runConsumeValueGroup(this.client, [calls.valueCall(tenant, meter, value)]))[0]
  }

  /** @type {PublishedTransaction['forgetValue']} */
  async forgetValue (tenant, meter, value) {
    return (await calls.runForgetValueGroup(this.client, [calls.valueCall(tenant, meter, value)]))[0]
  }

  /** @type {PublishedTransaction['check']} */
  async check (tenant, meter, amount = 1) {
    calls.checkName(tenant, 'tenant')
    calls.checkName(meter, 'meter')
    calls.checkAmount(amount, 'amount', false)
    return calls.decision(await check(this.client, tenant, meter, amount))
  }

  /** @type {PublishedTransaction['balance']} */
  async balance (tenant, meter) {
    calls.checkName(tenant, 'tenant')
    calls.checkName(meter, 'meter')
    return credits.balance(this.client, tenant, meter)
  }

  /** @type {PublishedTransaction['reserve']} */
  async reserve (tenant, meter, amount, options = {}) {
    const c = calls.reserveCall(tenant, meter, amount, options)
    return calls.reservation(await credits.reserve(this.client, c.tenant, c.meter, c.amount, c.ttl ?? DEFAULTS.reserveTtl, c.key))
  }

  /** @type {PublishedTransaction['settle']} */
  async settle (reservationId, actual) {
    calls.checkReservation(reservationId, actual)
    return calls.decision(await credits.settle(this.client, reservationId, actual))
  }

  /** @type {PublishedTransaction['release']} */
  async release (reservationId) {
    calls.checkReservation(reservationId)
    return credits.release(this.client, reservationId)
  }
}

// Connections the client opens give up connecting after connectTimeoutMs
// and keep TCP keepalives on, so that a server that went silent (a network
// partition, a paused pooler) shows as an error rather than as a wait.
/** @param {FlagMeterOptions} options */
function connectionDefaults (options) {
  return { connectionTimeoutMillis: options.connectTimeoutMs, keepAlive: true }
}

/**
 * @param {FlagMeterOptions} options
 * @returns {import('pg').PoolConfig | null}  null: no connection options (a pool is given)
 */
function poolConfig (options) {
  const base = { max: options.poolSize ?? DEFAULTS.poolSize, ...connectionDefaults(options) }
  if (options.connectionString) return { ...base, connectionString: options.connectionString }
  if (options.connection) return { ...base, ...options.connection }
  return null
}

/**
 * pg Client options for one LISTEN connection, from a string or options.
 * @param {string | import('pg').ClientConfig} listen
 * @returns {import('pg').ClientConfig}
 */
function clientConfig (listen) {
  return typeof listen === 'string' ? { connectionString: listen } : listen
}

/**
 * @param {number | undefined} value
 * @param {string} name
 * @param {number} fallback  when value is undefined
 */
function positive (value, name, fallback) {
  if (value === undefined) return fallback
  if (!Number.isFinite(value) || value <= 0) throw new RangeError(`${name} must be a positive number of milliseconds: ${value}`)
  return value
}

/**
 * The LISTEN connections: one per shard (README "Scale-out": each shard has
 * its own outbox and versions, and a proxy does not forward notifications),
 * by default one to the database of the request path.
 * @param {FlagMeterOptions} options
 * @returns {import('pg').ClientConfig[]}
 */
function listenConfigs (options) {
  if (options.listen === false) return []
  if (Array.isArray(options.listen)) {
    if (options.listen.length === 0) throw new TypeError('listen: an empty list of shards (false: no LISTEN)')
    return options.listen.map(clientConfig)
  }
  if (options.listen) return [clientConfig(options.listen)]
  if (options.connectionString) return [{ connectionString: options.connectionString }]
  if (options.connection) {
    const { max, idleTimeoutMillis, connectionTimeoutMillis, ...rest } = options.connection
    return [rest]
  }
  return []
}

class FlagMeter extends EventEmitter {
  /** Every kind of event with a payload of the event stream: the quota events, and invalidate. */
  static EVENT_KINDS = Object.freeze([...QUOTA_EVENT_KINDS, 'invalidate'])

  /** @param {FlagMeterOptions} options */
  constructor (options = {}) {
    super()
    const timeoutMs = positive(options.timeoutMs, 'timeoutMs', DEFAULTS.timeoutMs)
    options = { ...options, connectTimeoutMs: positive(options.connectTimeoutMs, 'connectTimeoutMs', Math.min(timeoutMs, DEFAULTS.connectTimeoutMs)) }
    const retry = {
      initialDelayMs: options.retry?.initialDelayMs ?? DEFAULTS.retry.initialDelayMs,
      maxDelayMs: options.retry?.maxDelayMs ?? DEFAULTS.retry.maxDelayMs
    }
    const own = poolConfig(options)
    if (options.pool && own) throw new TypeError('pass either pool or connection options, not both')
    if (!options.pool && !own) throw new TypeError('flagmeter needs a pg Pool (pool) or connection options (connectionString, connection)')
    this.pool = options.pool ?? new pg.Pool(/** @type {import('pg').PoolConfig} given: checked above */ (own))
    this._ownsPool = !options.pool
    this._path = new RequestPath(this.pool, { timeoutMs, retry })
    // An idle connection of the client's own pool that the server ended: the
    // pool drops it; heard here so that it cannot end the process.  (An
    // app's own pool is the app's to listen to: README "Faults and retries".)
    if (this._ownsPool) this.pool.on('error', (err) => this._reportError(err, 'pool'))
    /** @type {Set<string>} kinds of error logged once already */
    this._logged = new Set()
    /** @type {Promise<void> | null} */
    this._closing = null
    const batching = {
      maxInFlight: options.maxInFlight ?? DEFAULTS.maxInFlight,
      maxGroup: options.maxGroup ?? DEFAULTS.maxGroup,
      timeoutMs,
      retry,
      // a call with a key is recorded once however often it is sent
      canRetryUnknown: (/** @type {{ key: string | null }} */ call) => call.key !== null
    }
    /** @type {Batcher<import('./calls').TrackCall, import('./interfaces').TrackResult>} */
    this._tracks = new Batcher({ ...batching, run: (/** @type {import('./calls').TrackCall[]} */ group, deadline) => this._path.attempt((db) => calls.runTrackGroup(db, group), deadline) })
    /** @type {Batcher<import('./calls').ConsumeCall, Decision | Decision[]>} */
    this._consumes = new Batcher({ ...batching, run: (/** @type {import('./calls').ConsumeCall[]} */ group, deadline) => this._path.attempt((db) => calls.runConsumeGroup(db, group), deadline) })
    // A rate limit call's key names what it limits, not an idempotency key:
    // one whose outcome is unknown may have spent, and is not sent again.
    /** @type {Batcher<import('./calls').RateLimitCall, import('./interfaces').RateDecision>} */
    this._rateLimits = new Batcher({
      ...batching,
      canRetryUnknown: () => false,
      run: (/** @type {import('./calls').RateLimitCall[]} */ group, deadline) =>
        this._path.attempt((db) => calls.runRateLimitGroup(db, group), deadline, spendingOutcomeOf)
    })
    // The value calls of unique meters have no idempotency key.  A value is
    // counted once per period however often it is seen, so trackValue is
    // sent again after an unknown outcome, as a keyed track is: the value
    // is in its period's set once, and an attempt after one that did
    // commit answers false (not new), as a keyed track answers counted:
    // false.  consumeValue and forgetValue are not, as consume without a
    // key is not: between the attempts another call may have forgotten or
    // counted the same value, and the second attempt would then take a
    // seat, or free one, that the first did not; they fail with the
    // unknown error, and the app decides (a check, or the call again).
    // All three are transactional (the tenant's rate limit of consumeValue
    // as consume's): an ERROR rolled back what they wrote.
    /** @type {Batcher<import('./calls').ValueCall, boolean>} */
    this._trackValues = new Batcher({
      ...batching,
      canRetryUnknown: () => true,
      run: (/** @type {import('./calls').ValueCall[]} */ group, deadline) => this._path.attempt((db) => calls.runTrackValueGroup(db, group), deadline)
    })
    /** @type {Batcher<import('./calls').ValueCall, Decision>} */
    this._consumeValues = new Batcher({
      ...batching,
      canRetryUnknown: () => false,
      run: (/** @type {import('./calls').ValueCall[]} */ group, deadline) => this._path.attempt((db) => calls.runConsumeValueGroup(db, group), deadline)
    })
    /** @type {Batcher<import('./calls').ValueCall, boolean>} */
    this._forgetValues = new Batcher({
      ...batching,
      canRetryUnknown: () => false,
      run: (/** @type {import('./calls').ValueCall[]} */ group, deadline) => this._path.attempt((db) => calls.runForgetValueGroup(db, group), deadline)
    })
    /** Every batcher, by its name in stats(). */
    this._batchers = {
      track: this._tracks,
      consume: this._consumes,
      rateLimit: this._rateLimits,
      trackValue: this._trackValues,
      consumeValue: this._consumeValues,
      forgetValue: this._forgetValues
    }
    // One stream and one cache per shard: a shard's versions order only its
    // own events, and its tenants are on no other shard.
    const listens = listenConfigs(options)
    this._caches = listens.length > 0 ? listens.map(() => new QuotaCache()) : [new QuotaCache()]
    this.cache = this._caches[0]
    this.features = new FeatureCache({ maxTenants: options.featureCacheSize ?? DEFAULTS.featureCacheSize })
    /** @type {Map<string, Promise<void>>} */
    this._featureLoads = new Map() // tenant -> the load in flight
    const streamConnection = connectionDefaults(options)
    this._streams = listens.map((listen, shard) => new EventStream({
      connect: () => new pg.Client({ ...streamConnection, ...listen }),
      cache: this._caches[shard],
      // Features are cached with one database only: which shard holds a
      // tenant is the proxy's to know, so with several the answers come
      // from the database through it (has_feature, routed).
      features: listens.length === 1 ? this.features : null,
      emit: (kind, event) => this.emit(kind, Object.assign(event, { shard })),
      onError: (err) => {
        if (listens.length > 1) /** @type {{ shard?: number }} */ (err).shard = shard
        this._reportError(err, 'listen')
      },
      onState: (connected) => this.emit(connected ? 'connected' : 'disconnected', { shard }),
      reconnect: options.reconnect
    }))
  }

  /**
   * An error no call is waiting for (an idle pool connection, a LISTEN
   * session, which reconnects by itself): to fm.on('error') with
   * err.source, or, when nothing listens, logged once per source and code.
   * @param {unknown} err
   * @param {'pool' | 'listen'} source
   */
  _reportError (err, source) {
    const e = /** @type {import('./outcome').Failure & { source?: string } | null | undefined} */ (err)
    if (err && typeof err === 'object') /** @type {{ source?: string }} */ (err).source = source
    if (this.listenerCount('error') > 0) {
      this.emit('error', err)
      return
    }
    const kind = `${source} ${e?.code ?? e?.message}`
    if (this._logged.has(kind)) return
    this._logged.add(kind)
    console.warn(`flagmeter: ${source}: ${e?.message ?? err} (logged once per kind; fm.on('error') hears every one)`)
  }

  _open () {
    if (this._closing) throw new FlagMeterClosedError()
  }

  /**
   * An unbatched call on the request path (src/request_path.js).
   * @template T
   * @param {(db: LentClient) => Promise<T>} fn
   * @param {boolean} retryUnknown
   * @param {number} [timeoutMs]
   * @returns {Promise<T>}
   */
  _call (fn, retryUnknown, timeoutMs) {
    try {
      this._open()
    } catch (err) {
      return Promise.reject(err)
    }
    return this._path.call(fn, retryUnknown, timeoutMs)
  }

  /** @type {PublishedFlagMeter['ready']} Resolves once the cache holds its first snapshot (rejects if closed first). */
  ready () {
    if (this._streams.length === 0) return Promise.reject(new TypeError('flagmeter was created with listen: false'))
    return Promise.all(this._streams.map((s) => s.ready())).then(() => {})
  }

  /**
   * Queue the call made by makeCall (which checks its arguments) on a batcher.
   * @template Item, Result
   * @param {Batcher<Item, Result>} batcher
   * @param {() => Item} makeCall
   * @returns {Promise<Result>}
   */
  _push (batcher, makeCall) {
    try {
      this._open()
      return batcher.push(makeCall())
    } catch (err) {
      return Promise.reject(err)
    }
  }

  /** @type {PublishedFlagMeter['track']} Records usage; resolves after the event is durably committed. */
  track (tenant, meter, amount = 1, options = {}) {
    return this._push(this._tracks, () => calls.trackCall(tenant, meter, amount, options))
  }

  /**
   * @overload
   * @param {string} tenant
   * @param {string} meter
   * @param {Int} [amount]
   * @param {ConsumeOptions} [options]
   * @returns {Promise<Decision>}
   */
  /**
   * @overload
   * @param {string} tenant
   * @param {string[]} meters
   * @param {Int[]} amounts
   * @param {ConsumeOptions} [options]
   * @returns {Promise<Decision[]>}
   */
  /**
   * Checks the limit and records, atomically; grouped like track.
   * @param {string} tenant
   * @param {string | string[]} meter  several: all or nothing
   * @param {Int | Int[]} [amount]
   * @param {ConsumeOptions} [options]
   * @returns {Promise<Decision | Decision[]>}
   */
  consume (tenant, meter, amount = 1, options = {}) {
    return this._push(this._consumes, () => calls.consumeCall(tenant, meter, amount, options))
  }

  /**
   * Spends options.cost (default 1) units of key's rate limit, rate units
   * per per (seconds or an interval text) in bursts of burst (default rate),
   * shared by every session of the database server (flagmeter.limit).
   * Grouped like consume, into one limit_batch call.  Not transactional: a
   * unit granted stays spent.
   * @type {PublishedFlagMeter['rateLimit']}
   */
  rateLimit (key, options) {
    return this._push(this._rateLimits, () => calls.rateLimitCall(key, options))
  }

  /**
   * Records that value was seen on a unique meter (flagmeter.track_value):
   * true when it was new in its period.  Never refused by the limit.
   * Grouped: concurrent calls go as one statement, answered in order.
   * @type {PublishedFlagMeter['trackValue']}
   */
  trackValue (tenant, meter, value, options = {}) {
    return this._push(this._trackValues, () => calls.valueCall(tenant, meter, value, options))
  }

  /**
   * Granted when value is counted in the current period already, or when
   * one more value fits the limit (then counted): flagmeter.consume_value.
   * Grouped like trackValue.
   * @type {PublishedFlagMeter['consumeValue']}
   */
  consumeValue (tenant, meter, value) {
    return this._push(this._consumeValues, () => calls.valueCall(tenant, meter, value))
  }

  /**
   * Frees value in the current period (flagmeter.forget_value): true when
   * it was counted there.  Grouped like trackValue.
   * @type {PublishedFlagMeter['forgetValue']}
   */
  forgetValue (tenant, meter, value) {
    return this._push(this._forgetValues, () => calls.valueCall(tenant, meter, value))
  }

  /** @type {PublishedFlagMeter['check']} The exact decision for amount more, recording nothing (a database read). */
  async check (tenant, meter, amount = 1) {
    calls.checkName(tenant, 'tenant')
    calls.checkName(meter, 'meter')
    calls.checkAmount(amount, 'amount', false)
    return this._call((db) => new Transaction(db).check(tenant, meter, amount), true)
  }

  /** @type {PublishedFlagMeter['balance']} Quota left plus what the tenant's active credit grants hold (a database read; null: unlimited). */
  async balance (tenant, meter) {
    calls.checkName(tenant, 'tenant')
    calls.checkName(meter, 'meter')
    return this._call((db) => new Transaction(db).balance(tenant, meter), true)
  }

  /**
   * Resolves once the database answered a trivial query on the request
   * path (readiness probes); rejects with FlagMeterNotAppliedError when it
   * did not within timeoutMs (default: the client's timeoutMs).
   * @type {PublishedFlagMeter['ping']}
   */
  async ping ({ timeoutMs = this._path.timeoutMs } = {}) {
    await this._call((db) => db.query('SELECT 1'), true, positive(timeoutMs, 'timeoutMs', this._path.timeoutMs))
  }

  /** Whether every LISTEN session is connected and caught up (false without one). */
  get connected () {
    return this._streams.length > 0 && this._streams.every((s) => s.synced)
  }

  /**
   * Hold amount against the quota and grants until settle, release or the
   * ttl (seconds or an interval text; default DEFAULTS.reserveTtl); committed when it
   * resolves.  Unbatched: one transaction per call.
   * @type {PublishedFlagMeter['reserve']}
   */
  async reserve (tenant, meter, amount, options = {}) {
    const { key } = calls.reserveCall(tenant, meter, amount, options)
    return this._call((db) => new Transaction(db).reserve(tenant, meter, amount, options), key !== null)
  }

  /** @type {PublishedFlagMeter['settle']} Record actual for a reservation and free the rest of its hold; the decision of the recorded usage. */
  async settle (reservationId, actual) {
    calls.checkReservation(reservationId, actual)
    return this._call((db) => new Transaction(db).settle(reservationId, actual), false)
  }

  /** @type {PublishedFlagMeter['release']} Free a reservation's hold without recording usage; false when it had ended already. */
  async release (reservationId) {
    calls.checkReservation(reservationId)
    return this._call((db) => new Transaction(db).release(reservationId), false)
  }

  /** @type {PublishedFlagMeter['isBlocked']} Whether the tenant is blocked at a hard limit of the meter, from the cache. */
  isBlocked (tenant, meter) {
    return this._caches.some((c) => c.isBlocked(tenant, meter))
  }

  /**
   * Two calls under one name, told apart by the second argument's type so
   * that neither can be taken for the other: limit(key, options), options
   * an object, is the rate limiter (rateLimit, the name issue 37's API
   * gives it); limit(tenant, meter), meter a string, the limit in force for
   * the tenant and meter from the cache (undefined: none).
   * @overload
   * @param {string} first the tenant
   * @param {string} second the meter
   * @returns {import('./interfaces').Limit | undefined}
   */
  /**
   * @overload
   * @param {string} first the key
   * @param {import('./interfaces').RateLimitOptions} second
   * @returns {Promise<import('./interfaces').RateDecision>}
   */
  /**
   * @param {string} first
   * @param {string | import('./interfaces').RateLimitOptions} second
   * @returns {import('./interfaces').Limit | undefined | Promise<import('./interfaces').RateDecision>}
   */
  limit (first, second) {
    if (typeof second === 'object' && second !== null) return this.rateLimit(first, second)
    if (typeof second !== 'string') {
      throw new TypeError('limit(key, { rate, per }) or limit(tenant, meter): the second argument is an options object or a meter name')
    }
    for (const c of this._caches) {
      const l = c.limit(first, second)
      if (l !== undefined) return l
    }
    return undefined
  }

  /**
   * { enabled, config } of the tenant's feature: from the feature cache,
   * which loads the tenant on first use and follows feature_changed and
   * plan_changed after; from the database (has_feature, feature_config)
   * while the event stream is not connected, or without one (listen:
   * false), and once for a feature the cache does not know.  An unknown
   * feature rejects as the SQL calls do (42704).
   * @param {string} tenant
   * @param {string} feature
   * @returns {Promise<{ enabled: boolean, config: import('./interfaces').FeatureConfig }>}
   */
  async _feature (tenant, feature) {
    calls.checkName(tenant, 'tenant')
    calls.checkName(feature, 'feature')
    this._open()
    const f = this.features
    let answer = f.answer(tenant, feature)
    if (answer !== undefined) return answer
    const stream = this._featureStream()
    if (stream && stream.synced && !f.hasTenant(tenant)) {
      try {
        await this._loadFeatures(tenant)
      } catch (err) {
        // the stream lost its connection (it reconnects), or the listener
        // role cannot read the feature tables: the database answers
        if (stream.synced && this.listenerCount('error') > 0) this.emit('error', err)
      }
      answer = f.answer(tenant, feature)
      if (answer !== undefined) return answer
    }
    answer = await this._call((db) => featureAnswer(db, tenant, feature), true)
    f.know(feature) // it exists: the database did not raise
    return answer
  }

  /** The stream that keeps the feature cache: the only one, or none (listen: false, or several shards). */
  _featureStream () {
    return this._streams.length === 1 ? this._streams[0] : null
  }

  /**
   * One load per tenant at a time, between two events of the stream.
   * @param {string} tenant
   */
  _loadFeatures (tenant) {
    let load = this._featureLoads.get(tenant)
    if (load === undefined) {
      const f = this.features
      const stream = /** @type {EventStream} _feature() calls it with one */ (this._featureStream())
      load = stream.run(async (db) => {
        if (!f.hasTenant(tenant)) f.loadTenant(tenant, await tenantFeatures(db, tenant, (plan) => f.hasPlan(plan)))
      }).finally(() => this._featureLoads.delete(tenant))
      this._featureLoads.set(tenant, load)
    }
    return load
  }

  /** @type {PublishedFlagMeter['hasFeature']} Whether the tenant may use the feature (flagmeter.has_feature), from the feature cache. */
  async hasFeature (tenant, feature) {
    return (await this._feature(tenant, feature)).enabled
  }

  /** @type {PublishedFlagMeter['featureConfig']} The feature's configuration value for the tenant (flagmeter.feature_config), from the feature cache. */
  async featureConfig (tenant, feature) {
    return (await this._feature(tenant, feature)).config
  }

  /** The version of the last quota event applied (null before the first snapshot; of the first shard when several). */
  get version () {
    return this.cache.version
  }

  /** Per shard, in the order of the listen list: the version of its last quota event applied. */
  get versions () {
    return this._caches.map((c) => c.version)
  }

  /** The backend pid of the (first shard's) LISTEN session, null while it is not connected. */
  get listenerPid () {
    return this._streams.length > 0 ? this._streams[0].pid : null
  }

  /** Per shard: the backend pid of its LISTEN session, null while it is not connected. */
  get listenerPids () {
    return this._streams.map((s) => s.pid)
  }

  /**
   * Run fn(tx) in one transaction on a pool connection: tx.track,
   * tx.consume, tx.check, the value calls and the others are unbatched and
   * roll back with it.  With a client first, run on that client, inside
   * the transaction the caller manages.
   * @template T
   * @param {import('pg').ClientBase | TransactionFn<T>} clientOrFn
   * @param {TransactionFn<T>} [maybeFn]  with a client first
   * @returns {Promise<T>}
   */
  async transaction (clientOrFn, maybeFn) {
    this._open()
    if (typeof clientOrFn !== 'function') return /** @type {TransactionFn<T>} */ (maybeFn)(new Transaction(clientOrFn))
    let committing = false
    // Until COMMIT is sent nothing can be committed: a fault is not
    // applied, and the function's own errors pass as they are.  Not made
    // again: the function is the app's, and may have done more than SQL.
    /** @type {import('./request_path').Classify} */
    const classify = (err, sent, connectionFailed) => {
      if (committing) return outcomeOf(err, sent)
      if (err instanceof pg.DatabaseError || connectionFailed) return outcomeOf(err, true) === 'refused' ? 'refused' : 'not_applied'
      return null
    }
    return this._path.attempt(async (client) => {
      await client.query('BEGIN')
      let result
      try {
        result = await clientOrFn(new Transaction(client))
      } catch (err) {
        await client.query('ROLLBACK').catch(() => {})
        throw err
      }
      committing = true
      await client.query('COMMIT')
      return result
    }, Date.now() + this._path.timeoutMs, classify)
  }

  /**
   * How many calls went in how many groups (server transactions), per kind
   * of grouped call;
   * groups split because one call's input was refused; calls sent again
   * after a fault; LISTEN reconnects.
   */
  stats () {
    const batchers = Object.values(this._batchers)
    /** @param {Batcher<any, any>} b */
    const kind = (b) => ({ calls: b.calls, groups: b.groups })
    const b = this._batchers
    return {
      track: kind(b.track),
      consume: kind(b.consume),
      rateLimit: kind(b.rateLimit),
      trackValue: kind(b.trackValue),
      consumeValue: kind(b.consumeValue),
      forgetValue: kind(b.forgetValue),
      splits: batchers.reduce((n, x) => n + x.splits, 0),
      retries: batchers.reduce((n, x) => n + x.retries, 0),
      reconnects: this._streams.reduce((n, s) => n + s.reconnects, 0)
    }
  }

  /**
   * Stop taking calls, send and wait for what is pending, then end the
   * LISTEN session and, if this client created it, the pool.  Idempotent.
   */
  close () {
    if (!this._closing) {
      this._closing = (async () => {
        await Promise.all(Object.values(this._batchers).map((b) => b.drain()))
        await Promise.all(this._streams.map((s) => s.close()))
        this._path.closed = true
        if (this._ownsPool) await this.pool.end()
      })()
    }
    return this._closing
  }
}

module.exports = { FlagMeter, Transaction }
