// Compiled by test/types.test.js with tsc --noEmit: the declarations must
// describe the API as a TypeScript app uses it (and reject misuse below).
import {
  FlagMeter, FlagMeterClosedError, FlagMeterNotAppliedError, FlagMeterOutcomeUnknownError, FlagMeterFaultError,
  QUOTA_EVENT_KINDS, DEFAULTS, toInt, checkAmount, parseJson, intTypes,
  type CallOutcome, type Decision, type DecisionReason, type RateDecision, type RateLimitOptions, type Limit, type FeatureConfig, type Int, type ThresholdEvent,
  type QuotaEvent, type QuotaEventKind, type FlagMeterEvents
} from 'flagmeter'
import { Client, Pool } from 'pg'

// Whether two types are the same (not merely assignable one way).
type Same<A, B> = (<T>() => T extends A ? 1 : 2) extends (<T>() => T extends B ? 1 : 2) ? true : false

// One list of event kinds: the exported list, its union type, the kinds of
// the QuotaEvent types and the quota events fm.on() takes are the same set.
const listIsUnion: Same<(typeof QUOTA_EVENT_KINDS)[number], QuotaEventKind> = true
const unionIsEvents: Same<QuotaEventKind, QuotaEvent['kind']> = true
const eventNames: Same<QuotaEventKind | 'invalidate' | 'error' | 'connected' | 'disconnected', keyof FlagMeterEvents> = true
void listIsUnion; void unionIsEvents; void eventNames
// @ts-expect-error: the list is frozen
QUOTA_EVENT_KINDS.push('threshold')
// @ts-expect-error: so are the defaults
DEFAULTS.maxInFlight = 4
const inFlight: number = DEFAULTS.maxInFlight
const retryWait: number = DEFAULTS.retry.maxDelayMs
void inFlight; void retryWait

// The number rules, for an app's own figures and queries.
const big: Int | null = toInt('9223372036854775807')
const amount: Int = checkAmount(5n, 'amount', true)
const payload: unknown = parseJson('{"used": 9007199254740993}')
void big; void amount; void payload
void new Pool().query({ text: 'SELECT 1::bigint AS one', types: intTypes })

