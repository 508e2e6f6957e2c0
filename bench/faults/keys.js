'use strict'
// What an idempotency key on every call costs: should the client generate
// one per track/consume by default?
//
//   node bench/faults/keys.js [--rounds 3] [--round-seconds 8] [--warmup-seconds 4]
//                             [--concurrency 64] [--tenants 10000] [--sequential 0|1]
//                             [--out file.json]
//
// A throwaway cluster (test/node-helpers/cluster.js): meter
// api_calls (tracked; no limit), meter tokens with a plan limit of 10^15
// (lifetime, hard: never refuses) on the plan of all `tenants` tenants; one
// FlagMeter client (connectionString, its defaults).  For fm.track, then for
// fm.consume: a warm-up of each variant, then rounds A B A B A B (rounds
// pairs), each of `concurrency` callers in a loop for round-seconds:
//   A  no key
//   B  { key: crypto.randomUUID() } per call
//   C  (--sequential 1 only, as A B C A B C ...) a key of this process's
//      prefix and a counter: is it the randomness of the key that costs?
// A round's rate is its acknowledged calls over the time from its start
// until its last call settled.  Reported: calls/s per round, calls per
// group, the client's CPU per 1000 calls, and B/A as the median of the
// pairs' ratios and as median(B)/median(A); then the size of event_keys
// per key.
const crypto = require('node:crypto')
const fs = require('node:fs')
const path = require('node:path')
const { Cluster } = require('@flagmeter/test-helpers')
const { FlagMeter } = require('../../clients/node')
const { parseArgs, median, quantile, checkout, machine, exitOnSignals } = require('./common')

const opts = parseArgs(process.argv.slice(2), {
  rounds: 3,
  roundSeconds: 8,
  warmupSeconds: 4,
  concurrency: 64,
  tenants: 10000,
  sequential: 0,
  out: ''
})

const SETUP = `
  SELECT flagmeter.define_meter('api_calls');
  SELECT flagmeter.define_meter('tokens');
  SELECT flagmeter.define_plan('big');
  SELECT flagmeter.set_limit('big', 'tokens', 1000000000000000, 'lifetime', 'hard');
  SELECT count(*) FROM (SELECT flagmeter.assign_plan('t' || i, 'big') FROM generate_series(0, ${opts.tenants - 1}) i) a;`

const VARIANTS = {
  A: { label: 'A no key', key: () => null },
  B: { label: 'B uuid', key: () => crypto.randomUUID() },
  C: { label: 'C seq', key: (() => { const prefix = `${process.pid}-${Date.now().toString(36)}-`; let n = 0; return () => prefix + n++ })() }
}

/** concurrency callers of call(tenant, key) for ms; { rate, calls, failed, groups, ... }. */
async function round (fm, kind, variant, ms) {
  const makeKey = VARIANTS[variant].key
  const call = kind === 'track'
    ? (t, key) => fm.track(t, 'api_calls', 1, key ? { key } : undefined)
    : (t, key) => fm.consume(t, 'tokens', 1, key ? { key } : undefined)
  let stopping = false
  let ok = 0
  let refused = 0
  const failed = {}
  const latencies = []
  let next = Math.floor(Math.random() * opts.tenants)
  const before = fm.stats()[kind]
  const cpu0 = process.cpuUsage()
  const t0 = performance.now()
  async function caller () {
    while (!stopping) {
      const t = `t${next++ % opts.tenants}`
      const key = makeKey()
      const s = performance.now()
      try {
        const r = await call(t, key)
        if (kind === 'consume' && r.granted === false) refused++
        ok++
        latencies.push(performance.now() - s)
      } catch (err) {
        failed[err.code ?? err.name] = (failed[err.code ?? err.name] ?? 0) + 1
      }
    }
  }
  const loops = []
  for (let i = 0; i < opts.concurrency; i++) loops.push(caller())
  await new Promise((resolve) => setTimeout(resolve, ms))
  stopping = true
  await Promise.all(loops)
  const elapsed = performance.now() - t0
  const cpu = process.cpuUsage(cpu0)
  const after = fm.stats()[kind]
  latencies.sort((a, b) => a - b)
  return {
    kind,
    variant,
    rate: ok / (elapsed / 1000),
    calls: ok,
    refused,
    failed,
    perGroup: (after.calls - before.calls) / Math.max(1, after.groups - before.groups),
    p50: quantile(latencies, 0.5),
    p99: quantile(latencies, 0.99),
    cpuPer1000: ((cpu.user + cpu.system) / 1000) / (ok / 1000)
  }
}

