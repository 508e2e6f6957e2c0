'use strict'
// The app reads bigints (usage, quotas, versions) by the client's number
// rule: a number while it is a safe integer, a BigInt beyond, never a
// string.  Passed as the `types` of each query, so the pool keeps its own.
const pg = require('pg')

const INT8 = 20

function int8 (text) {
  const n = Number(text)
  return Number.isSafeInteger(n) ? n : BigInt(text)
}

const types = {
  getTypeParser (oid, format) {
    if (oid === INT8 && format !== 'binary') return int8
    return pg.types.getTypeParser(oid, format)
  }
}

module.exports = { types }
