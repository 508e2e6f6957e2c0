'use strict'
// The number rule: bigints are JavaScript numbers while they are safe
// integers, BigInt beyond, never strings: in decisions, usage and events.
const { test, before, after } = require('node:test')
const assert = require('node:assert/strict')
// the rules as the package exports them (the dashboard app uses them)
const { FlagMeter, parseJson, toInt, checkAmount, intTypes } = require('..')
const { createDatabase, until } = require('./helpers')

const BIG_QUOTA = 2n ** 62n // 4611686018427387904: far past 2^53

let db
before(async () => {
  db = await createDatabase('fm_node_numbers', `
    SELECT flagmeter.define_meter('bytes');
    SELECT flagmeter.define_plan('huge');
    SELECT flagmeter.set_limit('huge', 'bytes', ${BIG_QUOTA}, 'lifetime', 'hard', '{50}');
    SELECT flagmeter.assign_plan('acme', 'huge');`)
})
after(async () => { await db.drop() })

test('toInt and parseJson', () => {
  assert.equal(toInt('9007199254740991'), 9007199254740991)
  assert.equal(toInt('-9007199254740991'), -9007199254740991)
  assert.equal(toInt('9007199254740992'), 9007199254740992n)
  assert.equal(toInt('9223372036854775807'), 9223372036854775807n)
  assert.deepEqual(parseJson('{"v":1,"q":9223372036854775807,"t":"x:12345678901234567890","u":-9007199254740993}'),
    { v: 1, q: 9223372036854775807n, t: 'x:12345678901234567890', u: -9007199254740993n })
  assert.deepEqual(parseJson('{"a":"\\"","b":[1,2.5,1e3]}'), { a: '"', b: [1, 2.5, 1000] })
})

test('checkAmount: a non-negative (or positive) safe integer or a BigInt in the bigint range, as given', () => {
  assert.equal(checkAmount(0, 'amount'), 0)
  assert.equal(checkAmount(2n ** 62n, 'amount', true), 2n ** 62n)
  assert.throws(() => checkAmount(0, 'amount', true), RangeError)
  assert.throws(() => checkAmount(-1, 'amount'), /amount must be non-negative/)
  assert.throws(() => checkAmount(1.5, 'amount'), TypeError)
  assert.throws(() => checkAmount(2 ** 53, 'amount'), TypeError)
  assert.throws(() => checkAmount('1', 'amount'), TypeError)
  assert.throws(() => checkAmount(2n ** 63n, 'actual'), /actual is out of the bigint range/)
})

test('intTypes: int8 and int8[] by the number rule, other types as pg reads them', () => {
  assert.equal(intTypes.getTypeParser(20, 'text')('9007199254740993'), 9007199254740993n)
  assert.deepEqual(intTypes.getTypeParser(1016, 'text')('{1,NULL,9223372036854775807}'), [1, null, 9223372036854775807n])
  assert.equal(intTypes.getTypeParser(23, 'text')('42'), 42)
})

test('amounts, usage and quotas past 2^53 are BigInt; small ones numbers', async () => {
  const fm = new FlagMeter({ connection: db.connection() })
  try {
    await fm.ready()
    const seen = []
    fm.on('threshold', (e) => seen.push(e))
    assert.equal(fm.limit('acme', 'bytes').quota, BIG_QUOTA)
    const d1 = await fm.consume('acme', 'bytes', 5)
    assert.deepEqual([d1.used, d1.quota, d1.remaining, d1.overage], [5, BIG_QUOTA, BIG_QUOTA - 5n, 0])
    assert.equal(typeof d1.used, 'number')
    // a BigInt amount; usage crosses 50 % of 2^62 (the threshold event carries BigInts)
    const half = BIG_QUOTA / 2n
    assert.deepEqual(await fm.track('acme', 'bytes', half), { counted: true })
    const c = await fm.check('acme', 'bytes', 1)
    assert.equal(c.used, half + 5n)
    assert.equal(typeof c.used, 'bigint')
    await until(() => seen.length === 1, 10000, 'the threshold event')
    assert.equal(seen[0].used, half + 5n)
    assert.equal(seen[0].quota, BIG_QUOTA)
    assert.equal(typeof seen[0].version, 'number')
    assert.equal(seen[0].threshold, 50)
    // no figure of a decision is a string
    for (const f of ['used', 'quota', 'remaining', 'overage']) assert.ok(['number', 'bigint'].includes(typeof c[f]), f)
  } finally { await fm.close() }
})
