'use strict'
// What a consume refused for its rate (reason 'rate_limited') answers
// besides 429: Retry-After and the RateLimit-Policy and RateLimit fields of
// the IETF httpapi draft, draft-ietf-httpapi-ratelimit-headers-10
// (September 2025; the same structured-field syntax since -08):
//
//   Retry-After: 12
//   RateLimit-Policy: "default";q=5;w=60
//   RateLimit: "default";r=0;t=12
//
// The decision says when the same amount would be granted (retryAfterMs),
// not the limit itself: that is read from the catalog once per tenant and
// meter and kept until the client reports a change of limits or plans.
const { rateLimitConfig } = require('./sql/rateLimitConfig')

// One policy per answer (the tenant's rate limit of the meter consumed),
// so the draft's usual name for it.
const POLICY = '"default"'

// A structured-field Integer has at most 15 digits (RFC 8941, 3.3.1).
const SF_MAX = 999999999999999n

/** n as a structured-field Integer, capped at its largest value. */
function sfInt (n) {
  return BigInt(n) > SF_MAX ? String(SF_MAX) : String(n)
}

/**
 * RateLimit-Policy for rate units per `per` seconds in bursts of `burst`:
 * q units per w seconds.  w must be whole seconds, so a per that is not
 * (1.5 s) becomes the next whole second and q the units it holds.  The
 * burst, which the draft has no parameter for, is a vendor parameter
 * (`flagmeter-burst`), given only when it differs from the rate.
 */
function policyField ({ rate, per, burst }) {
  let q = rate
  let w = per
  if (!Number.isInteger(w)) {
    w = Math.ceil(w)
    q = Math.floor(Number(rate) * w / per)
  }
  let field = `${POLICY};q=${sfInt(q)};w=${w}`
  if (BigInt(burst) !== BigInt(rate)) field += `;flagmeter-burst=${sfInt(burst)}`
  return field
}

/**
 * The headers of a rate-limited 429.  r=0: fewer units are left than the
 * request asked for (the decision does not say how many).  With no
 * retryAfterMs (the amount is more than the burst: waiting cannot help)
 * there is no Retry-After and no t.  Without a policy (its read failed,
 * or the limit was dropped meanwhile) no RateLimit-Policy.
 * @param {{rate: number, per: number, burst: number | bigint} | null} policy
 * @param {number | null} retryAfterMs
 */
function rateLimitedHeaders (policy, retryAfterMs) {
  const h = {}
  if (policy) h['RateLimit-Policy'] = policyField(policy)
  if (retryAfterMs === null || retryAfterMs === undefined) {
    h.RateLimit = `${POLICY};r=0`
  } else {
    const seconds = String(Math.ceil(retryAfterMs / 1000))
    h['Retry-After'] = seconds
    h.RateLimit = `${POLICY};r=0;t=${seconds}`
  }
  return h
}

/**
 * The rate limits of the tenants and meters refused for their rate, read
 * once each (a refusal storm is when they are needed, and it should not
 * double the database's work), forgotten when the client reports a limit
 * changed (rate limits announce limit_changed too), a plan changed, or
 * that it may have missed events (invalidate, after a reconnect).
 */
class RatePolicies {
  /** @param {import('flagmeter').FlagMeter} fm */
  constructor (fm) {
    this._fm = fm
    this._policies = new Map() // "tenant\0meter" -> Promise of the policy or null
    const forget = () => this._policies.clear()
    for (const kind of ['limit_changed', 'plan_changed', 'invalidate']) fm.on(kind, forget)
  }

  /** The rate limit in force, or null (when none applies or it could not be read). */
  get (tenant, meter) {
    const k = tenant + '\u0000' + meter
    let p = this._policies.get(k)
    if (!p) {
      // a read that fails is not kept: the next refusal tries again
      p = rateLimitConfig(this._fm.pool, tenant, meter).catch(() => {
        if (this._policies.get(k) === p) this._policies.delete(k)
        return null
      })
      this._policies.set(k, p)
    }
    return p
  }
}

module.exports = { RatePolicies, rateLimitedHeaders, policyField }
