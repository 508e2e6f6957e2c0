'use strict'
// A load of concurrent callers for the fault suites, and the checks every
// fault must pass (README "Faults and retries"):
// - every call acknowledged is counted exactly once (its key, in events);
// - every failed call says what became of it: not applied (its key is not
//   in events), or unknown (sending it again with its key settles it);
//   calls without a key are counted between the acknowledged and the
//   acknowledged plus the unknown;
// - no call outlives its deadline;
// - the quota events the client emitted are the outbox's, once each, in
//   version order, and its version reaches the outbox's last.
const assert = require('node:assert/strict')
const { sleep } = require('@flagmeter/test-helpers')
const { FlagMeter } = require('../..')

const METER = 'api_calls'

// Each tenant crosses a threshold every 15 calls: quota events flow all
// through a test, before, during and after the fault.
const SETUP = `
  SELECT flagmeter.define_meter('${METER}');
  SELECT flagmeter.define_plan('metered');
  SELECT flagmeter.set_limit('metered', '${METER}', 300, 'lifetime', 'soft',
    (SELECT array_agg(p) FROM generate_series(5, 100, 5) p));
  SELECT flagmeter.assign_plan('t' || i, 'metered') FROM generate_series(0, 39) i;
  SELECT flagmeter.assign_plan('u' || i, 'metered') FROM generate_series(0, 3) i;`

class Load {
  /**
   * @param {import('../..').FlagMeter} fm
   * @param {object} [opts]
   * @param {number} [opts.keyed]    callers of track with a key
   * @param {number} [opts.consumers] callers of consume with a key
   * @param {number} [opts.unkeyed]  callers of track without a key (tenants u0..u3)
   * @param {number} [opts.timeoutMs] the client's deadline, for the check
   */
  constructor (fm, { keyed = 24, consumers = 4, unkeyed = 4, timeoutMs }) {
    this.fm = fm
    this.timeoutMs = timeoutMs
    this.acked = new Set() // keys of calls that resolved
    this.failed = [] // { key, kind, err }
    this.unkeyedAcked = 0
    this.unkeyedUnknown = 0
    this.slowest = 0
    this.okAt = [] // Date.now() of each resolved call
    this.events = [] // versions of the quota events emitted
    this._stopping = false
    this._loops = []
    this._specs = { keyed, consumers, unkeyed }
    this._onEvent = (e) => { if (e.version !== undefined) this.events.push(BigInt(e.version)) }
    for (const kind of FlagMeter.EVENT_KINDS) if (kind !== 'invalidate') fm.on(kind, this._onEvent)
  }

  start () {
    const { keyed, consumers, unkeyed } = this._specs
    for (let w = 0; w < keyed; w++) this._loops.push(this._loop(`k${w}`, (key, i) => this.fm.track(`t${i % 40}`, METER, 1, { key })))
    for (let w = 0; w < consumers; w++) this._loops.push(this._loop(`c${w}`, (key, i) => this.fm.consume(`t${(i + w) % 40}`, METER, 1, { key })))
    for (let w = 0; w < unkeyed; w++) this._loops.push(this._loop(null, () => this.fm.track(`u${w}`, METER, 1), w))
    return this
  }

  async _loop (prefix, call) {
    for (let i = 0; !this._stopping; i++) {
      const key = prefix === null ? null : `${prefix}-${i}`
      const t0 = Date.now()
      try {
        await call(key, i)
        if (key === null) this.unkeyedAcked++
        else this.acked.add(key)
        this.okAt.push(Date.now())
      } catch (err) {
        if (key === null && err.outcome === 'unknown') this.unkeyedUnknown++
        this.failed.push({ key, kind: prefix === null ? 'track' : prefix[0] === 'c' ? 'consume' : 'track', err })
        await sleep(10) // as an app would answer 503 and its caller come back
      }
      this.slowest = Math.max(this.slowest, Date.now() - t0)
    }
  }

  /** Resolves once n calls resolved after `since` (the database is back). */
  async recovered (since, n = 50, ms = 30000) {
    const end = Date.now() + ms
    while (this.okAt.filter((t) => t > since).length < n) {
      if (Date.now() > end) throw new Error(`no recovery: ${this.okAt.filter((t) => t > since).length} calls after the fault; last errors: ${this.failed.slice(-3).map((f) => f.err.message).join(' | ')}`)
      await sleep(20)
    }
  }

  async stop () {
    this._stopping = true
    await Promise.all(this._loops)
  }

