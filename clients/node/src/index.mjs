// ESM entry: the CommonJS module's exports.
import cjs from './index.js'

export const { FlagMeter, Transaction, FlagMeterClosedError, FlagMeterNotAppliedError, FlagMeterOutcomeUnknownError } = cjs
export default cjs
