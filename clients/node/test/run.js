'use strict'
// npm test: test/*.test.js (or those whose names contain an argument) with
// node:test against a real cluster: the one in PGHOST and PGPORT (make test
// hands its cluster over that way), or else a throwaway PostgreSQL 15
// cluster with flagmeter preloaded that the runner starts and deletes
// (@flagmeter/test-helpers, runner.js).  flagmeter is created once, in a
// template database each file clones (helpers.createDatabase).
const { runSuite } = require('@flagmeter/test-helpers')
const { TEMPLATE, checkBuild } = require('./helpers')

runSuite({ dir: __dirname, templateName: TEMPLATE, check: checkBuild })