async function main (): Promise<void> {
  const fm = new FlagMeter({
    pool: new Pool(), listen: 'postgres://localhost/app', maxInFlight: 4, maxGroup: 500, featureCacheSize: 5000,
    timeoutMs: 3000, connectTimeoutMs: 1000, retry: { initialDelayMs: 10, maxDelayMs: 500 }
  })
  fm.on('error', (e) => { const from: 'pool' | 'listen' | undefined = e.source; void from })
  fm.on('disconnected', (e) => { const shard: number = e.shard; void shard })
  fm.on('connected', () => {})
  const up: boolean = fm.connected
  await fm.ping({ timeoutMs: 500 })
  try {
    await fm.track('acme', 'api_calls', 1, { key: 'k2' })
  } catch (e) {
    if (e instanceof FlagMeterOutcomeUnknownError) { const o: 'unknown' = e.outcome; const a: number = e.attempts; void o; void a }
    if (e instanceof FlagMeterNotAppliedError) { const s: string | undefined = e.sqlstate; const t: boolean = e.timedOut; void s; void t }
    if (e instanceof FlagMeterFaultError) { const a: number = e.attempts; void a }
  }
  const outcome: CallOutcome = 'not_applied'
  void up; void outcome
  const { counted }: { counted: boolean } = await fm.track('acme', 'api_calls', 1, { key: 'k', occurredAt: new Date() })
  const d: Decision = await fm.consume('acme', 'api_calls', 1n, { key: 'r' })
  const ds: Decision[] = await fm.consume('acme', ['api_calls', 'tokens'], [1, 800])
  const used: Int = d.used
  const wait: number | null = d.retryAfterMs
  const rateLimited: DecisionReason = 'rate_limited'
  const opts: RateLimitOptions = { rate: 100, per: '1 minute', burst: 20n, cost: 0 }
  const r: RateDecision = await fm.rateLimit('ip:10.0.0.1', { rate: 10, per: 1 })
  const allowed: boolean = r.allowed
  const left: Int = r.remaining
  const retry: number | null = r.retryAfterMs
  const reset: number = r.resetAfterMs
  const limits: { calls: number; groups: number } = fm.stats().rateLimit
  await fm.rateLimit('login:acme', opts)
  void wait; void rateLimited; void allowed; void left; void retry; void reset; void limits
  // @ts-expect-error: a rate limit needs its window
  await fm.rateLimit('k', { rate: 10 })
  // @ts-expect-error: per is seconds or an interval text, not a Date
  await fm.rateLimit('k', { rate: 10, per: new Date() })
  // @ts-expect-error: the cached limit of a tenant and meter is fm.limit, synchronous
  const cached: Promise<RateDecision> = fm.limit('acme', 'api_calls')
  void cached
  // fm.limit(key, options) is the rate limiter (issue 37's name), fm.limit(tenant, meter) the cache
  const viaLimit: RateDecision = await fm.limit('ip:10.0.0.1', { rate: 10, per: 1 })
  const fromCache: Limit | undefined = fm.limit('acme', 'api_calls')
  void viaLimit; void fromCache
  // unique meters: distinct values per period
  const isNew: boolean = await fm.trackValue('acme', 'mau', 'user-1', { occurredAt: new Date() })
  const seat: Decision = await fm.consumeValue('acme', 'seats', 'ann@acme.test')
  const seatWait: number | null = seat.retryAfterMs
  const freed: boolean = await fm.forgetValue('acme', 'seats', 'ann@acme.test')
  const valueStats: { calls: number; groups: number } = fm.stats().consumeValue
  const unique: Limit['aggregation'] = 'unique'
  void isNew; void seatWait; void freed; void valueStats; void unique
  // @ts-expect-error: a value is a string (an id as text), not a number
  await fm.trackValue('acme', 'mau', 42)
  // @ts-expect-error: consumeValue takes no options (no idempotency key: the value is one)
  await fm.consumeValue('acme', 'seats', 'ann', { key: 'k' })
  // @ts-expect-error: trackValue's options are occurredAt only
  await fm.trackValue('acme', 'mau', 'user-1', { key: 'k' })
  const resets: Date | null = ds[0].resetsAt
  const blocked: boolean = fm.isBlocked('acme', 'api_calls')
  fm.on('threshold', (e: ThresholdEvent) => { const p: number = e.threshold; void p })
  fm.on('blocked', (e) => { const t: string = e.tenant; void t })
  fm.on('invalidate', (e) => { void e.all })
  fm.on('feature_changed', (e) => { const on: boolean | null = e.enabled; const f: string = e.feature; void on; void f; void e.tenant })
  for (const kind of QUOTA_EVENT_KINDS) fm.on(kind, (e) => { const k: QuotaEventKind = e.kind; const v: Int = e.version; void k; void v })
  const sso: boolean = await fm.hasFeature('acme', 'sso')
  const cfg: FeatureConfig = await fm.featureConfig('acme', 'max_projects')
  void sso; void cfg
  // @ts-expect-error: hasFeature answers asynchronously (the first use of a tenant loads it)
  const syncSso: boolean = fm.hasFeature('acme', 'sso')
  void syncSso
  const n: number = await fm.transaction(async (tx) => { await tx.track('acme', 'api_calls'); return 1 })
  const own = new Client()
  const ok: boolean = await fm.transaction(own, async (tx) => (await tx.consume('acme', 'api_calls')).granted)
  const seated: boolean = await fm.transaction(async (tx) => {
    await tx.trackValue('acme', 'mau', 'user-1')
    return (await tx.consumeValue('acme', 'seats', 'ann')).granted && await tx.forgetValue('acme', 'seats', 'bob')
  })
  void seated
  await fm.close()
  const err = new FlagMeterClosedError()
  const code: 'FLAGMETER_CLOSED' = err.code
  void counted; void used; void resets; void blocked; void n; void ok; void code
  // @ts-expect-error: amounts are numbers or BigInts, not strings
  await fm.track('acme', 'api_calls', '1')
  // @ts-expect-error: not an event kind
  fm.on('blocked_soon', () => {})
}
void main
