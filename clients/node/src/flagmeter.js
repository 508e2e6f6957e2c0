'use strict'
// FlagMeter: the client an app instance keeps for its life.  It wires the
// pieces together and owns what it opened:
//   - the request path: a pg Pool (the app's, or one it creates), used by
//     two Batchers, one for track and one for consume (src/batcher.js), and
//     by check and transaction();
//   - the event stream: a connection of its own for LISTEN, its catch-up
//     and the QuotaCache it keeps (src/event_stream.js, src/cache.js).

const { EventEmitter } = require('node:events')
const pg = require('pg')

const { Batcher } = require('./batcher')
const { QuotaCache } = require('./cache')
const { EventStream } = require('./event_stream')
const { FlagMeterClosedError } = require('./errors')
const calls = require('./calls')
const { check } = require('./sql/check')
const { track } = require('./sql/track')
const { consume } = require('./sql/consume')
const { consumeMeters } = require('./sql/consumeMeters')

const EVENT_KINDS = ['threshold', 'blocked', 'unblocked', 'limit_changed', 'plan_changed',
  'grant_low', 'grant_exhausted', 'grant_expired', 'invalidate']

/** Calls that run in one transaction the caller holds: unbatched. */
class Transaction {
  constructor (client) {
    this.client = client
  }

  async track (tenant, meter, amount = 1, options = {}) {
    const c = calls.trackCall(tenant, meter, amount, options)
    return { counted: await track(this.client, c.tenant, c.meter, c.amount, c.occurredAt, c.key) }
  }

  async consume (tenant, meter, amount = 1, options = {}) {
    const c = calls.consumeCall(tenant, meter, amount, options)
    if (!c.multi) return calls.decision(await consume(this.client, c.tenant, c.meters[0], c.amounts[0], c.key))
    return (await consumeMeters(this.client, c.tenant, c.meters, c.amounts, c.key)).map(calls.decision)
  }

  async check (tenant, meter, amount = 1) {
    calls.checkName(tenant, 'tenant')
    calls.checkName(meter, 'meter')
    calls.checkAmount(amount, 'amount', false)
    return calls.decision(await check(this.client, tenant, meter, amount))
  }
}

function poolConfig (options) {
  if (options.connectionString) return { connectionString: options.connectionString, max: options.poolSize ?? 20 }
  if (options.connection) return { max: options.poolSize ?? 20, ...options.connection }
  return null
}

function listenConfig (options) {
  if (options.listen === false) return null
  if (typeof options.listen === 'string') return { connectionString: options.listen }
  if (options.listen) return options.listen
  if (options.connectionString) return { connectionString: options.connectionString }
  if (options.connection) {
    const { max, idleTimeoutMillis, connectionTimeoutMillis, ...rest } = options.connection
    return rest
  }
  return null
}

class FlagMeter extends EventEmitter {
  /** @param {import('./index').FlagMeterOptions} options */
  constructor (options = {}) {
    super()
    const own = poolConfig(options)
    if (options.pool && own) throw new TypeError('pass either pool or connection options, not both')
    if (!options.pool && !own) throw new TypeError('flagmeter needs a pg Pool (pool) or connection options (connectionString, connection)')
    this.pool = options.pool ?? new pg.Pool(own)
    this._ownsPool = !options.pool
    this._closing = null
    const batching = { maxInFlight: options.maxInFlight ?? 2, maxGroup: options.maxGroup ?? 500 }
    this._tracks = new Batcher({ ...batching, run: (group) => this._withClient((db) => calls.runTrackGroup(db, group)) })
    this._consumes = new Batcher({ ...batching, run: (group) => this._withClient((db) => calls.runConsumeGroup(db, group)) })
    this.cache = new QuotaCache()
    const listen = listenConfig(options)
    this._stream = listen === null ? null : new EventStream({
      connect: () => new pg.Client(listen),
      cache: this.cache,
      emit: (kind, event) => this.emit(kind, event),
      onError: (err) => { if (this.listenerCount('error') > 0) this.emit('error', err) },
      reconnect: options.reconnect
    })
  }

  async _withClient (fn) {
    const client = await this.pool.connect()
    let broken
    try {
      return await fn(client)
    } catch (err) {
      // a connection error leaves the client unusable: do not return it
      broken = err instanceof pg.DatabaseError ? undefined : err
      throw err
    } finally {
      client.release(broken)
    }
  }

  _open () {
    if (this._closing) throw new FlagMeterClosedError()
  }

  /** Resolves once the cache holds its first snapshot (rejects if closed first). */
  ready () {
    if (!this._stream) return Promise.reject(new TypeError('flagmeter was created with listen: false'))
    return this._stream.ready()
  }

  /** Queue the call made by makeCall (which checks its arguments) on a batcher. */
  _push (batcher, makeCall) {
    try {
      this._open()
      return batcher.push(makeCall())
    } catch (err) {
      return Promise.reject(err)
    }
  }

  /** Records usage; resolves after the event is durably committed. */
  track (tenant, meter, amount = 1, options = {}) {
    return this._push(this._tracks, () => calls.trackCall(tenant, meter, amount, options))
  }

  /** Checks the limit and records, atomically; grouped like track. */
  consume (tenant, meter, amount = 1, options = {}) {
    return this._push(this._consumes, () => calls.consumeCall(tenant, meter, amount, options))
  }

  /** The exact decision for amount more, recording nothing (a database read). */
  async check (tenant, meter, amount = 1) {
    this._open()
    return this._withClient((db) => new Transaction(db).check(tenant, meter, amount))
  }

  /** Whether the tenant is blocked at a hard limit of the meter, from the cache. */
  isBlocked (tenant, meter) {
    return this.cache.isBlocked(tenant, meter)
  }

  /** The limit in force for the tenant and meter, from the cache (undefined: none). */
  limit (tenant, meter) {
    return this.cache.limit(tenant, meter)
  }

  /** The version of the last quota event applied (null before the first snapshot). */
  get version () {
    return this.cache.version
  }

  /** The backend pid of the LISTEN session, null while it is not connected. */
  get listenerPid () {
    return this._stream ? this._stream.pid : null
  }

  /**
   * Run fn(tx) in one transaction on a pool connection: tx.track, tx.consume
   * and tx.check are unbatched and roll back with it.  With a client first,
   * run on that client, inside the transaction the caller manages.
   */
  async transaction (clientOrFn, maybeFn) {
    this._open()
    if (typeof clientOrFn !== 'function') return maybeFn(new Transaction(clientOrFn))
    return this._withClient(async (client) => {
      await client.query('BEGIN')
      try {
        const result = await clientOrFn(new Transaction(client))
        await client.query('COMMIT')
        return result
      } catch (err) {
        await client.query('ROLLBACK').catch(() => {})
        throw err
      }
    })
  }

  /** How many calls went in how many groups (server transactions), per kind. */
  stats () {
    return {
      track: { calls: this._tracks.calls, groups: this._tracks.groups },
      consume: { calls: this._consumes.calls, groups: this._consumes.groups },
      reconnects: this._stream ? this._stream.reconnects : 0
    }
  }

  /**
   * Stop taking calls, send and wait for what is pending, then end the
   * LISTEN session and, if this client created it, the pool.  Idempotent.
   */
  close () {
    if (!this._closing) {
      this._closing = (async () => {
        await Promise.all([this._tracks.drain(), this._consumes.drain()])
        if (this._stream) await this._stream.close()
        if (this._ownsPool) await this.pool.end()
      })()
    }
    return this._closing
  }
}

FlagMeter.EVENT_KINDS = EVENT_KINDS

module.exports = { FlagMeter, Transaction }
