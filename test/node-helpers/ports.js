'use strict'
// The ports of the Node suites' own servers, one range each, so that they
// never pick a port another part of a run uses at the same time:
//   54321-54340  make test's and the benches' clusters (tools/common.sh)
//   54341-54360  the cluster a suite's runner starts without PGHOST (runner.js)
//   54363-54380  the app instances and receivers of examples/dashboard's tests
//   54381-54399  the fault suites' clusters and pgbouncers (cluster.js)
const fs = require('node:fs')
const net = require('node:net')

const RANGES = {
  run: [54341, 54360],
  apps: [54363, 54380],
  faults: [54381, 54399]
}

/** True when nothing listens on 127.0.0.1:port and no unix socket of it is in /tmp. */
function portFree (port) {
  if (fs.existsSync(`/tmp/.s.PGSQL.${port}`)) return Promise.resolve(false)
  return new Promise((resolve) => {
    const s = net.createServer()
    s.once('error', () => resolve(false))
    s.listen(port, '127.0.0.1', () => s.close(() => resolve(true)))
  })
}

/**
 * The ports of first..last, each handed out once by this process until
 * released; a port something else listens on (another run of these
 * suites) is skipped.  { take(): Promise<port>, release(port) }
 */
function portRange (first, last) {
  const taken = new Set()
  return {
    async take () {
      for (let p = first; p <= last; p++) {
        if (taken.has(p)) continue
        if (await portFree(p)) {
          taken.add(p)
          return p
        }
      }
      throw new Error(`no free port in ${first}-${last}`)
    },
    release (port) {
      taken.delete(port)
    }
  }
}

module.exports = { RANGES, portFree, portRange }
