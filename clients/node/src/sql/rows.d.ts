// The rows the client's statements return (src/sql/*.js), as node-postgres
// gives them with the number rule (src/numbers.js): snake_case, bigints as Int.
// Types only: the client's own, not part of the package's API.
import type { Int, DecisionReason, Limit } from '../interfaces'

/** A row of flagmeter.decision: check, consume, settle. */
export interface DecisionRow {
  granted: boolean
  used: Int
  quota: Int | null
  remaining: Int | null
  resets_at: Date | null
  overage: Int | null
  meter: string
  reason: DecisionReason
  from_grants: Int
  balance: Int | null
  /** retry_after in whole milliseconds, rounded up (src/sql/decision.js) */
  retry_after_ms: number | null
}

/** A row of consume_batch, or of a group of consume_value calls: a decision of item `item` (1-based). */
export interface BatchDecisionRow extends DecisionRow {
  item: number
}

/** A row of a group of track_value calls: the answer to item `item` (1-based), true when the value was new in its period. */
export interface ValueAddedRow {
  item: number
  added: boolean
}

/** A row of a group of forget_value calls: the answer to item `item` (1-based), true when the value was counted and is freed. */
export interface ValueForgottenRow {
  item: number
  forgotten: boolean
}

/** A row of flagmeter.reserve. */
export interface ReservationRow {
  granted: boolean
  reservation_id: Int | null
  reserved: Int
  expires_at: Date | null
  balance: Int | null
  retry_after_ms: number | null
}

/** A row of flagmeter.limit_batch, its intervals in whole milliseconds: the answer to item `item` (1-based). */
export interface RateDecisionRow {
  item: number
  allowed: boolean
  remaining: Int
  retry_after_ms: number | null
  reset_after_ms: number
}

/** A row of flagmeter.effective_limits, as the cache keeps it (Limit). */
export type LimitRow = Limit

/**
 * A blocked tenant and meter with the end of its period (null: a lifetime
 * period, never); pg reads an infinite timestamp as the number -Infinity.
 */
export interface BlockedRow {
  tenant: string
  meter: string
  period_start: Date | number | null
  period_end: Date | number | null
}

/** What the snapshot reads in one transaction. */
export interface State {
  version: Int
  blocked: BlockedRow[]
  limits: LimitRow[]
}

/** An outbox row of changes_since, config as text. */
export interface OutboxRow {
  version: Int
  kind: string
  tenant: string | null
  meter: string | null
  plan: string | null
  period_start: Date | number | null
  threshold: number | null
  used: Int | null
  quota: Int | null
  feature: string | null
  enabled: boolean | null
  config: string | null
}

/** A feature's row of a plan or of a tenant's overrides, config parsed. */
export interface FeatureRow {
  feature: string
  enabled: boolean
  config: import('../interfaces').FeatureConfig
}

/** A tenant's rows, read in one snapshot of `version`; planRows unless its plan is cached. */
export interface TenantFeatures {
  version: Int
  plan: string | null
  overrides: FeatureRow[]
  planRows?: FeatureRow[]
  names: string[]
}
