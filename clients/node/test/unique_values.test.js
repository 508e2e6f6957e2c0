'use strict'
// Unique meters through the client: fm.trackValue, fm.consumeValue and
// fm.forgetValue, grouped like track and consume (one statement per group,
// answered per call in the calls' order), a bad call failing alone, and
// what is sent again after an unknown outcome.
const { test, before, after } = require('node:test')
const assert = require('node:assert/strict')
const { FlagMeter, FlagMeterOutcomeUnknownError } = require('..')
const { createDatabase } = require('./helpers')

const TENANTS = ['acme', 'globex', 'initech', 'order', 'bad', 'kinds', 'tx', 'faults']

let db
before(async () => {
  db = await createDatabase('fm_node_unique_values', `
    SELECT flagmeter.configure(late_events => '100 years');
    SELECT flagmeter.define_meter('mau', aggregation => 'unique');
    SELECT flagmeter.define_meter('seats', aggregation => 'unique');
    SELECT flagmeter.define_meter('api_calls');
    SELECT flagmeter.define_plan('team');
    SELECT flagmeter.set_limit('team', 'mau', 1000, 'month');
    SELECT flagmeter.set_limit('team', 'seats', 5, 'month');
    SELECT flagmeter.set_limit('team', 'api_calls', 1000, 'month');
    SELECT flagmeter.assign_plan(t, 'team') FROM unnest(ARRAY[${TENANTS.map((t) => `'${t}'`).join(', ')}]) t;`)
})
after(async () => { await db.drop() })

// maxInFlight 1: the first call goes alone, the others queue behind it and
// go as one group
function client (extra = {}) {
  return new FlagMeter({ connection: db.connection(), listen: false, maxInFlight: 1, ...extra })
}

async function used (tenant, meter, at = null) {
  const { rows } = await db.query('SELECT flagmeter.used(flagmeter.usage($1, $2, coalesce($3, now())))::int AS u', [tenant, meter, at])
  return rows[0].u
}

/** The SQLSTATE (or the error's name) of each rejected result, in order. */
function refusals (results) {
  return results.filter((r) => r.status === 'rejected').map((r) => r.reason.code ?? r.reason.name)
}

test('trackValue: true for a value new in its period, false for one counted already', async () => {
  const fm = client()
  try {
    assert.equal(await fm.trackValue('acme', 'mau', 'user-1'), true)
    assert.equal(await fm.trackValue('acme', 'mau', 'user-1'), false)
    assert.equal(await fm.trackValue('acme', 'mau', 'user-2'), true)
    assert.equal(await fm.trackValue('globex', 'mau', 'user-1'), true, 'another tenant counts its own')
    assert.equal(await used('acme', 'mau'), 2)
    // occurredAt: counted in the period of that time, not in this one
    const past = new Date(Date.UTC(2001, 2, 15))
    assert.equal(await fm.trackValue('acme', 'mau', 'user-1', { occurredAt: past }), true)
    assert.equal(await fm.trackValue('acme', 'mau', 'user-1', { occurredAt: past }), false)
    assert.equal(await used('acme', 'mau', past), 1)
    assert.equal(await used('acme', 'mau'), 2)
    assert.deepEqual(fm.stats().trackValue, { calls: 6, groups: 6 })
  } finally { await fm.close() }
})

test('concurrent calls go as one statement, answered each in the order of the calls', async () => {
  const fm = client()
  try {
    const first = fm.trackValue('order', 'mau', 'first')
    // 60 calls over 15 values, with and without occurredAt: the first call
    // of each value is the new one
    const now = new Date()
    const calls = Array.from({ length: 60 }, (_, i) =>
      fm.trackValue('order', 'mau', `u${(i * 7) % 15}`, i % 2 === 0 ? { occurredAt: now } : {}))
    const answers = await Promise.all([first, ...calls])
    const seen = new Set()
    const expected = [true, ...Array.from({ length: 60 }, (_, i) => {
      const v = (i * 7) % 15
      if (seen.has(v)) return false
      seen.add(v)
      return true
    })]
    assert.deepEqual(answers, expected)
    assert.deepEqual(fm.stats().trackValue, { calls: 61, groups: 2 }, 'the first alone, the 60 others in one group')
    assert.equal(await used('order', 'mau'), 16)
    // forgetValue groups the same way; the second forget of a value finds it gone
    const forgets = await Promise.all([fm.forgetValue('order', 'mau', 'first'), fm.forgetValue('order', 'mau', 'u0'),
      fm.forgetValue('order', 'mau', 'u0'), fm.forgetValue('order', 'mau', 'never-seen'), fm.forgetValue('order', 'mau', 'u1')])
    assert.deepEqual(forgets, [true, true, false, false, true])
    assert.deepEqual(fm.stats().forgetValue, { calls: 5, groups: 2 })
    assert.equal(await used('order', 'mau'), 13)
  } finally { await fm.close() }
})

