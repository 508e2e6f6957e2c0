// Every public type of the flagmeter client, in one place.
import type { EventEmitter } from 'node:events'
import type { Pool, ClientBase, PoolConfig, ClientConfig, CustomTypesConfig } from 'pg'

/**
 * A bigint of PostgreSQL (an amount, a usage figure, a quota, a version):
 * a number while it is a safe integer (|n| <= 2^53 - 1), a BigInt beyond.
 * Never a string.
 */
export type Int = number | bigint

/**
 * The number rule for one bigint as text: a number while it is a safe
 * integer, a BigInt beyond; null for null.
 */
export declare function toInt (text: string | null | undefined): Int | null
/**
 * An amount as the client takes it: a non-negative (positive: > 0) safe
 * integer number or a BigInt within PostgreSQL's bigint, returned as given;
 * else a TypeError or RangeError whose message names `what`.
 */
export declare function checkAmount (value: unknown, what: string, positive?: boolean): Int
/** JSON.parse with the number rule: integers beyond 2^53 - 1 become BigInt instead of losing digits. */
export declare function parseJson (text: string): unknown
/**
 * node-postgres `types` for a query config (`{ text, values, types: intTypes }`):
 * int8 and int8[] read by the number rule, every other type as pg reads it.
 */
export declare const intTypes: CustomTypesConfig

/** The defaults of the options (FlagMeterOptions, and reserve's ttl), frozen. */
export declare const DEFAULTS: {
  readonly poolSize: 20
  readonly maxInFlight: 2
  readonly maxGroup: 500
  readonly timeoutMs: 5000
  /** at most: a shorter timeoutMs is the default then */
  readonly connectTimeoutMs: 5000
  readonly retry: { readonly initialDelayMs: 25; readonly maxDelayMs: 250 }
  readonly reconnect: { readonly initialDelayMs: 100; readonly maxDelayMs: 5000 }
  readonly featureCacheSize: 10000
  readonly reserveTtl: '5 minutes'
}

export interface FlagMeterOptions {
  /** The request path: the app's own pg Pool (close() does not end it). */
  pool?: Pool
  /** Or a connection string for a Pool the client creates (and ends on close()). */
  connectionString?: string
  /** Or pg Pool options for a Pool the client creates (and ends on close()). */
  connection?: PoolConfig
  /** Size of the Pool the client creates. Default DEFAULTS.poolSize. */
  poolSize?: number
  /**
   * The LISTEN session: a connection string or pg Client options, directly to
   * the primary (not through a transaction-mode pooler: LISTEN belongs to one
   * server session). Default: the connection options above; required to get
   * events and a cache when `pool` is given. `false`: no events, no cache.
   */
  listen?: string | ClientConfig | false
    /**
     * Sharded (README "Scale-out"): one connection per shard, directly to each
     * shard's primary. Each shard's events arrive in its own version order and
     * carry `shard`, the index in this list.
     */
    | Array<string | ClientConfig>
  /**
   * Groups of calls running at once, per kind (track, consume, rateLimit, trackValue,
   * consumeValue, forgetValue), each on one pool connection. Default DEFAULTS.maxInFlight.
   */
  maxInFlight?: number
  /** Most calls in one group (one server call, one transaction). Default DEFAULTS.maxGroup. */
  maxGroup?: number
  /** Backoff of LISTEN reconnects: doubles from initialDelayMs up to maxDelayMs, with jitter. Default DEFAULTS.reconnect. */
  reconnect?: { initialDelayMs?: number; maxDelayMs?: number }
  /** Most tenants the feature cache holds; the oldest loaded go first. Default DEFAULTS.featureCacheSize. */
  featureCacheSize?: number
  /**
   * Each call's deadline, retries included: by then it has resolved or
   * rejected (README "Faults and retries"). Default DEFAULTS.timeoutMs.
   */
  timeoutMs?: number
  /** Connecting (the pool the client creates, the LISTEN sessions) gives up after this. Default min(timeoutMs, DEFAULTS.connectTimeoutMs). */
  connectTimeoutMs?: number
  /** Waits between the attempts of a call: doubles from initialDelayMs up to maxDelayMs, with jitter. Default DEFAULTS.retry. */
  retry?: { initialDelayMs?: number; maxDelayMs?: number }
}

export interface TrackOptions {
  /** When the usage happened (default: the server's now()). */
  occurredAt?: Date
  /** Idempotency key (1 to 256 bytes, unique per tenant): a retry is not counted twice. */
  key?: string
}

