'use strict'
// The defaults of the client's options, in one place: the code reads them
// from here, the app and the types (interfaces.d.ts, `DEFAULTS`) refer to
// them, and comments name them rather than restate the numbers.  Why each
// value: src/batcher.js (maxInFlight, maxGroup), README "Options".

/**
 * Freeze an object and the objects it holds.
 * @template {object} T
 * @param {T} object
 * @returns {T}
 */
function deepFreeze (object) {
  for (const value of Object.values(object)) {
    if (value !== null && typeof value === 'object') deepFreeze(value)
  }
  return Object.freeze(object)
}

const DEFAULTS = deepFreeze(/** @type {const} */ ({
  /** Size of the pool the client creates. */
  poolSize: 20,
  /** Groups running at once, per kind (track, consume). */
  maxInFlight: 2,
  /** Most calls in one group. */
  maxGroup: 500,
  /** Each call's deadline, retries included. */
  timeoutMs: 5000,
  /** Connecting gives up after this, or after timeoutMs when that is shorter. */
  connectTimeoutMs: 5000,
  /** Waits between the attempts of a call (doubling, with jitter). */
  retry: { initialDelayMs: 25, maxDelayMs: 250 },
  /** Backoff of the LISTEN sessions' reconnects (doubling, with jitter). */
  reconnect: { initialDelayMs: 100, maxDelayMs: 5000 },
  /** Most tenants the feature cache holds. */
  featureCacheSize: 10000,
  /** How long a reservation holds when reserve() is given no ttl. */
  reserveTtl: '5 minutes'
}))

module.exports = { DEFAULTS }
