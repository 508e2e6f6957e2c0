'use strict'
// The client's own errors.  Every error a call rejects with says what became
// of the call (err.outcome, README "Faults and retries"):
//   'refused'      the database refused it (bad input, an unknown meter, a
//                  key reused across kinds): node-postgres's DatabaseError,
//                  SQLSTATE in err.code; nothing was recorded, and the same
//                  call will be refused again
//   'not_applied'  FlagMeterNotAppliedError: it was never run, or its
//                  transaction rolled back (no connection, the server
//                  starting or stopping, out of connections, a statement
//                  timeout, a deadlock); nothing was recorded, and the same
//                  call may succeed later
//   'unknown'      FlagMeterOutcomeUnknownError: the connection went while
//                  the statement was with the server, which may or may not
//                  have committed it; a call with an idempotency key is
//                  settled by sending it again with the same key
// Arguments the client checks itself fail with TypeError or RangeError
// before anything is sent.

/** Raised for calls made after close() began, and by ready() when closed first. */
class FlagMeterClosedError extends Error {
  constructor (message = 'flagmeter client is closed') {
    super(message)
    this.name = 'FlagMeterClosedError'
    /** @type {'FLAGMETER_CLOSED'} */
    this.code = 'FLAGMETER_CLOSED'
    /** @type {'not_applied'} */
    this.outcome = 'not_applied'
  }
}

/**
 * What a fault error is made with.
 * @typedef {{ cause?: unknown, attempts?: number, timedOut?: boolean }} FaultDetails
 */

/**
 * What the two fault errors share: the error that caused the last attempt
 * to fail (cause), its SQLSTATE when the server sent one (sqlstate), how
 * many attempts were made, and whether the call's deadline ended it.
 */
class FlagMeterFaultError extends Error {
  /**
   * @param {string} [message]
   * @param {FaultDetails} [details]
   */
  constructor (message, { cause, attempts = 1, timedOut = false } = {}) {
    super(message, { cause })
    const code = /** @type {{ code?: unknown } | null | undefined} */ (cause)?.code
    /** @type {string | undefined} */
    this.sqlstate = typeof code === 'string' && /^[0-9A-Z]{5}$/.test(code) ? code : undefined
    this.attempts = attempts
    this.timedOut = timedOut
  }
}

/** Nothing of the call was recorded; the same call may be made again. */
class FlagMeterNotAppliedError extends FlagMeterFaultError {
  /**
   * @param {string} [message]
   * @param {FaultDetails} [details]
   */
  constructor (message, details) {
    super(message, details)
    this.name = 'FlagMeterNotAppliedError'
    /** @type {'FLAGMETER_NOT_APPLIED'} */
    this.code = 'FLAGMETER_NOT_APPLIED'
    /** @type {'not_applied'} */
    this.outcome = 'not_applied'
  }
}

/** The call may or may not have been recorded: send it again with the same key to know. */
class FlagMeterOutcomeUnknownError extends FlagMeterFaultError {
  /**
   * @param {string} [message]
   * @param {FaultDetails} [details]
   */
  constructor (message, details) {
    super(message, details)
    this.name = 'FlagMeterOutcomeUnknownError'
    /** @type {'FLAGMETER_OUTCOME_UNKNOWN'} */
    this.code = 'FLAGMETER_OUTCOME_UNKNOWN'
    /** @type {'unknown'} */
    this.outcome = 'unknown'
  }
}

module.exports = { FlagMeterClosedError, FlagMeterFaultError, FlagMeterNotAppliedError, FlagMeterOutcomeUnknownError }
