'use strict'
// The local cache of an app instance: which tenants are blocked at a hard
// limit, and the limit in force per tenant and meter.  It is filled from
// the snapshot the event stream reads at start (README, "The client
// protocol", step 2) and changed only by quota events applied in version
// order after it (step 3), so it never moves backwards.  A blocked entry
// carries the end of its period and stops counting at that instant, on
// the next read: no timer, no waiting for maintain()'s "unblocked".

/** @typedef {import('./interfaces').Limit} Limit */
/** @typedef {{ periodStart: Date | null, until: number }} BlockedEntry */

/**
 * @param {string} tenant
 * @param {string} meter
 */
function keyOf (tenant, meter) {
  return tenant + '\u0000' + meter
}

/**
 * @param {import('./sql/rows').LimitRow} row
 * @returns {Limit}
 */
function limitOf (row) {
  return {
    tenant: row.tenant,
    meter: row.meter,
    aggregation: row.aggregation,
    quota: row.quota,
    period: row.period,
    mode: row.mode,
    thresholds: row.thresholds,
    plan: row.plan,
    anchor: row.anchor,
    timezone: row.timezone
  }
}

/**
 * A period start as stored: a Date, or null for -infinity (lifetime).
 * @param {unknown} value
 */
function periodStartOf (value) {
  return value instanceof Date ? value : null
}

/**
 * A period end as stored: ms since the epoch, Infinity when it never ends.
 * @param {unknown} value
 */
function untilOf (value) {
  return value instanceof Date ? value.getTime() : Infinity
}

class QuotaCache {
  /** @param {{ now?: () => number }} [opts]  now: the clock (tests set it) */
  constructor ({ now = Date.now } = {}) {
    this._now = now
    /** @type {Map<string, BlockedEntry>} */
    this._blocked = new Map()
    /** @type {Map<string, Limit>} */
    this._limits = new Map()
    /** @type {import('./interfaces').Int | null} */
    this.version = null // null: no snapshot yet
  }

  /**
   * Replace everything with a snapshot { version, blocked, limits }.
   * @param {import('./sql/rows').State} state
   */
  load ({ version, blocked, limits }) {
    this._blocked.clear()
    for (const b of blocked) this.block(b.tenant, b.meter, b.period_start, b.period_end)
    this._limits.clear()
    for (const row of limits) this._limits.set(keyOf(row.tenant, row.meter), limitOf(row))
    this.version = version
  }

  /**
   * @param {string} tenant
   * @param {string} meter
   * @param {unknown} periodStart  a Date, else a lifetime period
   * @param {unknown} periodEnd  a Date, else never
   */
  block (tenant, meter, periodStart, periodEnd) {
    this._blocked.set(keyOf(tenant, meter), {
      periodStart: periodStartOf(periodStart),
      until: untilOf(periodEnd)
    })
  }

  /**
   * An unblocked event: only for the period it names (an older event cannot clear a newer block).
   * @param {string} tenant
   * @param {string} meter
   * @param {unknown} periodStart  a Date, else a lifetime period
   */
  unblock (tenant, meter, periodStart) {
    const k = keyOf(tenant, meter)
    const entry = this._blocked.get(k)
    if (!entry) return
    const start = periodStartOf(periodStart)
    const entryStart = entry.periodStart === null ? -Infinity : entry.periodStart.getTime()
    const eventStart = start === null ? -Infinity : start.getTime()
    if (eventStart >= entryStart) this._blocked.delete(k)
  }

  /**
   * @param {string} tenant
   * @param {string} meter
   */
  isBlocked (tenant, meter) {
    const k = keyOf(tenant, meter)
    const entry = this._blocked.get(k)
    if (!entry) return false
    if (entry.until <= this._now()) {
      this._blocked.delete(k)
      return false
    }
    return true
  }

  /**
   * Tenants and meters blocked now.
   * @returns {Array<{ tenant: string, meter: string, periodStart: Date | null, until: Date | null }>}
   */
  blocked () {
    const out = []
    for (const [k, entry] of this._blocked) {
      if (entry.until <= this._now()) continue
      const [tenant, meter] = k.split('\u0000')
      out.push({ tenant, meter, periodStart: entry.periodStart, until: entry.until === Infinity ? null : new Date(entry.until) })
    }
    return out
  }

  /**
   * @param {string} tenant
   * @param {string} meter
   */
  limit (tenant, meter) {
    return this._limits.get(keyOf(tenant, meter))
  }

  /**
   * Replace the limits matching { tenant, meter, plan } (undefined: any)
   * with rows read after the event that changed them.
   * @param {{ tenant?: string | null, meter?: string | null, plan?: string | null }} match
   * @param {import('./sql/rows').LimitRow[]} rows
   */
  replaceLimits (match, rows) {
    for (const [k, l] of this._limits) {
      if ((match.tenant == null || l.tenant === match.tenant) &&
          (match.meter == null || l.meter === match.meter) &&
          (match.plan == null || l.plan === match.plan)) this._limits.delete(k)
    }
    for (const row of rows) this._limits.set(keyOf(row.tenant, row.meter), limitOf(row))
  }
}

module.exports = { QuotaCache }