  /**
   * The checks, on a connection of the caller's (query(text, values));
   * returns a summary for the test's diagnostics.
   */
  async verify (query) {
    const codes = {}
    for (const f of this.failed) codes[f.err.code] = (codes[f.err.code] ?? 0) + 1
    for (const f of this.failed) {
      assert.ok(['FLAGMETER_NOT_APPLIED', 'FLAGMETER_OUTCOME_UNKNOWN'].includes(f.err.code),
        `a failed call says applied or not: ${f.err.code} ${f.err.message}`)
    }
    assert.ok(this.slowest <= this.timeoutMs + 1000, `the slowest call took ${this.slowest} ms (deadline ${this.timeoutMs})`)

    // acknowledged: counted once each
    const acked = [...this.acked]
    const { rows } = await query(`
      SELECT count(*)::int AS n, count(DISTINCT idempotency_key)::int AS keys
        FROM flagmeter.events WHERE idempotency_key = ANY($1)`, [acked])
    const consumes = acked.filter((k) => k[0] === 'c')
    const tracks = acked.length - consumes.length
    // a consume's key is in event_keys; a track's in events (and event_keys)
    const keyed = await query(`
      SELECT count(*)::int AS n, count(DISTINCT idempotency_key)::int AS keys
        FROM flagmeter.event_keys WHERE idempotency_key = ANY($1)`, [acked])
    assert.equal(keyed.rows[0].keys, acked.length, 'every acknowledged key is recorded')
    assert.equal(keyed.rows[0].n, acked.length, 'and recorded once')
    assert.equal(rows[0].n, rows[0].keys, 'no key counted twice')
    assert.ok(rows[0].keys >= tracks, 'every acknowledged track is an event')

    // not applied: not recorded
    const notApplied = this.failed.filter((f) => f.key !== null && f.err.outcome === 'not_applied').map((f) => f.key)
    const leaked = await query('SELECT idempotency_key FROM flagmeter.event_keys WHERE idempotency_key = ANY($1)', [notApplied])
    assert.deepEqual(leaked.rows.map((r) => r.idempotency_key), [], 'a call that was not applied recorded nothing')

    // unknown: settled by sending it again with its key (until it is
    // answered, as the app's caller would), then counted once
    const unknown = this.failed.filter((f) => f.key !== null && f.err.outcome === 'unknown')
    for (const f of unknown) {
      const i = Number(f.key.split('-')[1])
      const w = Number(f.key.slice(1).split('-')[0])
      const again = () => f.kind === 'consume'
        ? this.fm.consume(`t${(i + w) % 40}`, METER, 1, { key: f.key })
        : this.fm.track(`t${i % 40}`, METER, 1, { key: f.key })
      for (let tries = 1; ; tries++) {
        try {
          await again()
          break
        } catch (err) {
          if (tries >= 5 || !/^FLAGMETER_/.test(err.code)) throw err
        }
      }
    }
    if (unknown.length > 0) {
      const settled = await query('SELECT count(*)::int AS n, count(DISTINCT idempotency_key)::int AS keys FROM flagmeter.event_keys WHERE idempotency_key = ANY($1)',
        [unknown.map((f) => f.key)])
      assert.equal(settled.rows[0].n, unknown.length, 'an unknown outcome, sent again with its key, is counted once')
    }

    // without a key: between what was acknowledged and that plus the unknown
    const unkeyed = await query("SELECT coalesce(sum(amount), 0)::int AS n FROM flagmeter.events WHERE tenant LIKE 'u%'")
    assert.ok(unkeyed.rows[0].n >= this.unkeyedAcked && unkeyed.rows[0].n <= this.unkeyedAcked + this.unkeyedUnknown,
      `calls without a key: ${unkeyed.rows[0].n} counted, ${this.unkeyedAcked} acknowledged, ${this.unkeyedUnknown} unknown`)

    return { acked: acked.length, unkeyed: this.unkeyedAcked, failed: codes, unknownSettled: unknown.length, slowestMs: this.slowest }
  }

  /** The events emitted are the outbox's since `from`, once each, in order; the version reached its last. */
  async verifyEvents (query, from) {
    const last = async () => (await query('SELECT max(version)::text AS v FROM flagmeter.changes_since($1::bigint)', [String(from)])).rows[0].v
    const end = Date.now() + 15000
    let target = await last()
    while (target !== null && String(this.fm.version) !== target) {
      if (Date.now() > end) throw new Error(`the client's version ${this.fm.version} did not reach the outbox's ${target}`)
      await sleep(50)
      target = await last()
    }
    const { rows } = await query('SELECT version::text AS v FROM flagmeter.changes_since($1::bigint) ORDER BY version', [String(from)])
    const outbox = rows.map((r) => BigInt(r.v))
    const emitted = this.events.filter((v) => v > BigInt(from))
    assert.deepEqual(emitted, outbox, 'each quota event of the outbox emitted once, in version order')
    return outbox.length
  }
}

module.exports = { Load, SETUP, METER }
