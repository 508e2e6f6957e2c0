'use strict'
// Throughput of fm.track through a fast restart of the database.
//
//   node bench/faults/restart.js [--seconds 60] [--concurrency 64] [--restart-at 30]
//                                [--tenants 1000] [--timeout-ms 5000] [--keys 1|0]
//                                [--out file.json]
//
// A throwaway cluster (test/node-helpers/cluster.js) with one meter;
// one FlagMeter client (connectionString, its defaults: LISTEN on, pool of
// 20, timeoutMs 5000 unless --timeout-ms); `concurrency` callers in a loop,
// each awaiting fm.track(tenant, 'api_calls', 1, { key }) with a key of its
// own per call (--keys 0: no key) over `tenants` tenants; a failed call is
// followed by a 10 ms pause (as an app answering 503 whose caller comes
// back), then the next call.  At --restart-at, `pg_ctl restart -m fast -w`
// runs in a child process, so the load goes on meanwhile.
//
// Recorded per 100 ms bucket: acknowledged calls, failed calls by err.code.
// Reported: the baseline (median acknowledged calls per full second before
// the restart, second 0 left out as warm-up), the unavailability (the
// longest time without an acknowledgement around the restart, from the
// acknowledgements' own times; the 100 ms bucket figure too), the time from
// the restart command until a second begins that acknowledges >= 90 % of
// the baseline (and until one that the 4 next seconds also reach), failures
// by code, calls that outlived their deadline or never settled, and a
// consistency check: every acknowledged key is in flagmeter.events exactly
// once, no key is there twice, and a key there that was not acknowledged
// belongs to a call whose outcome was unknown (--keys 0: the events counted
// are between the calls acknowledged and those plus the unknown ones).
// Diagnostics: the failed attempts of track groups by outcome and cause
// (through the batcher's private _run, when there), and the calls reported
// FLAGMETER_NOT_APPLIED although an earlier attempt's outcome was unknown.
const fs = require('node:fs')
const path = require('node:path')
const { Cluster } = require('@flagmeter/test-helpers')
const { FlagMeter } = require('../../clients/node')
const { parseArgs, median, quantile, sleep, checkout, machine, restartAsync, exitOnSignals } = require('./common')

const BUCKET_MS = 100
const METER = 'api_calls'

const opts = parseArgs(process.argv.slice(2), {
  seconds: 60,
  concurrency: 64,
  restartAt: 30,
  tenants: 1000,
  timeoutMs: 5000,
  keys: 1,
  out: ''
})
if (opts.restartAt <= 1 || opts.restartAt >= opts.seconds) throw new Error('--restart-at must be within the run, after its first second')

/** The server's own times of the restart, from its log (log_timezone UTC, log_line_prefix %m). */
function serverTimes (log, since) {
  const marks = {
    shutdownRequested: /received fast shutdown request/,
    shutDown: /database system is shut down/,
    ready: /database system is ready to accept connections/
  }
  const out = {}
  for (const line of log.split('\n')) {
    const m = /^(\d{4}-\d\d-\d\d) (\d\d:\d\d:\d\d\.\d{3}) UTC /.exec(line)
    if (!m) continue
    const t = Date.parse(`${m[1]}T${m[2]}Z`)
    if (t < since - 1000) continue
    for (const [name, re] of Object.entries(marks)) if (out[name] === undefined && re.test(line)) out[name] = t
  }
  return out
}