test('consumeValue: the sixth seat is refused while the five seated stay granted; forgetValue frees a seat', async () => {
  const fm = client()
  try {
    const seat = (v) => fm.consumeValue('initech', 'seats', v)
    const first = await seat('ann')
    assert.deepEqual([first.granted, first.used, first.quota, first.remaining, first.reason, first.meter], [true, 1, 5, 4, 'ok', 'seats'])
    assert.ok(first.resetsAt instanceof Date)
    assert.equal(first.retryAfterMs, null)
    // ann alone again, then one group: four new seats, the sixth refused,
    // two seated again
    const group = await Promise.all([seat('ann'), seat('bob'), seat('cy'), seat('dee'), seat('eve'), seat('fay'), seat('bob'), seat('ann')])
    assert.deepEqual(group.map((d) => d.granted), [true, true, true, true, true, false, true, true])
    assert.deepEqual(group.map((d) => d.used), [1, 2, 3, 4, 5, 5, 5, 5])
    const refused = group[5]
    assert.deepEqual([refused.reason, refused.remaining, refused.overage, refused.retryAfterMs], ['quota_exceeded', 0, 0, null])
    assert.deepEqual(fm.stats().consumeValue, { calls: 9, groups: 3 }, 'ann alone twice, then the seven others as one group')
    assert.equal(await used('initech', 'seats'), 5)
    // a seat given up is a seat free for someone else, once
    assert.equal(await fm.forgetValue('initech', 'seats', 'cy'), true)
    assert.equal(await fm.forgetValue('initech', 'seats', 'cy'), false)
    assert.equal(await used('initech', 'seats'), 4)
    const [fay, gus, eve] = await Promise.all([seat('fay'), seat('gus'), seat('eve')])
    assert.deepEqual([fay.granted, fay.used], [true, 5])
    assert.deepEqual([gus.granted, gus.reason, gus.used], [false, 'quota_exceeded', 5])
    assert.deepEqual([eve.granted, eve.used], [true, 5])
    // trackValue records what happened: never refused, past the quota
    assert.equal(await fm.trackValue('initech', 'seats', 'hal'), true)
    assert.equal(await used('initech', 'seats'), 6)
  } finally { await fm.close() }
})

// The engine answers a value counted already with check's figures read in a
// new snapshot, so in a group it counts the values earlier calls of the same
// statement added.
test('a value counted already, after new ones in its group: used counts them', async () => {
  const fm = client()
  try {
    const seat = (v) => fm.consumeValue('globex', 'seats', v)
    await seat('ann')
    // the first alone, bob and ann in one group
    const [, bob, ann] = await Promise.all([seat('ann'), seat('bob'), seat('ann')])
    assert.equal(fm.stats().consumeValue.groups, 3)
    assert.deepEqual([bob.used, ann.used], [2, 2])
  } finally { await fm.close() }
})

test('bad input fails alone: the rest of its group is answered', async () => {
  const fm = client()
  try {
    const first = fm.trackValue('bad', 'mau', 'first')
    const calls = Array.from({ length: 30 }, (_, i) => fm.trackValue('bad', 'mau', `u${i}`))
    // refused by the server, inside the group: a value over 1024 bytes, a
    // meter that does not count values, a tenant never assigned a plan
    calls.splice(3, 0, fm.trackValue('bad', 'mau', 'x'.repeat(1025)))
    calls.splice(11, 0, fm.trackValue('bad', 'api_calls', 'u1'))
    calls.splice(20, 0, fm.trackValue('nobody', 'mau', 'u1'))
    // refused by the client before it joins a group: no value, an empty one
    calls.splice(25, 0, fm.trackValue('bad', 'mau', /** @type {any} */ (null)), fm.trackValue('bad', 'mau', ''))
    const results = await Promise.allSettled([first, ...calls])
    assert.deepEqual(refusals(results), ['22001', '42809', 'QT001', 'TypeError', 'TypeError'])
    const counted = results.filter((r) => r.status === 'fulfilled')
    assert.equal(counted.length, 31)
    assert.ok(counted.every((r) => r.value === true))
    assert.equal(await used('bad', 'mau'), 31)
    assert.ok(fm.stats().splits >= 1, 'the refused group was split')
    for (const r of results.filter((r) => r.status === 'rejected' && r.reason.code)) {
      assert.equal(r.reason.outcome, 'refused')
    }
    // the same for consumeValue and forgetValue
    const seats = ['a', 'b', 'c', 'd'].map((v) => fm.consumeValue('bad', 'seats', v))
    seats.splice(2, 0, fm.consumeValue('bad', 'seats', 'y'.repeat(2000)))
    const decided = await Promise.allSettled(seats)
    assert.deepEqual(refusals(decided), ['22001'])
    assert.ok(decided.every((r) => r.status === 'rejected' || r.value.granted))
    const forgets = await Promise.allSettled([fm.forgetValue('bad', 'seats', 'a'), fm.forgetValue('bad', 'api_calls', 'a'),
      fm.forgetValue('bad', 'seats', 'b')])
    assert.deepEqual(refusals(forgets), ['42809'])
    assert.equal(await used('bad', 'seats'), 2)
  } finally { await fm.close() }
})

