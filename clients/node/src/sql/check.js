'use strict'
// check: the decision for amount more, exact (reads every committed event).
const { types } = require('../numbers')

const text = 'SELECT granted, used, quota, remaining, resets_at, overage, meter, reason, from_grants, balance' +
  ' FROM flagmeter.check($1, $2, $3::bigint)'

async function check (db, tenant, meter, amount) {
  const { rows } = await db.query({ text, values: [tenant, meter, amount], types })
  return rows[0]
}

module.exports = { check }