export interface TrackValueOptions {
  /** When the value was seen (default: the server's now()): it is counted in the period of that time. */
  occurredAt?: Date
}

export interface ConsumeOptions {
  /** Idempotency key: a retry returns the first decision and records nothing. */
  key?: string
}

export interface TrackResult {
  /** false when the key was already recorded (a duplicate). */
  counted: boolean
}

/** flagmeter.decision, with camelCase names. */
export interface Decision {
  granted: boolean
  /** Usage of the current period: after recording when granted, unchanged when denied. */
  used: Int
  /** The limit in force; null when unlimited. */
  quota: Int | null
  /** quota - used, never below 0; null when unlimited. */
  remaining: Int | null
  /** End of the current period; null for lifetime limits. */
  resetsAt: Date | null
  /** used - quota when above the quota, else 0; null when unlimited. */
  overage: Int | null
  meter: string
  /** Why: see DecisionReason. */
  reason: DecisionReason
  /** Units of this call drawn from credit grants (for check: that would be drawn); 0 without grants or when denied. */
  fromGrants: Int
  /** remaining plus what the active credit grants hold; null when unlimited and never granted credits. */
  balance: Int | null
  /**
   * Refused for the tenant's rate limit (reason 'rate_limited'): milliseconds
   * until the same call would be granted, rounded up. null otherwise, and when
   * waiting cannot help (the amount is more than the rate limit's burst).
   */
  retryAfterMs: number | null
}

export interface ReserveOptions {
  /** How long the hold lasts: seconds, or a PostgreSQL interval text. Default DEFAULTS.reserveTtl. */
  ttl?: number | string
  /** Idempotency key: a retry returns the reservation it made. */
  key?: string
}

/** flagmeter.reserve's answer, with camelCase names. */
export interface Reservation {
  granted: boolean
  /** null when refused */
  reservationId: Int | null
  reserved: Int
  expiresAt: Date | null
  /** what is left after the hold */
  balance: Int | null
  /** Refused for the tenant's rate limit: milliseconds until it would fit, rounded up; else null. */
  retryAfterMs: number | null
}

export interface RateLimitOptions {
  /** Units granted per `per`: a positive safe integer or BigInt. */
  rate: Int
  /** The window of `rate`: seconds (a positive number), or a PostgreSQL interval text ('1 minute'); 1 second to 1 hour. */
  per: number | string
  /** Most units granted at once after an idle time. Default: rate. */
  burst?: Int
  /** Units this call spends (0: look without spending). Default 1. */
  cost?: Int
}

/** flagmeter.rate_decision (the answer of flagmeter.limit), with camelCase names and intervals in milliseconds. */
export interface RateDecision {
  /** Whether the cost was granted (and spent). */
  allowed: boolean
  /** Units that could be granted right now, after this call. */
  remaining: Int
  /** Refused: milliseconds until the cost would be granted, rounded up; null when allowed, or when the cost exceeds the burst. */
  retryAfterMs: number | null
  /** Milliseconds until the key is back to a full burst, rounded up (0 when it is). */
  resetAfterMs: number
}

/** flagmeter.decision.reason (README, "Decision"). */
export type DecisionReason =
  | 'ok'
  | 'over_soft_limit'
  | 'unlimited'
  | 'quota_exceeded'
  | 'rate_limited'
  | 'other_meter_refused'

/** The limit in force for a tenant and meter (flagmeter.effective_limits). */
export interface Limit {
  tenant: string
  meter: string
  /** 'unique': the number of distinct values of the period (trackValue, consumeValue, forgetValue) */
  aggregation: 'sum' | 'count' | 'max' | 'latest' | 'unique'
  quota: Int
  period: 'hour' | 'day' | 'week' | 'month' | 'year' | 'lifetime'
  mode: 'hard' | 'soft'
  thresholds: number[]
  plan: string
  anchor: Date
  timezone: string
}

/**
 * Every kind of quota event, frozen: the client's one list (src/quota_events.js),
 * which the app and the type test use; QuotaEventKind is its union.
 */
export declare const QUOTA_EVENT_KINDS: readonly ['threshold', 'blocked', 'unblocked', 'limit_changed', 'plan_changed',
  'feature_changed', 'grant_low', 'grant_exhausted', 'grant_expired']