test('a meter of the wrong kind is refused with 42809, both ways, and fails alone', async () => {
  const fm = client()
  try {
    for (const call of [
      () => fm.trackValue('kinds', 'api_calls', 'u1'),
      () => fm.consumeValue('kinds', 'api_calls', 'u1'),
      () => fm.forgetValue('kinds', 'api_calls', 'u1'),
      () => fm.track('kinds', 'mau', 1),
      () => fm.consume('kinds', 'mau', 1)
    ]) {
      await assert.rejects(call(), (err) => err.code === '42809' && err.outcome === 'refused')
    }
    // an amount on a unique meter in a group of tracks: split out, the others counted
    const first = fm.track('kinds', 'api_calls', 1)
    const tracks = Array.from({ length: 10 }, () => fm.track('kinds', 'api_calls', 1))
    tracks.splice(4, 0, fm.track('kinds', 'mau', 1))
    const results = await Promise.allSettled([first, ...tracks])
    assert.deepEqual(refusals(results), ['42809'])
    assert.equal(await used('kinds', 'api_calls'), 11)
    assert.equal(await used('kinds', 'mau'), 0)
  } finally { await fm.close() }
})

test('in fm.transaction: the value calls commit and roll back with it', async () => {
  const fm = client()
  try {
    await assert.rejects(fm.transaction(async (tx) => {
      assert.equal((await tx.consumeValue('tx', 'seats', 'ann')).granted, true)
      assert.equal(await tx.trackValue('tx', 'mau', 'ann'), true)
      throw new Error('the app changed its mind')
    }), /changed its mind/)
    assert.equal(await used('tx', 'seats'), 0)
    assert.equal(await used('tx', 'mau'), 0)
    const forgot = await fm.transaction(async (tx) => {
      await tx.consumeValue('tx', 'seats', 'ann')
      assert.equal(await tx.trackValue('tx', 'mau', 'ann', { occurredAt: new Date() }), true)
      return tx.forgetValue('tx', 'seats', 'ann')
    })
    assert.equal(forgot, true)
    assert.deepEqual([await used('tx', 'seats'), await used('tx', 'mau')], [0, 1])
    assert.deepEqual(fm.stats().consumeValue, { calls: 0, groups: 0 }, 'unbatched')
  } finally { await fm.close() }
})

/**
 * The next group of a batcher runs and commits, then its connection is
 * lost before the answer: an unknown outcome, once.
 */
function loseAnswerOnce (batcher) {
  const run = batcher._run
  batcher._run = async (items, deadline) => {
    batcher._run = run
    await run(items, deadline)
    throw Object.assign(new Error('connection lost'), { outcome: 'unknown' })
  }
}

test('after an unknown outcome trackValue is sent again; consumeValue and forgetValue are not', async () => {
  const fm = client()
  try {
    assert.equal((await fm.consumeValue('faults', 'seats', 'ann')).granted, true)
    loseAnswerOnce(fm._trackValues)
    // committed by the first attempt: the second finds it counted
    assert.equal(await fm.trackValue('faults', 'mau', 'ann'), false)
    assert.equal(fm.stats().retries, 1)
    loseAnswerOnce(fm._consumeValues)
    await assert.rejects(fm.consumeValue('faults', 'seats', 'bob'), FlagMeterOutcomeUnknownError)
    loseAnswerOnce(fm._forgetValues)
    await assert.rejects(fm.forgetValue('faults', 'seats', 'ann'), FlagMeterOutcomeUnknownError)
    assert.equal(fm.stats().retries, 1, 'neither was sent again')
    // what they did stands: bob seated, ann's seat freed
    assert.equal(await used('faults', 'mau'), 1)
    assert.equal(await used('faults', 'seats'), 1)
    assert.equal(await fm.forgetValue('faults', 'seats', 'bob'), true)
  } finally { await fm.close() }
})
