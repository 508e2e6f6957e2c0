'use strict'
// Quota events as the app receives them, the same shape whether they came
// in a notification payload (JSON) or from the outbox (changes_since):
// camelCase fields, absent when they do not apply, numbers by the number
// rule (src/numbers.js), periodStart a Date or null for a lifetime period.

const { toInt, parseJson } = require('./numbers')

/** @typedef {import('./interfaces').Int} Int */
/**
 * A quota event as it comes, snake_case: a notification payload's (parsed
 * JSON) or an outbox row (changes_since).
 * @typedef {{ kind: string, version?: unknown, [field: string]: any }} RawEvent
 */
/**
 * A quota event as the stream applies it, before it adds the shard (src/flagmeter.js).
 * @typedef {import('./interfaces').QuotaEvent extends infer E ? (E extends unknown ? Omit<E, 'shard'> : never) : never} ReceivedEvent
 */

// Every kind of quota event: the one list, exported (QUOTA_EVENT_KINDS,
// typed in interfaces.d.ts, where QuotaEventKind is its union).
const QUOTA_EVENT_KINDS = Object.freeze(/** @type {const} */ (['threshold', 'blocked', 'unblocked', 'limit_changed',
  'plan_changed', 'feature_changed', 'grant_low', 'grant_exhausted', 'grant_expired']))
/** @type {ReadonlySet<unknown>} */
const QUOTA_KINDS = new Set(QUOTA_EVENT_KINDS)

// What each kind carries when its payload is whole (README, "What is
// announced"); a payload shrunk to fit 1 kB lacks some, and is then read
// from the outbox instead.
/** @type {Readonly<Record<import('./interfaces').QuotaEventKind, readonly string[]>>} */
const REQUIRED = {
  threshold: ['tenant', 'meter', 'period_start', 'threshold', 'used', 'quota'],
  blocked: ['tenant', 'meter', 'period_start', 'used', 'quota'],
  unblocked: ['tenant', 'meter', 'period_start'],
  limit_changed: ['meter'],
  plan_changed: ['tenant', 'plan'],
  feature_changed: ['feature', 'enabled', 'config'],
  // credit grants: used is what was drawn, quota the grant's amount
  grant_low: ['tenant', 'meter', 'grant_id', 'threshold', 'used', 'quota'],
  grant_exhausted: ['tenant', 'meter', 'grant_id', 'used', 'quota'],
  grant_expired: ['tenant', 'meter', 'grant_id', 'used', 'quota']
}

/**
 * @param {unknown} value  a Date (outbox), a timestamp text (payload), or -infinity
 * @returns {Date | null}
 */
function periodStart (value) {
  if (value instanceof Date) return value
  if (typeof value === 'string' && value !== '-infinity') return new Date(value)
  return null // -infinity: a lifetime period
}

/**
 * A bigint of a payload (parsed JSON: a number or a BigInt) or of a row (by the number rule already).
 * @param {unknown} value
 * @returns {Int | null}
 */
function int (value) {
  if (typeof value === 'bigint' || typeof value === 'number') {
    return typeof value === 'bigint' && value >= BigInt(Number.MIN_SAFE_INTEGER) &&
      value <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(value) : value
  }
  return toInt(/** @type {string | null | undefined} */ (value))
}

/**
 * A payload event or an outbox row as a QuotaEvent; source says which.
 * @param {RawEvent} raw  of a kind of QUOTA_EVENT_KINDS
 * @param {'notification' | 'outbox'} source
 * @returns {ReceivedEvent}
 */
function quotaEvent (raw, source) {
  /** @type {Record<string, unknown>} */
  const e = { kind: raw.kind, version: int(raw.version) }
  for (const f of ['tenant', 'meter', 'plan']) if (raw[f] != null) e[f] = raw[f]
  if (raw.period_start !== undefined && raw.period_start !== null) e.periodStart = periodStart(raw.period_start)
  if (raw.threshold != null) e.threshold = Number(raw.threshold)
  if (raw.used != null) e.used = int(raw.used)
  if (raw.quota != null) e.quota = int(raw.quota)
  if (raw.kind === 'feature_changed') {
    // a plan's row (no tenant) or a tenant's override; enabled null: gone.
    // The outbox's config comes as text (changesSince), parsed like a payload.
    e.feature = raw.feature
    e.enabled = raw.enabled ?? null
    e.config = typeof raw.config === 'string' && source === 'outbox' ? parseJson(raw.config) : raw.config ?? null
  }
  if (raw.grant_id != null) e.grantId = int(raw.grant_id)
  e.source = source
  return /** @type {ReceivedEvent} */ (/** @type {unknown} */ (e))
}

/**
 * Whether a payload event carries every field of its kind.
 * @param {RawEvent} raw
 */
function isWhole (raw) {
  const required = /** @type {Record<string, readonly string[] | undefined>} */ (REQUIRED)[raw.kind]
  return required !== undefined && required.every((f) => raw[f] !== undefined)
}

module.exports = { quotaEvent, isWhole, QUOTA_KINDS, QUOTA_EVENT_KINDS }
