'use strict'
// The package's exports, nothing else (types: src/index.d.ts).
const { FlagMeter, Transaction } = require('./flagmeter')
const { FlagMeterClosedError, FlagMeterNotAppliedError, FlagMeterOutcomeUnknownError } = require('./errors')

module.exports = { FlagMeter, Transaction, FlagMeterClosedError, FlagMeterNotAppliedError, FlagMeterOutcomeUnknownError }
