'use strict'
// The package's exports, nothing else (types: src/index.d.ts, which this
// object is checked against: npm run typecheck).
const { FlagMeter, Transaction } = require('./flagmeter')
const { FlagMeterClosedError, FlagMeterFaultError, FlagMeterNotAppliedError, FlagMeterOutcomeUnknownError } = require('./errors')
const { DEFAULTS } = require('./defaults')
const { QUOTA_EVENT_KINDS } = require('./quota_events')
const { toInt, checkAmount, parseJson, types: intTypes } = require('./numbers')

/** @type {typeof import('./interfaces')} */
const exported = {
  FlagMeter,
  Transaction,
  FlagMeterClosedError,
  FlagMeterFaultError,
  FlagMeterNotAppliedError,
  FlagMeterOutcomeUnknownError,
  DEFAULTS,
  QUOTA_EVENT_KINDS,
  toInt,
  checkAmount,
  parseJson,
  intTypes
}

module.exports = exported
