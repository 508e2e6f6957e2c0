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
    this.code = 'FLAGMETER_CLOSED'
    this.outcome = 'not_applied'
  }
}

/**
 * What the two fault errors share: the error that caused the last attempt
 * to fail (cause), its SQLSTATE when the server sent one (sqlstate), how
 * many attempts were made, and whether the call's deadline ended it.
 */
class FlagMeterFaultError extends Error {
  constructor (message, { cause, attempts = 1, timedOut = false } = {}) {
    super(message, { cause })
    this.sqlstate = typeof cause?.code === 'string' && /^[0-9A-Z]{5}$/.test(cause.code) ? cause.code : undefined
    this.attempts = attempts
    this.timedOut = timedOut
  }
}

/** Nothing of the call was recorded; the same call may be made again. */
class FlagMeterNotAppliedError extends FlagMeterFaultError {
  constructor (message, details) {
    super(message, details)
    this.name = 'FlagMeterNotAppliedError'
    this.code = 'FLAGMETER_NOT_APPLIED'
    this.outcome = 'not_applied'
  }
}

/** The call may or may not have been recorded: send it again with the same key to know. */
class FlagMeterOutcomeUnknownError extends FlagMeterFaultError {
  constructor (message, details) {
    super(message, details)
    this.name = 'FlagMeterOutcomeUnknownError'
    this.code = 'FLAGMETER_OUTCOME_UNKNOWN'
    this.outcome = 'unknown'
  }
}

module.exports = { FlagMeterClosedError, FlagMeterNotAppliedError, FlagMeterOutcomeUnknownError }
