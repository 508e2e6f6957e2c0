'use strict'
// The request path: the pool every call runs on, with its deadlines and
// retries (README "Faults and retries").
//
// attempt(fn, deadline) is one try: a pool connection by the deadline,
// fn(client) on it, and the connection back to the pool, broken when it
// failed so that the pool ends it rather than lend it again (a connection
// that received a FATAL looks healthy to the pool until its socket closes).
// While the attempt holds the connection it listens to its 'error' event:
// node-postgres emits one on a checked-out client whose server went, and
// an unheard 'error' ends the process.  A failed attempt rejects with an
// error whose outcome is set (src/outcome.js).
//
// call(fn, retryUnknown) is a whole call: attempts until one succeeds, is
// refused, has an unknown outcome and may not be sent again, or the
// deadline passes; in between it waits (doubling, with jitter).  No attempt
// starts with less than minAttemptMs left, and a call that had an attempt
// of unknown outcome fails as unknown.  Grouped
// calls do the same in src/batcher.js, which sends attempts through
// attempt().

const { outcomeOf, callError, leavesConnection } = require('./outcome')

/** @typedef {import('./outcome').CallOutcome} CallOutcome */
/** @typedef {import('./outcome').Failure} Failure */
/**
 * A connection the pool lent, with the fields of node-postgres's Client that
 * say it is ending or ended (not in its types).
 * @typedef {import('pg').PoolClient & { _ending?: boolean, _queryable?: boolean }} LentClient
 */
/**
 * What became of an attempt that threw err: an outcome, or null to let err
 * pass untouched; sent: whether it reached the connection.
 * @typedef {(err: unknown, sent: boolean, connectionFailed: boolean) => CallOutcome | null} Classify
 */

/** @param {number} ms */
function sleep (ms) {
  return new Promise((resolve) => setTimeout(resolve, ms))
}

/**
 * Break a connection now: its query in flight fails at once, whatever the server does.
 * @param {import('pg').PoolClient} client
 */
function destroy (client) {
  const stream = client.connection && client.connection.stream
  if (stream && typeof stream.destroy === 'function') stream.destroy()
  else client.end().catch(() => {})
}

class RequestPath {
  /**
   * @param {import('pg').Pool} pool
   * @param {object} opts
   * @param {number} opts.timeoutMs  a call's deadline
   * @param {{ initialDelayMs: number, maxDelayMs: number }} opts.retry  waits between attempts
   */
  constructor (pool, { timeoutMs, retry }) {
    this.pool = pool
    // Every connection the pool opens is heard for its whole life.  pg-pool
    // stops listening to a connection as it lends it, before attempt() can
    // start: a FATAL read in the same chunk as the login (a backend
    // terminated right after it started) is emitted in that gap, and an
    // unheard 'error' ends the process.  attempt() then finds the
    // connection not queryable and does not send on it.
    pool.on('connect', (client) => client.on('error', () => {}))
    this.timeoutMs = timeoutMs
    this.retry = retry
    this.minAttemptMs = Math.min(250, timeoutMs / 4)
    this.closed = false // the pool is ending: no more attempts
  }

  /**
   * A pool connection by the deadline; a late one goes back to the pool.
   * @param {number} deadline  Date.now() time
   * @returns {Promise<LentClient>}
   */
  _checkout (deadline) {
    return new Promise((resolve, reject) => {
      let done = false
      const timer = setTimeout(() => {
        done = true
        reject(new Error('no pool connection became free in time'))
      }, Math.max(0, deadline - Date.now()))
      this.pool.connect().then((client) => {
        if (done) return client.release()
        done = true
        clearTimeout(timer)
        resolve(client)
      }, (err) => {
        if (done) return
        done = true
        clearTimeout(timer)
        reject(err)
      })
    })
  }

  /**
   * One attempt of fn(client), ended by the deadline (Date.now() time):
   * resolves with its result or rejects with an error whose outcome is set
   * by classify(err, sent, connectionFailed) (null: the error passes
   * untouched, for the app's own errors in a transaction).
   * @template T
   * @param {(client: LentClient) => Promise<T>} fn
   * @param {number} deadline  Date.now() time
   * @param {Classify} [classify]
   * @returns {Promise<T>}
   */
  async attempt (fn, deadline, classify = outcomeOf) {
    let client
    try {
      client = await this._checkout(deadline)
    } catch (err) {
      throw callError(err, outcomeOf(err, false))
    }
    /** @type {unknown} the error that broke the connection, once one did */
    let broken = null
    let sent = false
    let timedOut = false
    const onError = (/** @type {Error} */ err) => { broken = broken ?? err }
    client.on('error', onError)
    const timer = setTimeout(() => {
      timedOut = true
      broken = broken ?? new Error('no answer before the deadline')
      destroy(client)
    }, Math.max(0, deadline - Date.now()))
    try {
      if (broken || client._ending || client._queryable === false) {
        throw broken ?? new Error('the pool lent a connection that had ended')
      }
      sent = true
      return await fn(client)
    } catch (err) {
      const connectionFailed = broken !== null || client._ending || client._queryable === false
      const outcome = timedOut ? (sent ? 'unknown' : 'not_applied') : classify(err, sent, connectionFailed)
      if (outcome === null) throw err
      if (!leavesConnection(err)) broken = broken ?? err
      const cause = timedOut ? new Error(`no answer within the call's deadline (${this.timeoutMs} ms)`) : err
      throw callError(cause, outcome, { timedOut, timeoutMs: this.timeoutMs })
    } finally {
      clearTimeout(timer)
      client.release(/** @type {Error | undefined} */ (broken ?? undefined))
      // a broken connection may still report its end: keep hearing it
      if (!broken) client.removeListener('error', onError)
    }
  }

  /**
   * fn(client) as one call, sent again as the outcome allows until its deadline.
   * @template T
   * @param {(client: LentClient) => Promise<T>} fn
   * @param {boolean} retryUnknown  whether an attempt of unknown outcome may be sent again
   * @param {number} [timeoutMs]
   * @returns {Promise<T>}
   */
  async call (fn, retryUnknown, timeoutMs = this.timeoutMs) {
    const deadline = Date.now() + timeoutMs
    const minAttempt = Math.min(this.minAttemptMs, timeoutMs / 4)
    let delay = this.retry.initialDelayMs
    let unknown = false
    for (let attempts = 1; ; attempts++) {
      try {
        return await this.attempt(fn, deadline)
      } catch (thrown) {
        // what attempt() throws says its outcome (src/outcome.js)
        const err = /** @type {Failure} */ (thrown)
        unknown = unknown || err.outcome === 'unknown'
        const again = err.outcome === 'not_applied' || (err.outcome === 'unknown' && retryUnknown)
        if (!again || this.closed) throw err
        const wait = Math.min(delay * (0.5 + Math.random() / 2), deadline - minAttempt - Date.now())
        if (wait < 0) throw callError(err, unknown ? 'unknown' : /** @type {CallOutcome} */ (err.outcome), { attempts, timedOut: true, timeoutMs })
        await sleep(wait)
        delay = Math.min(delay * 2, this.retry.maxDelayMs)
      }
    }
  }
}

module.exports = { RequestPath }
