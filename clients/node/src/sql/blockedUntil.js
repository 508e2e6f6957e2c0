'use strict'
// The end of a blocked period, for a blocked event or row: its tenant's
// limit configuration gives the period's kind, anchor and time zone.
// Lifetime periods (period_start -infinity) never end.
const { types } = require('../numbers')

const blockedText =
  'SELECT b.tenant, b.meter, b.period_start,' +
  ' (SELECT p.period_end FROM flagmeter.limit_config(b.tenant, b.meter) c,' +
  '   flagmeter.period_bounds(b.period_start, c.period, c.anchor, c.timezone) p' +
  '  WHERE pg_catalog.isfinite(b.period_start)) AS period_end'

// A JavaScript Date holds milliseconds, the period start microseconds: the
// Date may fall just before the period it names, so the period is the one
// containing that instant plus 1 ms (periods last an hour at least).
const text = blockedText +
  " FROM (SELECT $1::text AS tenant, $2::text AS meter, $3::timestamptz + interval '1 millisecond' AS period_start) b"

/**
 * @param {import('pg').ClientBase} db
 * @param {string} tenant
 * @param {string} meter
 * @param {Date} periodStart
 * @returns {Promise<Date | number | null>}
 */
async function blockedUntil (db, tenant, meter, periodStart) {
  const { rows } = await db.query({ text, values: [tenant, meter, periodStart], types })
  return rows[0].period_end
}

module.exports = { blockedUntil, blockedText }