/** The kind of a quota event (QuotaEvent['kind']): one of QUOTA_EVENT_KINDS. */
export type QuotaEventKind = typeof QUOTA_EVENT_KINDS[number]

interface QuotaEventBase {
  /** The outbox version: events arrive once each, in increasing version (commit) order. */
  version: Int
  /** 'notification': from the NOTIFY payload; 'outbox': replayed by changes_since. */
  source: 'notification' | 'outbox'
  /** Index of the shard in the `listen` list (0 when there is one). Versions are per shard. */
  shard: number
}

export interface ThresholdEvent extends QuotaEventBase {
  kind: 'threshold'
  tenant: string
  meter: string
  /** null for a lifetime period */
  periodStart: Date | null
  /** percent of the quota */
  threshold: number
  used: Int
  quota: Int
}

export interface BlockedEvent extends QuotaEventBase {
  kind: 'blocked'
  tenant: string
  meter: string
  periodStart: Date | null
  used: Int
  quota: Int
}

export interface UnblockedEvent extends QuotaEventBase {
  kind: 'unblocked'
  tenant: string
  meter: string
  periodStart: Date | null
  used?: Int
  /** absent when the limit is gone */
  quota?: Int
}

export interface LimitChangedEvent extends QuotaEventBase {
  kind: 'limit_changed'
  meter: string
  /** set_limit: the plan */
  plan?: string
  /** override_limit / drop_override: the tenant */
  tenant?: string
}

export interface PlanChangedEvent extends QuotaEventBase {
  kind: 'plan_changed'
  tenant: string
  /** absent when the tenant has no plan any more (unassign_tenant, drop_plan with force) */
  plan?: string
}

/**
 * A plan's row for a feature (plan set, no tenant: it decides for the plan's
 * tenants without an override of the feature) or a tenant's override (tenant
 * set). `enabled` null: the row is gone (an override dropped: the plan
 * decides again; a plan dropped).
 */
export interface FeatureChangedEvent extends QuotaEventBase {
  kind: 'feature_changed'
  feature: string
  tenant?: string
  plan?: string
  enabled: boolean | null
  /** The row's configuration value (parsed JSON), null when none. */
  config: FeatureConfig
}

/** A configuration value (jsonb): parsed JSON, integers beyond 2^53 - 1 as BigInt. */
export type FeatureConfig = null | boolean | number | bigint | string | FeatureConfig[] | { [key: string]: FeatureConfig }

/** A credit grant ran low (threshold: its low_balance_percent), ran out, or expired with units left. */
export interface GrantEvent extends QuotaEventBase {
  kind: 'grant_low' | 'grant_exhausted' | 'grant_expired'
  tenant: string
  meter: string
  grantId: Int
  /** grant_low: the grant's low_balance_percent */
  threshold?: number
  /** what was drawn from the grant */
  used: Int
  /** the grant's amount */
  quota: Int
}

export type QuotaEvent = ThresholdEvent | BlockedEvent | UnblockedEvent | LimitChangedEvent | PlanChangedEvent |
  FeatureChangedEvent | GrantEvent

/** Rows of an app table changed (no version; not kept in the outbox). */
export interface InvalidateEvent {
  kind: 'invalidate'
  /** schema-qualified table name; absent after a reconnect */
  table?: string
  ops?: Array<'insert' | 'update' | 'delete' | 'truncate'>
  /** key column -> value as text */
  keys?: Array<Record<string, string | null>>
  /** drop every cached row (of the table, or of every table after a reconnect) */
  all?: boolean
  /** 'reconnect': invalidations sent while the instance was away are lost */
  reason?: 'reconnect'
  /** Index of the shard in the `listen` list whose database sent it (0 when there is one). */
  shard: number
}

export interface FlagMeterEvents {
  threshold: [ThresholdEvent]
  blocked: [BlockedEvent]
  unblocked: [UnblockedEvent]
  limit_changed: [LimitChangedEvent]
  plan_changed: [PlanChangedEvent]
  feature_changed: [FeatureChangedEvent]
  grant_low: [GrantEvent]
  grant_exhausted: [GrantEvent]
  grant_expired: [GrantEvent]
  invalidate: [InvalidateEvent]
  /**
   * Errors no call waits for: an idle connection of the client's own pool
   * that the server ended (err.source 'pool'), the LISTEN session's
   * (err.source 'listen'; it reconnects by itself). Without a listener each
   * kind is logged once with console.warn; never unhandled.
   */
  error: [Error & { source?: 'pool' | 'listen'; shard?: number }]
  /** A LISTEN session is connected and caught up (after a reconnect, after its replay). */
  connected: [{ shard: number }]
  /** A LISTEN session that was caught up lost its connection (it reconnects by itself). */
  disconnected: [{ shard: number }]
}

