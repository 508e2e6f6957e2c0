// ESM entry: the CommonJS module's exports.
import cjs from './index.js'

export const {
  FlagMeter, Transaction, FlagMeterClosedError, FlagMeterFaultError, FlagMeterNotAppliedError, FlagMeterOutcomeUnknownError,
  DEFAULTS, QUOTA_EVENT_KINDS, toInt, checkAmount, parseJson, intTypes
} = cjs
export default cjs
