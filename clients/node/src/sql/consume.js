'use strict'
// consume of one meter inside the caller's transaction.
const { types } = require('../numbers')

const text = 'SELECT granted, used, quota, remaining, resets_at, overage, meter, reason, from_grants, balance' +
  ' FROM flagmeter.consume($1, $2, $3::bigint, $4)'

async function consume (db, tenant, meter, amount, key) {
  const { rows } = await db.query({ text, values: [tenant, meter, amount, key], types })
  return rows[0]
}

module.exports = { consume }
