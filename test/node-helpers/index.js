'use strict'
// @flagmeter/test-helpers: what the Node suites share (see package.json).
//   db.js       sessions, template databases and a database per test file
//               on the cluster a suite runs against; until, sleep
//   cluster.js  throwaway clusters and pgbouncers (the fault suites' and
//               the runner's own)
//   runner.js   `npm test` of a suite: a cluster when none is given, the
//               template, node --test over its files
//   ports.js    the port range of each kind of server
module.exports = {
  ...require('./db'),
  ...require('./cluster'),
  ...require('./runner'),
  ...require('./ports')
}
