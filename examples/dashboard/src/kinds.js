'use strict'
// The quota events the app acts on: its choices among the client's one list
// of kinds (QUOTA_EVENT_KINDS), each checked against it when the app loads,
// so that a kind the client does not have (a typo, a rename) fails at once
// rather than never firing.
const { QUOTA_EVENT_KINDS } = require('flagmeter')

/**
 * @param {...string} kinds
 * @returns {readonly string[]}
 */
function kindsOf (...kinds) {
  const known = new Set(QUOTA_EVENT_KINDS)
  for (const kind of kinds) {
    if (!known.has(kind)) throw new Error(`not a kind of quota event of the client: ${kind}`)
  }
  return Object.freeze(kinds)
}

// What the dashboard shows, pushes and counts: usage against the limits,
// the limits and the plans (not entitlements or credit grants).
const SHOWN_KINDS = kindsOf('threshold', 'blocked', 'unblocked', 'limit_changed', 'plan_changed')

// What the webhooks deliver.
const ALERT_KINDS = kindsOf('threshold', 'blocked', 'unblocked')

module.exports = { SHOWN_KINDS, ALERT_KINDS }
