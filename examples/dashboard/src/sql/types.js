'use strict'
// The app reads bigints (usage, quotas, versions) by the client's number
// rule, the client's own parsers: a number while it is a safe integer, a
// BigInt beyond, never a string.  Passed as the `types` of each query, so
// the pool keeps its own.
const { intTypes } = require('flagmeter')

module.exports = { types: intTypes }
