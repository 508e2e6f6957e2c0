'use strict'
// npm test: test/*.test.js (or those whose names contain an argument) with
// node:test against the cluster in PGHOST and PGPORT (as `make test` hands
// it over), or else a throwaway PostgreSQL 15 cluster with flagmeter
// preloaded that the runner starts and deletes (@flagmeter/test-helpers,
// runner.js).  flagmeter is created once, in a template database each
// file clones (test/helpers.js).  Each file starts the app as child
// processes.  The browser test needs Debian's chromium and installs it
// when missing and run as root.
const { runSuite } = require('@flagmeter/test-helpers')
const { TEMPLATE, checkBuild } = require('./helpers')

runSuite({ dir: __dirname, templateName: TEMPLATE, check: checkBuild })