export interface FlagMeterStats {
  track: { calls: number; groups: number }
  consume: { calls: number; groups: number }
  rateLimit: { calls: number; groups: number }
  trackValue: { calls: number; groups: number }
  consumeValue: { calls: number; groups: number }
  forgetValue: { calls: number; groups: number }
  /**
   * Groups split in two because the database refused one call's input
   * (QT001, QT002, class 22, …): the other calls are sent again without it.
   */
  splits: number
  /** Grouped calls (track, consume, rateLimit and the value calls) sent again after a fault. */
  retries: number
  reconnects: number
}

/** Unbatched calls inside one transaction; they roll back with it. */
export declare class Transaction {
  /** Made by fm.transaction(), on the transaction's connection. */
  constructor (client: ClientBase)
  readonly client: ClientBase
  track (tenant: string, meter: string, amount?: Int, options?: TrackOptions): Promise<TrackResult>
  consume (tenant: string, meter: string, amount?: Int, options?: ConsumeOptions): Promise<Decision>
  consume (tenant: string, meters: string[], amounts: Int[], options?: ConsumeOptions): Promise<Decision[]>
  trackValue (tenant: string, meter: string, value: string, options?: TrackValueOptions): Promise<boolean>
  consumeValue (tenant: string, meter: string, value: string): Promise<Decision>
  forgetValue (tenant: string, meter: string, value: string): Promise<boolean>
  check (tenant: string, meter: string, amount?: Int): Promise<Decision>
  balance (tenant: string, meter: string): Promise<Int | null>
  reserve (tenant: string, meter: string, amount: Int, options?: ReserveOptions): Promise<Reservation>
  settle (reservationId: Int, actual: Int): Promise<Decision>
  release (reservationId: Int): Promise<boolean>
}

