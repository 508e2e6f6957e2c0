'use strict'
// The calls as the app makes them, turned into the statements of src/sql:
// grouped (one group = one statement = one transaction) or single (inside
// the app's own transaction).  Arguments are checked here, before a call
// can join a group: a bad call fails alone instead of failing its group.

const { checkAmount } = require('./numbers')
const { trackEvents } = require('./sql/trackEvents')
const { consumeBatch } = require('./sql/consumeBatch')
const { limitBatch } = require('./sql/limitBatch')
const { trackValues, consumeValues, forgetValues } = require('./sql/uniqueValues')

/** @typedef {import('./interfaces').Int} Int */
/** @typedef {import('./interfaces').Decision} Decision */
/** @typedef {{ tenant: string, meter: string, amount: Int, occurredAt: Date | null, key: string | null }} TrackCall */
/** @typedef {{ tenant: string, meters: string[], amounts: Int[], key: string | null, multi: boolean }} ConsumeCall */
/** @typedef {{ tenant: string, meter: string, amount: Int, ttl: string | null, key: string | null }} ReserveCall */
/** @typedef {{ key: string, rate: Int, per: string, burst: Int | null, cost: Int | null }} RateLimitCall */
/** @typedef {{ tenant: string, meter: string, value: string, occurredAt: Date | null }} ValueCall */

/**
 * @param {unknown} value
 * @param {string} what  its name in the error
 * @returns {string}
 */
function checkName (value, what) {
  if (typeof value !== 'string' || value.length === 0) {
    throw new TypeError(`${what} must be a non-empty string`)
  }
  return value
}

/**
 * @param {unknown} key
 * @returns {string | null}
 */
function checkKey (key) {
  if (key === undefined || key === null) return null
  return checkName(key, 'key')
}

/**
 * @param {unknown} value
 * @returns {Date | null}
 */
function checkDate (value) {
  if (value === undefined || value === null) return null
  if (!(value instanceof Date) || Number.isNaN(value.getTime())) {
    throw new TypeError('occurredAt must be a valid Date')
  }
  return value
}

/**
 * A track call, checked: { tenant, meter, amount, occurredAt, key }.
 * @param {unknown} tenant
 * @param {unknown} meter
 * @param {unknown} [amount]
 * @param {import('./interfaces').TrackOptions} [options]
 * @returns {TrackCall}
 */
function trackCall (tenant, meter, amount = 1, options = {}) {
  return {
    tenant: checkName(tenant, 'tenant'),
    meter: checkName(meter, 'meter'),
    amount: checkAmount(amount, 'amount', false),
    occurredAt: checkDate(options.occurredAt),
    key: checkKey(options.key)
  }
}

/**
 * A consume call, checked: { tenant, meters, amounts, key, multi }.
 * @param {unknown} tenant
 * @param {unknown} meter  a meter, or an array of them (multi)
 * @param {unknown} [amount]  an amount, or an array of as many (multi)
 * @param {import('./interfaces').ConsumeOptions} [options]
 * @returns {ConsumeCall}
 */
function consumeCall (tenant, meter, amount = 1, options = {}) {
  checkName(tenant, 'tenant')
  const multi = Array.isArray(meter)
  const meters = multi ? meter : [meter]
  const amounts = multi ? amount : [amount]
  if (!Array.isArray(amounts) || amounts.length !== meters.length) {
    throw new TypeError('consume of several meters takes an array of as many amounts')
  }
  if (meters.length === 0) throw new RangeError('meters must not be empty')
  meters.forEach((m) => checkName(m, 'meter'))
  amounts.forEach((a) => checkAmount(a, 'amount', true))
  if (new Set(meters).size !== meters.length) throw new RangeError('a meter is listed twice')
  return {
    // checked above, as each meter and amount
    tenant: /** @type {string} */ (tenant),
    meters: /** @type {string[]} */ (meters),
    amounts: /** @type {Int[]} */ (amounts),
    key: checkKey(options.key),
    multi
  }
}

/**
 * A row of consume, consume_batch or check as a Decision.
 * @param {import('./sql/rows').DecisionRow} row
 * @returns {Decision}
 */
function decision (row) {
  return {
    granted: row.granted,
    used: row.used,
    quota: row.quota,
    remaining: row.remaining,
    resetsAt: row.resets_at,
    overage: row.overage,
    meter: row.meter,
    reason: row.reason,
    fromGrants: row.from_grants,
    balance: row.balance,
    retryAfterMs: row.retry_after_ms
  }
}

/** @param {unknown[]} values */
function allNull (values) {
  return values.every((v) => v === null)
}