async function main () {
  exitOnSignals()
  const cluster = await Cluster.create('bench-keys')
  try {
    const started = new Date()
    const db = await cluster.createDatabase('bench', SETUP)
    const fm = new FlagMeter({ connectionString: cluster.url(db) })
    const background = []
    fm.on('error', (err) => background.push(`${err.source} ${err.code} ${err.message}`))
    await fm.ready()

    const variants = opts.sequential ? ['A', 'B', 'C'] : ['A', 'B']
    const results = { track: [], consume: [] }
    for (const kind of ['track', 'consume']) {
      for (const v of variants) await round(fm, kind, v, opts.warmupSeconds * 1000)
      for (let r = 0; r < opts.rounds; r++) {
        for (const v of variants) {
          const x = await round(fm, kind, v, opts.roundSeconds * 1000)
          results[kind].push(x)
          console.error(`${kind} ${x.variant} ${x.rate.toFixed(0)} calls/s`)
        }
      }
    }
    await fm.close()

    const pg = require('../../clients/node/node_modules/pg')
    const c = new pg.Client(cluster.connection(db))
    await c.connect()
    const size = (await c.query(`
      SELECT (SELECT count(*) FROM flagmeter.event_keys)::bigint AS keys,
             pg_total_relation_size('flagmeter.event_keys')::bigint AS bytes`)).rows[0]
    await c.end()

    console.log(`\nflagmeter: a generated key on every call: ${opts.concurrency} callers, ${opts.tenants} tenants, rounds of ${opts.roundSeconds} s after ${opts.warmupSeconds} s warm-ups`)
    console.log('\n kind     round  variant     calls/s  calls/group  p50 ms  p99 ms  client CPU ms/1000 calls  failed')
    const summary = {}
    for (const kind of ['track', 'consume']) {
      const rs = results[kind]
      rs.forEach((x, i) => {
        const failed = Object.entries(x.failed).map(([k, n]) => `${k} ${n}`).join(', ') || '0'
        console.log(` ${kind.padEnd(8)} ${String(Math.floor(i / variants.length) + 1).padStart(5)}  ${VARIANTS[x.variant].label.padEnd(8)}  ${x.rate.toFixed(0).padStart(9)}  ${x.perGroup.toFixed(1).padStart(11)}  ${x.p50.toFixed(1).padStart(6)}  ${x.p99.toFixed(1).padStart(6)}  ${x.cpuPer1000.toFixed(1).padStart(24)}  ${failed}${x.refused ? ` (refused ${x.refused})` : ''}`)
      })
      const rates = (v) => rs.filter((x) => x.variant === v).map((x) => x.rate)
      const a = rates('A')
      summary[kind] = { a, cpuPer1000: { A: median(rs.filter((x) => x.variant === 'A').map((x) => x.cpuPer1000)) } }
      for (const v of variants.slice(1)) {
        const b = rates(v)
        const pairs = a.map((x, i) => b[i] / x)
        summary[kind][v] = { rates: b, pairRatios: pairs, ratioMedianOfPairs: median(pairs), ratioOfMedians: median(b) / median(a) }
        summary[kind].cpuPer1000[v] = median(rs.filter((x) => x.variant === v).map((x) => x.cpuPer1000))
      }
    }
    console.log('')
    for (const kind of ['track', 'consume']) {
      for (const v of variants.slice(1)) {
        const s = summary[kind][v]
        console.log(`${kind.padEnd(8)} ${v}/A per round: ${s.pairRatios.map((r) => r.toFixed(3)).join(' ')}  median ${s.ratioMedianOfPairs.toFixed(3)}; median(${v})/median(A) ${s.ratioOfMedians.toFixed(3)}`)
      }
    }
    const perKey = Number(size.keys) > 0 ? Number(size.bytes) / Number(size.keys) : NaN
    console.log(`event_keys: ${size.keys} keys, ${(Number(size.bytes) / 1048576).toFixed(1)} MiB with its indexes: ${perKey.toFixed(0)} bytes per key`)
    if (background.length) console.log(`fm.on(error): ${background.length}: ${background.slice(0, 3).join(' | ')}`)

    const result = {
      bench: 'faults/keys',
      date: started.toISOString(),
      ...checkout(),
      machine: machine(),
      options: opts,
      track: summary.track,
      consume: summary.consume,
      eventKeys: { keys: Number(size.keys), bytes: Number(size.bytes), bytesPerKey: Math.round(perKey) },
      backgroundErrors: background.length
    }
    console.log('\nRESULT ' + JSON.stringify(result))
    if (opts.out) {
      fs.mkdirSync(path.dirname(path.resolve(opts.out)), { recursive: true })
      fs.writeFileSync(opts.out, JSON.stringify({ ...result, rounds: results }) + '\n')
    }
  } finally {
    cluster.destroy()
  }
}

main().catch((err) => {
  console.error(err)
  process.exit(1)
})
