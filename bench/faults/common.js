'use strict'
// What bench/faults/restart.js and bench/faults/keys.js share: arguments,
// statistics, the state of the checkout a run measured, and pg_ctl run
// without blocking the event loop.
const { spawn, execFileSync } = require('node:child_process')
const os = require('node:os')
const path = require('node:path')
const { serverCommand } = require('@flagmeter/test-helpers')

const ROOT = path.join(__dirname, '..', '..')

/** --name value (or --name=value) options over defaults; numbers stay numbers. */
function parseArgs (argv, defaults) {
  const out = { ...defaults }
  for (let i = 0; i < argv.length; i++) {
    const m = /^--([a-z-]+)(?:=(.*))?$/.exec(argv[i])
    if (!m) throw new Error(`unknown argument: ${argv[i]}`)
    const name = m[1].replace(/-([a-z])/g, (_, c) => c.toUpperCase())
    if (!(name in defaults)) throw new Error(`unknown option --${m[1]} (known: ${Object.keys(defaults).join(', ')})`)
    const raw = m[2] ?? argv[++i]
    if (raw === undefined) throw new Error(`--${m[1]} needs a value`)
    out[name] = typeof defaults[name] === 'number' ? Number(raw) : raw
    if (typeof defaults[name] === 'number' && !Number.isFinite(out[name])) throw new Error(`--${m[1]}: not a number: ${raw}`)
  }
  return out
}

function median (xs) {
  if (xs.length === 0) return NaN
  const s = [...xs].sort((a, b) => a - b)
  const m = s.length >> 1
  return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2
}

function quantile (sorted, q) {
  if (sorted.length === 0) return NaN
  return sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))]
}

function sleep (ms) {
  return new Promise((resolve) => setTimeout(resolve, ms))
}

/** The commit and the files changed in the checkout (others edit it as we measure). */
function checkout () {
  const git = (...args) => {
    try { return execFileSync('git', ['-C', ROOT, ...args], { encoding: 'utf8' }).trim() } catch { return null }
  }
  const dirty = git('status', '--porcelain', '--', 'clients/node/src', 'src', 'sql')
  return { commit: git('rev-parse', '--short', 'HEAD'), dirty: dirty ? dirty.split('\n').map((l) => l.trim()) : [] }
}

function machine () {
  return { cpus: os.cpus().length, node: process.version, load1: Number(os.loadavg()[0].toFixed(2)) }
}

/**
 * pg_ctl restart -m <mode> -w of the cluster in a child process: the event
 * loop (and the load) goes on meanwhile.  Resolves with { ms, output }.
 */
function restartAsync (cluster, mode = 'fast') {
  const args = ['-D', cluster.data, '-l', path.join(cluster.dir, 'server.log'), '-m', mode, '-w', '-t', '60', 'restart']
  // pg_ctl as the cluster owner (cluster.js's serverCommand: through
  // FLAGMETER_PG_RUN when set, else this machine's PostgreSQL 15)
  const [cmd, argv] = serverCommand('pg_ctl', args)
  return new Promise((resolve, reject) => {
    const t0 = performance.now()
    const child = spawn(cmd, argv, { stdio: ['ignore', 'pipe', 'pipe'] })
    let output = ''
    child.stdout.on('data', (d) => { output += d })
    child.stderr.on('data', (d) => { output += d })
    child.on('error', reject)
    child.on('exit', (code, signal) => {
      if (code === 0) resolve({ ms: performance.now() - t0, output })
      else reject(new Error(`pg_ctl restart failed (${code ?? signal}): ${output}`))
    })
  })
}

/** Stop the clusters (cluster.js's exit hook) on ^C too. */
function exitOnSignals () {
  for (const sig of ['SIGINT', 'SIGTERM']) process.on(sig, () => process.exit(130))
}

module.exports = { parseArgs, median, quantile, sleep, checkout, machine, restartAsync, exitOnSignals, ROOT }