/**
 * Run a group of track calls; one { counted } per call.
 * @param {import('pg').ClientBase} db
 * @param {TrackCall[]} calls
 * @returns {Promise<import('./interfaces').TrackResult[]>}
 */
async function runTrackGroup (db, calls) {
  const occurred = calls.map((c) => c.occurredAt)
  const keys = calls.map((c) => c.key)
  const counted = await trackEvents(db,
    calls.map((c) => c.tenant), calls.map((c) => c.meter), calls.map((c) => c.amount),
    allNull(occurred) ? null : occurred, allNull(keys) ? null : keys)
  return counted.map((c) => ({ counted: c }))
}

/**
 * Run a group of consume calls; one Decision (or Decision[]) per call.
 * @param {import('pg').ClientBase} db
 * @param {ConsumeCall[]} calls
 * @returns {Promise<Array<Decision | Decision[]>>}
 */
async function runConsumeGroup (db, calls) {
  /** @type {string[]} */
  const tenants = []
  /** @type {string[]} */
  const meters = []
  /** @type {Int[]} */
  const amounts = []
  /** @type {Array<string | null>} */
  const keys = []
  /** @type {number[]} */
  const items = []
  calls.forEach((c, i) => {
    c.meters.forEach((m, j) => {
      tenants.push(c.tenant)
      meters.push(m)
      amounts.push(c.amounts[j])
      keys.push(c.key)
      items.push(i + 1)
    })
  })
  const rows = await consumeBatch(db, tenants, meters, amounts, allNull(keys) ? null : keys, items)
  const byItem = calls.map(() => /** @type {Decision[]} */ ([]))
  for (const row of rows) byItem[row.item - 1].push(decision(row))
  return calls.map((c, i) => (c.multi ? byItem[i] : byItem[i][0]))
}

/**
 * A duration as the client takes it: seconds (a positive number) or a
 * PostgreSQL interval text, which the server reads (and refuses, class 22,
 * when it is not one).
 * @param {unknown} value
 * @param {string} what  its name in the error
 * @returns {string}  an interval text
 */
function checkDuration (value, what) {
  if (typeof value === 'number') {
    if (!Number.isFinite(value) || value <= 0) throw new RangeError(`${what} must be a positive number of seconds: ${value}`)
    return `${value} seconds`
  }
  if (typeof value === 'string' && value !== '') return value
  throw new TypeError(`${what} must be a number of seconds or an interval text`)
}

/**
 * A reservation's ttl (checkDuration); null: the server's default.
 * @param {unknown} ttl
 * @returns {string | null}
 */
function checkTtl (ttl) {
  if (ttl === undefined || ttl === null) return null
  return checkDuration(ttl, 'ttl')
}

/**
 * A reserve call, checked: { tenant, meter, amount, ttl, key }.
 * @param {unknown} tenant
 * @param {unknown} meter
 * @param {unknown} amount
 * @param {import('./interfaces').ReserveOptions} [options]
 * @returns {ReserveCall}
 */
function reserveCall (tenant, meter, amount, options = {}) {
  return {
    tenant: checkName(tenant, 'tenant'),
    meter: checkName(meter, 'meter'),
    amount: checkAmount(amount, 'amount', true),
    ttl: checkTtl(options.ttl),
    key: checkKey(options.key)
  }
}

/**
 * settle's arguments (actual omitted: release's), checked.
 * @param {unknown} reservationId
 * @param {unknown[]} actual  none, or settle's actual
 */
function checkReservation (reservationId, ...actual) {
  checkAmount(reservationId, 'reservationId', true)
  if (actual.length > 0) checkAmount(actual[0], 'actual', false)
}

/**
 * @param {import('./sql/rows').ReservationRow} row
 * @returns {import('./interfaces').Reservation}
 */
function reservation (row) {
  return {
    granted: row.granted,
    reservationId: row.reservation_id,
    reserved: row.reserved,
    expiresAt: row.expires_at,
    balance: row.balance,
    retryAfterMs: row.retry_after_ms
  }
}

/**
 * A rate limit call, checked: { key, rate, per, burst, cost }.  What only
 * the server can judge (a key over 256 bytes, a per outside 1 second to 1
 * hour, a rate too fine for it, an interval text it cannot read) is refused
 * by it, and the call fails alone (src/batcher.js).
 * @param {unknown} key
 * @param {import('./interfaces').RateLimitOptions} options
 * @returns {RateLimitCall}
 */
