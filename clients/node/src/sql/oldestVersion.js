'use strict'
// The oldest version the outbox still holds: when it is past the version an
// instance resumes from, maintain() may have deleted events it missed
// (retention), and the instance reloads its state instead of trusting the
// replay alone.
const { types } = require('../numbers')

const text = 'SELECT min(version) AS version FROM flagmeter.outbox'

/**
 * @param {import('pg').ClientBase} db
 * @returns {Promise<import('../interfaces').Int | null>}  null: the outbox is empty
 */
async function oldestVersion (db) {
  const { rows } = await db.query({ text, types })
  return rows[0].version
}

module.exports = { oldestVersion }
