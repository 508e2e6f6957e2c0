// ESM entry: the CommonJS module's exports.
import cjs from './index.js'

export const { FlagMeter, Transaction, FlagMeterClosedError } = cjs
export default cjs
