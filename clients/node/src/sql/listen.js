'use strict'
// Step 1 of the client protocol (README, "The client protocol"): on the
// listener's own session, before anything is read.
/** @param {import('pg').ClientBase} db */
async function listen (db) {
  await db.query('LISTEN flagmeter')
}

module.exports = { listen }