async function main () {
  exitOnSignals()
  const runTag = `r${Date.now().toString(36)}`
  const cluster = await Cluster.create('bench-restart', { conf: { log_timezone: "'UTC'" } })
  try {
    // its tenants have no plan: metered without limit, as configured here
    const db = await cluster.createDatabase('bench', `SELECT flagmeter.define_meter('${METER}');
      SELECT flagmeter.configure(unassigned_tenants => 'unlimited');`)
    const fm = new FlagMeter({ connectionString: cluster.url(db), timeoutMs: opts.timeoutMs })
    const background = [] // fm.on('error'): errors no call waited for
    const stream = [] // LISTEN session state changes
    let t0 = 0 // performance.now() of the load's start
    const rel = () => performance.now() - t0
    fm.on('error', (err) => background.push({ at: rel(), source: err.source, code: err.code, message: String(err.message).slice(0, 160) }))
    fm.on('connected', () => stream.push({ at: rel(), state: 'connected' }))
    fm.on('disconnected', () => stream.push({ at: rel(), state: 'disconnected' }))
    // Diagnostics only: each failed attempt of a track group (the batcher's
    // private run hook, when it is there), by outcome and cause; the calls
    // still see only what the client makes of them.
    const attempts = new Map() // kind -> { groups, calls, first, last }
    const unknownAttempt = new Set() // keys of calls an attempt of which had an unknown outcome
    if (fm._tracks && typeof fm._tracks._run === 'function') {
      const run = fm._tracks._run
      fm._tracks._run = async (items, deadline) => {
        try {
          return await run(items, deadline)
        } catch (err) {
          const cause = err?.cause ?? err
          const kind = `${err?.outcome} ${err?.code}${err?.sqlstate ? `/${err.sqlstate}` : ''}: ${cause?.code && cause.code !== err?.sqlstate ? `${cause.code} ` : ''}${String(cause?.message ?? cause).replace(/\d+ ms/g, 'N ms').slice(0, 100)}`
          const a = attempts.get(kind) ?? { groups: 0, calls: 0, first: rel(), last: 0 }
          a.groups++
          a.calls += items.length
          a.last = rel()
          attempts.set(kind, a)
          if (err?.outcome === 'unknown') for (const it of items) if (it.key) unknownAttempt.add(it.key)
          throw err
        }
      }
    }
    await fm.ready()
    // one call first: the pool's first connection and the statement's plan
    await fm.track('t0', METER, 1, opts.keys ? { key: `${runTag}-warm` } : undefined)

    const nBuckets = Math.ceil((opts.seconds * 1000 + opts.timeoutMs + 15000) / BUCKET_MS)
    const acks = new Int32Array(nBuckets)
    const failBuckets = new Map() // code -> Int32Array
    const ackTimes = [] // ms since t0 of each acknowledgement, in order
    const acked = new Set(opts.keys ? [`${runTag}-warm`] : [])
    let ackedCount = 1
    const failures = [] // { key, code, outcome, sqlstate, timedOut, attempts, started, ended, message }
    const latencies = []
    const pending = new Map() // key -> started (ms since t0)
    let notCounted = 0 // acknowledged with counted: false (the key was there already)
    let tenant = 0
    let stopping = false

    const bucket = (ms) => Math.min(nBuckets - 1, Math.floor(ms / BUCKET_MS))

    async function caller (w) {
      for (let i = 0; !stopping; i++) {
        const id = `${runTag}-${w}-${i}`
        const key = opts.keys ? id : null
        const t = `t${tenant++ % opts.tenants}`
        const started = rel()
        pending.set(id, started)
        try {
          const r = await fm.track(t, METER, 1, key ? { key } : undefined)
          const ended = rel()
          if (r.counted === false) notCounted++
          if (key) acked.add(key)
          ackedCount++
          acks[bucket(ended)]++
          ackTimes.push(ended)
          latencies.push(ended - started)
        } catch (err) {
          const ended = rel()
          const code = String(err?.code ?? err?.name ?? 'no code')
          if (!failBuckets.has(code)) failBuckets.set(code, new Int32Array(nBuckets))
          failBuckets.get(code)[bucket(ended)]++
          failures.push({
            key: id,
            code,
            name: err?.name,
            outcome: err?.outcome,
            sqlstate: err?.sqlstate,
            timedOut: err?.timedOut,
            attempts: err?.attempts,
            started,
            ended,
            message: String(err?.message).slice(0, 300),
            cause: err?.cause ? String(err.cause.message ?? err.cause).slice(0, 200) : undefined,
            causeCode: err?.cause?.code
          })
          await sleep(10)
        } finally {
          pending.delete(id)
        }
      }
    }

    // event loop lag: a 20 ms timer's lateness, the worst per bucket
    const lag = new Float64Array(nBuckets)
    let tick = performance.now()
    const lagTimer = setInterval(() => {
      const now = performance.now()
      const late = now - tick - 20
      tick = now
      const b = bucket(now - t0)
      if (late > lag[b]) lag[b] = late
    }, 20)

    const statsBefore = fm.stats()
    t0 = performance.now()
    const wallT0 = Date.now()
    const loops = []
    for (let w = 0; w < opts.concurrency; w++) loops.push(caller(w))

    await sleep(opts.restartAt * 1000 - rel())
    const restart = { at: rel(), wallAt: Date.now() }
    const restarted = restartAsync(cluster, 'fast').then((r) => {
      restart.returnedAt = rel()
      restart.output = r.output.trim().split('\n').slice(-2).join(' | ')
    }, (err) => { restart.error = err.message })

    await sleep(Math.max(0, opts.seconds * 1000 - rel()))
    stopping = true
    const loadEnd = rel()
    // every caller ends its call in flight; one that has not after the
    // deadline and 10 s more is a call that never settled
    const settled = await Promise.race([Promise.all(loops).then(() => true), sleep(opts.timeoutMs + 10000).then(() => false)])
    const hung = [...pending.entries()].map(([key, started]) => ({ key, started, waited: rel() - started }))
    await restarted
    clearInterval(lagTimer)
    const statsAfter = fm.stats()
    if (settled) await fm.close()

    // ---- the figures
    const perSecond = []
    // whole seconds of the load (the calls in flight at its end are left out)
    for (let s = 0; (s + 1) * 1000 <= loadEnd; s++) {
      let n = 0
      for (let b = s * 10; b < s * 10 + 10; b++) n += acks[b]
      perSecond.push(n)
    }
    const restartSecond = Math.floor(restart.at / 1000)
    const baseline = median(perSecond.slice(1, restartSecond))

    // the longest time without an acknowledgement, from 2 s before the restart on
    let gap = { ms: 0, from: NaN, to: NaN }
    let prev = null
    for (const t of ackTimes) {
      if (t < restart.at - 2000) { prev = t; continue }
      if (prev !== null && t - prev > gap.ms) gap = { ms: t - prev, from: prev, to: t }
      prev = t
    }
    let zeroRun = 0
    let run = 0
    for (let b = bucket(restart.at - 2000); b <= bucket(loadEnd); b++) {
      run = acks[b] === 0 ? run + 1 : 0
      zeroRun = Math.max(zeroRun, run)
    }
    // back to >= 90 %: the start of the first 1 s window (in 100 ms steps,
    // from the restart command on) that acknowledged >= 0.9 x baseline; and
    // "sustained": the start of the first such window after which every
    // of the 4 seconds that follow it does too
    const windowAcks = (b) => { let n = 0; for (let k = b; k < b + 10; k++) n += acks[k]; return n }
    const firstB = bucket(restart.at) + 1
    const lastB = bucket(loadEnd) - 10
    let back = null
    for (let b = firstB; b <= lastB; b++) {
      if (windowAcks(b) >= 0.9 * baseline) { back = b * BUCKET_MS - restart.at; break }
    }
    let sustained = null
    for (let b = firstB; b <= lastB - 40 && sustained === null; b++) {
      let ok = true
      for (let k = b; k <= b + 40; k += 10) if (windowAcks(k) < 0.9 * baseline) { ok = false; break }
      if (ok) sustained = b * BUCKET_MS - restart.at
    }

    const failedBy = {}
    for (const f of failures) {
      const k = `${f.code}${f.sqlstate ? `/${f.sqlstate}` : ''}${f.timedOut ? ' timedOut' : ''} (${f.outcome})`
      failedBy[k] = (failedBy[k] ?? 0) + 1
    }
    const causes = {}
    for (const f of failures) {
      const k = `${f.code}: ${(f.cause ?? f.message).replace(/\d+ ms/g, 'N ms')}`
      causes[k] = (causes[k] ?? 0) + 1
    }
    const allLat = [...latencies, ...failures.map((f) => f.ended - f.started)].sort((a, b) => a - b)
    const late = allLat.filter((ms) => ms > opts.timeoutMs + 100).length
    const foreign = failures.filter((f) => !/^FLAGMETER_/.test(f.code))
    // a call reported not applied although one of its attempts may have committed
    const notAppliedAfterUnknown = failures.filter((f) => f.outcome === 'not_applied' && unknownAttempt.has(f.key))

    // ---- consistency, on a connection of its own
    const pg = require('../../clients/node/node_modules/pg')
    const c = new pg.Client(cluster.connection(db))
    await c.connect()
    await c.query('CREATE TEMP TABLE acked (k text PRIMARY KEY)')
    await c.query('INSERT INTO acked SELECT unnest($1::text[])', [[...acked]])
    await c.query('CREATE TEMP TABLE failed (k text PRIMARY KEY, code text, outcome text)')
    await c.query('INSERT INTO failed SELECT * FROM unnest($1::text[], $2::text[], $3::text[])',
      [failures.map((f) => f.key), failures.map((f) => f.code), failures.map((f) => f.outcome ?? null)])
    const one = async (text) => (await c.query(text)).rows[0]
    const all = await one('SELECT count(*)::int AS n, count(DISTINCT idempotency_key)::int AS keys, count(*) FILTER (WHERE idempotency_key IS NULL)::int AS unkeyed FROM flagmeter.events')
    const ackedIn = await one('SELECT count(*)::int AS n, count(DISTINCT e.idempotency_key)::int AS keys FROM flagmeter.events e JOIN acked a ON a.k = e.idempotency_key')
    const twice = await one('SELECT count(*)::int AS keys FROM (SELECT idempotency_key FROM flagmeter.events GROUP BY 1 HAVING count(*) > 1) d')
    const { rows: extra } = opts.keys ? await c.query(`
      SELECT coalesce(f.code, 'neither acknowledged nor failed') AS code, f.outcome, count(*)::int AS n
        FROM flagmeter.events e LEFT JOIN acked a ON a.k = e.idempotency_key LEFT JOIN failed f ON f.k = e.idempotency_key
       WHERE a.k IS NULL GROUP BY 1, 2 ORDER BY 1, 2`) : { rows: [] }
    const keysTable = await one('SELECT count(*)::int AS n, count(DISTINCT idempotency_key)::int AS keys FROM flagmeter.event_keys')
    await c.end()
    const consistency = {
      acknowledged: acked.size,
      eventsRows: all.n,
      eventsDistinctKeys: all.keys,
      eventsWithoutKey: all.unkeyed,
      acknowledgedFound: ackedIn.keys,
      acknowledgedRows: ackedIn.n,
      keysTwice: twice.keys,
      notAcknowledgedInEvents: extra,
      eventKeys: keysTable
    }
    const unknownRecorded = extra.filter((r) => r.outcome === 'unknown').reduce((n, r) => n + r.n, 0)
    const badExtra = extra.filter((r) => r.outcome !== 'unknown').reduce((n, r) => n + r.n, 0)
    const unknownFailed = failures.filter((f) => f.outcome === 'unknown').length
    if (opts.keys) {
      consistency.ok = ackedIn.keys === acked.size && ackedIn.n === acked.size && twice.keys === 0 && all.n === all.keys && badExtra === 0
    } else {
      // without keys: what was counted is between the acknowledged calls and
      // those plus the calls whose outcome was unknown
      consistency.acknowledged = ackedCount
      consistency.ok = all.n >= ackedCount && all.n <= ackedCount + unknownFailed
    }

    const wall = (ms) => ms - restart.at
    const server = serverTimes(cluster.log(), restart.wallAt)
    const serverRel = Object.fromEntries(Object.entries(server).map(([k, t]) => [k, Math.round(t - restart.wallAt)]))

    // ---- the report
    const f1 = (ms) => (ms / 1000).toFixed(2)
    console.log(`\nflagmeter fast restart under load: ${opts.concurrency} callers, ${opts.tenants} tenants, ${opts.seconds} s, restart at ${opts.restartAt} s, timeoutMs ${opts.timeoutMs}`)
    console.log('\n second  acked/s  failed/s   max loop lag ms')
    for (let s = 0; s < perSecond.length; s++) {
      let failed = 0
      for (const arr of failBuckets.values()) for (let b = s * 10; b < s * 10 + 10; b++) failed += arr[b]
      let l = 0
      for (let b = s * 10; b < s * 10 + 10; b++) l = Math.max(l, lag[b])
      const mark = s === restartSecond ? '  <- restart' : ''
      console.log(`${String(s).padStart(7)}  ${String(perSecond[s]).padStart(7)}  ${String(failed).padStart(8)}   ${l.toFixed(0).padStart(6)}${mark}`)
    }
    console.log('\n 100 ms buckets from 0.5 s before the restart (acked, failed):')
    const from = bucket(restart.at - 500)
    const to = Math.min(bucket(loadEnd), bucket(gap.to + 1500))
    const row = []
    for (let b = from; b <= to; b++) {
      let failed = 0
      for (const arr of failBuckets.values()) failed += arr[b]
      row.push(`${f1(b * BUCKET_MS - restart.at)}:${acks[b]}${failed ? `/${failed}` : ''}`)
    }
    for (let i = 0; i < row.length; i += 10) console.log('  ' + row.slice(i, i + 10).join('  '))
    const table = [
      ['baseline (median acked/s before the restart)', baseline.toFixed(0)],
      ['restart command -> pg_ctl returned', `${f1(restart.returnedAt - restart.at)} s`],
      ['server: shutdown request / shut down / ready (from the restart command)', `${f1(serverRel.shutdownRequested)} / ${f1(serverRel.shutDown)} / ${f1(serverRel.ready)} s`],
      ['unavailability (longest time without an ack)', `${f1(gap.ms)} s (from ${f1(wall(gap.from))} to ${f1(wall(gap.to))} s after the restart command)`],
      ['unavailability (longest run of empty 100 ms buckets)', `${f1(zeroRun * BUCKET_MS)} s`],
      ['restart command -> a second at >= 90 % of baseline begins', back === null ? 'never within the run' : `${f1(back)} s`],
      ['  ... and the 4 seconds after it too (sustained)', sustained === null ? 'never within the run' : `${f1(sustained)} s`],
      ['failed calls', `${failures.length}`],
      ...Object.entries(failedBy).map(([k, n]) => [`  ${k}`, String(n)]),
      ['failed FLAGMETER_NOT_APPLIED after an attempt with an unknown outcome', String(notAppliedAfterUnknown.length)],
      ['calls past their deadline + 100 ms', String(late)],
      ['calls that never settled', String(hung.length)],
      ['latency p50 / p99 / max', `${allLat.length ? quantile(allLat, 0.5).toFixed(0) : '-'} / ${allLat.length ? quantile(allLat, 0.99).toFixed(0) : '-'} / ${allLat.length ? allLat[allLat.length - 1].toFixed(0) : '-'} ms`],
      ['acknowledged with counted: false', String(notCounted)],
      ['client retries (calls sent again) / groups / LISTEN reconnects', `${statsAfter.retries - statsBefore.retries} / ${statsAfter.track.groups - statsBefore.track.groups} / ${statsAfter.reconnects - statsBefore.reconnects}`],
      ['fm.on(error) reports', String(background.length)],
      ...(opts.keys
        ? [['acknowledged keys / found in events / rows', `${acked.size} / ${ackedIn.keys} / ${ackedIn.n}`],
            ['events rows / distinct keys / keys twice', `${all.n} / ${all.keys} / ${twice.keys}`],
            ['in events, not acknowledged', extra.length ? extra.map((r) => `${r.n} ${r.code} (${r.outcome})`).join(', ') : '0']]
        : [['acknowledged calls / events rows / failed unknown', `${ackedCount} / ${all.n} / ${unknownFailed}`],
            ['counted but not acknowledged (of the unknown)', String(all.n - ackedCount)]]),
      ['consistency', consistency.ok ? 'ok' : 'FAILED']
    ]
    const width = Math.max(...table.map((r) => r[0].length))
    console.log('')
    for (const [k, v] of table) console.log(`${k.padEnd(width)}  ${v}`)
    if (Object.keys(causes).length) {
      console.log('\nfailure causes:')
      for (const [k, n] of Object.entries(causes).sort((a, b) => b[1] - a[1])) console.log(`  ${String(n).padStart(6)}  ${k}`)
    }
    if (background.length) {
      console.log('\nfm.on(error):')
      for (const e of background.slice(0, 10)) console.log(`  ${f1(wall(e.at))} s  ${e.source} ${e.code} ${e.message}`)
    }
    if (attempts.size) {
      console.log('\nfailed group attempts (groups, calls, first-last from the restart command):')
      for (const [k, a] of attempts) console.log(`  ${String(a.groups).padStart(4)} ${String(a.calls).padStart(6)}  ${f1(wall(a.first))}-${f1(wall(a.last))} s  ${k}`)
    }
    if (stream.length) console.log('\nLISTEN session: ' + stream.map((e) => `${e.state} at ${f1(wall(e.at))} s`).join(', '))
    if (foreign.length) {
      console.log('\nfailures without a FLAGMETER_ code:')
      for (const f of foreign.slice(0, 10)) console.log(`  ${f.code} ${f.name} outcome=${f.outcome}: ${f.message}`)
    }
    if (hung.length) console.log(`\ncalls that never settled: ${hung.length}, e.g. ${JSON.stringify(hung.slice(0, 3))}`)

    const failWindow = failures.length
      ? { firstAt: Math.round(wall(Math.min(...failures.map((f) => f.ended)))), lastAt: Math.round(wall(Math.max(...failures.map((f) => f.ended)))) }
      : null
    const result = {
      bench: 'faults/restart',
      date: new Date(wallT0).toISOString(),
      ...checkout(),
      machine: machine(),
      options: opts,
      baselinePerSecond: baseline,
      restartCommandMs: Math.round(restart.returnedAt - restart.at),
      serverMs: serverRel,
      unavailabilityS: Number(f1(gap.ms)),
      gapFromS: Number(f1(wall(gap.from))),
      gapToS: Number(f1(wall(gap.to))),
      emptyBucketsS: Number(f1(zeroRun * BUCKET_MS)),
      backTo90S: back === null ? null : Number(f1(back)),
      sustained90S: sustained === null ? null : Number(f1(sustained)),
      failed: failures.length,
      failedBy,
      failWindowMs: failWindow,
      notAppliedAfterUnknown: notAppliedAfterUnknown.length,
      unknownAttemptCalls: unknownAttempt.size,
      pastDeadline: late,
      neverSettled: hung.length,
      latencyMs: { p50: quantile(allLat, 0.5), p99: quantile(allLat, 0.99), max: allLat[allLat.length - 1] },
      countedFalse: notCounted,
      retries: statsAfter.retries - statsBefore.retries,
      reconnects: statsAfter.reconnects - statsBefore.reconnects,
      backgroundErrors: background.length,
      failedAttempts: Object.fromEntries([...attempts].map(([k, a]) => [k, { groups: a.groups, calls: a.calls, firstMs: Math.round(wall(a.first)), lastMs: Math.round(wall(a.last)) }])),
      consistency,
      unknownRecorded,
      restartError: restart.error ?? null
    }
    console.log('\nRESULT ' + JSON.stringify(result))
    if (opts.out) {
      fs.mkdirSync(path.dirname(path.resolve(opts.out)), { recursive: true })
      fs.writeFileSync(opts.out, JSON.stringify({
        ...result,
        perSecond,
        acks100ms: Array.from(acks.slice(0, bucket(loadEnd) + 1)),
        failed100ms: Object.fromEntries([...failBuckets].map(([k, a]) => [k, Array.from(a.slice(0, bucket(loadEnd) + 1))])),
        restartAtMs: restart.at,
        failures: failures.slice(0, 200),
        background,
        stream
      }) + '\n')
    }
    if (!settled) {
      console.log('some calls never settled: exiting without fm.close()')
      process.exit(2)
    }
    process.exitCode = consistency.ok ? 0 : 1
  } finally {
    cluster.destroy()
  }
}

main().catch((err) => {
  console.error(err)
  process.exit(1)
})
