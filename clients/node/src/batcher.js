'use strict'
// Groups concurrent calls into one server call per transaction, adaptively
// and without a timer (the localQueue idea of graphile-worker, turned
// around: there it fetches jobs in batches, here it sends them).
//
// A call that arrives while fewer than maxInFlight groups are running goes
// at once, alone: an idle app pays no wait.  Calls that arrive while every
// slot is busy queue up, and the next free slot takes all of them (up to
// maxGroup) as one group.  So the group size follows the load: one at low
// rates, about (arrival rate x transaction time / maxInFlight) under load.
//
// Why the limits exist:
// - maxInFlight (default: DEFAULTS.maxInFlight, src/defaults.js): each group holds a pool connection for one
//   transaction.  More groups in flight give smaller groups and more
//   transactions for the same work (and take connections the app's own
//   queries need); fewer leave the database idle while a group commits.  At
//   1 200 connections on the 2-core benchmark machine (bench/node), 2 beat 4
//   in each of three alternating rounds (+6 to +17 % req/s), 1 and 3 were
//   no better than 2, and 8 was worse than 4; a database with more cores
//   may want more.
// - maxGroup (default: DEFAULTS.maxGroup): one statement's arrays, and one transaction's
//   locks and WAL, stay bounded, and a failed group fails at most that many
//   callers.
//
// Faults (README "Faults and retries"): every call has a deadline, timeoutMs
// after it was pushed.  A group that failed without being applied
// (err.outcome 'not_applied') goes back into the queue whole; one whose
// outcome is unknown sends again only the calls that carry an idempotency
// key (canRetryUnknown), and fails the others with the unknown error.  While
// the database is away the queue waits between attempts (retryDelayMs,
// doubling, with jitter), so no attempt loops on a refused connection.  A
// call whose deadline passes, queued or between attempts, fails with the
// last attempt's error marked timedOut, and as unknown when any of its
// attempts was.  No attempt is sent with less than minAttemptMs left (the
// group's deadline is its first call's): a call that close to its deadline
// fails rather than be cut off in flight.
//
// One call's bad input must not fail its neighbours: a group refused with
// an error about one call's input (a tenant never assigned a plan, an event
// time outside the window, an unknown meter, a meter of the wrong kind, an
// amount that overflows: PER_CALL below) wrote nothing, so it is split in two halves, sent again
// before the queue, and split again until the calls whose input was
// refused fail alone, with their own error (about 2 log2(n) attempts for
// one bad call in a group of n).  An error that would meet every call
// (permissions, a missing function) fails the group at once.
//
// Every promise settles: with its own result, with its own refusal
// (SQLSTATE in err.code), with its group's refusal when the error is not
// about one call, with its deadline's error, or with the error close()
// gives calls queued after it.

const { callError } = require('./outcome')
const { DEFAULTS } = require('./defaults')

// SQLSTATEs that refuse one call's input rather than the group: data
// exceptions (22), a key recorded by another call (23505), an unknown or
// badly named meter (42704, 42602), a meter of the wrong kind for the call
// (42809: a value on a meter that does not count distinct values, an
// amount on one that does), too many meters (54000), a key never recorded
// (P0002), and flagmeter's own class QT (QT001 a tenant never assigned a
// plan, QT002 an event time outside the window).
const PER_CALL = /^(22|23505|42704|42602|42809|54000|P0002|QT)/

/** @typedef {import('./outcome').Failure} Failure */
/**
 * A queued call: its item, its promise's ends, and what its attempts left.
 * @template Item, Result
 * @typedef {{
 *   item: Item, resolve: (result: Result) => void, reject: (err: unknown) => void,
 *   deadline: number, attempts: number, lastError: unknown, unknown: boolean
 * }} Queued
 */

/**
 * @template Item  a call, as run() takes it
 * @template Result  its answer
 */
