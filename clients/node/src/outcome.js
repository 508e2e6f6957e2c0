'use strict'
// What became of a call whose attempt failed: the rules behind err.outcome
// (src/errors.js, README "Faults and retries").
//
// The client sends every statement in autocommit, one statement per
// transaction, so the moment it was sent divides the failures:
// - Before it was sent (no connection from the pool, the server refusing
//   the connection: starting up, shutting down, out of connections), the
//   call was not applied.
// - After, an ErrorResponse of severity ERROR means the statement's
//   transaction rolled back: not applied.  Whether the same call can
//   succeed later depends on the SQLSTATE: a statement timeout, a deadlock,
//   a standby that became read-only can pass; bad input cannot (refused).
// - After, a connection that went (a socket error, a FATAL such as
//   pg_terminate_backend's 57P01, the server stopping) leaves the outcome
//   unknown: the server may have committed before the session ended.
const pg = require('pg')
const { FlagMeterNotAppliedError, FlagMeterOutcomeUnknownError } = require('./errors')

// SQLSTATEs after which the same call may succeed: it did not run, or its
// transaction rolled back for a reason of the moment.
const TRANSIENT = /^(08|53|57P0[1-5]|57014|40001|40P01|55P03|25006|25P03)/

// SQLSTATEs of a connection refused for good (authentication, no such
// database or role): trying again only delays the error.
const CONFIGURATION = /^(28|3D)/

/** @typedef {import('./interfaces').CallOutcome} CallOutcome */
/**
 * A thrown value as the client reads it (anything can be thrown): pg's
 * errors carry code and severity, the client's outcome and cause.
 * @typedef {{ code?: string, severity?: string, outcome?: CallOutcome, message?: string, cause?: unknown }} Failure
 */

/**
 * @param {unknown} err
 * @returns {err is import('pg').DatabaseError}
 */
function isServerError (err) {
  return err instanceof pg.DatabaseError
}

/**
 * Whether the connection can still be used after err (an ERROR leaves it usable).
 * @param {unknown} err
 */
function leavesConnection (err) {
  return isServerError(err) && err.severity === 'ERROR'
}

/**
 * 'refused' | 'not_applied' | 'unknown' for a failed attempt; sent: whether
 * the statement had been handed to the connection.
 * @param {unknown} err
 * @param {boolean} sent
 * @returns {CallOutcome}
 */
function outcomeOf (err, sent) {
  const marked = /** @type {Failure | null | undefined} */ (err)?.outcome
  if (typeof marked === 'string') return marked
  const code = isServerError(err) ? err.code ?? '' : ''
  if (!sent) return CONFIGURATION.test(code) ? 'refused' : 'not_applied'
  if (leavesConnection(err)) return TRANSIENT.test(code) ? 'not_applied' : 'refused'
  return 'unknown'
}

/**
 * outcomeOf for a statement that spends from the rate limiters (limit_batch):
 * they live in shared memory, so what a statement spent stays spent when its
 * transaction rolls back.  An ERROR after it was sent that another attempt
 * could pass (a statement timeout, 53400 for a full table of keys after
 * earlier keys of the group were spent) may have spent part of it: unknown,
 * not not_applied.  Input refused (class 22) is checked before any key is
 * spent: refused stays refused.
 * @param {unknown} err
 * @param {boolean} sent
 * @returns {CallOutcome}
 */
function spendingOutcomeOf (err, sent) {
  const outcome = outcomeOf(err, sent)
  return outcome === 'not_applied' && sent ? 'unknown' : outcome
}

/**
 * The error a caller gets for a failed call: a refused call's own error
 * (marked), or one of the client's fault errors with the last cause.
 * @param {unknown} err
 * @param {CallOutcome} outcome
 * @param {{ attempts?: number, timedOut?: boolean, timeoutMs?: number }} [details]  timeoutMs: for the message
 * @returns {unknown}
 */
function callError (err, outcome, { attempts = 1, timedOut = false, timeoutMs } = {}) {
  if (outcome === 'refused') {
    const failure = /** @type {Failure} */ (err)
    if (err && typeof err === 'object' && failure.outcome === undefined) failure.outcome = 'refused'
    return err
  }
  if (err instanceof FlagMeterNotAppliedError || err instanceof FlagMeterOutcomeUnknownError) {
    if (err.outcome === outcome && (!timedOut || err.timedOut)) return err
    err = err.cause ?? err
  }
  const why = /** @type {Failure | null | undefined} */ (err)?.message ?? String(err)
  const within = timedOut ? ` within its deadline (${timeoutMs} ms, ${attempts} attempt${attempts === 1 ? '' : 's'})` : ''
  const details = { cause: err, attempts, timedOut }
  if (outcome === 'unknown') {
    return new FlagMeterOutcomeUnknownError(`flagmeter: the outcome of the call is unknown${within}: ${why}`, details)
  }
  return new FlagMeterNotAppliedError(`flagmeter: the call was not applied${within}: ${why}`, details)
}

module.exports = { outcomeOf, spendingOutcomeOf, callError, leavesConnection }
