'use strict'
// The calls of unique meters (aggregation 'unique': distinct values per
// period, such as monthly active users), in one place: the Node client has
// no methods for them yet, so they are its SQL functions, run through the
// client's fm.transaction().  That keeps what the client's own calls give
// the app: the call's deadline (FLAGMETER_TIMEOUT_MS), a durable answer
// (resolved after COMMIT), and the outcome of a failure (not_applied or
// unknown: the app's 503; input the database refused: its own error, with
// the SQLSTATE, the app's 400).  When the client has fm.trackValue and
// fm.consumeValue, these two become calls of them.
const { types } = require('./sql/types')

const trackText = 'SELECT flagmeter.track_value($1, $2, $3) AS new'

// the columns of flagmeter.decision as the client reads them (retry_after
// in whole milliseconds, rounded up, like its own consume)
const consumeText = `
SELECT d.granted, d.used, d.quota, d.remaining, d.resets_at, d.overage, d.meter, d.reason,
       d.from_grants, d.balance, ceil(extract(epoch FROM d.retry_after) * 1000)::float8 AS retry_after_ms
FROM flagmeter.consume_value($1, $2, $3) d`

/** @param {import('flagmeter').FlagMeter} fm */
function createValueCalls (fm) {
  /** One statement in a transaction of the client's: its rows. */
  function run (text, values) {
    return fm.transaction(async (tx) => (await tx.client.query({ text, values, types })).rows)
  }

  return {
    /**
     * Records that value was seen now on a unique meter (never refused by
     * the limit): true when it is new in the current period.
     * @returns {Promise<boolean>}
     */
    async trackValue (tenant, meter, value) {
      return (await run(trackText, [tenant, meter, value]))[0].new
    },

    /**
     * Granted when value is counted in the period already or one more
     * fits; refused at a hard limit (quota_exceeded) or for the rate
     * (rate_limited), recording nothing.  The client's Decision shape.
     */
    async consumeValue (tenant, meter, value) {
      const [d] = await run(consumeText, [tenant, meter, value])
      return {
        granted: d.granted,
        used: d.used,
        quota: d.quota,
        remaining: d.remaining,
        resetsAt: d.resets_at,
        overage: d.overage,
        meter: d.meter,
        reason: d.reason,
        fromGrants: d.from_grants,
        balance: d.balance,
        retryAfterMs: d.retry_after_ms
      }
    }
  }
}

module.exports = { createValueCalls }
