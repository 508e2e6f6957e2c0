'use strict'

/** Raised for calls made after close() began, and by ready() when closed first. */
class FlagMeterClosedError extends Error {
  constructor (message = 'flagmeter client is closed') {
    super(message)
    this.name = 'FlagMeterClosedError'
    this.code = 'FLAGMETER_CLOSED'
  }
}

module.exports = { FlagMeterClosedError }