export declare class FlagMeter extends EventEmitter {
  constructor (options: FlagMeterOptions)
  /** The request path's pool. */
  readonly pool: Pool
  /** Version of the last quota event applied; null before the first snapshot. Of the first shard when several. */
  readonly version: Int | null
  /** Per shard, in `listen` order: the version of its last quota event applied (null before its first snapshot). */
  readonly versions: Array<Int | null>
  /** Backend pid of the (first shard's) LISTEN session; null while disconnected. */
  readonly listenerPid: number | null
  /** Per shard: backend pid of its LISTEN session; null while disconnected. */
  readonly listenerPids: Array<number | null>
  /** Whether every LISTEN session is connected and caught up; false without one. */
  readonly connected: boolean
  /** Resolves once the cache holds its first snapshot; rejects if closed first. */
  ready (): Promise<void>
  /** Resolves once the database answers on the request path; rejects with FlagMeterNotAppliedError after timeoutMs. */
  ping (options?: { timeoutMs?: number }): Promise<void>
  /** Records usage; resolves once the event is durably committed. Grouped with concurrent calls. */
  track (tenant: string, meter: string, amount?: Int, options?: TrackOptions): Promise<TrackResult>
  /** Check-and-record against the limit, atomically; grouped with concurrent calls. */
  consume (tenant: string, meter: string, amount?: Int, options?: ConsumeOptions): Promise<Decision>
  /** All or nothing across several meters. */
  consume (tenant: string, meters: string[], amounts: Int[], options?: ConsumeOptions): Promise<Decision[]>
  /**
   * Spends `cost` units of `key`'s rate limit when they fit (flagmeter.limit),
   * across every session of the database server; grouped with concurrent
   * calls into one limit_batch. Not transactional: a unit granted stays spent.
   */
  rateLimit (key: string, options: RateLimitOptions): Promise<RateDecision>
  /**
   * Records that `value` (1 to 1024 bytes: a user id, a seat's holder) was seen on a
   * unique meter: true when it was new in its period (usage up by one), false when
   * counted already. Never refused by the limit. Grouped with concurrent calls into
   * one statement, answered in order.
   */
  trackValue (tenant: string, meter: string, value: string, options?: TrackValueOptions): Promise<boolean>
  /**
   * Granted when `value` is counted in the current period already (usage unchanged), or
   * when one more value fits the limit (then counted); refused at a hard limit
   * ('quota_exceeded', or 'rate_limited' with retryAfterMs), recording nothing. Grouped.
   */
  consumeValue (tenant: string, meter: string, value: string): Promise<Decision>
  /** Frees `value` in the current period (a seat given up): true when it was counted there (usage down by one). Grouped. */
  forgetValue (tenant: string, meter: string, value: string): Promise<boolean>
  /** The exact decision for `amount` more, recording nothing (a database read). */
  check (tenant: string, meter: string, amount?: Int): Promise<Decision>
  /** Quota left plus active credit grants (a database read); null when unlimited. */
  balance (tenant: string, meter: string): Promise<Int | null>
  /** Hold amount against quota and grants until settle, release or the ttl; committed when it resolves. */
  reserve (tenant: string, meter: string, amount: Int, options?: ReserveOptions): Promise<Reservation>
  /** Record actual for a reservation (past the limit as overage if more than reserved); frees the rest. */
  settle (reservationId: Int, actual: Int): Promise<Decision>
  /** Free a reservation's hold without usage; false when it had ended already. */
  release (reservationId: Int): Promise<boolean>
  /** From the local cache, no round trip; an entry expires at its period's end. */
  isBlocked (tenant: string, meter: string): boolean
  /** From the local cache: the limit in force, undefined when unlimited. */
  limit (tenant: string, meter: string): Limit | undefined
  /** The rate limiter for any key: the same call as `rateLimit(key, options)`. */
  limit (key: string, options: RateLimitOptions): Promise<RateDecision>
  /**
   * Whether the tenant may use the feature (flagmeter.has_feature): from the
   * feature cache, which loads a tenant on first use and follows
   * feature_changed and plan_changed events; from the database while the
   * event stream is not connected. Rejects for an unknown feature (code 42704).
   */
  hasFeature (tenant: string, feature: string): Promise<boolean>
  /** The feature's configuration value for the tenant (flagmeter.feature_config), null when none or not granted. */
  featureConfig (tenant: string, feature: string): Promise<FeatureConfig>
  /** fn(tx) in one transaction on a pool connection: commit on return, rollback on throw. */
  transaction<T> (fn: (tx: Transaction) => Promise<T>): Promise<T>
  /** fn(tx) on the caller's own client, inside the transaction the caller manages. */
  transaction<T> (client: ClientBase, fn: (tx: Transaction) => Promise<T>): Promise<T>
  stats (): FlagMeterStats
  /** Flushes pending calls, then ends the LISTEN session and the pool it created. */
  close (): Promise<void>

  on<K extends keyof FlagMeterEvents> (event: K, listener: (...args: FlagMeterEvents[K]) => void): this
  once<K extends keyof FlagMeterEvents> (event: K, listener: (...args: FlagMeterEvents[K]) => void): this
  off<K extends keyof FlagMeterEvents> (event: K, listener: (...args: FlagMeterEvents[K]) => void): this
}

/** What became of a call that failed (README "Faults and retries"). */
export type CallOutcome = 'refused' | 'not_applied' | 'unknown'

/** Calls made after close() began reject with it; err.code is 'FLAGMETER_CLOSED'. */
export declare class FlagMeterClosedError extends Error {
  readonly code: 'FLAGMETER_CLOSED'
  readonly outcome: 'not_applied'
}

/** What the client's fault errors carry besides their code. */
export declare class FlagMeterFaultError extends Error {
  /** The error of the last attempt (Error's own `cause`: always set, optional in Error's type). */
  readonly cause?: unknown
  /** Its SQLSTATE, when the server sent one (57P01, 53300, 57014, ...). */
  readonly sqlstate: string | undefined
  /** Attempts made. */
  readonly attempts: number
  /** Whether the call's deadline ended it. */
  readonly timedOut: boolean
}

/** Nothing of the call was recorded; the same call may succeed later. */
export declare class FlagMeterNotAppliedError extends FlagMeterFaultError {
  readonly code: 'FLAGMETER_NOT_APPLIED'
  readonly outcome: 'not_applied'
}

/** The connection went while the server had the call: send it again with the same key to settle it. */
export declare class FlagMeterOutcomeUnknownError extends FlagMeterFaultError {
  readonly code: 'FLAGMETER_OUTCOME_UNKNOWN'
  readonly outcome: 'unknown'
}
