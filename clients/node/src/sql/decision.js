'use strict'
// The columns of flagmeter.decision as the client selects them, for every
// statement that returns decisions (check, consume, consume_batch, settle).
// retry_after is an interval: it comes back as whole milliseconds, rounded
// up so that a caller who waits retryAfterMs is not early, computed by the
// server from the exact interval (numeric EXTRACT, not a float division).

/**
 * An interval column as whole milliseconds (float8: a JavaScript number), rounded up; NULL stays NULL.
 * @param {string} column
 * @param {string} as
 */
function milliseconds (column, as) {
  return `pg_catalog.ceil(EXTRACT(epoch FROM ${column}) * 1000)::float8 AS ${as}`
}

const DECISION_COLUMNS = 'granted, used, quota, remaining, resets_at, overage, meter, reason, from_grants, balance, ' +
  milliseconds('retry_after', 'retry_after_ms')

module.exports = { DECISION_COLUMNS, milliseconds }