class Batcher {
  /**
   * @param {object} opts
   * @param {(items: Item[], deadline: number) => Promise<Result[]>} opts.run
   *        one attempt: one result per item, in order; rejects with an
   *        error whose outcome is set (src/outcome.js); deadline: Date.now()
   *        time by which the attempt must end
   * @param {number} [opts.maxInFlight]
   * @param {number} [opts.maxGroup]
   * @param {number} [opts.timeoutMs]  each call's deadline, from its push
   * @param {(item: Item) => boolean} [opts.canRetryUnknown]  whether an item may be sent again after an unknown outcome
   * @param {{ initialDelayMs?: number, maxDelayMs?: number }} [opts.retry]
   */
  constructor ({
    run, maxInFlight = DEFAULTS.maxInFlight, maxGroup = DEFAULTS.maxGroup, timeoutMs = DEFAULTS.timeoutMs,
    canRetryUnknown = () => false, retry = {}
  }) {
    if (!Number.isInteger(maxInFlight) || maxInFlight < 1) throw new RangeError(`maxInFlight must be a positive integer: ${maxInFlight}`)
    if (!Number.isInteger(maxGroup) || maxGroup < 1) throw new RangeError(`maxGroup must be a positive integer: ${maxGroup}`)
    this._run = run
    this._maxInFlight = maxInFlight
    this._maxGroup = maxGroup
    this._timeoutMs = timeoutMs
    this._canRetryUnknown = canRetryUnknown
    this._initialDelay = retry.initialDelayMs ?? DEFAULTS.retry.initialDelayMs
    this._maxDelay = retry.maxDelayMs ?? DEFAULTS.retry.maxDelayMs
    this._minAttempt = Math.min(250, timeoutMs / 4)
    this._delay = this._initialDelay
    /** @type {Array<Queued<Item, Result>>} */
    this._queue = [] // by deadline, earliest first
    /** @type {Array<Array<Queued<Item, Result>>>} */
    this._splits = [] // halves of refused groups, sent as they are, before the queue
    this._inFlight = 0
    /** @type {Array<() => void>} */
    this._idle = []
    this._retryAt = 0
    /** @type {NodeJS.Timeout | null} */
    this._resumeTimer = null
    /** @type {NodeJS.Timeout | null} */
    this._expiryTimer = null
    this.groups = 0
    this.calls = 0
    this.retries = 0
    this.splits = 0
  }

  /**
   * Queue one call; resolves with its result once its group committed.
   * @param {Item} item
   * @returns {Promise<Result>}
   */
  push (item) {
    this.calls++
    return new Promise((resolve, reject) => {
      this._queue.push({ item, resolve, reject, deadline: Date.now() + this._timeoutMs, attempts: 0, lastError: null, unknown: false })
      this._pump()
    })
  }

  /**
   * Resolves when nothing is queued or running (close() waits for it).
   * @returns {Promise<void>}
   */
  drain () {
    if (this._idleNow()) return Promise.resolve()
    return new Promise((resolve) => this._idle.push(resolve))
  }

  _idleNow () {
    return this._queue.length === 0 && this._splits.length === 0 && this._inFlight === 0
  }

  _pump () {
    const wait = this._retryAt - Date.now()
    if (wait > 0 && this._queue.length > 0) {
      if (this._resumeTimer === null) {
        this._resumeTimer = setTimeout(() => { this._resumeTimer = null; this._pump() }, wait)
      }
    } else {
      this._expire(Date.now() + this._minAttempt)
    }
    // a split half goes whatever the backoff: its group was refused, not
    // turned away by a database that is away
    while (this._inFlight < this._maxInFlight && (this._splits.length > 0 || (wait <= 0 && this._queue.length > 0))) {
      const group = this._splits.length > 0 ? this._takeSplit() : this._queue.splice(0, this._maxGroup)
      if (group.length === 0) continue
      this._inFlight++
      this.groups++
      this._send(group)
    }
    this._armExpiry()
    if (this._idleNow()) {
      const idle = this._idle
      this._idle = []
      for (const resolve of idle) resolve()
    }
  }

  /** @param {Array<Queued<Item, Result>>} group */
  async _send (group) {
    // the queue is by deadline: the first call's is the group's
    const deadline = group[0].deadline
    for (const g of group) g.attempts++
    try {
      const results = await this._run(group.map((g) => g.item), deadline)
      if (!Array.isArray(results) || results.length !== group.length) {
        throw new Error(`flagmeter: a group of ${group.length} calls got ${results && results.length} answers`)
      }
      this._delay = this._initialDelay
      group.forEach((g, i) => g.resolve(results[i]))
    } catch (err) {
      this._failed(group, err)
    } finally {
      this._inFlight--
      this._pump()
    }
  }