function rateLimitCall (key, options) {
  if (options === null || typeof options !== 'object') throw new TypeError('rateLimit takes the options { rate, per, burst, cost }')
  const { rate, per, burst, cost } = options
  return {
    key: checkName(key, 'key'),
    rate: checkAmount(rate, 'rate', true),
    per: checkDuration(per, 'per'),
    burst: burst === undefined || burst === null ? null : checkAmount(burst, 'burst', true),
    cost: cost === undefined || cost === null ? null : checkAmount(cost, 'cost', false)
  }
}

/**
 * The answers of a group's statement, one per call in the calls' order:
 * row.item (1-based) says whose each row is.
 * @template {{ item: number }} Row
 * @template Result
 * @param {Row[]} rows
 * @param {number} n  calls in the group
 * @param {string} what  the statement, for the error
 * @param {(row: Row) => Result} answer
 * @returns {Result[]}
 */
function byItem (rows, n, what, answer) {
  if (rows.length !== n) throw new Error(`flagmeter: ${what} answered ${rows.length} of ${n} calls`)
  /** @type {Result[]} */
  const out = new Array(n)
  for (const row of rows) out[row.item - 1] = answer(row)
  return out
}

/**
 * Run a group of rate limit calls; one RateDecision per call.
 * @param {import('pg').ClientBase} db
 * @param {RateLimitCall[]} calls
 * @returns {Promise<import('./interfaces').RateDecision[]>}
 */
async function runRateLimitGroup (db, calls) {
  const rows = await limitBatch(db, calls.map((c) => c.key), calls.map((c) => c.rate), calls.map((c) => c.per),
    calls.map((c) => c.burst), calls.map((c) => c.cost))
  return byItem(rows, calls.length, 'limit_batch', (row) => ({
    allowed: row.allowed,
    remaining: row.remaining,
    retryAfterMs: row.retry_after_ms,
    resetAfterMs: row.reset_after_ms
  }))
}

/**
 * A value call of a unique meter (trackValue, consumeValue, forgetValue),
 * checked: { tenant, meter, value, occurredAt }.  A value is a non-empty
 * string; its length in bytes (at most 1024) is the server's to judge
 * (22001), and a call refused for it fails alone (src/batcher.js).
 * @param {unknown} tenant
 * @param {unknown} meter
 * @param {unknown} value
 * @param {import('./interfaces').TrackValueOptions} [options]  trackValue's
 * @returns {ValueCall}
 */
function valueCall (tenant, meter, value, options = {}) {
  return {
    tenant: checkName(tenant, 'tenant'),
    meter: checkName(meter, 'meter'),
    value: checkName(value, 'value'),
    occurredAt: checkDate(options.occurredAt)
  }
}

/**
 * A group's arrays of tenants, meters and values.
 * @param {ValueCall[]} calls
 * @returns {[string[], string[], string[]]}
 */
function valueArrays (calls) {
  return [calls.map((c) => c.tenant), calls.map((c) => c.meter), calls.map((c) => c.value)]
}

/**
 * Run a group of trackValue calls; per call, whether its value was new in its period.
 * @param {import('pg').ClientBase} db
 * @param {ValueCall[]} calls
 * @returns {Promise<boolean[]>}
 */
async function runTrackValueGroup (db, calls) {
  const occurred = calls.map((c) => c.occurredAt)
  const rows = await trackValues(db, ...valueArrays(calls), allNull(occurred) ? null : occurred)
  return byItem(rows, calls.length, 'track_value', (row) => row.added)
}

/**
 * Run a group of consumeValue calls; one Decision per call.
 * @param {import('pg').ClientBase} db
 * @param {ValueCall[]} calls
 * @returns {Promise<Decision[]>}
 */
async function runConsumeValueGroup (db, calls) {
  return byItem(await consumeValues(db, ...valueArrays(calls)), calls.length, 'consume_value', decision)
}

/**
 * Run a group of forgetValue calls; per call, whether its value was counted (and is freed).
 * @param {import('pg').ClientBase} db
 * @param {ValueCall[]} calls
 * @returns {Promise<boolean[]>}
 */
async function runForgetValueGroup (db, calls) {
  return byItem(await forgetValues(db, ...valueArrays(calls)), calls.length, 'forget_value', (row) => row.forgotten)
}

module.exports = {
  trackCall,
  consumeCall,
  decision,
  reservation,
  reserveCall,
  checkReservation,
  runTrackGroup,
  runConsumeGroup,
  rateLimitCall,
  runRateLimitGroup,
  valueCall,
  runTrackValueGroup,
  runConsumeValueGroup,
  runForgetValueGroup,
  checkName,
  checkAmount,
  checkKey,
  checkTtl,
  checkDuration
}