  /**
   * A group's attempt failed: send again what may be sent again, fail the rest.
   * @param {Array<Queued<Item, Result>>} group
   * @param {unknown} err  what run() rejected with: its outcome set (refused when not)
   */
  _failed (group, err) {
    const outcome = /** @type {Failure} */ (err).outcome ?? 'refused'
    const code = /** @type {{ code?: unknown }} */ (err).code
    if (outcome === 'refused' && group.length > 1 && typeof code === 'string' && PER_CALL.test(code)) {
      const half = Math.ceil(group.length / 2)
      this._splits.push(group.slice(0, half), group.slice(half))
      this.splits++
      return
    }
    const again = []
    const last = Date.now() + this._minAttempt
    for (const g of group) {
      g.lastError = err
      if (outcome === 'unknown') g.unknown = true
      const retryable = outcome === 'not_applied' || (outcome === 'unknown' && this._canRetryUnknown(g.item))
      if (retryable && g.deadline > last) again.push(g)
      else g.reject(retryable ? this._expired(g) : callError(err, outcome))
    }
    if (outcome === 'refused') return
    // the database is away or busy: the next attempts, of these calls or
    // of new ones, wait
    this._retryAt = Date.now() + this._delay * (0.5 + Math.random() / 2)
    this._delay = Math.min(this._delay * 2, this._maxDelay)
    if (again.length === 0) return
    this.retries += again.length
    this._queue = mergeByDeadline(again, this._queue)
  }

  /**
   * The error of a call whose deadline passed (or is too near for an
   * attempt): its last attempt's, marked timedOut; unknown when any
   * attempt's outcome was.
   * @param {Queued<Item, Result>} g
   */
  _expired (g) {
    const err = /** @type {Failure} */ (g.lastError ?? new Error('no pool connection became free'))
    const outcome = g.unknown ? 'unknown' : err.outcome ?? 'not_applied'
    return callError(err, outcome, { attempts: g.attempts, timedOut: true, timeoutMs: this._timeoutMs })
  }

  /**
   * The next split half, without the calls too near their deadline for an
   * attempt (they fail as expired).
   * @returns {Array<Queued<Item, Result>>}
   */
  _takeSplit () {
    const half = /** @type {Array<Queued<Item, Result>>} not empty */ (this._splits.shift())
    const last = Date.now() + this._minAttempt
    return half.filter((g) => {
      if (g.deadline > last) return true
      g.reject(this._expired(g))
      return false
    })
  }

  /**
   * Fail the queued calls whose deadline is before `by`.
   * @param {number} by  Date.now() time
   */
  _expire (by) {
    while (this._queue.length > 0 && this._queue[0].deadline <= by) {
      const g = /** @type {Queued<Item, Result>} not empty */ (this._queue.shift())
      g.reject(this._expired(g))
    }
  }

  /** One timer, at the earliest queued deadline, fails the calls whose deadline passed. */
  _armExpiry () {
    if (this._queue.length === 0) {
      // nothing left to expire: no timer outlives the calls
      if (this._expiryTimer !== null) clearTimeout(this._expiryTimer)
      this._expiryTimer = null
      return
    }
    if (this._expiryTimer !== null) return
    this._expiryTimer = setTimeout(() => {
      this._expiryTimer = null
      this._expire(Date.now())
      this._pump()
    }, Math.max(0, this._queue[0].deadline - Date.now()))
  }
}

/**
 * Two lists ordered by deadline, as one.
 * @template {{ deadline: number }} T
 * @param {T[]} a
 * @param {T[]} b
 * @returns {T[]}
 */
function mergeByDeadline (a, b) {
  const out = []
  let i = 0
  let j = 0
  while (i < a.length && j < b.length) out.push(a[i].deadline <= b[j].deadline ? a[i++] : b[j++])
  while (i < a.length) out.push(a[i++])
  while (j < b.length) out.push(b[j++])
  return out
}

module.exports = { Batcher }
