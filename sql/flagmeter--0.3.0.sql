-- flagmeter install script, built from sql/parts/*.sql (one file per concern).
-- Everything is schema-qualified; no CREATE OR REPLACE, no IF NOT EXISTS.

\echo Use "CREATE EXTENSION flagmeter" to load this file. \quit

-- ---------------------------------------------------------------------------
-- The native type flagmeter.quota_counter: usage of one tenant and meter over
-- a span of time (sum, count, max, latest, optional limit).  Fixed size
-- (56 bytes), passed by reference, double-aligned, first byte a version.
-- ---------------------------------------------------------------------------

CREATE TYPE flagmeter.quota_counter;

CREATE FUNCTION flagmeter.quota_counter_in(cstring)
RETURNS flagmeter.quota_counter
AS 'MODULE_PATHNAME', 'quota_counter_in'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;

CREATE FUNCTION flagmeter.quota_counter_out(flagmeter.quota_counter)
RETURNS cstring
AS 'MODULE_PATHNAME', 'quota_counter_out'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;

CREATE FUNCTION flagmeter.quota_counter_recv(internal)
RETURNS flagmeter.quota_counter
AS 'MODULE_PATHNAME', 'quota_counter_recv'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;

CREATE FUNCTION flagmeter.quota_counter_send(flagmeter.quota_counter)
RETURNS bytea
AS 'MODULE_PATHNAME', 'quota_counter_send'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;

CREATE TYPE flagmeter.quota_counter (
	INTERNALLENGTH = 56,
	INPUT = flagmeter.quota_counter_in,
	OUTPUT = flagmeter.quota_counter_out,
	RECEIVE = flagmeter.quota_counter_recv,
	SEND = flagmeter.quota_counter_send,
	ALIGNMENT = double,
	STORAGE = plain
);

COMMENT ON TYPE flagmeter.quota_counter IS
'usage of one tenant and meter over a span: used (sum), events (count), max, latest amount and time, optional limit; mergeable with +';
COMMENT ON FUNCTION flagmeter.quota_counter_in(cstring) IS
'text input of quota_counter: used=N events=N max=N[ latest=N@YYYY-MM-DDTHH:MM:SS[.ffffff]Z][ limit=N]';
COMMENT ON FUNCTION flagmeter.quota_counter_out(flagmeter.quota_counter) IS
'text output of quota_counter (UTC, independent of TimeZone and DateStyle)';
COMMENT ON FUNCTION flagmeter.quota_counter_recv(internal) IS
'binary input of quota_counter, validated like the text input';
COMMENT ON FUNCTION flagmeter.quota_counter_send(flagmeter.quota_counter) IS
'binary output of quota_counter';

-- Constructors --------------------------------------------------------------

CREATE FUNCTION flagmeter.event_counter(amount bigint, occurred_at timestamptz)
RETURNS flagmeter.quota_counter
AS 'MODULE_PATHNAME', 'quota_counter_from_event'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION flagmeter.event_counter(bigint, timestamptz) IS
'the quota_counter of a single event';

CREATE FUNCTION flagmeter.with_limit(counter flagmeter.quota_counter, quota bigint)
RETURNS flagmeter.quota_counter
AS 'MODULE_PATHNAME', 'quota_counter_with_limit'
LANGUAGE C IMMUTABLE CALLED ON NULL INPUT PARALLEL SAFE;
COMMENT ON FUNCTION flagmeter.with_limit(flagmeter.quota_counter, bigint) IS
'the counter carrying the given limit (quota > 0); a NULL quota removes the limit';

CREATE FUNCTION flagmeter.subtract_events(counter flagmeter.quota_counter, amount bigint, events bigint)
RETURNS flagmeter.quota_counter
AS 'MODULE_PATHNAME', 'quota_counter_subtract'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION flagmeter.subtract_events(flagmeter.quota_counter, bigint, bigint) IS
'the counter without voided events (amount = their total): used and events go down, max and latest stay; an error if it holds less';

-- Merge and equality ----------------------------------------------------------

CREATE FUNCTION flagmeter.quota_counter_merge(flagmeter.quota_counter, flagmeter.quota_counter)
RETURNS flagmeter.quota_counter
AS 'MODULE_PATHNAME', 'quota_counter_merge'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION flagmeter.quota_counter_merge(flagmeter.quota_counter, flagmeter.quota_counter) IS
'merge two counters: sums add, max and latest are kept, the smaller limit wins; associative and commutative';

CREATE FUNCTION flagmeter.quota_counter_eq(flagmeter.quota_counter, flagmeter.quota_counter)
RETURNS boolean
AS 'MODULE_PATHNAME', 'quota_counter_eq'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION flagmeter.quota_counter_eq(flagmeter.quota_counter, flagmeter.quota_counter) IS
'true when every field of the two counters is equal';

CREATE FUNCTION flagmeter.quota_counter_ne(flagmeter.quota_counter, flagmeter.quota_counter)
RETURNS boolean
AS 'MODULE_PATHNAME', 'quota_counter_ne'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION flagmeter.quota_counter_ne(flagmeter.quota_counter, flagmeter.quota_counter) IS
'true when any field of the two counters differs';

CREATE OPERATOR flagmeter.+ (
	LEFTARG = flagmeter.quota_counter,
	RIGHTARG = flagmeter.quota_counter,
	FUNCTION = flagmeter.quota_counter_merge,
	COMMUTATOR = OPERATOR(flagmeter.+)
);
COMMENT ON OPERATOR flagmeter.+ (flagmeter.quota_counter, flagmeter.quota_counter) IS
'merge two quota counters';

CREATE OPERATOR flagmeter.= (
	LEFTARG = flagmeter.quota_counter,
	RIGHTARG = flagmeter.quota_counter,
	FUNCTION = flagmeter.quota_counter_eq,
	COMMUTATOR = OPERATOR(flagmeter.=),
	NEGATOR = OPERATOR(flagmeter.<>),
	RESTRICT = eqsel,
	JOIN = eqjoinsel
);
COMMENT ON OPERATOR flagmeter.= (flagmeter.quota_counter, flagmeter.quota_counter) IS
'quota counters are equal';

CREATE OPERATOR flagmeter.<> (
	LEFTARG = flagmeter.quota_counter,
	RIGHTARG = flagmeter.quota_counter,
	FUNCTION = flagmeter.quota_counter_ne,
	COMMUTATOR = OPERATOR(flagmeter.<>),
	NEGATOR = OPERATOR(flagmeter.=),
	RESTRICT = neqsel,
	JOIN = neqjoinsel
);
COMMENT ON OPERATOR flagmeter.<> (flagmeter.quota_counter, flagmeter.quota_counter) IS
'quota counters differ';

-- Accessors -------------------------------------------------------------------

CREATE FUNCTION flagmeter.used(flagmeter.quota_counter) RETURNS bigint
AS 'MODULE_PATHNAME', 'quota_counter_used'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION flagmeter.used(flagmeter.quota_counter) IS
'total usage: the sum of the amounts';

CREATE FUNCTION flagmeter.events(flagmeter.quota_counter) RETURNS bigint
AS 'MODULE_PATHNAME', 'quota_counter_events'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION flagmeter.events(flagmeter.quota_counter) IS
'number of events';

CREATE FUNCTION flagmeter.max_amount(flagmeter.quota_counter) RETURNS bigint
AS 'MODULE_PATHNAME', 'quota_counter_max_amount'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION flagmeter.max_amount(flagmeter.quota_counter) IS
'the greatest single amount; NULL when the counter has seen no event';

CREATE FUNCTION flagmeter.latest(flagmeter.quota_counter) RETURNS bigint
AS 'MODULE_PATHNAME', 'quota_counter_latest'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION flagmeter.latest(flagmeter.quota_counter) IS
'the amount of the latest event (greatest timestamp, then greatest amount); NULL when no event';

CREATE FUNCTION flagmeter.latest_at(flagmeter.quota_counter) RETURNS timestamptz
AS 'MODULE_PATHNAME', 'quota_counter_latest_at'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION flagmeter.latest_at(flagmeter.quota_counter) IS
'the time of the latest event; NULL when no event';

CREATE FUNCTION flagmeter.quota(flagmeter.quota_counter) RETURNS bigint
AS 'MODULE_PATHNAME', 'quota_counter_quota'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION flagmeter.quota(flagmeter.quota_counter) IS
'the limit the counter carries; NULL when unlimited';

CREATE FUNCTION flagmeter.remaining(flagmeter.quota_counter) RETURNS bigint
AS 'MODULE_PATHNAME', 'quota_counter_remaining'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION flagmeter.remaining(flagmeter.quota_counter) IS
'quota minus used, never below zero; NULL when unlimited';

CREATE FUNCTION flagmeter.exceeded(flagmeter.quota_counter) RETURNS boolean
AS 'MODULE_PATHNAME', 'quota_counter_exceeded'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION flagmeter.exceeded(flagmeter.quota_counter) IS
'true once used >= quota; NULL when unlimited';

CREATE FUNCTION flagmeter.usage_ratio(flagmeter.quota_counter) RETURNS double precision
AS 'MODULE_PATHNAME', 'quota_counter_usage_ratio'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION flagmeter.usage_ratio(flagmeter.quota_counter) IS
'used / quota (1.0 at the limit); NULL when unlimited';

-- The figure of a counter that a meter's aggregation calls "used".
CREATE FUNCTION flagmeter.used_by(counter flagmeter.quota_counter, aggregation text)
RETURNS bigint
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$
-- (CASE WHEN with qualified operators: CASE x WHEN would resolve = through
-- the caller's search_path)
SELECT CASE
	WHEN $2 OPERATOR(pg_catalog.=) 'count' THEN flagmeter.events($1)
	WHEN $2 OPERATOR(pg_catalog.=) 'max' THEN COALESCE(flagmeter.max_amount($1), 0)
	WHEN $2 OPERATOR(pg_catalog.=) 'latest' THEN COALESCE(flagmeter.latest($1), 0)
	ELSE flagmeter.used($1)
END
$$;
COMMENT ON FUNCTION flagmeter.used_by(flagmeter.quota_counter, text) IS
'the figure of a counter that an aggregation (sum, count, max, latest) counts as used';

-- Aggregates --------------------------------------------------------------------

CREATE FUNCTION flagmeter.quota_counter_add_event(flagmeter.quota_counter, bigint, timestamptz)
RETURNS flagmeter.quota_counter
AS 'MODULE_PATHNAME', 'quota_counter_add_event'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION flagmeter.quota_counter_add_event(flagmeter.quota_counter, bigint, timestamptz) IS
'transition function of quota_counter_agg: adds one event (updates the state in place inside an aggregate)';

CREATE FUNCTION flagmeter.quota_counter_merge_trans(flagmeter.quota_counter, flagmeter.quota_counter)
RETURNS flagmeter.quota_counter
AS 'MODULE_PATHNAME', 'quota_counter_merge_trans'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION flagmeter.quota_counter_merge_trans(flagmeter.quota_counter, flagmeter.quota_counter) IS
'transition and combine function of the counter aggregates (updates the state in place inside an aggregate)';

CREATE AGGREGATE flagmeter.quota_counter_agg(amount bigint, occurred_at timestamptz) (
	SFUNC = flagmeter.quota_counter_add_event,
	STYPE = flagmeter.quota_counter,
	COMBINEFUNC = flagmeter.quota_counter_merge_trans,
	INITCOND = 'used=0 events=0 max=0',
	PARALLEL = SAFE
);
COMMENT ON AGGREGATE flagmeter.quota_counter_agg(bigint, timestamptz) IS
'the quota_counter of a set of events (amount, occurred_at); rows with a NULL are skipped';

CREATE AGGREGATE flagmeter.merge_agg(flagmeter.quota_counter) (
	SFUNC = flagmeter.quota_counter_merge_trans,
	STYPE = flagmeter.quota_counter,
	COMBINEFUNC = flagmeter.quota_counter_merge_trans,
	INITCOND = 'used=0 events=0 max=0',
	PARALLEL = SAFE
);
COMMENT ON AGGREGATE flagmeter.merge_agg(flagmeter.quota_counter) IS
'merge a set of quota counters (rollups of rollups equal rollups of the events)';
-- ---------------------------------------------------------------------------
-- The answers of consume and check (decision) and of limit()
-- (rate_decision).  Here, next to the counter, because a PL/Proxy proxy
-- database (contrib/plproxy) carries these types and nothing of the
-- tables: its install script is built from this part and the counter's.
-- ---------------------------------------------------------------------------

CREATE TYPE flagmeter.decision AS (
	granted		boolean,
	used		bigint,
	quota		bigint,
	remaining	bigint,
	resets_at	timestamptz,
	overage		bigint,
	meter		text,
	reason		text,
	from_grants	bigint,
	balance		bigint,
	retry_after	interval
);
COMMENT ON TYPE flagmeter.decision IS
'answer of consume and check: granted, used and remaining after the call (unchanged when denied), quota, remaining and overage NULL when unlimited, resets_at NULL for lifetime, overage = used beyond the quota (soft limits), reason why (ok, over_soft_limit, unlimited, quota_exceeded, rate_limited, other_meter_refused), from_grants = units of this call drawn from credit grants, balance = quota remaining plus active credit grants remaining (NULL when unlimited without grants), retry_after = how long until a call refused for its rate limit would be granted (NULL otherwise, and when waiting cannot help)';

CREATE TYPE flagmeter.rate_decision AS (
	allowed		boolean,
	remaining	bigint,
	retry_after	interval,
	reset_after	interval
);
COMMENT ON TYPE flagmeter.rate_decision IS
'answer of limit(): allowed, remaining = units that could still be granted now, retry_after = how long until the refused cost would be granted (NULL when allowed, or when the cost exceeds the burst and waiting cannot help), reset_after = how long until the key is back to a full burst';
-- ---------------------------------------------------------------------------
-- Billing periods: hour, day and week follow the calendar in the tenant's
-- time zone (weeks start on Monday); month and year follow the tenant's
-- anchor instant, clamped at month ends; lifetime is all of time.
-- ---------------------------------------------------------------------------

CREATE FUNCTION flagmeter.period_bounds(
	at timestamptz,
	period text,
	anchor timestamptz,
	timezone text,
	OUT period_start timestamptz,
	OUT period_end timestamptz)
RETURNS record
AS 'MODULE_PATHNAME', 'fm_period_bounds_sql'
LANGUAGE C STABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION flagmeter.period_bounds(timestamptz, text, timestamptz, text) IS
'[period_start, period_end) of the period (hour, day, week, month, year or lifetime) containing at, in the given time zone; month and year periods start at the local date and time of day of anchor, clamped at month ends (Jan 31 -> Feb 28/29); STABLE because it reads the time zone database';
-- ---------------------------------------------------------------------------
-- Catalog: meters, plans, limits, tenants and per-tenant overrides.
--
-- Configuration is plain tables (readable, dumped by pg_dump), changed only
-- through the functions below, which validate everything before writing.
-- ---------------------------------------------------------------------------

-- Names of meters and plans are 1 to 63 characters from A-Z a-z 0-9 _ . : -
-- (what a dashboard, a notification payload and a JSON key carry without
-- quoting surprises); flagmeter.check_name() reports a bad one clearly and
-- the CHECK constraints hold the line for direct writes.

CREATE TABLE flagmeter.meters (
	meter		text PRIMARY KEY
		CONSTRAINT meters_name_valid CHECK (meter OPERATOR(pg_catalog.~) '^[A-Za-z0-9][A-Za-z0-9_.:-]{0,62}$'),
	aggregation	text NOT NULL
		CONSTRAINT meters_aggregation_valid
		CHECK (aggregation OPERATOR(pg_catalog.=) ANY (ARRAY['sum', 'count', 'max', 'latest', 'unique'])),
	unit		text CONSTRAINT meters_unit_length CHECK (pg_catalog.length(unit) OPERATOR(pg_catalog.<=) 63),
	created_at	timestamptz NOT NULL DEFAULT pg_catalog.now(),
	-- a credit pool: usage of this meter also uses rate units of the pool
	-- meter per unit (define_meter checks the rest: a sum pool that draws
	-- from no pool itself, a sum or count drawer)
	draws		text REFERENCES flagmeter.meters,
	rate		numeric
		CONSTRAINT meters_rate_valid
		CHECK (rate OPERATOR(pg_catalog.>) 0 AND pg_catalog.scale(rate) OPERATOR(pg_catalog.<=) 6
		       AND rate OPERATOR(pg_catalog.<) 1000000000000::pg_catalog.numeric),
	CONSTRAINT meters_draws_with_rate CHECK ((draws IS NULL) OPERATOR(pg_catalog.=) (rate IS NULL)),
	CONSTRAINT meters_draws_other CHECK (draws OPERATOR(pg_catalog.<>) meter)
);
COMMENT ON TABLE flagmeter.meters IS
'what is counted; aggregation says which figure of the counter is "used": sum of amounts, count of events, max amount, latest amount, or the number of distinct values (unique); draws and rate make a meter draw from a credit pool';
COMMENT ON COLUMN flagmeter.meters.draws IS
'the pool meter this meter draws from (NULL: none): every unit recorded on this meter records rate units of the pool, decided with it all or nothing';
COMMENT ON COLUMN flagmeter.meters.rate IS
'units of the pool per unit of this meter: an exact numeric (at most 6 decimal places), never a float; a call''s pool amount is amount * rate rounded up to a whole unit';

CREATE TABLE flagmeter.plans (
	plan		text PRIMARY KEY
		CONSTRAINT plans_name_valid CHECK (plan OPERATOR(pg_catalog.~) '^[A-Za-z0-9][A-Za-z0-9_.:-]{0,62}$'),
	created_at	timestamptz NOT NULL DEFAULT pg_catalog.now()
);
COMMENT ON TABLE flagmeter.plans IS 'named sets of limits that tenants are assigned to';

CREATE TABLE flagmeter.limits (
	plan		text NOT NULL REFERENCES flagmeter.plans ON DELETE CASCADE,
	meter		text NOT NULL REFERENCES flagmeter.meters ON DELETE CASCADE,
	quota		bigint NOT NULL CONSTRAINT limits_quota_positive CHECK (quota OPERATOR(pg_catalog.>) 0),
	period		text NOT NULL
		CONSTRAINT limits_period_valid
		CHECK (period OPERATOR(pg_catalog.=) ANY (ARRAY['hour', 'day', 'week', 'month', 'year', 'lifetime'])),
	mode		text NOT NULL
		CONSTRAINT limits_mode_valid CHECK (mode OPERATOR(pg_catalog.=) ANY (ARRAY['hard', 'soft'])),
	thresholds	integer[] NOT NULL
		CONSTRAINT limits_thresholds_valid
		CHECK (pg_catalog.cardinality(thresholds) OPERATOR(pg_catalog.<=) 32
		       AND pg_catalog.array_position(thresholds, NULL) IS NULL),
	updated_at	timestamptz NOT NULL DEFAULT pg_catalog.now(),
	-- rollover (47_credits.sql, roll_over()): all three NULL, or a share,
	-- an optional cap and a lifetime in periods
	rollover	integer,
	rollover_cap	bigint,
	rollover_periods	integer,
	CONSTRAINT limits_rollover_valid CHECK (
		(rollover IS NULL AND rollover_cap IS NULL AND rollover_periods IS NULL)
		OR (rollover IS NOT NULL AND rollover OPERATOR(pg_catalog.>=) 1 AND rollover OPERATOR(pg_catalog.<=) 100
		    AND (rollover_cap IS NULL OR rollover_cap OPERATOR(pg_catalog.>) 0)
		    AND rollover_periods IS NOT NULL
		    AND rollover_periods OPERATOR(pg_catalog.>=) 1 AND rollover_periods OPERATOR(pg_catalog.<=) 120
		    AND period OPERATOR(pg_catalog.<>) 'lifetime')),
	PRIMARY KEY (plan, meter)
);
COMMENT ON TABLE flagmeter.limits IS
'the quota of a plan for one meter per period, hard (consume refuses past it) or soft (grants and reports overage), with alert thresholds in percent, and what of the unused quota rolls over into credit grants';
COMMENT ON COLUMN flagmeter.limits.rollover IS
'percentage (1 to 100) of a period''s unused quota that maintain() grants as credits once the period has ended (roll_over()); NULL: no rollover';
COMMENT ON COLUMN flagmeter.limits.rollover_cap IS
'at most this many units in one rollover grant; NULL: no cap but the quota''s share';
COMMENT ON COLUMN flagmeter.limits.rollover_periods IS
'lifetime of a rollover grant in periods (1 to 120): it starts when its period ends and expires at the end of the rollover_periods-th period after it; NULL without rollover';

-- What store_limit changed and announce_limit has not announced yet: the
-- limits in force before, per tenant (contrib/plproxy commits the first
-- with two-phase commit and runs the second in a later transaction).
CREATE TABLE flagmeter.pending_limit_changes (
	plan		text NOT NULL,
	meter		text NOT NULL,
	before		jsonb NOT NULL,
	PRIMARY KEY (plan, meter)
);
COMMENT ON TABLE flagmeter.pending_limit_changes IS
'limits in force before a store_limit, per tenant, kept until announce_limit announces the change';

CREATE TABLE flagmeter.tenants (
	tenant		text PRIMARY KEY,
	plan		text NOT NULL REFERENCES flagmeter.plans,
	anchor		timestamptz NOT NULL,
	timezone	text NOT NULL,
	assigned_at	timestamptz NOT NULL DEFAULT pg_catalog.now()
);
COMMENT ON TABLE flagmeter.tenants IS
'tenants assigned to a plan, with the billing anchor (monthly and yearly periods restart at its local date and time) and time zone; a tenant not listed is metered in calendar months in UTC, unlimited';

CREATE TABLE flagmeter.overrides (
	tenant		text NOT NULL REFERENCES flagmeter.tenants ON DELETE CASCADE,
	meter		text NOT NULL REFERENCES flagmeter.meters ON DELETE CASCADE,
	quota		bigint NOT NULL CONSTRAINT overrides_quota_positive CHECK (quota OPERATOR(pg_catalog.>) 0),
	period		text
		CONSTRAINT overrides_period_valid
		CHECK (period OPERATOR(pg_catalog.=) ANY (ARRAY['hour', 'day', 'week', 'month', 'year', 'lifetime'])),
	mode		text
		CONSTRAINT overrides_mode_valid CHECK (mode OPERATOR(pg_catalog.=) ANY (ARRAY['hard', 'soft'])),
	thresholds	integer[]
		CONSTRAINT overrides_thresholds_valid
		CHECK (pg_catalog.cardinality(thresholds) OPERATOR(pg_catalog.<=) 32
		       AND pg_catalog.array_position(thresholds, NULL) IS NULL),
	updated_at	timestamptz NOT NULL DEFAULT pg_catalog.now(),
	PRIMARY KEY (tenant, meter)
);
COMMENT ON TABLE flagmeter.overrides IS
'per-tenant limits that win over the plan''s; a NULL period, mode or thresholds inherits the plan''s (or the defaults month, hard, {80,100})';

-- Every change of these tables invalidates the limits that backends cache
-- (src/limit_lookup.c), at commit for the others, at once for the changer.
CREATE FUNCTION flagmeter.config_changed()
RETURNS trigger
AS 'MODULE_PATHNAME', 'fm_config_changed'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION flagmeter.config_changed() IS
'statement trigger of the catalog tables: makes every backend reload the limits it cached';

CREATE TRIGGER meters_changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON flagmeter.meters
	FOR EACH STATEMENT EXECUTE FUNCTION flagmeter.config_changed();
CREATE TRIGGER plans_changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON flagmeter.plans
	FOR EACH STATEMENT EXECUTE FUNCTION flagmeter.config_changed();
CREATE TRIGGER limits_changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON flagmeter.limits
	FOR EACH STATEMENT EXECUTE FUNCTION flagmeter.config_changed();
CREATE TRIGGER tenants_changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON flagmeter.tenants
	FOR EACH STATEMENT EXECUTE FUNCTION flagmeter.config_changed();
CREATE TRIGGER overrides_changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON flagmeter.overrides
	FOR EACH STATEMENT EXECUTE FUNCTION flagmeter.config_changed();

SELECT pg_catalog.pg_extension_config_dump('flagmeter.meters', '');
SELECT pg_catalog.pg_extension_config_dump('flagmeter.plans', '');
SELECT pg_catalog.pg_extension_config_dump('flagmeter.limits', '');
SELECT pg_catalog.pg_extension_config_dump('flagmeter.tenants', '');
SELECT pg_catalog.pg_extension_config_dump('flagmeter.overrides', '');

-- The limit in force for one tenant and meter.  The single definition of
-- "which limit applies", used by the C hot path (track, consume, check) and
-- by the views.  A tenant that is not assigned gets no limit and calendar
-- months in UTC; an assigned tenant without a limit for this meter is
-- unlimited and metered in months from its anchor.  No row: unknown meter.
-- LANGUAGE sql without SET so that the planner inlines it: every name in it
-- is qualified (types too: pg_temp comes first for types otherwise), since it
-- runs under the caller's search_path, also inside flagmeter's own statements
-- that run as the owner.
CREATE FUNCTION flagmeter.limit_config(tenant text, meter text,
	OUT aggregation text, OUT plan text, OUT quota bigint, OUT period text,
	OUT mode text, OUT thresholds integer[], OUT anchor timestamptz, OUT timezone text)
RETURNS SETOF record
LANGUAGE sql STABLE PARALLEL SAFE ROWS 1
AS $$
SELECT m.aggregation, t.plan,
       COALESCE(o.quota, l.quota),
       COALESCE(o.period, l.period, 'month'::pg_catalog.text),
       COALESCE(o.mode, l.mode, 'hard'::pg_catalog.text),
       COALESCE(o.thresholds, l.thresholds, '{80,100}'::pg_catalog.int4[]),
       COALESCE(t.anchor, '2000-01-01 00:00:00+00'::pg_catalog.timestamptz),
       COALESCE(t.timezone, 'UTC'::pg_catalog.text)
FROM flagmeter.meters m
LEFT JOIN flagmeter.tenants t ON t.tenant OPERATOR(pg_catalog.=) $1
LEFT JOIN flagmeter.limits l
       ON l.plan OPERATOR(pg_catalog.=) t.plan AND l.meter OPERATOR(pg_catalog.=) m.meter
LEFT JOIN flagmeter.overrides o
       ON o.tenant OPERATOR(pg_catalog.=) t.tenant AND o.meter OPERATOR(pg_catalog.=) m.meter
WHERE m.meter OPERATOR(pg_catalog.=) $2
$$;
COMMENT ON FUNCTION flagmeter.limit_config(text, text) IS
'the limit in force for a tenant and meter (override, else plan, else unlimited) with the period, anchor and time zone its usage is counted in; no row for an unknown meter';

-- The same limit as the calls see it: limit_lookup.c reads the tenant's row and
-- override by primary key and the plan's part through its own query (an
-- SPI join per tenant was a fifth of track's time), composing them by the
-- rule above; the regression test catalog compares the two.
CREATE FUNCTION flagmeter.limit_in_force(tenant text, meter text,
	OUT aggregation text, OUT quota bigint, OUT period text, OUT mode text,
	OUT thresholds integer[], OUT anchor timestamptz, OUT timezone text)
RETURNS record
AS 'MODULE_PATHNAME', 'fm_limit_in_force'
LANGUAGE C STABLE CALLED ON NULL INPUT PARALLEL SAFE;
COMMENT ON FUNCTION flagmeter.limit_in_force(text, text) IS
'the limit in force for a tenant and meter as track, consume and check use it (this backend''s cache); equals limit_config() but for plan; an unknown meter is an error';

-- The limit cache all backends share when flagmeter is in
-- shared_preload_libraries (src/shared_limits.c): its size, use and
-- generation (bumped by every configuration change).
CREATE FUNCTION flagmeter.shared_limit_cache(
	OUT capacity integer, OUT entries bigint, OUT generation bigint,
	OUT hits bigint, OUT loads bigint, OUT not_stored bigint)
RETURNS record
AS 'MODULE_PATHNAME', 'fm_shared_limit_cache'
LANGUAGE C VOLATILE PARALLEL SAFE;
COMMENT ON FUNCTION flagmeter.shared_limit_cache() IS
'the limit cache shared by all backends (flagmeter preloaded): capacity (flagmeter.shared_limits), entries, generation, limits found in it, limits read from the catalog to be shared (by track and consume) and those not stored because it was full (raise flagmeter.shared_limits when this grows), since the server started; all NULL when flagmeter is not preloaded';

-- The table of consumes in flight when flagmeter is preloaded
-- (src/inflight.c): its size, the transactions registered in it now, and
-- how consumes decided since the server started.
CREATE FUNCTION flagmeter.consumes_in_flight(
	OUT capacity integer, OUT in_flight bigint, OUT lock_free bigint,
	OUT waits bigint, OUT fell_back bigint, OUT lockers bigint,
	OUT overflowed bigint)
RETURNS record
AS 'MODULE_PATHNAME', 'fm_consumes_in_flight'
LANGUAGE C VOLATILE PARALLEL SAFE;
COMMENT ON FUNCTION flagmeter.consumes_in_flight() IS
'the table of consumes in flight (flagmeter preloaded): capacity (flagmeter.inflight_periods rounded up), transactions registered in it now, and since the server started: consumes decided without a row lock, their waits for a consume in flight, consumes sent to the row lock (a decider under it in flight, or no room), deciders registered under the row lock, and those that found no room (raise flagmeter.inflight_periods when this grows); all NULL when flagmeter is not preloaded';

CREATE VIEW flagmeter.effective_limits AS
SELECT t.tenant, m.meter, c.aggregation, c.quota, c.period, c.mode, c.thresholds,
       c.plan, c.anchor, c.timezone
FROM flagmeter.tenants t
CROSS JOIN flagmeter.meters m
CROSS JOIN LATERAL flagmeter.limit_config(t.tenant, m.meter) c
WHERE c.quota IS NOT NULL;
COMMENT ON VIEW flagmeter.effective_limits IS
'the limit in force per assigned tenant and limited meter (override, else plan), with the tenant''s anchor and time zone';

-- Validation shared by the catalog functions -----------------------------------

CREATE FUNCTION flagmeter.check_thresholds(thresholds integer[])
RETURNS integer[]
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	sorted integer[];
BEGIN
	IF thresholds IS NULL THEN
		RETURN NULL;
	END IF;
	IF array_ndims(thresholds) IS DISTINCT FROM 1 OR array_position(thresholds, NULL) IS NOT NULL THEN
		RAISE EXCEPTION 'thresholds must be a one-dimensional array without NULLs'
			USING ERRCODE = 'invalid_parameter_value';
	END IF;
	IF cardinality(thresholds) > 32 THEN
		RAISE EXCEPTION 'too many thresholds: %', cardinality(thresholds)
			USING ERRCODE = 'program_limit_exceeded', DETAIL = 'A limit has at most 32 thresholds.';
	END IF;
	IF EXISTS (SELECT FROM unnest(thresholds) p WHERE p < 1 OR p > 1000) THEN
		RAISE EXCEPTION 'thresholds must be percentages between 1 and 1000: %', thresholds
			USING ERRCODE = 'invalid_parameter_value';
	END IF;
	SELECT array_agg(DISTINCT p ORDER BY p) INTO sorted FROM unnest(thresholds) p;
	IF cardinality(sorted) <> cardinality(thresholds) THEN
		RAISE EXCEPTION 'thresholds must not repeat a value: %', thresholds
			USING ERRCODE = 'invalid_parameter_value';
	END IF;
	RETURN sorted;
END $$;
COMMENT ON FUNCTION flagmeter.check_thresholds(integer[]) IS
'validates alert thresholds (at most 32 percentages 1..1000, no NULLs, no repeats) and returns them sorted';

CREATE FUNCTION flagmeter.check_name(kind text, value text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	IF value IS NULL THEN
		RAISE EXCEPTION '% must not be NULL', kind USING ERRCODE = 'null_value_not_allowed';
	END IF;
	IF value !~ '^[A-Za-z0-9][A-Za-z0-9_.:-]{0,62}$' THEN
		RAISE EXCEPTION 'invalid % name "%"', kind, left(value, 64)
			USING ERRCODE = 'invalid_name',
			      DETAIL = 'Names are 1 to 63 characters from A-Z a-z 0-9 _ . : - and start with a letter or digit.';
	END IF;
END $$;
COMMENT ON FUNCTION flagmeter.check_name(text, text) IS
'raises a clear error unless value is a valid meter or plan name';

-- The catalog API -----------------------------------------------------------------

CREATE FUNCTION flagmeter.define_meter(meter text, aggregation text DEFAULT 'sum', unit text DEFAULT NULL,
	draws text DEFAULT NULL, rate numeric DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	e_state text; e_message text; e_detail text; e_hint text;	-- the error, raised again
	current_aggregation text;
BEGIN
	PERFORM flagmeter.check_name('meter', meter);
	IF aggregation IS NULL THEN
		RAISE EXCEPTION 'aggregation must not be NULL' USING ERRCODE = 'null_value_not_allowed';
	END IF;
	IF NOT aggregation = ANY (ARRAY['sum', 'count', 'max', 'latest', 'unique']) THEN
		RAISE EXCEPTION 'invalid aggregation "%"', left(aggregation, 64)
			USING ERRCODE = 'invalid_parameter_value',
			      HINT = 'Valid aggregations are "sum", "count", "max", "latest" and "unique".';
	END IF;
	IF length(unit) > 63 THEN
		RAISE EXCEPTION 'unit is too long' USING ERRCODE = 'string_data_right_truncation',
			DETAIL = 'A unit is at most 63 characters.';
	END IF;
	PERFORM flagmeter.check_pool(meter, aggregation, draws, rate);
	IF draws IS NOT NULL THEN
		rate := trim_scale(COALESCE(rate, 1));
	END IF;
	-- The counters keep every figure, but "used" of the current periods,
	-- their blocks and thresholds would change meaning at once: refused.
	SELECT m.aggregation INTO current_aggregation FROM flagmeter.meters m
	WHERE m.meter = define_meter.meter;
	IF current_aggregation IS NOT NULL AND current_aggregation <> aggregation
	   AND flagmeter.meter_has_usage(meter) THEN
		RAISE EXCEPTION 'cannot change the aggregation of meter "%" from "%" to "%"',
			meter, current_aggregation, aggregation
			USING ERRCODE = 'object_in_use',
			      DETAIL = 'The meter has recorded usage, which would be read differently at once.',
			      HINT = 'Define a new meter, or drop this one with its usage first: '
			             'flagmeter.drop_meter(meter, force => true).';
	END IF;
	INSERT INTO flagmeter.meters AS m (meter, aggregation, unit, draws, rate)
	VALUES (define_meter.meter, define_meter.aggregation, define_meter.unit,
	        define_meter.draws, define_meter.rate)
	ON CONFLICT ON CONSTRAINT meters_pkey DO UPDATE
		SET aggregation = EXCLUDED.aggregation, unit = EXCLUDED.unit,
		    draws = EXCLUDED.draws, rate = EXCLUDED.rate;
EXCEPTION WHEN OTHERS THEN	-- without the CONTEXT of the helpers (raise_plain)
	GET STACKED DIAGNOSTICS e_state = RETURNED_SQLSTATE, e_message = MESSAGE_TEXT,
	                        e_detail = PG_EXCEPTION_DETAIL, e_hint = PG_EXCEPTION_HINT;
	PERFORM flagmeter.raise_plain(e_state, e_message, e_detail, e_hint);
END $$;
COMMENT ON FUNCTION flagmeter.define_meter(text, text, text, text, numeric) IS
'defines a meter (aggregation sum, count, max, latest or unique: distinct values) or changes its unit, its pool, or its aggregation while it has no recorded usage; draws names a sum meter (the pool) that every unit of this one also uses rate units of (default 1), decided all or nothing with it';

-- What makes a meter a valid drawer of a pool, and a pool a valid pool:
-- one level (a pool draws from nothing, a drawer is no pool), sum pools,
-- sum or count drawers, and no credit grants of the drawer's own (a
-- drawer's balance is its pool's).
CREATE FUNCTION flagmeter.check_pool(meter text, aggregation text, draws text, rate numeric)
RETURNS void
LANGUAGE plpgsql STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	pool record;
BEGIN
	IF draws IS NULL THEN
		IF rate IS NOT NULL THEN
			RAISE EXCEPTION 'rate needs draws' USING ERRCODE = 'invalid_parameter_value',
				HINT = 'Name the pool meter: draws => ''credits''.';
		END IF;
		-- a meter that others draw from stays a sum meter
		IF aggregation <> 'sum' AND EXISTS (SELECT FROM flagmeter.meters m WHERE m.draws = check_pool.meter) THEN
			RAISE EXCEPTION 'meter "%" is a credit pool: it must stay a sum meter', meter
				USING ERRCODE = 'object_in_use';
		END IF;
		RETURN;
	END IF;
	IF rate IS NOT NULL AND rate <= 0 THEN
		RAISE EXCEPTION 'rate must be positive, not %', rate USING ERRCODE = 'invalid_parameter_value';
	END IF;
	IF rate IS NOT NULL AND (scale(trim_scale(rate)) > 6 OR rate >= 1000000000000) THEN
		RAISE EXCEPTION 'rate % is out of range', rate USING ERRCODE = 'numeric_value_out_of_range',
			DETAIL = 'A rate is below 10^12 with at most 6 decimal places.';
	END IF;
	IF draws = meter THEN
		RAISE EXCEPTION 'meter "%" cannot draw from itself', meter USING ERRCODE = 'invalid_parameter_value';
	END IF;
	SELECT m.aggregation, m.draws INTO pool FROM flagmeter.meters m WHERE m.meter = check_pool.draws;
	IF NOT FOUND THEN
		RAISE EXCEPTION 'meter "%" does not exist', left(draws, 64) USING ERRCODE = 'undefined_object',
			HINT = 'Define the pool first with flagmeter.define_meter().';
	END IF;
	IF pool.aggregation <> 'sum' THEN
		RAISE EXCEPTION 'meter "%" is a % meter: a credit pool is a sum meter', draws, pool.aggregation
			USING ERRCODE = 'feature_not_supported';
	END IF;
	IF pool.draws IS NOT NULL THEN
		RAISE EXCEPTION 'meter "%" draws from "%" itself: a pool draws from no pool', draws, pool.draws
			USING ERRCODE = 'feature_not_supported';
	END IF;
	IF aggregation NOT IN ('sum', 'count') THEN
		RAISE EXCEPTION 'meter "%" is a % meter: only sum and count meters draw from a pool', meter, aggregation
			USING ERRCODE = 'feature_not_supported';
	END IF;
	IF EXISTS (SELECT FROM flagmeter.meters m WHERE m.draws = check_pool.meter) THEN
		RAISE EXCEPTION 'meter "%" is a credit pool: a pool draws from no pool', meter
			USING ERRCODE = 'feature_not_supported';
	END IF;
	IF EXISTS (SELECT FROM flagmeter.limits l WHERE l.meter = check_pool.meter AND l.rollover IS NOT NULL) THEN
		RAISE EXCEPTION 'meter "%" rolls unused quota over into grants of its own', meter
			USING ERRCODE = 'object_in_use',
			      HINT = 'Set its limits without rollover first, or roll the pool over instead.';
	END IF;
	IF EXISTS (SELECT FROM flagmeter.credit_accounts a WHERE a.meter = check_pool.meter) THEN
		RAISE EXCEPTION 'meter "%" has credit grants or reservations of its own', meter
			USING ERRCODE = 'object_in_use',
			      DETAIL = 'A meter that draws from a pool uses the pool''s grants.';
	END IF;
END $$;
COMMENT ON FUNCTION flagmeter.check_pool(text, text, text, numeric) IS
'raises a clear error unless meter (of aggregation) may draw from the pool draws at rate (NULL draws: unless meter may stop being a pool)';

CREATE FUNCTION flagmeter.define_plan(plan text)
RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	e_state text; e_message text; e_detail text; e_hint text;	-- the error, raised again
BEGIN
	PERFORM flagmeter.check_name('plan', plan);
	INSERT INTO flagmeter.plans (plan) VALUES (define_plan.plan)
	ON CONFLICT ON CONSTRAINT plans_pkey DO NOTHING;
EXCEPTION WHEN OTHERS THEN	-- without the CONTEXT of the helpers (raise_plain)
	GET STACKED DIAGNOSTICS e_state = RETURNED_SQLSTATE, e_message = MESSAGE_TEXT,
	                        e_detail = PG_EXCEPTION_DETAIL, e_hint = PG_EXCEPTION_HINT;
	PERFORM flagmeter.raise_plain(e_state, e_message, e_detail, e_hint);
END $$;
COMMENT ON FUNCTION flagmeter.define_plan(text) IS 'defines a plan; defining an existing plan does nothing';

-- set_limit is store_limit then announce_limit: a change that must reach
-- several shards at once (contrib/plproxy) commits the first with two-phase
-- commit on every shard and runs the second after, because a transaction
-- with announcements pending cannot be prepared.
CREATE FUNCTION flagmeter.store_limit(plan text, meter text, quota bigint,
	period text DEFAULT 'month', mode text DEFAULT 'hard',
	thresholds integer[] DEFAULT '{80,100}', rollover integer DEFAULT NULL,
	rollover_cap bigint DEFAULT NULL, rollover_periods integer DEFAULT 1)
RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
SET jit = off	-- see apply_limit_changes
AS $$
DECLARE
	before jsonb;
	sorted integer[] := flagmeter.check_thresholds(thresholds);
	r record;
BEGIN
	PERFORM flagmeter.check_limit_args(quota, period, mode, thresholds, false);
	PERFORM flagmeter.check_plan_exists(plan);
	PERFORM flagmeter.check_meter_exists(meter);
	PERFORM flagmeter.check_rollover_args(meter, period, rollover, rollover_cap, rollover_periods);

	-- the limit in force for the meter of every tenant of the plan, before
	SELECT jsonb_object_agg(t.tenant, flagmeter.limit_configs(t.tenant, store_limit.meter))
	INTO before FROM flagmeter.tenants t WHERE t.plan = store_limit.plan;

	-- without rollover, the three are NULL (rollover_periods' default too)
	INSERT INTO flagmeter.limits AS l (plan, meter, quota, period, mode, thresholds,
	                                   rollover, rollover_cap, rollover_periods)
	VALUES (store_limit.plan, store_limit.meter, store_limit.quota, store_limit.period,
	        store_limit.mode, sorted, store_limit.rollover, store_limit.rollover_cap,
	        CASE WHEN store_limit.rollover IS NOT NULL THEN store_limit.rollover_periods END)
	ON CONFLICT ON CONSTRAINT limits_pkey DO UPDATE
		SET quota = EXCLUDED.quota, period = EXCLUDED.period, mode = EXCLUDED.mode,
		    thresholds = EXCLUDED.thresholds, rollover = EXCLUDED.rollover,
		    rollover_cap = EXCLUDED.rollover_cap, rollover_periods = EXCLUDED.rollover_periods,
		    updated_at = now();

	-- A period that moved for a tenant is recounted now; what changed is
	-- kept for announce_limit, which may run in a later transaction.
	FOR r IN
		SELECT b.tenant, m.meter FROM jsonb_each(COALESCE(before, '{}')) b(tenant, limits)
		CROSS JOIN jsonb_each(b.limits) m(meter, old)
		CROSS JOIN LATERAL flagmeter.limit_config(b.tenant, m.meter) c
		WHERE (m.old -> 'period', m.old -> 'anchor', m.old -> 'timezone')
		      IS DISTINCT FROM (to_jsonb(c) -> 'period', to_jsonb(c) -> 'anchor', to_jsonb(c) -> 'timezone')
		ORDER BY 1, 2
	LOOP
		PERFORM flagmeter.recount_current_period(r.tenant, r.meter);
	END LOOP;
	INSERT INTO flagmeter.pending_limit_changes AS p (plan, meter, before)
	VALUES (store_limit.plan, store_limit.meter, COALESCE(before, '{}'))
	ON CONFLICT ON CONSTRAINT pending_limit_changes_pkey DO UPDATE SET before = p.before || EXCLUDED.before;
END $$;
COMMENT ON FUNCTION flagmeter.store_limit(text, text, bigint, text, text, integer[], integer, bigint, integer) IS
'the part of set_limit that announces nothing: validates and stores the limit (its rollover too), recounts the current period where it moved, and keeps the limits in force before for announce_limit';

CREATE FUNCTION flagmeter.announce_limit(plan text, meter text)
RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	l record;
	before jsonb;
BEGIN
	DELETE FROM flagmeter.pending_limit_changes p
	WHERE p.plan = announce_limit.plan AND p.meter = announce_limit.meter
	RETURNING p.before INTO before;
	SELECT li.quota, li.period, li.mode, li.thresholds INTO l FROM flagmeter.limits li
	WHERE li.plan = announce_limit.plan AND li.meter = announce_limit.meter;
	-- the plan's own limit, then every tenant whose limit in force changed
	PERFORM flagmeter.announce('limit_changed', NULL, meter, plan, NULL, NULL, l.quota,
	                           l.period, l.mode, l.thresholds);
	PERFORM flagmeter.apply_limit_changes(before);
END $$;
COMMENT ON FUNCTION flagmeter.announce_limit(text, text) IS
'the part of set_limit that announces: limit_changed for the plan and meter, and unblocked for its tenants back under the limit';

CREATE FUNCTION flagmeter.set_limit(plan text, meter text, quota bigint,
	period text DEFAULT 'month', mode text DEFAULT 'hard',
	thresholds integer[] DEFAULT '{80,100}', rollover integer DEFAULT NULL,
	rollover_cap bigint DEFAULT NULL, rollover_periods integer DEFAULT 1)
RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	e_state text; e_message text; e_detail text; e_hint text;	-- the error, raised again
BEGIN
	PERFORM flagmeter.store_limit(plan, meter, quota, period, mode, thresholds,
	                              rollover, rollover_cap, rollover_periods);
	PERFORM flagmeter.announce_limit(plan, meter);
EXCEPTION WHEN OTHERS THEN	-- without the CONTEXT of the helpers (raise_plain)
	GET STACKED DIAGNOSTICS e_state = RETURNED_SQLSTATE, e_message = MESSAGE_TEXT,
	                        e_detail = PG_EXCEPTION_DETAIL, e_hint = PG_EXCEPTION_HINT;
	PERFORM flagmeter.raise_plain(e_state, e_message, e_detail, e_hint);
END $$;
COMMENT ON FUNCTION flagmeter.set_limit(text, text, bigint, text, text, integer[], integer, bigint, integer) IS
'sets or replaces the limit of a plan for a meter; applies to the current period at once; rollover (1 to 100, NULL: none) is the percentage of each ended period''s unused quota that maintain() grants as credits, at most rollover_cap units (NULL: no cap), expiring rollover_periods periods after the period';

-- A NULL anchor or time zone keeps the tenant's (for a tenant not assigned
-- yet: now() and UTC): changing a tenant's plan keeps its periods, and so
-- its usage, unless the caller moves them on purpose.
CREATE FUNCTION flagmeter.assign_plan(tenant text, plan text,
	anchor timestamptz DEFAULT NULL, timezone text DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	e_state text; e_message text; e_detail text; e_hint text;	-- the error, raised again
	before jsonb;
	current_anchor timestamptz;
	current_timezone text;
BEGIN
	PERFORM flagmeter.check_tenant(tenant);
	PERFORM flagmeter.check_plan_exists(plan);
	-- a zone name, not a POSIX offset such as '+05:30' (which reads as UTC-05:30)
	IF timezone IS NOT NULL THEN
		PERFORM flagmeter.check_timezone(timezone);
	END IF;
	SELECT t.anchor, t.timezone INTO current_anchor, current_timezone
	FROM flagmeter.tenants t WHERE t.tenant = assign_plan.tenant;
	anchor := COALESCE(anchor, current_anchor, now());
	timezone := COALESCE(timezone, current_timezone, 'UTC');
	IF NOT isfinite(anchor) THEN
		RAISE EXCEPTION 'anchor must be a finite timestamp' USING ERRCODE = 'invalid_parameter_value';
	END IF;
	-- raises "time zone ... not recognized" for a bad name
	PERFORM flagmeter.period_bounds(anchor, 'day', anchor, timezone);

	before := jsonb_build_object(tenant, flagmeter.limit_configs(tenant));

	INSERT INTO flagmeter.tenants AS t (tenant, plan, anchor, timezone)
	VALUES (assign_plan.tenant, assign_plan.plan, assign_plan.anchor, assign_plan.timezone)
	ON CONFLICT ON CONSTRAINT tenants_pkey DO UPDATE
		SET plan = EXCLUDED.plan, anchor = EXCLUDED.anchor, timezone = EXCLUDED.timezone,
		    assigned_at = now();

	PERFORM flagmeter.announce('plan_changed', tenant, NULL, plan);
	PERFORM flagmeter.apply_limit_changes(before);
EXCEPTION WHEN OTHERS THEN	-- without the CONTEXT of the helpers (raise_plain)
	GET STACKED DIAGNOSTICS e_state = RETURNED_SQLSTATE, e_message = MESSAGE_TEXT,
	                        e_detail = PG_EXCEPTION_DETAIL, e_hint = PG_EXCEPTION_HINT;
	PERFORM flagmeter.raise_plain(e_state, e_message, e_detail, e_hint);
END $$;
COMMENT ON FUNCTION flagmeter.assign_plan(text, text, timestamptz, text) IS
'puts a tenant on a plan; a NULL anchor or time zone keeps the tenant''s (now() and UTC for a new tenant), so a plan change keeps its periods and usage; usage of the current period is recounted when its boundaries move';

CREATE FUNCTION flagmeter.override_limit(tenant text, meter text, quota bigint,
	period text DEFAULT NULL, mode text DEFAULT NULL, thresholds integer[] DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	e_state text; e_message text; e_detail text; e_hint text;	-- the error, raised again
	before jsonb;
	sorted integer[] := flagmeter.check_thresholds(thresholds);
BEGIN
	PERFORM flagmeter.check_tenant(tenant);
	PERFORM flagmeter.check_limit_args(quota, period, mode, thresholds, true);
	PERFORM flagmeter.check_meter_exists(meter);
	IF NOT EXISTS (SELECT FROM flagmeter.tenants t WHERE t.tenant = override_limit.tenant) THEN
		RAISE EXCEPTION 'tenant "%" has no plan', left(tenant, 64) USING ERRCODE = 'undefined_object',
			HINT = 'Assign a plan first with flagmeter.assign_plan().';
	END IF;

	before := jsonb_build_object(tenant, flagmeter.limit_configs(tenant, meter));

	INSERT INTO flagmeter.overrides AS o (tenant, meter, quota, period, mode, thresholds)
	VALUES (override_limit.tenant, override_limit.meter, override_limit.quota,
	        override_limit.period, override_limit.mode, sorted)
	ON CONFLICT ON CONSTRAINT overrides_pkey DO UPDATE
		SET quota = EXCLUDED.quota, period = EXCLUDED.period, mode = EXCLUDED.mode,
		    thresholds = EXCLUDED.thresholds, updated_at = now();

	PERFORM flagmeter.apply_limit_changes(before);
EXCEPTION WHEN OTHERS THEN	-- without the CONTEXT of the helpers (raise_plain)
	GET STACKED DIAGNOSTICS e_state = RETURNED_SQLSTATE, e_message = MESSAGE_TEXT,
	                        e_detail = PG_EXCEPTION_DETAIL, e_hint = PG_EXCEPTION_HINT;
	PERFORM flagmeter.raise_plain(e_state, e_message, e_detail, e_hint);
END $$;
COMMENT ON FUNCTION flagmeter.override_limit(text, text, bigint, text, text, integer[]) IS
'gives one tenant its own limit for a meter, winning over its plan''s; NULL period, mode or thresholds inherit the plan''s';

CREATE FUNCTION flagmeter.drop_override(tenant text, meter text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	e_state text; e_message text; e_detail text; e_hint text;	-- the error, raised again
	before jsonb;
BEGIN
	PERFORM flagmeter.check_tenant(tenant);
	PERFORM flagmeter.check_meter_exists(meter);
	before := jsonb_build_object(tenant, flagmeter.limit_configs(tenant, meter));
	DELETE FROM flagmeter.overrides o
	WHERE o.tenant = drop_override.tenant AND o.meter = drop_override.meter;
	IF NOT FOUND THEN
		RETURN false;
	END IF;
	PERFORM flagmeter.apply_limit_changes(before);
	RETURN true;
EXCEPTION WHEN OTHERS THEN	-- without the CONTEXT of the helpers (raise_plain)
	GET STACKED DIAGNOSTICS e_state = RETURNED_SQLSTATE, e_message = MESSAGE_TEXT,
	                        e_detail = PG_EXCEPTION_DETAIL, e_hint = PG_EXCEPTION_HINT;
	PERFORM flagmeter.raise_plain(e_state, e_message, e_detail, e_hint);
END $$;
COMMENT ON FUNCTION flagmeter.drop_override(text, text) IS
'removes a tenant''s override so its plan''s limit applies again; false when there was none';

-- Lifecycle: a tenant leaves its plan, a plan or a meter goes ---------------------

-- Deletes every row recorded for a tenant (meter NULL) or a meter (tenant
-- NULL): counters, events, rollups, idempotency keys, voids.  As
-- recount_current_period it first waits for the transactions recording
-- usage, and holds new ones until the caller's transaction ends, so that
-- none of them records into what is deleted.
CREATE FUNCTION flagmeter.delete_usage(tenant text, meter text)
RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	e_state text; e_message text; e_detail text; e_hint text;	-- the error, raised again
BEGIN
	IF (tenant IS NULL) = (meter IS NULL) THEN
		RAISE EXCEPTION 'delete_usage takes a tenant or a meter' USING ERRCODE = 'invalid_parameter_value';
	END IF;
	LOCK TABLE flagmeter.counters IN SHARE ROW EXCLUSIVE MODE;
	DELETE FROM flagmeter.counters c WHERE c.tenant = delete_usage.tenant OR c.meter = delete_usage.meter;
	PERFORM flagmeter.pending_drop(tenant, meter, NULL);
	DELETE FROM flagmeter.events e WHERE e.tenant = delete_usage.tenant OR e.meter = delete_usage.meter;
	DELETE FROM flagmeter.rollup_hour h WHERE h.tenant = delete_usage.tenant OR h.meter = delete_usage.meter;
	DELETE FROM flagmeter.rollup_day d WHERE d.tenant = delete_usage.tenant OR d.meter = delete_usage.meter;
	DELETE FROM flagmeter.event_keys k WHERE k.tenant = delete_usage.tenant OR k.meter = delete_usage.meter;
	DELETE FROM flagmeter.voids v WHERE v.tenant = delete_usage.tenant OR v.meter = delete_usage.meter;
	DELETE FROM flagmeter.unique_values u WHERE u.tenant = delete_usage.tenant OR u.meter = delete_usage.meter;
	DELETE FROM flagmeter.value_sightings s WHERE s.tenant = delete_usage.tenant OR s.meter = delete_usage.meter;
EXCEPTION WHEN OTHERS THEN	-- without the CONTEXT of the helpers (raise_plain)
	GET STACKED DIAGNOSTICS e_state = RETURNED_SQLSTATE, e_message = MESSAGE_TEXT,
	                        e_detail = PG_EXCEPTION_DETAIL, e_hint = PG_EXCEPTION_HINT;
	PERFORM flagmeter.raise_plain(e_state, e_message, e_detail, e_hint);
END $$;
COMMENT ON FUNCTION flagmeter.delete_usage(text, text) IS
'deletes everything recorded for a tenant or for a meter (counters, events, rollups, idempotency keys, voids, distinct values), after the transactions recording usage; for unassign_tenant(forget_usage) and drop_meter';

-- The tenant leaves its plan (its overrides go with it) and is unassigned
-- again: metered without limit in calendar months in UTC, or refused
-- (settings.unassigned_tenants).  Its usage, events, idempotency keys and
-- outbox rows stay unless forget_usage, which deletes them all (after the
-- transactions that are recording for it, and before any that starts
-- meanwhile: they wait).  Announces plan_changed without a plan,
-- limit_changed without a quota for every meter it had a limit for, and
-- unblocked for its blocks.
CREATE FUNCTION flagmeter.unassign_tenant(tenant text, forget_usage boolean DEFAULT false)
RETURNS boolean
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	e_state text; e_message text; e_detail text; e_hint text;	-- the error, raised again
	before jsonb;
	assigned boolean;
BEGIN
	PERFORM flagmeter.check_tenant(tenant);
	IF forget_usage IS NULL THEN
		RAISE EXCEPTION 'forget_usage must not be NULL' USING ERRCODE = 'null_value_not_allowed';
	END IF;
	before := jsonb_build_object(tenant, flagmeter.limit_configs(tenant));
	IF forget_usage THEN
		PERFORM flagmeter.delete_usage(tenant, NULL);
		-- this transaction's own events are written at its commit, after this
		DELETE FROM flagmeter.outbox o WHERE o.tenant = unassign_tenant.tenant;
	END IF;
	DELETE FROM flagmeter.tenants t WHERE t.tenant = unassign_tenant.tenant;
	assigned := FOUND;
	IF assigned THEN
		PERFORM flagmeter.announce('plan_changed', tenant, NULL);
	END IF;
	PERFORM flagmeter.apply_limit_changes(before);
	RETURN assigned;
EXCEPTION WHEN OTHERS THEN	-- without the CONTEXT of the helpers (raise_plain)
	GET STACKED DIAGNOSTICS e_state = RETURNED_SQLSTATE, e_message = MESSAGE_TEXT,
	                        e_detail = PG_EXCEPTION_DETAIL, e_hint = PG_EXCEPTION_HINT;
	PERFORM flagmeter.raise_plain(e_state, e_message, e_detail, e_hint);
END $$;
COMMENT ON FUNCTION flagmeter.unassign_tenant(text, boolean) IS
'takes a tenant off its plan (its overrides go too): it is unassigned again; usage, events, idempotency keys and outbox rows stay unless forget_usage; false when it was not assigned';

-- A plan goes, with its limits.  Refused while tenants are on it, unless
-- force, which unassigns them first (as unassign_tenant, usage kept).
CREATE FUNCTION flagmeter.drop_plan(plan text, force boolean DEFAULT false)
RETURNS boolean
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	e_state text; e_message text; e_detail text; e_hint text;	-- the error, raised again
	n bigint;
	t text;
	l record;
BEGIN
	PERFORM flagmeter.check_name('plan', plan);
	IF force IS NULL THEN
		RAISE EXCEPTION 'force must not be NULL' USING ERRCODE = 'null_value_not_allowed';
	END IF;
	PERFORM FROM flagmeter.plans p WHERE p.plan = drop_plan.plan FOR UPDATE;
	IF NOT FOUND THEN
		RETURN false;
	END IF;
	SELECT count(*) INTO n FROM flagmeter.tenants tn WHERE tn.plan = drop_plan.plan;
	IF n > 0 AND NOT force THEN
		RAISE EXCEPTION 'plan "%" is in use', plan
			USING ERRCODE = 'dependent_objects_still_exist',
			      DETAIL = format('Tenants on it: %s.', n),
			      HINT = 'Move them with flagmeter.assign_plan(), or pass force => true to unassign them '
			             '(their usage is kept).';
	END IF;
	FOR t IN SELECT tn.tenant FROM flagmeter.tenants tn WHERE tn.plan = drop_plan.plan ORDER BY 1 LOOP
		PERFORM flagmeter.unassign_tenant(t);
	END LOOP;
	-- the plan's limits are gone, and its features' rows (a plan of the
	-- name defined again starts without them)
	FOR l IN SELECT li.meter FROM flagmeter.limits li WHERE li.plan = drop_plan.plan ORDER BY 1 LOOP
		PERFORM flagmeter.announce('limit_changed', NULL, l.meter, plan);
	END LOOP;
	FOR l IN SELECT pf.feature FROM flagmeter.plan_features pf WHERE pf.plan = drop_plan.plan ORDER BY 1 LOOP
		PERFORM flagmeter.announce_feature(NULL, plan, l.feature, NULL);
	END LOOP;
	DELETE FROM flagmeter.plans p WHERE p.plan = drop_plan.plan;
	RETURN true;
EXCEPTION WHEN OTHERS THEN	-- without the CONTEXT of the helpers (raise_plain)
	GET STACKED DIAGNOSTICS e_state = RETURNED_SQLSTATE, e_message = MESSAGE_TEXT,
	                        e_detail = PG_EXCEPTION_DETAIL, e_hint = PG_EXCEPTION_HINT;
	PERFORM flagmeter.raise_plain(e_state, e_message, e_detail, e_hint);
END $$;
COMMENT ON FUNCTION flagmeter.drop_plan(text, boolean) IS
'drops a plan and its limits; refused (2BP01) while tenants are on it unless force, which unassigns them (usage kept); false when there is no such plan';

-- Whether a meter has recorded usage: an event in a counter row (kept for
-- every period, ended ones compacted; a refused consume leaves an empty
-- one) or in the rollups.
CREATE FUNCTION flagmeter.meter_has_usage(meter text)
RETURNS boolean
LANGUAGE sql STABLE PARALLEL SAFE
AS $$
SELECT EXISTS (SELECT FROM flagmeter.counters c
               WHERE c.meter OPERATOR(pg_catalog.=) $1
                 AND flagmeter.events(c.counter) OPERATOR(pg_catalog.>) 0)
    OR EXISTS (SELECT FROM flagmeter.rollup_day r
               WHERE r.meter OPERATOR(pg_catalog.=) $1
                 AND flagmeter.events(r.counter) OPERATOR(pg_catalog.>) 0)
    OR flagmeter.has_pending_events(NULL, $1)
$$;
COMMENT ON FUNCTION flagmeter.meter_has_usage(text) IS
'whether a meter has recorded usage (an event in its counters or rollups)';

-- A meter goes.  Refused while a plan limits it, a tenant overrides it or
-- usage is recorded for it, unless force, which drops its limits and
-- overrides (limit_changed without a quota, for the plans and the tenants
-- that had one) and unblocks its blocked tenants.  Its rows go in either
-- case (without force only empty counters and the keys of refused
-- consumes can be left): usage, events, idempotency keys (of a
-- multi-meter consume, only its part), voids and announced thresholds,
-- after the transactions recording for it (calls that start meanwhile
-- wait, then fail with 42704).
CREATE FUNCTION flagmeter.drop_meter(meter text, force boolean DEFAULT false)
RETURNS boolean
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	e_state text; e_message text; e_detail text; e_hint text;	-- the error, raised again
	nlimits bigint;
	noverrides bigint;
	used boolean;
	drawers text;
	r record;
BEGIN
	PERFORM flagmeter.check_name('meter', meter);
	IF force IS NULL THEN
		RAISE EXCEPTION 'force must not be NULL' USING ERRCODE = 'null_value_not_allowed';
	END IF;
	PERFORM FROM flagmeter.meters m WHERE m.meter = drop_meter.meter FOR UPDATE;
	IF NOT FOUND THEN
		RETURN false;
	END IF;
	SELECT string_agg(format('"%s"', m.meter), ', ' ORDER BY m.meter) INTO drawers
	FROM flagmeter.meters m WHERE m.draws = drop_meter.meter;
	IF drawers IS NOT NULL THEN
		RAISE EXCEPTION 'meter "%" is the credit pool of %', meter, drawers
			USING ERRCODE = 'dependent_objects_still_exist',
			      HINT = 'Define those meters without draws first, or drop them.';
	END IF;
	-- no call records usage between the check below and the deletes
	LOCK TABLE flagmeter.counters IN SHARE ROW EXCLUSIVE MODE;
	SELECT count(*) INTO nlimits FROM flagmeter.limits l WHERE l.meter = drop_meter.meter;
	SELECT count(*) INTO noverrides FROM flagmeter.overrides o WHERE o.meter = drop_meter.meter;
	used := flagmeter.meter_has_usage(meter);
	IF (nlimits > 0 OR noverrides > 0 OR used) AND NOT force THEN
		RAISE EXCEPTION 'meter "%" is in use', meter
			USING ERRCODE = 'dependent_objects_still_exist',
			      DETAIL = format('Plans limiting it: %s; tenants overriding it: %s; recorded usage: %s.',
			                      nlimits, noverrides, CASE WHEN used THEN 'yes' ELSE 'no' END),
			      HINT = 'Pass force => true to drop it with its limits, overrides, usage, events '
			             'and idempotency keys.';
	END IF;

	FOR r IN SELECT l.plan FROM flagmeter.limits l WHERE l.meter = drop_meter.meter ORDER BY 1 LOOP
		PERFORM flagmeter.announce('limit_changed', NULL, meter, r.plan);
	END LOOP;
	FOR r IN SELECT e.tenant, e.plan FROM flagmeter.effective_limits e
	         WHERE e.meter = drop_meter.meter ORDER BY 1 LOOP
		PERFORM flagmeter.announce('limit_changed', r.tenant, meter, r.plan);
	END LOOP;
	PERFORM flagmeter.delete_usage(NULL, meter);
	-- so that a meter defined again under the name announces its thresholds
	DELETE FROM flagmeter.outbox o WHERE o.meter = drop_meter.meter AND o.kind = 'threshold';
	DELETE FROM flagmeter.meters m WHERE m.meter = drop_meter.meter;
	-- its blocks: unblocked (the rows leave flagmeter.blocked at commit)
	PERFORM flagmeter.review_blocks(NULL, meter);
	RETURN true;
EXCEPTION WHEN OTHERS THEN	-- without the CONTEXT of the helpers (raise_plain)
	GET STACKED DIAGNOSTICS e_state = RETURNED_SQLSTATE, e_message = MESSAGE_TEXT,
	                        e_detail = PG_EXCEPTION_DETAIL, e_hint = PG_EXCEPTION_HINT;
	PERFORM flagmeter.raise_plain(e_state, e_message, e_detail, e_hint);
END $$;
COMMENT ON FUNCTION flagmeter.drop_meter(text, boolean) IS
'drops a meter; refused (2BP01) while other meters draw from it (a credit pool), and while plans limit it, tenants override it or it has recorded usage, unless force, which drops those with all its usage, events and idempotency keys; false when there is no such meter';

-- Helpers of the catalog API ---------------------------------------------------

-- The zones flagmeter stores (tenants) and groups by (usage_series): names
-- of pg_timezone_names only (src/period.c).
CREATE FUNCTION flagmeter.check_timezone(timezone text)
RETURNS void
AS 'MODULE_PATHNAME', 'fm_check_timezone'
LANGUAGE C STABLE PARALLEL SAFE;
COMMENT ON FUNCTION flagmeter.check_timezone(text) IS
'raises a clear error unless timezone is the name of a zone of pg_timezone_names (POSIX specifications such as +05:30, read with their sign inverted, are refused)';

-- The C check every call makes (src/args.c), so that one bound holds everywhere.
CREATE FUNCTION flagmeter.check_tenant(tenant text)
RETURNS void
AS 'MODULE_PATHNAME', 'fm_check_tenant_sql'
LANGUAGE C IMMUTABLE PARALLEL SAFE;
COMMENT ON FUNCTION flagmeter.check_tenant(text) IS
'raises a clear error unless tenant is a valid tenant id (1 to 256 bytes)';

-- What the public catalog functions raise an error they caught from their
-- helpers with: the same SQLSTATE, message, detail and hint, without the
-- helpers' CONTEXT lines.
CREATE FUNCTION flagmeter.raise_plain(sqlstate text, message text, detail text, hint text)
RETURNS void
AS 'MODULE_PATHNAME', 'fm_raise_plain'
LANGUAGE C VOLATILE PARALLEL SAFE;

CREATE FUNCTION flagmeter.check_meter_exists(meter text)
RETURNS void
LANGUAGE plpgsql STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	IF meter IS NULL THEN
		RAISE EXCEPTION 'meter must not be NULL' USING ERRCODE = 'null_value_not_allowed';
	END IF;
	IF NOT EXISTS (SELECT FROM flagmeter.meters m WHERE m.meter = check_meter_exists.meter) THEN
		RAISE EXCEPTION 'meter "%" does not exist', left(meter, 64) USING ERRCODE = 'undefined_object',
			HINT = 'Define it first with flagmeter.define_meter().';
	END IF;
END $$;
COMMENT ON FUNCTION flagmeter.check_meter_exists(text) IS 'raises a clear error unless the meter is defined';

CREATE FUNCTION flagmeter.check_plan_exists(plan text)
RETURNS void
LANGUAGE plpgsql STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	IF plan IS NULL THEN
		RAISE EXCEPTION 'plan must not be NULL' USING ERRCODE = 'null_value_not_allowed';
	END IF;
	IF NOT EXISTS (SELECT FROM flagmeter.plans p WHERE p.plan = check_plan_exists.plan) THEN
		RAISE EXCEPTION 'plan "%" does not exist', left(plan, 64) USING ERRCODE = 'undefined_object',
			HINT = 'Define it first with flagmeter.define_plan().';
	END IF;
END $$;
COMMENT ON FUNCTION flagmeter.check_plan_exists(text) IS 'raises a clear error unless the plan is defined';

CREATE FUNCTION flagmeter.check_limit_args(quota bigint, period text, mode text,
	thresholds integer[], inherit boolean)
RETURNS void
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	IF quota IS NULL THEN
		RAISE EXCEPTION 'quota must not be NULL' USING ERRCODE = 'null_value_not_allowed';
	END IF;
	IF quota <= 0 THEN
		RAISE EXCEPTION 'quota must be positive: %', quota USING ERRCODE = 'invalid_parameter_value';
	END IF;
	IF period IS NULL AND NOT inherit THEN
		RAISE EXCEPTION 'period must not be NULL' USING ERRCODE = 'null_value_not_allowed';
	END IF;
	IF period IS NOT NULL AND NOT period = ANY (ARRAY['hour', 'day', 'week', 'month', 'year', 'lifetime']) THEN
		RAISE EXCEPTION 'invalid period "%"', left(period, 64) USING ERRCODE = 'invalid_parameter_value',
			HINT = 'Valid periods are "hour", "day", "week", "month", "year" and "lifetime".';
	END IF;
	IF mode IS NULL AND NOT inherit THEN
		RAISE EXCEPTION 'mode must not be NULL' USING ERRCODE = 'null_value_not_allowed';
	END IF;
	IF mode IS NOT NULL AND NOT mode = ANY (ARRAY['hard', 'soft']) THEN
		RAISE EXCEPTION 'invalid mode "%"', left(mode, 64) USING ERRCODE = 'invalid_parameter_value',
			HINT = 'Valid modes are "hard" and "soft".';
	END IF;
	IF thresholds IS NULL AND NOT inherit THEN
		RAISE EXCEPTION 'thresholds must not be NULL' USING ERRCODE = 'null_value_not_allowed';
	END IF;
END $$;
COMMENT ON FUNCTION flagmeter.check_limit_args(bigint, text, text, integer[], boolean) IS
'validates the arguments of set_limit and override_limit (inherit: NULL period, mode and thresholds allowed)';

CREATE FUNCTION flagmeter.check_rollover_args(meter text, period text, rollover integer,
	rollover_cap bigint, rollover_periods integer)
RETURNS void
LANGUAGE plpgsql STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	aggregation text;
BEGIN
	IF rollover_periods IS NULL THEN
		RAISE EXCEPTION 'rollover_periods must not be NULL' USING ERRCODE = 'null_value_not_allowed',
			HINT = 'Leave it out for rollover grants that last one period.';
	END IF;
	IF rollover IS NULL THEN
		IF rollover_cap IS NOT NULL OR rollover_periods <> 1 THEN
			RAISE EXCEPTION 'rollover_cap and rollover_periods need rollover'
				USING ERRCODE = 'invalid_parameter_value',
				      HINT = 'Give rollover, the percentage of unused quota carried over.';
		END IF;
		RETURN;
	END IF;
	IF rollover < 1 OR rollover > 100 THEN
		RAISE EXCEPTION 'rollover must be a percentage from 1 to 100, not %', rollover
			USING ERRCODE = 'invalid_parameter_value', HINT = 'NULL rolls nothing over.';
	END IF;
	IF rollover_cap <= 0 THEN
		RAISE EXCEPTION 'rollover_cap must be positive, not %', rollover_cap
			USING ERRCODE = 'invalid_parameter_value', HINT = 'NULL caps a grant at the quota''s share only.';
	END IF;
	IF rollover_periods < 1 OR rollover_periods > 120 THEN
		RAISE EXCEPTION 'rollover_periods must be 1 to 120, not %', rollover_periods
			USING ERRCODE = 'invalid_parameter_value';
	END IF;
	IF period = 'lifetime' THEN
		RAISE EXCEPTION 'a lifetime limit cannot roll over' USING ERRCODE = 'invalid_parameter_value',
			DETAIL = 'Rollover carries the unused quota of a period that has ended; a lifetime period never ends.';
	END IF;
	SELECT m.aggregation INTO aggregation FROM flagmeter.meters m WHERE m.meter = check_rollover_args.meter;
	IF aggregation NOT IN ('sum', 'count') THEN
		RAISE EXCEPTION 'meter "%" is a % meter: rollover makes credits, which are units of sum and count meters',
			meter, aggregation USING ERRCODE = 'feature_not_supported';
	END IF;
	-- rollover makes grants, which a meter drawing from a pool has not
	PERFORM flagmeter.check_not_drawing(meter);
END $$;
COMMENT ON FUNCTION flagmeter.check_rollover_args(text, text, integer, bigint, integer) IS
'validates the rollover arguments of set_limit for a defined meter and a valid period: rollover 1 to 100 or NULL (then no cap and rollover_periods 1), rollover_cap positive or NULL, rollover_periods 1 to 120, not on a lifetime period, a max or latest meter, or a meter that draws from a credit pool';

-- {meter: limit} for every meter, or for one: the limit in force for the
-- tenant as limit_config() gives it (aggregation, plan, quota, period,
-- mode, thresholds, anchor, timezone), compared before and after a change.
CREATE FUNCTION flagmeter.limit_configs(tenant text, meter text DEFAULT NULL)
RETURNS jsonb
LANGUAGE sql STABLE PARALLEL SAFE
AS $$
SELECT COALESCE(pg_catalog.jsonb_object_agg(m.meter, pg_catalog.to_jsonb(c)), '{}'::pg_catalog.jsonb)
FROM flagmeter.meters m
CROSS JOIN LATERAL flagmeter.limit_config($1, m.meter) c
WHERE $2 IS NULL OR m.meter OPERATOR(pg_catalog.=) $2
$$;
COMMENT ON FUNCTION flagmeter.limit_configs(text, text) IS
'per meter (or for one meter), the limit in force for a tenant with its period, anchor and time zone, as jsonb';

-- What follows a change of the configuration, for every tenant and meter of
-- before ({tenant: {meter: limit}}, limit_configs() taken before the
-- change) whose limit in force is now different:
--   - the current period is recounted when its boundaries moved (period
--     kind, anchor or time zone);
--   - "limit_changed" is announced with the limit now in force (no quota:
--     unlimited) when the quota, period, mode or thresholds changed;
--   - tenants no longer at a hard limit are unblocked (review_blocks), and
--     then what the current usage reaches under the new limit is announced
--     (review_usage): thresholds not announced in the period yet, and
--     "blocked" at a hard limit now at or below the usage.
-- Unblocking comes first, so that a tenant unblocked in a period that
-- moved and blocked in the new one ends blocked, in version order too.
--
-- jit is off here and in store_limit: the planner takes each jsonb_each()
-- for 100 rows, so their join of one tenant's limits looked like 10 000
-- limit lookups, past jit_above_cost, and every call JIT-compiled its loop
-- query: 13 of the 14 ms an assign_plan() took.
CREATE FUNCTION flagmeter.apply_limit_changes(before jsonb)
RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
DECLARE
	r record;
	changed_tenants text[] := '{}';
	changed_meters text[] := '{}';
BEGIN
	FOR r IN
		SELECT b.tenant, m.meter, m.old, to_jsonb(c) AS new
		FROM jsonb_each(COALESCE(before, '{}')) b(tenant, limits)
		CROSS JOIN jsonb_each(b.limits) m(meter, old)
		CROSS JOIN LATERAL flagmeter.limit_config(b.tenant, m.meter) c
		WHERE m.old IS DISTINCT FROM to_jsonb(c)
		ORDER BY 1, 2
	LOOP
		IF (r.old -> 'period', r.old -> 'anchor', r.old -> 'timezone')
		   IS DISTINCT FROM (r.new -> 'period', r.new -> 'anchor', r.new -> 'timezone') THEN
			PERFORM flagmeter.recount_current_period(r.tenant, r.meter);
		END IF;
		IF (r.old -> 'quota', r.old -> 'period', r.old -> 'mode', r.old -> 'thresholds')
		   IS DISTINCT FROM (r.new -> 'quota', r.new -> 'period', r.new -> 'mode', r.new -> 'thresholds')
		   AND (r.old ->> 'quota' IS NOT NULL OR r.new ->> 'quota' IS NOT NULL) THEN
			IF r.new ->> 'quota' IS NULL THEN
				PERFORM flagmeter.announce('limit_changed', r.tenant, r.meter, r.new ->> 'plan');
			ELSE
				PERFORM flagmeter.announce('limit_changed', r.tenant, r.meter, r.new ->> 'plan',
				            NULL, NULL, (r.new ->> 'quota')::bigint, r.new ->> 'period', r.new ->> 'mode',
				            ARRAY(SELECT jsonb_array_elements_text(r.new -> 'thresholds')::integer));
			END IF;
		END IF;
		changed_tenants := changed_tenants || r.tenant;
		changed_meters := changed_meters || r.meter;
	END LOOP;

	FOR r IN
		SELECT DISTINCT bl.tenant FROM flagmeter.blocked bl
		WHERE bl.tenant IN (SELECT jsonb_object_keys(COALESCE(before, '{}')))
		ORDER BY 1
	LOOP
		PERFORM flagmeter.review_blocks(r.tenant);
	END LOOP;

	FOR r IN
		SELECT u.tenant, u.meter FROM unnest(changed_tenants, changed_meters) u(tenant, meter)
		WHERE EXISTS (SELECT FROM flagmeter.counters c WHERE c.tenant = u.tenant AND c.meter = u.meter)
		   OR flagmeter.has_pending_events(u.tenant, u.meter)
	LOOP
		PERFORM flagmeter.review_usage(r.tenant, r.meter);
	END LOOP;
END $$;
COMMENT ON FUNCTION flagmeter.apply_limit_changes(jsonb) IS
'after a configuration change: recounts moved periods, announces limit_changed with the new limit, unblocks and blocks, and announces thresholds now reached, for each tenant and meter of before whose limit in force changed';
-- ---------------------------------------------------------------------------
-- Rate limits: "50 requests a second, bursts of 100" beside the period
-- quotas.  A plan's rate limit for a meter (rate_limits), or a tenant's own
-- (rate_overrides, which wins), is applied by consume, consume_batch,
-- reserve and check together with the quota; track is never rate limited
-- (it records what happened).  limit() is the same limiter for any key,
-- with no catalog row per key.
--
-- The limiter is GCRA (the generic cell rate algorithm) over a table in
-- shared memory (src/rate_limiter.c): exact, one time per key, no
-- WAL and no row lock.  It needs flagmeter in shared_preload_libraries; the
-- calls that would apply a rate limit raise 55000 without it.  The
-- algorithm, its bound and what a restart does are in docs/design.md
-- ("Rate limits").
-- ---------------------------------------------------------------------------

-- The one validation of a rate limit (src/rate_limiter.c): rate >= 1, per
-- from 1 second to 1 hour, burst >= 1, at least one nanosecond per unit
-- (rate <= per in nanoseconds) and a burst that refills within a year.
CREATE FUNCTION flagmeter.rate_limit_valid(rate bigint, per interval, burst bigint)
RETURNS boolean
AS 'MODULE_PATHNAME', 'fm_rate_limit_valid'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION flagmeter.rate_limit_valid(bigint, interval, bigint) IS
'whether rate units per per in bursts of burst is a rate limit flagmeter can apply';

CREATE FUNCTION flagmeter.check_rate_limit(rate bigint, per interval, burst bigint)
RETURNS void
AS 'MODULE_PATHNAME', 'fm_check_rate_limit'
LANGUAGE C IMMUTABLE CALLED ON NULL INPUT PARALLEL SAFE;
COMMENT ON FUNCTION flagmeter.check_rate_limit(bigint, interval, bigint) IS
'raises the error that says why rate units per per in bursts of burst is not a valid rate limit; nothing when it is';

CREATE TABLE flagmeter.rate_limits (
	plan		text NOT NULL REFERENCES flagmeter.plans ON DELETE CASCADE,
	meter		text NOT NULL REFERENCES flagmeter.meters ON DELETE CASCADE,
	rate		bigint NOT NULL,
	per			interval NOT NULL,
	burst		bigint NOT NULL,
	updated_at	timestamptz NOT NULL DEFAULT pg_catalog.now(),
	PRIMARY KEY (plan, meter),
	CONSTRAINT rate_limits_valid CHECK (flagmeter.rate_limit_valid(rate, per, burst))
);
COMMENT ON TABLE flagmeter.rate_limits IS
'the rate limit of a plan for one meter: at most rate units per per (1 second to 1 hour), in bursts of at most burst units';

CREATE TABLE flagmeter.rate_overrides (
	tenant		text NOT NULL REFERENCES flagmeter.tenants ON DELETE CASCADE,
	meter		text NOT NULL REFERENCES flagmeter.meters ON DELETE CASCADE,
	rate		bigint NOT NULL,
	per			interval NOT NULL,
	burst		bigint NOT NULL,
	updated_at	timestamptz NOT NULL DEFAULT pg_catalog.now(),
	PRIMARY KEY (tenant, meter),
	CONSTRAINT rate_overrides_valid CHECK (flagmeter.rate_limit_valid(rate, per, burst))
);
COMMENT ON TABLE flagmeter.rate_overrides IS
'a tenant''s own rate limit for a meter, winning over its plan''s';

CREATE TRIGGER rate_limits_changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON flagmeter.rate_limits
	FOR EACH STATEMENT EXECUTE FUNCTION flagmeter.config_changed();
CREATE TRIGGER rate_overrides_changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON flagmeter.rate_overrides
	FOR EACH STATEMENT EXECUTE FUNCTION flagmeter.config_changed();

SELECT pg_catalog.pg_extension_config_dump('flagmeter.rate_limits', '');
SELECT pg_catalog.pg_extension_config_dump('flagmeter.rate_overrides', '');

-- The rate limit in force for a tenant and meter, as consume applies it:
-- the tenant's override, else its plan's; no row when neither has one.
CREATE FUNCTION flagmeter.rate_limit_config(tenant text, meter text,
	OUT rate bigint, OUT per interval, OUT burst bigint, OUT source text)
RETURNS SETOF record
LANGUAGE sql STABLE PARALLEL SAFE ROWS 1
AS $$
SELECT o.rate, o.per, o.burst, 'override'::pg_catalog.text
FROM flagmeter.rate_overrides o
WHERE o.tenant OPERATOR(pg_catalog.=) $1 AND o.meter OPERATOR(pg_catalog.=) $2
UNION ALL
SELECT r.rate, r.per, r.burst, 'plan'::pg_catalog.text
FROM flagmeter.tenants t
JOIN flagmeter.rate_limits r
  ON r.plan OPERATOR(pg_catalog.=) t.plan AND r.meter OPERATOR(pg_catalog.=) $2
WHERE t.tenant OPERATOR(pg_catalog.=) $1
  AND NOT EXISTS (SELECT FROM flagmeter.rate_overrides o
                  WHERE o.tenant OPERATOR(pg_catalog.=) $1 AND o.meter OPERATOR(pg_catalog.=) $2)
$$;
COMMENT ON FUNCTION flagmeter.rate_limit_config(text, text) IS
'the rate limit in force for a tenant and meter (override, else plan) and where it comes from; no row when none applies';

-- Stores a plan's (tenant NULL) or a tenant's (plan NULL) rate limit: the
-- first half of set_rate_limit and override_rate_limit, announce_rate_limit
-- the second (contrib/plproxy prepares the first on every shard, and a
-- transaction with announcements pending cannot be prepared).
CREATE FUNCTION flagmeter.store_rate_limit(plan text, tenant text, meter text, rate bigint,
	per interval, burst bigint)
RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	l record;
BEGIN
	burst := COALESCE(burst, rate);
	PERFORM flagmeter.check_rate_limit(rate, per, burst);
	PERFORM flagmeter.check_meter_exists(meter);
	IF tenant IS NULL THEN
		PERFORM flagmeter.check_plan_exists(plan);
		INSERT INTO flagmeter.rate_limits AS r (plan, meter, rate, per, burst)
		VALUES (store_rate_limit.plan, store_rate_limit.meter, store_rate_limit.rate,
		        store_rate_limit.per, store_rate_limit.burst)
		ON CONFLICT ON CONSTRAINT rate_limits_pkey DO UPDATE
			SET rate = EXCLUDED.rate, per = EXCLUDED.per, burst = EXCLUDED.burst, updated_at = now();
	ELSE
		PERFORM flagmeter.check_tenant(tenant);
		SELECT t.plan INTO plan FROM flagmeter.tenants t WHERE t.tenant = store_rate_limit.tenant;
		IF NOT FOUND THEN
			RAISE EXCEPTION 'tenant "%" has no plan', left(tenant, 64) USING ERRCODE = 'undefined_object',
				HINT = 'Assign a plan first with flagmeter.assign_plan().';
		END IF;
		INSERT INTO flagmeter.rate_overrides AS r (tenant, meter, rate, per, burst)
		VALUES (store_rate_limit.tenant, store_rate_limit.meter, store_rate_limit.rate,
		        store_rate_limit.per, store_rate_limit.burst)
		ON CONFLICT ON CONSTRAINT rate_overrides_pkey DO UPDATE
			SET rate = EXCLUDED.rate, per = EXCLUDED.per, burst = EXCLUDED.burst, updated_at = now();
	END IF;
END $$;
COMMENT ON FUNCTION flagmeter.store_rate_limit(text, text, text, bigint, interval, bigint) IS
'the part of set_rate_limit (tenant NULL) and override_rate_limit (plan NULL) that announces nothing: validates and stores';

-- limit_changed for a plan's (tenant NULL) or a tenant's rate limit, with
-- the quota in force beside it, as every limit_changed carries it.
CREATE FUNCTION flagmeter.announce_rate_limit(plan text, tenant text, meter text)
RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	l record;
BEGIN
	-- the quota in force: a tenant's (its override, else its plan's), or the plan's
	IF tenant IS NOT NULL THEN
		SELECT c.plan, c.quota, c.period, c.mode, c.thresholds INTO l
		FROM flagmeter.limit_config(tenant, meter) c;
		plan := l.plan;
	ELSE
		SELECT li.quota, li.period, li.mode, li.thresholds INTO l FROM flagmeter.limits li
		WHERE li.plan = announce_rate_limit.plan AND li.meter = announce_rate_limit.meter;
	END IF;
	PERFORM flagmeter.announce('limit_changed', tenant, meter, plan, NULL, NULL, l.quota,
	                           l.period, l.mode, l.thresholds);
END $$;
COMMENT ON FUNCTION flagmeter.announce_rate_limit(text, text, text) IS
'the part of set_rate_limit, override_rate_limit and their drops that announces: limit_changed for the plan (tenant NULL) or the tenant and meter';

CREATE FUNCTION flagmeter.set_rate_limit(plan text, meter text, rate bigint, per interval,
	burst bigint DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	e_state text; e_message text; e_detail text; e_hint text;	-- the error, raised again
BEGIN
	IF plan IS NULL THEN
		RAISE EXCEPTION 'plan must not be NULL' USING ERRCODE = 'null_value_not_allowed';
	END IF;
	PERFORM flagmeter.store_rate_limit(plan, NULL, meter, rate, per, burst);
	PERFORM flagmeter.announce_rate_limit(plan, NULL, meter);
EXCEPTION WHEN OTHERS THEN	-- without the CONTEXT of the helpers (raise_plain)
	GET STACKED DIAGNOSTICS e_state = RETURNED_SQLSTATE, e_message = MESSAGE_TEXT,
	                        e_detail = PG_EXCEPTION_DETAIL, e_hint = PG_EXCEPTION_HINT;
	PERFORM flagmeter.raise_plain(e_state, e_message, e_detail, e_hint);
END $$;
COMMENT ON FUNCTION flagmeter.set_rate_limit(text, text, bigint, interval, bigint) IS
'sets or replaces the rate limit of a plan for a meter: at most rate units per per (1 second to 1 hour), bursts of at most burst units (NULL: rate); consume, consume_batch, reserve and check apply it with the quota from the next call on';

CREATE FUNCTION flagmeter.override_rate_limit(tenant text, meter text, rate bigint, per interval,
	burst bigint DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	e_state text; e_message text; e_detail text; e_hint text;	-- the error, raised again
BEGIN
	IF tenant IS NULL THEN
		RAISE EXCEPTION 'tenant must not be NULL' USING ERRCODE = 'null_value_not_allowed';
	END IF;
	PERFORM flagmeter.store_rate_limit(NULL, tenant, meter, rate, per, burst);
	PERFORM flagmeter.announce_rate_limit(NULL, tenant, meter);
EXCEPTION WHEN OTHERS THEN	-- without the CONTEXT of the helpers (raise_plain)
	GET STACKED DIAGNOSTICS e_state = RETURNED_SQLSTATE, e_message = MESSAGE_TEXT,
	                        e_detail = PG_EXCEPTION_DETAIL, e_hint = PG_EXCEPTION_HINT;
	PERFORM flagmeter.raise_plain(e_state, e_message, e_detail, e_hint);
END $$;
COMMENT ON FUNCTION flagmeter.override_rate_limit(text, text, bigint, interval, bigint) IS
'gives one tenant its own rate limit for a meter, winning over its plan''s; the tenant must be assigned a plan';

-- Deletes a plan's (tenant NULL) or a tenant's (plan NULL) rate limit and
-- announces limit_changed when there was one: the body of drop_rate_limit
-- and drop_rate_override.
CREATE FUNCTION flagmeter.delete_rate_limit(plan text, tenant text, meter text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	PERFORM flagmeter.check_meter_exists(meter);
	IF tenant IS NULL THEN
		DELETE FROM flagmeter.rate_limits r
		WHERE r.plan = delete_rate_limit.plan AND r.meter = delete_rate_limit.meter;
	ELSE
		PERFORM flagmeter.check_tenant(tenant);
		DELETE FROM flagmeter.rate_overrides r
		WHERE r.tenant = delete_rate_limit.tenant AND r.meter = delete_rate_limit.meter;
	END IF;
	IF NOT FOUND THEN
		RETURN false;
	END IF;
	PERFORM flagmeter.announce_rate_limit(plan, tenant, meter);
	RETURN true;
END $$;
COMMENT ON FUNCTION flagmeter.delete_rate_limit(text, text, text) IS
'the body of drop_rate_limit (tenant NULL) and drop_rate_override (plan NULL)';

CREATE FUNCTION flagmeter.drop_rate_limit(plan text, meter text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	e_state text; e_message text; e_detail text; e_hint text;	-- the error, raised again
BEGIN
	IF plan IS NULL THEN
		RAISE EXCEPTION 'plan must not be NULL' USING ERRCODE = 'null_value_not_allowed';
	END IF;
	PERFORM flagmeter.check_plan_exists(plan);
	RETURN flagmeter.delete_rate_limit(plan, NULL, meter);
EXCEPTION WHEN OTHERS THEN	-- without the CONTEXT of the helpers (raise_plain)
	GET STACKED DIAGNOSTICS e_state = RETURNED_SQLSTATE, e_message = MESSAGE_TEXT,
	                        e_detail = PG_EXCEPTION_DETAIL, e_hint = PG_EXCEPTION_HINT;
	PERFORM flagmeter.raise_plain(e_state, e_message, e_detail, e_hint);
END $$;
COMMENT ON FUNCTION flagmeter.drop_rate_limit(text, text) IS
'removes the rate limit of a plan for a meter; false when there was none';

CREATE FUNCTION flagmeter.drop_rate_override(tenant text, meter text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	e_state text; e_message text; e_detail text; e_hint text;	-- the error, raised again
BEGIN
	IF tenant IS NULL THEN
		RAISE EXCEPTION 'tenant must not be NULL' USING ERRCODE = 'null_value_not_allowed';
	END IF;
	RETURN flagmeter.delete_rate_limit(NULL, tenant, meter);
EXCEPTION WHEN OTHERS THEN	-- without the CONTEXT of the helpers (raise_plain)
	GET STACKED DIAGNOSTICS e_state = RETURNED_SQLSTATE, e_message = MESSAGE_TEXT,
	                        e_detail = PG_EXCEPTION_DETAIL, e_hint = PG_EXCEPTION_HINT;
	PERFORM flagmeter.raise_plain(e_state, e_message, e_detail, e_hint);
END $$;
COMMENT ON FUNCTION flagmeter.drop_rate_override(text, text) IS
'removes a tenant''s rate override so its plan''s rate limit (or none) applies again; false when there was none';

-- The ad-hoc limiter ------------------------------------------------------------

-- (its answer, the type rate_decision, is in 15_decision.sql)
CREATE FUNCTION flagmeter.limit(key text, rate bigint, per interval, burst bigint DEFAULT NULL,
	cost bigint DEFAULT 1)
RETURNS flagmeter.rate_decision
AS 'MODULE_PATHNAME', 'fm_limit'
LANGUAGE C VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE;
COMMENT ON FUNCTION flagmeter.limit(text, bigint, interval, bigint, bigint) IS
'spends cost units of key''s rate limit (rate units per per, bursts of burst, NULL: rate) when they fit, across every session of the server; cost 0 looks without spending; not transactional: a rollback does not give the units back';

CREATE FUNCTION flagmeter.limit_batch(keys text[], rates bigint[], pers interval[],
	bursts bigint[], costs bigint[])
RETURNS TABLE (item integer, allowed boolean, remaining bigint, retry_after interval,
               reset_after interval)
AS 'MODULE_PATHNAME', 'fm_limit_batch'
LANGUAGE C VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE ROWS 100;
COMMENT ON FUNCTION flagmeter.limit_batch(text[], bigint[], interval[], bigint[], bigint[]) IS
'limit() for many keys in one call, in order, one row per element (item from 1); NULL elements of bursts and costs take limit()''s defaults; every argument is checked before any key is spent';

CREATE FUNCTION flagmeter.rate_limiter(OUT capacity bigint, OUT keys bigint,
	OUT full_refusals bigint)
RETURNS record
AS 'MODULE_PATHNAME', 'fm_rate_limiter_stats'
LANGUAGE C VOLATILE PARALLEL SAFE;
COMMENT ON FUNCTION flagmeter.rate_limiter() IS
'the rate limiters'' table in shared memory: the keys it holds at most (flagmeter.rate_limit_keys), the keys it holds now that are not idle, and the calls that failed since the server started because their part of the table was full of such keys';

CREATE FUNCTION flagmeter.set_test_clock(at timestamptz)
RETURNS void
AS 'MODULE_PATHNAME', 'fm_set_test_clock'
LANGUAGE C VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE;
COMMENT ON FUNCTION flagmeter.set_test_clock(timestamptz) IS
'for tests, superuser only: the time this session''s rate limiters read, instead of the clock (NULL: the clock again)';
-- ---------------------------------------------------------------------------
-- Entitlements: features per plan, per-tenant overrides, and the reads
-- has_feature / feature_config (src/entitlements.c) that an app's own queries and
-- row-level-security policies can call.
--
-- A feature is granted to a tenant by its override when it has one, else by
-- its plan's row for the feature; a feature its plan does not mention (and a
-- tenant with no plan) is not granted.  enabled = false in a plan's row is an
-- explicit denial, which an override can still lift.
--
-- Changes are announced as feature_changed (70_notify.sql): set_feature
-- announces the plan's row, override_feature and drop_feature_override the
-- tenant's override, each only when the row changed; assign_plan and
-- unassign_tenant announce plan_changed, which moves the tenant onto the
-- rows of its new plan.
-- ---------------------------------------------------------------------------

CREATE TABLE flagmeter.features (
	feature		text PRIMARY KEY
		CONSTRAINT features_name_valid CHECK (feature OPERATOR(pg_catalog.~) '^[A-Za-z0-9][A-Za-z0-9_.:-]{0,62}$'),
	description	text,
	created_at	timestamptz NOT NULL DEFAULT pg_catalog.now()
);
COMMENT ON TABLE flagmeter.features IS
'what a plan can grant: a boolean feature, optionally with a configuration value';

CREATE TABLE flagmeter.plan_features (
	plan		text NOT NULL REFERENCES flagmeter.plans ON DELETE CASCADE,
	feature		text NOT NULL REFERENCES flagmeter.features ON DELETE CASCADE,
	enabled		boolean NOT NULL,
	config		jsonb,
	updated_at	timestamptz NOT NULL DEFAULT pg_catalog.now(),
	PRIMARY KEY (plan, feature)
);
COMMENT ON TABLE flagmeter.plan_features IS
'the features a plan grants (enabled) or explicitly denies, each with an optional configuration value';

CREATE TABLE flagmeter.feature_overrides (
	tenant		text NOT NULL REFERENCES flagmeter.tenants ON DELETE CASCADE,
	feature		text NOT NULL REFERENCES flagmeter.features ON DELETE CASCADE,
	enabled		boolean NOT NULL,
	config		jsonb,
	updated_at	timestamptz NOT NULL DEFAULT pg_catalog.now(),
	PRIMARY KEY (tenant, feature)
);
COMMENT ON TABLE flagmeter.feature_overrides IS
'per-tenant grants or denials of a feature that win over the plan''s, with their own configuration value';

CREATE TRIGGER features_changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON flagmeter.features
	FOR EACH STATEMENT EXECUTE FUNCTION flagmeter.config_changed();
CREATE TRIGGER plan_features_changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON flagmeter.plan_features
	FOR EACH STATEMENT EXECUTE FUNCTION flagmeter.config_changed();
CREATE TRIGGER feature_overrides_changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON flagmeter.feature_overrides
	FOR EACH STATEMENT EXECUTE FUNCTION flagmeter.config_changed();

SELECT pg_catalog.pg_extension_config_dump('flagmeter.features', '');
SELECT pg_catalog.pg_extension_config_dump('flagmeter.plan_features', '');
SELECT pg_catalog.pg_extension_config_dump('flagmeter.feature_overrides', '');

CREATE FUNCTION flagmeter.check_feature_exists(feature text)
RETURNS void
LANGUAGE plpgsql STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	IF feature IS NULL THEN
		RAISE EXCEPTION 'feature must not be NULL' USING ERRCODE = 'null_value_not_allowed';
	END IF;
	IF NOT EXISTS (SELECT FROM flagmeter.features f WHERE f.feature = check_feature_exists.feature) THEN
		RAISE EXCEPTION 'feature "%" does not exist', left(feature, 64) USING ERRCODE = 'undefined_object',
			HINT = 'Define it first with flagmeter.define_feature().';
	END IF;
END $$;
COMMENT ON FUNCTION flagmeter.check_feature_exists(text) IS
'raises a clear error unless the feature is defined';

CREATE FUNCTION flagmeter.define_feature(feature text, description text DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	e_state text; e_message text; e_detail text; e_hint text;	-- the error, raised again
BEGIN
	PERFORM flagmeter.check_name('feature', feature);
	INSERT INTO flagmeter.features AS f (feature, description)
	VALUES (define_feature.feature, define_feature.description)
	ON CONFLICT ON CONSTRAINT features_pkey DO UPDATE SET description = EXCLUDED.description;
EXCEPTION WHEN OTHERS THEN	-- without the CONTEXT of the helpers (raise_plain)
	GET STACKED DIAGNOSTICS e_state = RETURNED_SQLSTATE, e_message = MESSAGE_TEXT,
	                        e_detail = PG_EXCEPTION_DETAIL, e_hint = PG_EXCEPTION_HINT;
	PERFORM flagmeter.raise_plain(e_state, e_message, e_detail, e_hint);
END $$;
COMMENT ON FUNCTION flagmeter.define_feature(text, text) IS
'defines a feature, or changes the description of one that exists';

-- set_feature is store_feature then, when the row changed, its
-- announcement, like set_limit: a proxy runs the two apart, store_feature
-- under two-phase commit on every shard and announce_plan_feature after it
-- (a transaction with announcements pending cannot be prepared).
CREATE FUNCTION flagmeter.store_feature(plan text, feature text, enabled boolean DEFAULT true,
	config jsonb DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	PERFORM flagmeter.check_plan_exists(plan);
	PERFORM flagmeter.check_feature_exists(feature);
	IF enabled IS NULL THEN
		RAISE EXCEPTION 'enabled must not be NULL' USING ERRCODE = 'null_value_not_allowed';
	END IF;
	-- a row written again as it was is not news: nothing is updated or announced
	INSERT INTO flagmeter.plan_features AS pf (plan, feature, enabled, config)
	VALUES (store_feature.plan, store_feature.feature, store_feature.enabled, store_feature.config)
	ON CONFLICT ON CONSTRAINT plan_features_pkey DO UPDATE
		SET enabled = EXCLUDED.enabled, config = EXCLUDED.config, updated_at = now()
		WHERE (pf.enabled, pf.config) IS DISTINCT FROM (EXCLUDED.enabled, EXCLUDED.config);
	RETURN FOUND;
END $$;
COMMENT ON FUNCTION flagmeter.store_feature(text, text, boolean, jsonb) IS
'the part of set_feature that announces nothing: validates and stores the plan''s row; true when it changed';

CREATE FUNCTION flagmeter.announce_plan_feature(plan text, feature text)
RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	r flagmeter.plan_features;
BEGIN
	SELECT * INTO r FROM flagmeter.plan_features pf
	WHERE pf.plan = announce_plan_feature.plan AND pf.feature = announce_plan_feature.feature;
	-- no row (any more): announced as gone, enabled NULL
	PERFORM flagmeter.announce_feature(NULL, plan, feature, r.enabled, r.config);
END $$;
COMMENT ON FUNCTION flagmeter.announce_plan_feature(text, text) IS
'announces the plan''s row of the feature as it is now (feature_changed; enabled NULL when there is none): the second half of set_feature on a proxy';

CREATE FUNCTION flagmeter.set_feature(plan text, feature text, enabled boolean DEFAULT true,
	config jsonb DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	e_state text; e_message text; e_detail text; e_hint text;	-- the error, raised again
BEGIN
	IF flagmeter.store_feature(plan, feature, enabled, config) THEN
		PERFORM flagmeter.announce_feature(NULL, plan, feature, enabled, config);
	END IF;
EXCEPTION WHEN OTHERS THEN	-- without the CONTEXT of the helpers (raise_plain)
	GET STACKED DIAGNOSTICS e_state = RETURNED_SQLSTATE, e_message = MESSAGE_TEXT,
	                        e_detail = PG_EXCEPTION_DETAIL, e_hint = PG_EXCEPTION_HINT;
	PERFORM flagmeter.raise_plain(e_state, e_message, e_detail, e_hint);
END $$;
COMMENT ON FUNCTION flagmeter.set_feature(text, text, boolean, jsonb) IS
'a plan grants a feature (enabled) or denies it, with an optional configuration value; replaces the plan''s earlier row, announced (feature_changed) when it changed';

CREATE FUNCTION flagmeter.override_feature(tenant text, feature text, enabled boolean,
	config jsonb DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	e_state text; e_message text; e_detail text; e_hint text;	-- the error, raised again
BEGIN
	PERFORM flagmeter.check_tenant(tenant);
	PERFORM flagmeter.check_feature_exists(feature);
	IF enabled IS NULL THEN
		RAISE EXCEPTION 'enabled must not be NULL' USING ERRCODE = 'null_value_not_allowed';
	END IF;
	IF NOT EXISTS (SELECT FROM flagmeter.tenants t WHERE t.tenant = override_feature.tenant) THEN
		RAISE EXCEPTION 'tenant "%" has no plan', left(tenant, 64) USING ERRCODE = 'undefined_object',
			HINT = 'Assign a plan first with flagmeter.assign_plan().';
	END IF;
	INSERT INTO flagmeter.feature_overrides AS o (tenant, feature, enabled, config)
	VALUES (override_feature.tenant, override_feature.feature, override_feature.enabled,
	        override_feature.config)
	ON CONFLICT ON CONSTRAINT feature_overrides_pkey DO UPDATE
		SET enabled = EXCLUDED.enabled, config = EXCLUDED.config, updated_at = now()
		WHERE (o.enabled, o.config) IS DISTINCT FROM (EXCLUDED.enabled, EXCLUDED.config);
	IF FOUND THEN
		PERFORM flagmeter.announce_feature(tenant, NULL, feature, enabled, config);
	END IF;
EXCEPTION WHEN OTHERS THEN	-- without the CONTEXT of the helpers (raise_plain)
	GET STACKED DIAGNOSTICS e_state = RETURNED_SQLSTATE, e_message = MESSAGE_TEXT,
	                        e_detail = PG_EXCEPTION_DETAIL, e_hint = PG_EXCEPTION_HINT;
	PERFORM flagmeter.raise_plain(e_state, e_message, e_detail, e_hint);
END $$;
COMMENT ON FUNCTION flagmeter.override_feature(text, text, boolean, jsonb) IS
'grants (enabled) or denies a feature to one tenant, winning over its plan''s row; replaces the tenant''s earlier override';

CREATE FUNCTION flagmeter.drop_feature_override(tenant text, feature text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	e_state text; e_message text; e_detail text; e_hint text;	-- the error, raised again
BEGIN
	PERFORM flagmeter.check_tenant(tenant);
	PERFORM flagmeter.check_feature_exists(feature);
	DELETE FROM flagmeter.feature_overrides o
	WHERE o.tenant = drop_feature_override.tenant AND o.feature = drop_feature_override.feature;
	IF NOT FOUND THEN
		RETURN false;
	END IF;
	PERFORM flagmeter.announce_feature(tenant, NULL, feature, NULL);
	RETURN true;
EXCEPTION WHEN OTHERS THEN	-- without the CONTEXT of the helpers (raise_plain)
	GET STACKED DIAGNOSTICS e_state = RETURNED_SQLSTATE, e_message = MESSAGE_TEXT,
	                        e_detail = PG_EXCEPTION_DETAIL, e_hint = PG_EXCEPTION_HINT;
	PERFORM flagmeter.raise_plain(e_state, e_message, e_detail, e_hint);
END $$;
COMMENT ON FUNCTION flagmeter.drop_feature_override(text, text) IS
'removes a tenant''s override of a feature so that its plan decides again; false when there was none';

-- The reads.  STABLE and PARALLEL SAFE: they can stand in a WHERE clause, a
-- join or a row-level-security policy.  Answers are cached per backend and
-- every committed change of the feature tables, tenants or plans empties the
-- caches before the next statement (src/entitlements.c says what each snapshot
-- sees).  An unknown feature is an error, as an unknown meter is.

CREATE FUNCTION flagmeter.has_feature(tenant text, feature text)
RETURNS boolean
AS 'MODULE_PATHNAME', 'fm_has_feature'
LANGUAGE C STABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION flagmeter.has_feature(text, text) IS
'whether the tenant may use the feature: its override, else its plan''s row, else not granted';

CREATE FUNCTION flagmeter.feature_config(tenant text, feature text)
RETURNS jsonb
AS 'MODULE_PATHNAME', 'fm_feature_config'
LANGUAGE C STABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION flagmeter.feature_config(text, text) IS
'the configuration value of the feature for the tenant (from the same row as has_feature), NULL when none or not granted';

-- The same answer as a relation, for every assigned tenant and feature, with
-- where it comes from: the one definition the C reads are tested against.
CREATE VIEW flagmeter.tenant_features AS
SELECT t.tenant, f.feature,
       COALESCE(o.enabled, pf.enabled, false) AS enabled,
       CASE WHEN COALESCE(o.enabled, pf.enabled, false)
            THEN CASE WHEN o.tenant IS NOT NULL THEN o.config ELSE pf.config END END AS config,
       CASE WHEN o.tenant IS NOT NULL THEN 'override'
            WHEN pf.plan IS NOT NULL THEN 'plan'
            ELSE 'none' END AS source,
       t.plan
FROM flagmeter.tenants t
CROSS JOIN flagmeter.features f
LEFT JOIN flagmeter.plan_features pf
       ON pf.plan OPERATOR(pg_catalog.=) t.plan AND pf.feature OPERATOR(pg_catalog.=) f.feature
LEFT JOIN flagmeter.feature_overrides o
       ON o.tenant OPERATOR(pg_catalog.=) t.tenant AND o.feature OPERATOR(pg_catalog.=) f.feature;
COMMENT ON VIEW flagmeter.tenant_features IS
'every assigned tenant and feature: enabled, its configuration value (when enabled), and its source (override, plan, or none: not mentioned)';

-- Privileges (see 80_security.sql for the layout): changing features is
-- configuration; the reads take their rows as the owner of the tables (a
-- direct scan, as check does), so EXECUTE on them is the permission to read
-- any tenant's entitlements: granted to the roles whose queries or policies
-- call them.
REVOKE ALL ON FUNCTION flagmeter.define_feature(text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.set_feature(text, text, boolean, jsonb) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.store_feature(text, text, boolean, jsonb) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.announce_plan_feature(text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.override_feature(text, text, boolean, jsonb) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.drop_feature_override(text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.has_feature(text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.feature_config(text, text) FROM PUBLIC;
-- ---------------------------------------------------------------------------
-- Usage accounting: the tables behind track / consume / check / void / usage.
--
-- Writers never share a row (docs/design.md, "The write path"):
--   events      one row per recorded event, never updated (audit, rollups,
--               recounts); only a refused consume deletes the event it
--               had just inserted, in its own transaction;
--   counters    per tenant, meter and period, a few quota_counter rows:
--               stripe 0 is the row consume locks and updates, the others
--               take track's increments, each in a stripe no other
--               transaction holds (src/stripes.c), so
--               concurrent trackers of one tenant do not queue behind each
--               other.  The period's usage is the merge of its rows:
--               O(stripes), not O(events);
--   event_keys  idempotency keys and the decisions given for them.
-- ---------------------------------------------------------------------------

-- Raw events, partitioned by the day they were recorded (UTC) so that
-- retention drops whole partitions; maintain() creates the partitions ahead
-- of time, and the default partition catches rows when it has not run.
-- xid is the recording transaction's id: maintain() folds events into the
-- rollups in bands of xid below the snapshot xmin (all such transactions
-- have ended), which no commit order can break.  It is the xid8 as a
-- bigint (flagmeter.xid_int) because that type has a BRIN operator class
-- and xid8 has none: see index_event_partition.
-- A transaction id as stored in flagmeter.events.xid.  FullTransactionIds
-- stay far below 2^63 (the epoch would have to pass 2^31); the largest xid8
-- maps to the largest bigint so that "up to the end" bounds keep working.
-- In C: it is the default of every event row, and a SQL function there is
-- run through the SQL-function executor, not inlined.
CREATE FUNCTION flagmeter.xid_int(x xid8) RETURNS bigint
AS 'MODULE_PATHNAME', 'fm_xid_int'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION flagmeter.xid_int(xid8) IS
'a transaction id as the bigint flagmeter.events.xid stores';

CREATE TABLE flagmeter.events (
	tenant			text NOT NULL,
	meter			text NOT NULL,
	amount			bigint NOT NULL,
	occurred_at		timestamptz NOT NULL,
	recorded_at		timestamptz NOT NULL,
	idempotency_key	text,
	xid				bigint NOT NULL DEFAULT flagmeter.xid_int(pg_catalog.pg_current_xact_id()),
	-- the period the amount is pending in (src/pending*.c), NULL when a
	-- counter row took it as the event was written
	period_start	timestamptz
) PARTITION BY RANGE (recorded_at);
CREATE TABLE flagmeter.events_default PARTITION OF flagmeter.events DEFAULT;

-- Each partition is indexed on its own, not through the partitioned table:
-- partitions are created at run time and dumped as ordinary tables with
-- their indexes, which an index of the (extension-owned) parent would
-- duplicate on restore.
--
-- xid gets a BRIN index, not a btree: rows are appended in roughly
-- increasing xid order, so a summary per 128 pages finds the band maintain()
-- folds (the pages written since the last run) as well as a btree would,
-- at a fraction of the cost per insert: a btree on xid was one of the three
-- index insertions every track paid for.  autosummarize keeps the summary
-- current without waiting for a VACUUM; pages not yet summarized are always
-- read, which is where the unfolded rows are anyway.
CREATE FUNCTION flagmeter.index_event_partition(partition regclass)
RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	name text := (SELECT c.relname FROM pg_class c WHERE c.oid = partition);
BEGIN
	EXECUTE format('CREATE INDEX %I ON %s (tenant, meter, occurred_at)', name || '_tenant_meter_time', partition);
	EXECUTE format('CREATE INDEX %I ON %s USING brin (xid) WITH (autosummarize = on)',
				   name || '_xid', partition);
END $$;
COMMENT ON FUNCTION flagmeter.index_event_partition(regclass) IS
'creates the indexes of a partition of flagmeter.events: btree (tenant, meter, occurred_at) and brin (xid)';

SELECT flagmeter.index_event_partition('flagmeter.events_default');
COMMENT ON TABLE flagmeter.events IS
'every recorded event, never updated (voids are logged in voids; a refused consume deletes the event it inserted), partitioned by recorded_at day';
COMMENT ON COLUMN flagmeter.events.period_start IS
'not NULL: the event was written alone, its amount pending in shared memory in this period; in no counter row while xid is at or above maintenance_state.counted_through';
COMMENT ON TABLE flagmeter.events_default IS
'events recorded on a day that has no partition yet (maintain() creates them ahead)';

-- Voids, logged so that maintain() takes them out of the rollups too.
CREATE TABLE flagmeter.voids (
	tenant			text NOT NULL,
	meter			text NOT NULL,
	amount			bigint NOT NULL,
	occurred_at		timestamptz NOT NULL,
	idempotency_key	text NOT NULL,
	voided_at		timestamptz NOT NULL,
	xid				xid8 NOT NULL DEFAULT pg_catalog.pg_current_xact_id()
);
CREATE INDEX voids_xid ON flagmeter.voids (xid);
COMMENT ON TABLE flagmeter.voids IS
'voided events, folded out of the rollups by maintain() like events are folded in';

CREATE TABLE flagmeter.counters (
	tenant			text NOT NULL,
	meter			text NOT NULL,
	period_start	timestamptz NOT NULL,
	stripe			smallint NOT NULL,
	counter			flagmeter.quota_counter NOT NULL,
	-- track's stripes only: when this row's own usage reaches recheck_at,
	-- track reads the whole period again to see whether a threshold, the
	-- quota or the bigint range is reached; recheck_for fingerprints the
	-- limit that figure was worked out for (a changed limit: read again).
	-- NULL: read on the next track.  See src/track_alerts.c.
	recheck_at		bigint,
	recheck_for		integer,
	PRIMARY KEY (tenant, meter, period_start, stripe)
) WITH (fillfactor = 50);	-- room for HOT updates of the same row
COMMENT ON TABLE flagmeter.counters IS
'usage per tenant, meter and period, in stripes merged on read; stripe 0 is consume''s, the others track''s; recheck_at/recheck_for say when track must next read the whole period';

-- The rows maintain() may still merge: track stripes and merged stripes
-- (stripe > 0).  compact_counters() turns an ended period's rows into its
-- stripe 0 alone, so this index holds the open periods' rows and those of
-- periods ended since the last run, not the history: maintain() finds its
-- work here in time proportional to the open periods, where a scan of the
-- whole table grew with every period ever counted.  Track writes a stripe
-- in place (a HOT update: no indexed column changes), so only a new stripe
-- adds an entry.
CREATE INDEX counters_track_stripes ON flagmeter.counters (tenant, meter, period_start)
	WHERE stripe OPERATOR(pg_catalog.>) 0;

CREATE TABLE flagmeter.event_keys (
	tenant			text NOT NULL,
	idempotency_key	text NOT NULL,
	seq				smallint NOT NULL,
	meter			text NOT NULL,
	amount			bigint NOT NULL,
	occurred_at		timestamptz NOT NULL,
	period_start	timestamptz NOT NULL,
	recorded_at		timestamptz NOT NULL,
	kind			text NOT NULL
		CONSTRAINT event_keys_kind_valid
		CHECK (kind OPERATOR(pg_catalog.=) ANY (ARRAY['track', 'consume', 'track_pool', 'consume_pool'])),
	granted			boolean NOT NULL,
	used			bigint,
	quota			bigint,
	remaining		bigint,
	resets_at		timestamptz,
	overage			bigint,
	reason			text,
	voided_at		timestamptz,
	from_grants		bigint,
	balance			bigint,
	PRIMARY KEY (tenant, idempotency_key, seq)
);
COMMENT ON TABLE flagmeter.event_keys IS
'idempotency keys: what each key recorded (one row per meter, seq in call order; kind track_pool or consume_pool for the credit pool a named meter draws from) and the decision returned for it; voided_at marks voided events';

SELECT pg_catalog.pg_extension_config_dump('flagmeter.events_default', '');
SELECT pg_catalog.pg_extension_config_dump('flagmeter.voids', '');
SELECT pg_catalog.pg_extension_config_dump('flagmeter.counters', '');
SELECT pg_catalog.pg_extension_config_dump('flagmeter.event_keys', '');

-- The calls ------------------------------------------------------------------------

CREATE FUNCTION flagmeter.track(tenant text, meter text, amount bigint DEFAULT 1,
	occurred_at timestamptz DEFAULT now(), idempotency_key text DEFAULT NULL)
RETURNS boolean
AS 'MODULE_PATHNAME', 'fm_track'
LANGUAGE C VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE;
COMMENT ON FUNCTION flagmeter.track(text, text, bigint, timestamptz, text) IS
'records usage (amount >= 0) in the period containing occurred_at; false when the idempotency key was already recorded; never blocks on other writers of the tenant';

-- track with an untyped (or text) fourth argument: read as timestamptz input
-- reads it, and when it is not a time (a key passed there by mistake), the
-- error's hint says to pass the key by name.
CREATE FUNCTION flagmeter.track(tenant text, meter text, amount bigint, occurred_at text,
	idempotency_key text DEFAULT NULL)
RETURNS boolean
AS 'MODULE_PATHNAME', 'fm_track_text'
LANGUAGE C VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE;
COMMENT ON FUNCTION flagmeter.track(text, text, bigint, text, text) IS
'track with occurred_at given as text or an untyped literal: the same call; an occurred_at that is not a time gets a hint to pass the idempotency key by name';

CREATE FUNCTION flagmeter.track_batch(tenants text[], meters text[], amounts bigint[],
	occurred_at timestamptz[] DEFAULT NULL, idempotency_keys text[] DEFAULT NULL)
RETURNS bigint
AS 'MODULE_PATHNAME', 'fm_track_batch'
LANGUAGE C VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE;
COMMENT ON FUNCTION flagmeter.track_batch(text[], text[], bigint[], timestamptz[], text[]) IS
'records many events at once (arrays of equal length; occurred_at NULL means now(), a NULL key means none); returns how many were counted (duplicates of already recorded keys are skipped); all or nothing on error';

CREATE FUNCTION flagmeter.consume(tenant text, meter text, amount bigint DEFAULT 1,
	idempotency_key text DEFAULT NULL)
RETURNS flagmeter.decision
AS 'MODULE_PATHNAME', 'fm_consume'
LANGUAGE C VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE;
COMMENT ON FUNCTION flagmeter.consume(text, text, bigint, text) IS
'atomically checks the limit and records amount (> 0) if granted; never grants past a hard limit; a retried idempotency key returns the original decision';

-- consume with an untyped (or text) amount: an untyped NULL or parameter
-- there matches the one-meter and the multi-meter consume alike, which
-- PostgreSQL cannot choose between ("function is not unique"); this
-- overload takes it, so a NULL amount is 22004 as documented.
CREATE FUNCTION flagmeter.consume(tenant text, meter text, amount text,
	idempotency_key text DEFAULT NULL)
RETURNS flagmeter.decision
AS 'MODULE_PATHNAME', 'fm_consume_text'
LANGUAGE C VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE;
COMMENT ON FUNCTION flagmeter.consume(text, text, text, text) IS
'consume with the amount given as text or untyped (a NULL literal, a driver''s untyped parameter): the same call; read as bigint input reads it';

CREATE FUNCTION flagmeter.consume(tenant text, meters text[], amounts bigint[],
	idempotency_key text DEFAULT NULL)
RETURNS SETOF flagmeter.decision
AS 'MODULE_PATHNAME', 'fm_consume_multi'
LANGUAGE C VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE ROWS 2;
COMMENT ON FUNCTION flagmeter.consume(text, text[], bigint[], text) IS
'all-or-nothing consume across several meters: one decision per meter in argument order, all granted or none recorded';

CREATE FUNCTION flagmeter.check(tenant text, meter text, amount bigint DEFAULT 1)
RETURNS flagmeter.decision
AS 'MODULE_PATHNAME', 'fm_check'
LANGUAGE C STABLE CALLED ON NULL INPUT PARALLEL SAFE;
COMMENT ON FUNCTION flagmeter.check(text, text, bigint) IS
'the decision consume would give for amount (>= 0) now, without recording anything';

CREATE FUNCTION flagmeter.usage(tenant text, meter text, at timestamptz DEFAULT now())
RETURNS flagmeter.quota_counter
AS 'MODULE_PATHNAME', 'fm_usage'
LANGUAGE C STABLE CALLED ON NULL INPUT PARALLEL SAFE;
COMMENT ON FUNCTION flagmeter.usage(text, text, timestamptz) IS
'the quota_counter of the period containing at, carrying the limit in force; exact (sees all committed events and the caller''s own)';

CREATE FUNCTION flagmeter.void(tenant text, idempotency_key text)
RETURNS boolean
AS 'MODULE_PATHNAME', 'fm_void'
LANGUAGE C VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE;
COMMENT ON FUNCTION flagmeter.void(text, text) IS
'cancels the event(s) recorded under an idempotency key: usage goes down by their amount; false when already voided or when the key''s consume was denied; an unknown key is an error';

-- Recount after the boundaries of the current period moved --------------------

-- Pending usage (src/pending*.c) outside shared memory: events written alone
-- that no counter row holds yet.
CREATE FUNCTION flagmeter.has_pending_events(tenant text, meter text)
RETURNS boolean
AS 'MODULE_PATHNAME', 'fm_has_pending_events'
LANGUAGE C STABLE PARALLEL SAFE;
COMMENT ON FUNCTION flagmeter.has_pending_events(text, text) IS
'whether a tenant''s (NULL: any) usage of a meter (NULL: any) has events written alone that no counter row holds yet';

CREATE FUNCTION flagmeter.counted_through()
RETURNS xid8
AS 'MODULE_PATHNAME', 'fm_counted_through'
LANGUAGE C STABLE PARALLEL SAFE;
COMMENT ON FUNCTION flagmeter.counted_through() IS
'maintenance_state.counted_through (read as the owner): pending events of transactions below it are in the counter rows';

CREATE FUNCTION flagmeter.pending_drop(tenant text, meter text, period_start timestamptz)
RETURNS void
AS 'MODULE_PATHNAME', 'fm_pending_drop'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION flagmeter.pending_drop(text, text, timestamptz) IS
'the pending usage in shared memory of a tenant, meter and period (NULL: all) is gone for whoever sees this transaction committed (delete_usage, which holds SHARE ROW EXCLUSIVE on flagmeter.counters)';

-- Called by the catalog functions when a change of period kind, anchor or
-- time zone moves the boundaries of the current period of (tenant, meter):
-- its counter is rebuilt from the raw events.  The SHARE ROW EXCLUSIVE lock
-- waits for in-flight track/consume calls (they hold ROW EXCLUSIVE on
-- counters from before they read the configuration) and holds new ones
-- until the change commits, so no event is counted under the old
-- boundaries after the recount.
CREATE FUNCTION flagmeter.recount_current_period(tenant text, meter text)
RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	cfg record;
	b record;
BEGIN
	-- No usage yet (the common case: a tenant assigned at signup): nothing
	-- to recount, and no reason to pause anyone's ingest.  A track of this
	-- tenant in flight right now counts in the period its occurred_at had
	-- under the old boundaries.
	IF NOT EXISTS (SELECT FROM flagmeter.counters c
	               WHERE c.tenant = recount_current_period.tenant
	                 AND c.meter = recount_current_period.meter)
	   AND NOT flagmeter.has_pending_events(tenant, meter) THEN
		RETURN;
	END IF;
	LOCK TABLE flagmeter.counters IN SHARE ROW EXCLUSIVE MODE;
	SELECT * INTO cfg FROM flagmeter.limit_config(tenant, meter);
	IF NOT FOUND THEN
		RETURN;
	END IF;
	SELECT * INTO b FROM flagmeter.period_bounds(now(), cfg.period, cfg.anchor, cfg.timezone);

	DELETE FROM flagmeter.counters c
	WHERE c.tenant = recount_current_period.tenant AND c.meter = recount_current_period.meter
	  AND c.period_start = b.period_start;
	IF cfg.aggregation = 'unique' THEN
		-- its events include values forgotten since (voided without a key)
		PERFORM flagmeter.recount_unique_values(tenant, meter, b.period_start, b.period_end);
		RETURN;
	END IF;

	INSERT INTO flagmeter.counters (tenant, meter, period_start, stripe, counter)
	SELECT recount_current_period.tenant, recount_current_period.meter, b.period_start, 0,
	       flagmeter.quota_counter_agg(e.amount, e.occurred_at)
	FROM flagmeter.events e
	WHERE e.tenant = recount_current_period.tenant AND e.meter = recount_current_period.meter
	  AND e.occurred_at >= b.period_start AND e.occurred_at < b.period_end
	  -- the period's usage still pending (src/pending*.c) stays pending
	  AND NOT (e.period_start IS NOT NULL AND e.period_start = b.period_start
	           AND e.xid >= flagmeter.xid_int(flagmeter.counted_through()))
	  AND NOT EXISTS (SELECT FROM flagmeter.event_keys k
	                  WHERE k.tenant = e.tenant AND k.idempotency_key = e.idempotency_key
	                    AND k.meter = e.meter AND k.voided_at IS NOT NULL)
	HAVING count(*) > 0;
END $$;
COMMENT ON FUNCTION flagmeter.recount_current_period(text, text) IS
'rebuilds the counter of the current period of a tenant and meter from the raw events (after its boundaries moved); pauses ingest briefly';
-- ---------------------------------------------------------------------------
-- Distinct counts: meters of aggregation 'unique' (monthly active users,
-- seats, distinct API keys), whose usage in a period is the number of
-- distinct values recorded in it (src/unique_values.c).
--
--   unique_values    each period's set of values, one row per value, as
--                    the first 128 bits of its SHA-256: the primary key
--                    decides "new in this period?", so concurrent writers
--                    of one new value count it once.  A new value is one
--                    event of amount 1 (the counters hold the count: check
--                    never counts rows); a forgotten one takes it back.
--   value_sightings  which values were seen on which UTC day (and in which
--                    period), for usage_series: a day's, week's or
--                    month's distinct count is a count of distinct hashes
--                    over its days.
--
-- Both are kept as long as the events are (the retention): a set until
-- its period has ended that long ago, a sighting until its day has.  A
-- lifetime period's set stays.  docs/design.md, "Distinct counts".
-- ---------------------------------------------------------------------------

CREATE TABLE flagmeter.unique_values (
	tenant			text NOT NULL,
	meter			text NOT NULL,
	period_start	timestamptz NOT NULL,
	value_hash		uuid NOT NULL,
	-- the time of the event of amount 1 that counted the value (forget_value
	-- takes it back from the period and the rollup bucket of that time)
	counted_at		timestamptz NOT NULL,
	period_end		timestamptz NOT NULL,
	PRIMARY KEY (tenant, meter, period_start, value_hash)
);
-- retention deletes by period_end; rows arrive roughly in period order
CREATE INDEX unique_values_period_end ON flagmeter.unique_values USING brin (period_end)
	WITH (autosummarize = on);
COMMENT ON TABLE flagmeter.unique_values IS
'the distinct values of each period of a unique meter, by tenant: one row per value (the first 128 bits of its SHA-256), the count itself kept in the counters';

CREATE TABLE flagmeter.value_sightings (
	tenant			text NOT NULL,
	meter			text NOT NULL,
	day				date NOT NULL,
	period_start	timestamptz NOT NULL,
	value_hash		uuid NOT NULL,
	PRIMARY KEY (tenant, meter, day, period_start, value_hash)
);
CREATE INDEX value_sightings_day ON flagmeter.value_sightings USING brin (day)
	WITH (autosummarize = on);
COMMENT ON TABLE flagmeter.value_sightings IS
'which values of a unique meter were seen on which UTC day (and in which period): what usage_series counts distinct values per day, week or month from';

SELECT pg_catalog.pg_extension_config_dump('flagmeter.unique_values', '');
SELECT pg_catalog.pg_extension_config_dump('flagmeter.value_sightings', '');

CREATE FUNCTION flagmeter.track_value(tenant text, meter text, value text,
	occurred_at timestamptz DEFAULT now())
RETURNS boolean
AS 'MODULE_PATHNAME', 'fm_track_value'
LANGUAGE C VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE;
COMMENT ON FUNCTION flagmeter.track_value(text, text, text, timestamptz) IS
'records that value (1 to 1024 bytes) was seen at occurred_at on a unique meter: true when it was new in its period (usage up by one), false when counted already; never refused by the limit';

CREATE FUNCTION flagmeter.consume_value(tenant text, meter text, value text)
RETURNS flagmeter.decision
AS 'MODULE_PATHNAME', 'fm_consume_value'
LANGUAGE C VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE;
COMMENT ON FUNCTION flagmeter.consume_value(text, text, text) IS
'granted when value is counted in the current period already, or when one more value fits the limit and the rate limit (then it is counted); refused at a hard limit (quota_exceeded), recording nothing';

CREATE FUNCTION flagmeter.forget_value(tenant text, meter text, value text)
RETURNS boolean
AS 'MODULE_PATHNAME', 'fm_forget_value'
LANGUAGE C VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE;
COMMENT ON FUNCTION flagmeter.forget_value(text, text, text) IS
'frees value in the current period of a unique meter (a seat given up): true when it was counted there and the usage went down by one; earlier periods keep their counts';

-- A unique meter's current period after its boundaries moved (a plan,
-- period, anchor or time zone change; recount_current_period): the values
-- counted within the new bounds move from the sets of the periods they
-- were counted in (periods of the configuration before) into its set, once
-- each, and its counter is their number.  Moved, not copied: a value
-- forgotten since it was counted must not come back from an older set when
-- the configuration changes back.  A value seen in the new bounds but first
-- counted before them is counted again when it is next seen.
CREATE FUNCTION flagmeter.recount_unique_values(tenant text, meter text,
	period_start timestamptz, period_end timestamptz)
RETURNS void
LANGUAGE sql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
WITH moved AS (
	DELETE FROM flagmeter.unique_values v
	WHERE v.tenant OPERATOR(pg_catalog.=) $1 AND v.meter OPERATOR(pg_catalog.=) $2
	  AND v.period_start OPERATOR(pg_catalog.<>) $3
	  AND v.counted_at OPERATOR(pg_catalog.>=) $3 AND v.counted_at OPERATOR(pg_catalog.<) $4
	RETURNING v.value_hash, v.counted_at
)
INSERT INTO flagmeter.unique_values AS u (tenant, meter, period_start, value_hash, counted_at, period_end)
SELECT DISTINCT ON (m.value_hash) $1, $2, $3, m.value_hash, m.counted_at, $4
FROM moved m
ORDER BY m.value_hash, m.counted_at
ON CONFLICT DO NOTHING;

-- the set's own rows, from when the period had other bounds
UPDATE flagmeter.unique_values v SET period_end = $4
WHERE v.tenant OPERATOR(pg_catalog.=) $1 AND v.meter OPERATOR(pg_catalog.=) $2
  AND v.period_start OPERATOR(pg_catalog.=) $3 AND v.period_end OPERATOR(pg_catalog.<>) $4;

INSERT INTO flagmeter.counters (tenant, meter, period_start, stripe, counter)
SELECT $1, $2, $3, 0, flagmeter.quota_counter_agg(1, v.counted_at)
FROM flagmeter.unique_values v
WHERE v.tenant OPERATOR(pg_catalog.=) $1 AND v.meter OPERATOR(pg_catalog.=) $2
  AND v.period_start OPERATOR(pg_catalog.=) $3
HAVING count(*) OPERATOR(pg_catalog.>) 0;
$$;
COMMENT ON FUNCTION flagmeter.recount_unique_values(text, text, timestamptz, timestamptz) IS
'rebuilds the set and the counter of a unique meter''s period [period_start, period_end) from the values counted within it, moved from the sets they were in (recount_current_period, after the counters of that period were deleted)';

-- usage_series of a unique meter (series()): distinct values per day, week
-- or month bucket in UTC, counted from the sightings.  Finer buckets and
-- other time zones would need sightings per hour; a day is what the table
-- keeps, so they are refused rather than answered wrong.
CREATE FUNCTION flagmeter.unique_series(tenant text, meter text, first_bucket timestamptz,
	"to" timestamptz, bucket text, timezone text)
RETURNS TABLE (bucket_start timestamptz, used bigint, counter flagmeter.quota_counter)
LANGUAGE plpgsql STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	IF bucket NOT IN ('day', 'week', 'month') OR timezone <> 'UTC' THEN
		RAISE EXCEPTION 'usage of unique meter "%" is counted in day, week and month buckets in UTC', meter
			USING ERRCODE = 'feature_not_supported',
			      DETAIL = 'A unique meter keeps which values were seen on which UTC day.',
			      HINT = 'Ask for bucket => ''day'' (or week, month) and timezone => ''UTC''.';
	END IF;
	IF first_bucket < now() - (SELECT s.retention FROM flagmeter.current_settings s) THEN
		RAISE EXCEPTION 'the distinct values of a unique meter reach back only as far as the retention'
			USING ERRCODE = 'invalid_parameter_value',
			      DETAIL = 'Which values were seen on a day is kept for the retention (flagmeter.current_settings).',
			      HINT = 'Start the series later, or read a past period''s count with flagmeter.usage(tenant, meter, at).';
	END IF;
	RETURN QUERY
	WITH buckets AS (
		SELECT s.b FROM generate_series(first_bucket, "to" - interval '1 microsecond',
		                                ('1 ' || bucket)::interval) AS s(b)
	), counted AS (
		-- each value once per bucket (once per tenant and bucket over all
		-- tenants), as an event of amount 1 on the last day it was seen
		SELECT d.b, count(*) AS n, flagmeter.quota_counter_agg(1, d.seen) AS counter
		FROM (SELECT date_trunc(bucket, v.day::timestamp) AT TIME ZONE 'UTC' AS b,
		             max(v.day)::timestamp AT TIME ZONE 'UTC' AS seen
		      FROM flagmeter.value_sightings v
		      WHERE (unique_series.tenant IS NULL OR v.tenant = unique_series.tenant)
		        AND v.meter = unique_series.meter
		        AND v.day >= (first_bucket AT TIME ZONE 'UTC')::date
		        AND v.day <= (("to" - interval '1 microsecond') AT TIME ZONE 'UTC')::date
		      GROUP BY 1, v.tenant, v.value_hash) d
		GROUP BY d.b
	)
	SELECT k.b, COALESCE(c.n, 0), COALESCE(c.counter, 'used=0 events=0 max=0'::flagmeter.quota_counter)
	FROM buckets k LEFT JOIN counted c ON c.b = k.b
	ORDER BY k.b;
END $$;
COMMENT ON FUNCTION flagmeter.unique_series(text, text, timestamptz, timestamptz, text, text) IS
'distinct values of a unique meter per day, week or month bucket in UTC, of a tenant (NULL: all tenants, a value counted once per tenant): the body of usage_series for unique meters';
-- ---------------------------------------------------------------------------
-- Batched calls with per-event answers: what a client that groups
-- concurrent requests into one transaction calls (clients/node).  Each
-- shares its code with the single call it batches (src/track_batch.c,
-- src/consume_batch.c), so an event or an item is decided exactly as the
-- single call would decide it.  Like those calls they run their statements
-- as the owner of schema flagmeter, so EXECUTE is taken back from PUBLIC
-- here, next to them (see 80_security.sql for why).
-- ---------------------------------------------------------------------------

CREATE FUNCTION flagmeter.track_events(tenants text[], meters text[], amounts bigint[],
	occurred_at timestamptz[] DEFAULT NULL, idempotency_keys text[] DEFAULT NULL)
RETURNS boolean[]
AS 'MODULE_PATHNAME', 'fm_track_events'
LANGUAGE C VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE;
COMMENT ON FUNCTION flagmeter.track_events(text[], text[], bigint[], timestamptz[], text[]) IS
'track_batch with one answer per event: element i is true when event i was counted, false when its idempotency key was recorded before (or earlier in the call); all or nothing on error';

CREATE FUNCTION flagmeter.consume_batch(tenants text[], meters text[], amounts bigint[],
	idempotency_keys text[] DEFAULT NULL, items integer[] DEFAULT NULL)
RETURNS TABLE (item integer, granted boolean, used bigint, quota bigint, remaining bigint,
	resets_at timestamptz, overage bigint, meter text, reason text, from_grants bigint,
	balance bigint, retry_after interval)
AS 'MODULE_PATHNAME', 'fm_consume_batch'
LANGUAGE C VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE ROWS 16;
COMMENT ON FUNCTION flagmeter.consume_batch(text[], text[], bigint[], text[], integer[]) IS
'many independent consumes in one call, decided in order, each exactly as consume: row i is (tenants[i], meters[i], amounts[i], idempotency_keys[i]); adjacent rows with the same items[i] form one all-or-nothing item (NULL items: every row is an item, numbered from 1); one decision per row, in argument order, with its item';

REVOKE ALL ON FUNCTION flagmeter.track_events(text[], text[], bigint[], timestamptz[], text[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.consume_batch(text[], text[], bigint[], text[], integer[]) FROM PUBLIC;
-- ---------------------------------------------------------------------------
-- Credit grants: units a tenant may use on top of a meter's period quota (a
-- top-up, a promotion, a prepaid balance).
--
-- consume and track draw the period quota first, then the grants active at
-- their transaction's start (started, not expired, not voided, not
-- exhausted): lowest priority number first, then soonest expiry (grants
-- that never expire last), then oldest.  A hard-limit consume is granted
-- only when quota plus grants cover it, all or nothing; a soft limit draws
-- what the grants hold and reports the rest as overage; track is never
-- refused and draws what the grants hold.  A tenant with no limit on the
-- meter that has been granted credits on it is limited by its grants
-- alone: a hard quota of zero per period (the meter's month when no limit
-- says otherwise), so a prepaid balance is a tenant without a limit and
-- with grants.  The C side is src/grants.c.
--
--   credit_accounts  the (tenant, meter) pairs ever granted credits or
--                    given a reservation: their calls look at grants and
--                    holds (cached with the limits)
--   credit_grants    one row per grant: amount, what was drawn, its order
--   reservations     amounts held against quota and grants until settled,
--                    released or expired (reserve, settle, release)
-- ---------------------------------------------------------------------------

CREATE TABLE flagmeter.credit_accounts (
	tenant		text NOT NULL,
	meter		text NOT NULL REFERENCES flagmeter.meters ON DELETE CASCADE,
	created_at	timestamptz NOT NULL DEFAULT pg_catalog.now(),
	grants		boolean NOT NULL DEFAULT true,
	reservations	boolean NOT NULL DEFAULT false,
	PRIMARY KEY (tenant, meter)
);
COMMENT ON TABLE flagmeter.credit_accounts IS
'the tenants and meters that have been granted credits (grants) or made a reservation (reservations): their consumes, tracks and checks look at their grants and holds; one without a limit on the meter but with grants is limited by its grants alone';

-- A new pair changes what the calls do for it: the limits' caches are
-- emptied as for any catalog change (grant_credits inserts only new pairs).
CREATE TRIGGER credit_accounts_changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE
	ON flagmeter.credit_accounts
	FOR EACH STATEMENT EXECUTE FUNCTION flagmeter.config_changed();

CREATE SEQUENCE flagmeter.credit_grant_id;
COMMENT ON SEQUENCE flagmeter.credit_grant_id IS 'ids of credit grants, in the order they were made';

CREATE TABLE flagmeter.credit_grants (
	grant_id		bigint PRIMARY KEY DEFAULT pg_catalog.nextval('flagmeter.credit_grant_id'),
	tenant			text NOT NULL,
	meter			text NOT NULL,
	amount			bigint NOT NULL CONSTRAINT credit_grants_amount_positive
		CHECK (amount OPERATOR(pg_catalog.>) 0),
	-- never more than the amount, whatever the concurrency (src/grants.c
	-- locks the rows it draws from; this holds the line too)
	drawn			bigint NOT NULL DEFAULT 0 CONSTRAINT credit_grants_drawn_valid
		CHECK (drawn OPERATOR(pg_catalog.>=) 0 AND drawn OPERATOR(pg_catalog.<=) amount),
	priority		integer NOT NULL,
	starts_at		timestamptz NOT NULL,
	expires_at		timestamptz,
	created_at		timestamptz NOT NULL DEFAULT pg_catalog.now(),
	voided_at		timestamptz,
	idempotency_key	text,
	-- grant_low is announced when remaining falls under this share of amount
	low_balance_percent	integer CONSTRAINT credit_grants_low_balance_valid
		CHECK (low_balance_percent OPERATOR(pg_catalog.>=) 1 AND low_balance_percent OPERATOR(pg_catalog.<=) 99),
	CONSTRAINT credit_grants_expiry_valid
		CHECK (expires_at IS NULL OR expires_at OPERATOR(pg_catalog.>) starts_at),
	CONSTRAINT credit_grants_key UNIQUE (tenant, idempotency_key),
	FOREIGN KEY (tenant, meter) REFERENCES flagmeter.credit_accounts ON DELETE CASCADE
) WITH (fillfactor = 80);
COMMENT ON TABLE flagmeter.credit_grants IS
'credit grants: amount units of a meter for a tenant, usable from starts_at until expires_at (NULL: never expires) once the period quota is used up; drawn so far; drawn in order of priority (lowest first), expiry (soonest first), id; voided_at stops a grant';

-- the grants a call may draw from, by (tenant, meter).  drawn is in no
-- index, not even a predicate, and pages keep room (fillfactor), so that a
-- draw is a HOT update: it writes no index entry.
CREATE INDEX credit_grants_drawable ON flagmeter.credit_grants (tenant, meter)
	WHERE voided_at IS NULL;

SELECT pg_catalog.pg_extension_config_dump('flagmeter.credit_accounts', '');
SELECT pg_catalog.pg_extension_config_dump('flagmeter.credit_grants', '');
SELECT pg_catalog.pg_extension_config_dump('flagmeter.credit_grant_id', '');

-- A meter that draws from a credit pool has no grants or holds of its own:
-- its balance is its pool's, so credits go to the pool.
CREATE FUNCTION flagmeter.check_not_drawing(meter text)
RETURNS void
LANGUAGE plpgsql STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	pool text;
BEGIN
	SELECT m.draws INTO pool FROM flagmeter.meters m WHERE m.meter = check_not_drawing.meter;
	IF pool IS NOT NULL THEN
		RAISE EXCEPTION 'meter "%" draws from the credit pool "%"', meter, pool
			USING ERRCODE = 'feature_not_supported',
			      HINT = format('Grant credits on "%s": every unit of "%s" uses its pool''s.', pool, meter);
	END IF;
END $$;
COMMENT ON FUNCTION flagmeter.check_not_drawing(text) IS
'raises a clear error when meter draws from a credit pool (its grants are the pool''s)';

CREATE FUNCTION flagmeter.grant_credits(tenant text, meter text, amount bigint,
	expires_at timestamptz DEFAULT NULL, priority integer DEFAULT 0,
	starts_at timestamptz DEFAULT pg_catalog.now(), idempotency_key text DEFAULT NULL,
	low_balance_percent integer DEFAULT 10)
RETURNS bigint
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	e_state text; e_message text; e_detail text; e_hint text;	-- the error, raised again
	aggregation text;
	id bigint;
	g record;
	b record;
BEGIN
	PERFORM flagmeter.check_tenant(tenant);
	PERFORM flagmeter.check_meter_exists(meter);
	IF amount IS NULL THEN
		RAISE EXCEPTION 'amount must not be NULL' USING ERRCODE = 'null_value_not_allowed';
	END IF;
	IF amount <= 0 THEN
		RAISE EXCEPTION 'amount must be positive, not %', amount USING ERRCODE = 'invalid_parameter_value';
	END IF;
	IF priority IS NULL THEN
		RAISE EXCEPTION 'priority must not be NULL' USING ERRCODE = 'null_value_not_allowed';
	END IF;
	IF starts_at IS NULL THEN
		RAISE EXCEPTION 'starts_at must not be NULL' USING ERRCODE = 'null_value_not_allowed',
			HINT = 'Leave it out to start the grant now.';
	END IF;
	IF expires_at IS NOT NULL AND expires_at <= starts_at THEN
		RAISE EXCEPTION 'expires_at must be later than starts_at' USING ERRCODE = 'invalid_parameter_value';
	END IF;
	IF idempotency_key IS NOT NULL AND (length(idempotency_key) < 1 OR octet_length(idempotency_key) > 256) THEN
		RAISE EXCEPTION 'idempotency_key must be 1 to 256 bytes' USING ERRCODE = 'invalid_parameter_value';
	END IF;
	SELECT m.aggregation INTO aggregation FROM flagmeter.meters m WHERE m.meter = grant_credits.meter;
	IF low_balance_percent IS NOT NULL AND (low_balance_percent < 1 OR low_balance_percent > 99) THEN
		RAISE EXCEPTION 'low_balance_percent must be 1 to 99, not %', low_balance_percent
			USING ERRCODE = 'invalid_parameter_value', HINT = 'NULL announces no grant_low.';
	END IF;
	IF aggregation NOT IN ('sum', 'count') THEN
		RAISE EXCEPTION 'meter "%" is a % meter: credits are units of sum and count meters', meter, aggregation
			USING ERRCODE = 'feature_not_supported';
	END IF;
	PERFORM flagmeter.check_not_drawing(meter);

	IF NOT EXISTS (SELECT FROM flagmeter.credit_accounts a
	               WHERE a.tenant = grant_credits.tenant AND a.meter = grant_credits.meter AND a.grants) THEN
		INSERT INTO flagmeter.credit_accounts AS a (tenant, meter)
		VALUES (grant_credits.tenant, grant_credits.meter)
		ON CONFLICT ON CONSTRAINT credit_accounts_pkey DO UPDATE SET grants = true;
	END IF;
	INSERT INTO flagmeter.credit_grants AS c
		(tenant, meter, amount, priority, starts_at, expires_at, idempotency_key, low_balance_percent)
	VALUES (grant_credits.tenant, grant_credits.meter, grant_credits.amount, grant_credits.priority,
	        grant_credits.starts_at, grant_credits.expires_at, grant_credits.idempotency_key,
	        grant_credits.low_balance_percent)
	ON CONFLICT ON CONSTRAINT credit_grants_key DO NOTHING
	RETURNING c.grant_id INTO id;
	IF id IS NULL THEN
		-- a retried key: the grant it made, if it is the same grant
		SELECT * INTO g FROM flagmeter.credit_grants c
		WHERE c.tenant = grant_credits.tenant AND c.idempotency_key = grant_credits.idempotency_key;
		IF g.meter <> meter OR g.amount <> amount OR g.priority <> priority
		   OR g.expires_at IS DISTINCT FROM grant_credits.expires_at THEN
			RAISE EXCEPTION 'idempotency key "%" of tenant "%" names another grant (%)',
				left(idempotency_key, 64), left(tenant, 64), g.grant_id
				USING ERRCODE = 'unique_violation',
				      DETAIL = 'A key names one grant: its meter, amount, priority and expiry.';
		END IF;
		RETURN g.grant_id;
	END IF;

	-- a tenant blocked at its hard limit may consume again
	FOR b IN SELECT bl.period_start FROM flagmeter.blocked bl
	         WHERE bl.tenant = grant_credits.tenant AND bl.meter = grant_credits.meter
	           AND grant_credits.starts_at <= now()
	LOOP
		PERFORM flagmeter.announce('unblocked', tenant, meter, NULL, b.period_start);
	END LOOP;
	RETURN id;
EXCEPTION WHEN OTHERS THEN	-- without the CONTEXT of the helpers (raise_plain)
	GET STACKED DIAGNOSTICS e_state = RETURNED_SQLSTATE, e_message = MESSAGE_TEXT,
	                        e_detail = PG_EXCEPTION_DETAIL, e_hint = PG_EXCEPTION_HINT;
	PERFORM flagmeter.raise_plain(e_state, e_message, e_detail, e_hint);
END $$;
COMMENT ON FUNCTION flagmeter.grant_credits(text, text, bigint, timestamptz, integer, timestamptz, text, integer) IS
'grants a tenant amount units of a sum or count meter on top of its period quota, usable from starts_at until expires_at (NULL: never); drawn lowest priority first, then soonest expiry, then oldest; a tenant without a limit on the meter is limited by its grants alone; grant_low is announced once its remaining falls under low_balance_percent of amount (NULL: never), grant_exhausted when nothing is left, grant_expired (by maintain) when it expires with units left; a retried idempotency key returns the grant it made; returns the grant''s id';

CREATE FUNCTION flagmeter.announce_expired_grants()
RETURNS integer
AS 'MODULE_PATHNAME', 'fm_announce_expired_grants'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION flagmeter.announce_expired_grants() IS
'queues grant_expired (announced at commit) for every grant that expired with units left and was not announced yet; maintain() calls it; returns how many';

CREATE FUNCTION flagmeter.void_grant(grant_id bigint)
RETURNS boolean
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	e_state text; e_message text; e_detail text; e_hint text;	-- the error, raised again
	g record;
BEGIN
	IF grant_id IS NULL THEN
		RAISE EXCEPTION 'grant_id must not be NULL' USING ERRCODE = 'null_value_not_allowed';
	END IF;
	-- waits for a call drawing from it: what that one drew stays drawn
	UPDATE flagmeter.credit_grants c SET voided_at = now()
	WHERE c.grant_id = void_grant.grant_id AND c.voided_at IS NULL
	RETURNING c.tenant, c.meter INTO g;
	IF FOUND THEN
		-- the last grant gone: a tenant at its hard limit is blocked now
		IF NOT EXISTS (SELECT FROM flagmeter.credit_grants c
		               WHERE c.tenant = g.tenant AND c.meter = g.meter AND c.voided_at IS NULL
		                 AND c.drawn < c.amount AND (c.expires_at IS NULL OR c.expires_at > now())) THEN
			PERFORM flagmeter.review_usage(g.tenant, g.meter);
		END IF;
		RETURN true;
	END IF;
	IF NOT EXISTS (SELECT FROM flagmeter.credit_grants c WHERE c.grant_id = void_grant.grant_id) THEN
		RAISE EXCEPTION 'credit grant % does not exist', grant_id USING ERRCODE = 'undefined_object';
	END IF;
	RETURN false;
EXCEPTION WHEN OTHERS THEN	-- without the CONTEXT of the helpers (raise_plain)
	GET STACKED DIAGNOSTICS e_state = RETURNED_SQLSTATE, e_message = MESSAGE_TEXT,
	                        e_detail = PG_EXCEPTION_DETAIL, e_hint = PG_EXCEPTION_HINT;
	PERFORM flagmeter.raise_plain(e_state, e_message, e_detail, e_hint);
END $$;
COMMENT ON FUNCTION flagmeter.void_grant(bigint) IS
'stops a credit grant: nothing more is drawn from it (what was drawn stays drawn); false when it was already voided';

CREATE VIEW flagmeter.grants AS
SELECT g.grant_id, g.tenant, g.meter, g.amount, g.drawn,
	CASE WHEN g.voided_at IS NOT NULL OR g.expires_at OPERATOR(pg_catalog.<=) pg_catalog.now()
	     THEN 0::pg_catalog.int8 ELSE g.amount OPERATOR(pg_catalog.-) g.drawn END AS remaining,
	CASE WHEN g.voided_at IS NOT NULL THEN 'voided'
	     WHEN g.expires_at OPERATOR(pg_catalog.<=) pg_catalog.now() THEN 'expired'
	     WHEN g.drawn OPERATOR(pg_catalog.=) g.amount THEN 'exhausted'
	     WHEN g.starts_at OPERATOR(pg_catalog.>) pg_catalog.now() THEN 'pending'
	     ELSE 'active' END AS state,
	g.priority, g.starts_at, g.expires_at, g.created_at, g.voided_at, g.idempotency_key
FROM flagmeter.credit_grants g;
COMMENT ON VIEW flagmeter.grants IS
'every credit grant with what remains of it (0 once voided or expired) and its state at now(): active, pending (not started), exhausted, expired or voided';

CREATE FUNCTION flagmeter.balance(tenant text, meter text)
RETURNS bigint
LANGUAGE sql STABLE PARALLEL SAFE
AS $$ SELECT (flagmeter.check($1, $2, 0)).balance $$;
COMMENT ON FUNCTION flagmeter.balance(text, text) IS
'what a tenant may still use of a meter now: the period quota remaining plus what its active credit grants hold; NULL when unlimited and never granted credits';

-- Rollover ------------------------------------------------------------------------
-- A limit with rollover (set_limit(..., rollover, rollover_cap,
-- rollover_periods)) carries a share of each ended period's unused quota
-- into a credit grant: maintain() calls roll_over(), which, for every
-- assigned tenant whose plan's limit on a meter rolls over, looks at the
-- last rollover_periods periods of the limit in force (an override's quota
-- and period count) that have ended, after the tenant was assigned, and
-- grants floor(unused * rollover / 100) units, at most rollover_cap, from
-- the period's end until the end of the rollover_periods-th period after
-- it.  unused is the quota less the period's whole usage (which counts
-- what grants covered), so rolled-over credits never roll over again.
-- Each period is decided once, recorded in rollovers (a period with
-- nothing to roll over too), from the usage recorded by then: a late
-- event for it changes nothing.  A run with nothing due costs one
-- primary-key probe per tenant and meter with rollover: the most recent
-- ended period has its row.

CREATE TABLE flagmeter.rollovers (
	tenant			text NOT NULL,
	meter			text NOT NULL REFERENCES flagmeter.meters ON DELETE CASCADE,
	period_start	timestamptz NOT NULL,
	period_end		timestamptz NOT NULL,
	quota			bigint NOT NULL,
	used			bigint NOT NULL,
	amount			bigint NOT NULL CONSTRAINT rollovers_amount_valid
		CHECK (amount OPERATOR(pg_catalog.>=) 0),
	-- the grant made (NULL when amount is 0); no foreign key: a grant goes
	-- with its tenant's credit account, and this row with the retention
	grant_id		bigint,
	expires_at		timestamptz NOT NULL,
	rolled_at		timestamptz NOT NULL DEFAULT pg_catalog.now(),
	PRIMARY KEY (tenant, meter, period_start)
);
COMMENT ON TABLE flagmeter.rollovers IS
'one row per ended period that roll_over() decided: the quota and usage it saw, the amount rolled over (0: nothing) and the grant made, until its expiry; maintain() deletes the rows expired for longer than the retention';
SELECT pg_catalog.pg_extension_config_dump('flagmeter.rollovers', '');

CREATE FUNCTION flagmeter.roll_over()
RETURNS integer
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	r record;
	p record;
	ends timestamptz[];
	period_used bigint;
	share bigint;
	grant_key text;
	id bigint;
	made integer := 0;
	tenant_made integer;
BEGIN
	-- the tenants and meters whose most recent ended period is not decided
	FOR r IN
		SELECT t.tenant, l.meter, t.assigned_at, c.aggregation, c.quota, c.period, c.anchor, c.timezone,
		       l.rollover, l.rollover_cap, l.rollover_periods, cur.period_end AS current_end,
		       last.period_start AS last_start, last.period_end AS last_end
		FROM flagmeter.limits l
		JOIN flagmeter.tenants t ON t.plan = l.plan
		CROSS JOIN LATERAL flagmeter.limit_config(t.tenant, l.meter) c
		CROSS JOIN LATERAL flagmeter.period_bounds(now(), c.period, c.anchor, c.timezone) cur
		CROSS JOIN LATERAL flagmeter.period_bounds(cur.period_start - interval '1 microsecond',
		                                           c.period, c.anchor, c.timezone) last
		JOIN flagmeter.meters m ON m.meter = l.meter
		WHERE l.rollover IS NOT NULL AND m.draws IS NULL
		  AND c.period <> 'lifetime' AND c.aggregation IN ('sum', 'count')
		  AND last.period_end > t.assigned_at
		  AND NOT EXISTS (SELECT FROM flagmeter.rollovers x
		                  WHERE x.tenant = t.tenant AND x.meter = l.meter
		                    AND x.period_start = last.period_start)
		ORDER BY t.tenant, l.meter
	LOOP
		-- ends[k]: the end of the (k-1)-th period after the current one; the
		-- grant of the i-th ended period back expires at ends[rollover_periods - i + 1]
		ends := ARRAY[r.current_end];
		FOR k IN 2..r.rollover_periods LOOP
			ends := ends || (flagmeter.period_bounds(ends[k - 1], r.period, r.anchor, r.timezone)).period_end;
		END LOOP;
		SELECT r.last_start AS period_start, r.last_end AS period_end INTO p;
		tenant_made := 0;
		-- newest first; a period already decided means the older ones were
		-- decided with it; older than rollover_periods back, the grant
		-- would have expired
		BEGIN
			FOR i IN 1..r.rollover_periods LOOP
				EXIT WHEN p.period_end <= r.assigned_at;
				period_used := COALESCE(flagmeter.used_by(flagmeter.usage(r.tenant, r.meter, p.period_start), r.aggregation), 0);
				share := floor(greatest(r.quota - period_used, 0)::numeric * r.rollover / 100);
				share := least(share, COALESCE(r.rollover_cap, share));
				INSERT INTO flagmeter.rollovers AS x (tenant, meter, period_start, period_end, quota, used,
				                                      amount, expires_at)
				VALUES (r.tenant, r.meter, p.period_start, p.period_end, r.quota, period_used,
				        share, ends[r.rollover_periods - i + 1])
				ON CONFLICT ON CONSTRAINT rollovers_pkey DO NOTHING;
				EXIT WHEN NOT FOUND;
				IF share > 0 THEN
					grant_key := 'rollover:' || r.meter || ':'
					       || to_char(p.period_start AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"');
					-- a grant under the key already (a row deleted by the
					-- retention, a lifetime changed since): that one stands
					SELECT g.grant_id INTO id FROM flagmeter.credit_grants g
					WHERE g.tenant = r.tenant AND g.idempotency_key = grant_key;
					IF NOT FOUND THEN
						id := flagmeter.grant_credits(r.tenant, r.meter, share,
						                              expires_at => ends[r.rollover_periods - i + 1],
						                              starts_at => p.period_end, idempotency_key => grant_key);
						tenant_made := tenant_made + 1;
					END IF;
					UPDATE flagmeter.rollovers x SET grant_id = id
					WHERE x.tenant = r.tenant AND x.meter = r.meter AND x.period_start = p.period_start;
				END IF;
				SELECT * INTO p FROM flagmeter.period_bounds(p.period_start - interval '1 microsecond',
				                                             r.period, r.anchor, r.timezone);
			END LOOP;
			made := made + tenant_made;
		EXCEPTION WHEN object_not_in_prerequisite_state THEN
			-- a tenant being moved to another shard (fence_partition): its
			-- periods are decided there, with the rows the move copies
			NULL;
		END;
	END LOOP;
	RETURN made;
END $$;
COMMENT ON FUNCTION flagmeter.roll_over() IS
'grants, for every assigned tenant whose plan''s limit rolls over, the rollover share of the unused quota of each of its last rollover_periods ended periods not decided yet (ended after it was assigned), capped at rollover_cap, from the period''s end to the end of the rollover_periods-th period after it, under the key rollover:<meter>:<period start, UTC>; records each period in rollovers; maintain() calls it; returns how many grants it made';

-- Reservations --------------------------------------------------------------------
-- reserve holds an amount against quota and grants, under the period's
-- stripe 0 lock as consume decides: every consume and reserve of the
-- tenant's meter counts the holds as used, until settle records the actual
-- usage (as a consume that is never refused: the work was done), release
-- gives the hold back, or the ttl passes (then it counts for nobody, at
-- once: holds are active only while expires_at is after the transaction's
-- start).  maintain() only deletes old rows.  Sum meters only.

CREATE SEQUENCE flagmeter.reservation_id;
COMMENT ON SEQUENCE flagmeter.reservation_id IS 'ids of reservations';

CREATE TABLE flagmeter.reservations (
	reservation_id	bigint PRIMARY KEY DEFAULT pg_catalog.nextval('flagmeter.reservation_id'),
	tenant			text NOT NULL,
	meter			text NOT NULL REFERENCES flagmeter.meters ON DELETE CASCADE,
	amount			bigint NOT NULL CONSTRAINT reservations_amount_positive
		CHECK (amount OPERATOR(pg_catalog.>) 0),
	created_at		timestamptz NOT NULL,
	expires_at		timestamptz NOT NULL,
	settled_at		timestamptz,
	actual			bigint,
	released_at		timestamptz,
	idempotency_key	text,
	CONSTRAINT reservations_key UNIQUE (tenant, idempotency_key)
);
COMMENT ON TABLE flagmeter.reservations IS
'amounts held against a tenant''s quota and grants: active until settled (actual recorded), released, or expires_at; maintain() deletes them once expired for longer than the retention';

-- the holds a decision counts, by (tenant, meter)
CREATE INDEX reservations_open ON flagmeter.reservations (tenant, meter)
	WHERE settled_at IS NULL AND released_at IS NULL;

SELECT pg_catalog.pg_extension_config_dump('flagmeter.reservations', '');
SELECT pg_catalog.pg_extension_config_dump('flagmeter.reservation_id', '');

CREATE FUNCTION flagmeter.reserve(tenant text, meter text, amount bigint,
	ttl interval DEFAULT '5 minutes', idempotency_key text DEFAULT NULL,
	OUT granted boolean, OUT reservation_id bigint, OUT reserved bigint,
	OUT expires_at timestamptz, OUT balance bigint, OUT retry_after interval)
RETURNS record
AS 'MODULE_PATHNAME', 'fm_reserve'
LANGUAGE C VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE;
COMMENT ON FUNCTION flagmeter.reserve(text, text, bigint, interval, text) IS
'holds amount of a sum meter against the tenant''s quota and credit grants for ttl, all or nothing as a hard-limit consume decides: granted with a reservation_id, or refused (reservation_id NULL); balance is what is left after it; the tenant''s rate limit for the meter applies to amount too (refused for it: retry_after says when it would fit); a retried idempotency key returns the reservation it made';

CREATE FUNCTION flagmeter.settle(reservation_id bigint, actual bigint)
RETURNS flagmeter.decision
AS 'MODULE_PATHNAME', 'fm_settle'
LANGUAGE C VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE;
COMMENT ON FUNCTION flagmeter.settle(bigint, bigint) IS
'ends a reservation by recording actual (>= 0) as usage, as a consume that is never refused (more than reserved goes past the limits as overage, hard or soft), drawing grants past the quota; the rest of the hold is freed; an error once settled, released or expired';

CREATE FUNCTION flagmeter.release(reservation_id bigint)
RETURNS boolean
AS 'MODULE_PATHNAME', 'fm_release'
LANGUAGE C VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE;
COMMENT ON FUNCTION flagmeter.release(bigint) IS
'gives a reservation''s hold back without recording usage; false when it was settled, released or expired already';
-- ---------------------------------------------------------------------------
-- Maintenance: folding raw events into rollups, partitions and retention,
-- compaction of closed periods, scheduling with pg_cron, operator stats.
--
-- maintain() does it all, in one transaction:
--   1. fold: events (and voids) whose transaction id lies in
--      [folded_through, snapshot xmin) go into the hourly and daily rollups.
--      Every transaction below the xmin has ended, so a band is complete
--      when it is folded, whatever order the transactions committed in;
--      nothing is folded twice because the watermark moves in the same
--      transaction, under the lock of the state row.
--   2. idempotency keys and voids older than the retention are deleted;
--   3. the stripes of periods that have ended are merged into one row,
--      and near the end of the run the idle track stripes of every period
--      into its merged stripe (merge_idle_stripes);
--      tenants blocked in ended periods are unblocked; the unused quota of
--      ended periods rolls over into credit grants (roll_over()); a resync hint goes
--      out for notifications skipped under backpressure; old outbox rows
--      are deleted;
--   4. partitions for the coming days are created; partitions older than
--      the retention whose events are all folded are dropped.
-- It never waits for a lock that track holds and never makes track wait,
-- except: a late event for a period that has ended waits for the end of
-- the run when its stripes are being compacted, so does a track that
-- writes a stripe idle for a minute at the moment the run merges it, and
-- dropping an expired partition (once a day) holds inserts for the last
-- moment of the run.
-- ---------------------------------------------------------------------------

-- The two single-row tables below get their row on first use, not from
-- this script: they are dumped with pg_dump (pg_extension_config_dump), and
-- a row inserted here would collide with the dumped one on restore.

CREATE TABLE flagmeter.settings (
	singleton			boolean PRIMARY KEY DEFAULT true CONSTRAINT settings_singleton CHECK (singleton),
	retention			interval NOT NULL DEFAULT '90 days'
		CONSTRAINT settings_retention_positive CHECK (retention OPERATOR(pg_catalog.>=) '1 day'::interval),
	partitions_ahead	integer NOT NULL DEFAULT 3
		CONSTRAINT settings_partitions_ahead_range
		CHECK (partitions_ahead OPERATOR(pg_catalog.>=) 1 AND partitions_ahead OPERATOR(pg_catalog.<=) 60),
	-- what the calls do for a tenant never assigned a plan: meter it without
	-- limit, or refuse the call (QT001); read by the calls from their cached
	-- configuration (src/limit_lookup.c), hence the trigger below
	unassigned_tenants	text NOT NULL DEFAULT 'refuse'
		CONSTRAINT settings_unassigned_tenants_valid
		CHECK (unassigned_tenants OPERATOR(pg_catalog.=) ANY (ARRAY['unlimited', 'refuse'])),
	-- the window of event times track, track_batch and track_events accept
	-- (QT002 outside it): occurred_at from now() - late_events to now() +
	-- future_events; cached by the calls like unassigned_tenants
	late_events			interval NOT NULL DEFAULT '35 days'
		CONSTRAINT settings_late_events_range
		CHECK (late_events OPERATOR(pg_catalog.>=) '0'::interval
		       AND late_events OPERATOR(pg_catalog.<=) '1000 years'::interval),
	future_events		interval NOT NULL DEFAULT '5 minutes'
		CONSTRAINT settings_future_events_range
		CHECK (future_events OPERATOR(pg_catalog.>=) '0'::interval
		       AND future_events OPERATOR(pg_catalog.<=) '1000 years'::interval)
);
COMMENT ON TABLE flagmeter.settings IS
'settings of maintain() and of the calls when changed from the defaults (see flagmeter.configure and flagmeter.current_settings)';
SELECT pg_catalog.pg_extension_config_dump('flagmeter.settings', '');
-- the calls cache unassigned_tenants and the event window with the limits:
-- a change empties the caches
CREATE TRIGGER settings_changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON flagmeter.settings
	FOR EACH STATEMENT EXECUTE FUNCTION flagmeter.config_changed();

CREATE VIEW flagmeter.current_settings AS
SELECT COALESCE(s.retention, '90 days'::interval) AS retention,
       COALESCE(s.partitions_ahead, 3) AS partitions_ahead,
       COALESCE(s.unassigned_tenants, 'refuse') AS unassigned_tenants,
       COALESCE(s.late_events, '35 days'::interval) AS late_events,
       COALESCE(s.future_events, '5 minutes'::interval) AS future_events
FROM (VALUES (true)) AS one(singleton)
LEFT JOIN flagmeter.settings s ON s.singleton;
COMMENT ON VIEW flagmeter.current_settings IS
'the settings in force: retention of raw events, idempotency keys, voids and outbox rows (the idempotency window), how many daily partitions to create ahead, what the calls do for a tenant never assigned a plan (refuse or unlimited), and the window of event times track, track_batch and track_events accept (late_events before and future_events after now())';

CREATE FUNCTION flagmeter.configure(retention interval DEFAULT NULL, partitions_ahead integer DEFAULT NULL,
	unassigned_tenants text DEFAULT NULL, late_events interval DEFAULT NULL,
	future_events interval DEFAULT NULL)
RETURNS flagmeter.current_settings
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	result flagmeter.current_settings;
BEGIN
	IF retention IS NOT NULL AND retention < interval '1 day' THEN
		RAISE EXCEPTION 'retention must be at least one day: %', retention
			USING ERRCODE = 'invalid_parameter_value';
	END IF;
	IF partitions_ahead IS NOT NULL AND (partitions_ahead < 1 OR partitions_ahead > 60) THEN
		RAISE EXCEPTION 'partitions_ahead must be between 1 and 60: %', partitions_ahead
			USING ERRCODE = 'invalid_parameter_value';
	END IF;
	IF unassigned_tenants IS NOT NULL AND NOT unassigned_tenants = ANY (ARRAY['unlimited', 'refuse']) THEN
		RAISE EXCEPTION 'invalid unassigned_tenants "%"', left(unassigned_tenants, 64)
			USING ERRCODE = 'invalid_parameter_value',
			      HINT = 'Valid values are "unlimited" (metered without limit) and "refuse".';
	END IF;
	IF late_events IS NOT NULL AND (late_events < interval '0' OR late_events > interval '1000 years') THEN
		RAISE EXCEPTION 'late_events must be between 0 and 1000 years: %', late_events
			USING ERRCODE = 'invalid_parameter_value',
			      HINT = 'To accept any event time, set a large window: late_events => ''100 years''.';
	END IF;
	IF future_events IS NOT NULL AND (future_events < interval '0' OR future_events > interval '1000 years') THEN
		RAISE EXCEPTION 'future_events must be between 0 and 1000 years: %', future_events
			USING ERRCODE = 'invalid_parameter_value',
			      HINT = 'To accept any event time, set a large window: future_events => ''100 years''.';
	END IF;
	INSERT INTO flagmeter.settings AS s (retention, partitions_ahead, unassigned_tenants, late_events,
		future_events)
	SELECT COALESCE(configure.retention, c.retention), COALESCE(configure.partitions_ahead, c.partitions_ahead),
	       COALESCE(configure.unassigned_tenants, c.unassigned_tenants),
	       COALESCE(configure.late_events, c.late_events), COALESCE(configure.future_events, c.future_events)
	FROM flagmeter.current_settings c
	ON CONFLICT ON CONSTRAINT settings_pkey DO UPDATE
		SET retention = EXCLUDED.retention, partitions_ahead = EXCLUDED.partitions_ahead,
		    unassigned_tenants = EXCLUDED.unassigned_tenants, late_events = EXCLUDED.late_events,
		    future_events = EXCLUDED.future_events;
	SELECT * INTO result FROM flagmeter.current_settings;
	RETURN result;
END $$;
COMMENT ON FUNCTION flagmeter.configure(interval, integer, text, interval, interval) IS
'changes the settings (NULL keeps a setting): retention, partitions_ahead, unassigned_tenants (refuse, the default: calls for a tenant never assigned a plan fail with QT001; unlimited: it is metered without limit), late_events and future_events (track, track_batch and track_events refuse with QT002 an occurred_at earlier than now() - late_events or later than now() + future_events; 0 to 1000 years each); returns the settings in force';

CREATE TABLE flagmeter.maintenance_state (
	singleton			boolean PRIMARY KEY DEFAULT true CONSTRAINT maintenance_state_singleton CHECK (singleton),
	system_identifier	bigint,
	folded_through		xid8 NOT NULL DEFAULT '0',
	counted_through		xid8 NOT NULL DEFAULT '0',
	runs				bigint NOT NULL DEFAULT 0,
	last_run_at			timestamptz,
	last_run_duration	interval,
	last_run_folded		bigint NOT NULL DEFAULT 0,
	total_folded		bigint NOT NULL DEFAULT 0,
	total_voids_folded	bigint NOT NULL DEFAULT 0,
	resync_sent_through	bigint NOT NULL DEFAULT 0,
	resync_sent_at		timestamptz
);
COMMENT ON TABLE flagmeter.maintenance_state IS
'where folding stands (events with xid below folded_through are in the rollups; xids of the cluster system_identifier), counters of maintain() runs, and the outbox version up to which a resync hint went out';
SELECT pg_catalog.pg_extension_config_dump('flagmeter.maintenance_state', '');

-- The state, as readers see it before maintain() first ran.
CREATE VIEW flagmeter.current_state AS
SELECT COALESCE(m.folded_through, '0'::xid8) AS folded_through,
       COALESCE(m.runs, 0) AS runs, m.last_run_at, m.last_run_duration,
       COALESCE(m.last_run_folded, 0) AS last_run_folded,
       COALESCE(m.total_folded, 0) AS total_folded,
       COALESCE(m.total_voids_folded, 0) AS total_voids_folded,
       COALESCE(m.resync_sent_through, 0) AS resync_sent_through,
       m.resync_sent_at,
       m.system_identifier,
       COALESCE(m.counted_through, '0'::xid8) AS counted_through
FROM (VALUES (true)) AS one(singleton)
LEFT JOIN flagmeter.maintenance_state m ON m.singleton;
COMMENT ON VIEW flagmeter.current_state IS
'maintenance_state with its defaults before the first maintain()';

CREATE TABLE flagmeter.rollup_hour (
	tenant		text NOT NULL,
	meter		text NOT NULL,
	bucket_start timestamptz NOT NULL,
	counter		flagmeter.quota_counter NOT NULL,
	PRIMARY KEY (tenant, meter, bucket_start)
);
COMMENT ON TABLE flagmeter.rollup_hour IS
'folded usage per tenant, meter and UTC hour (the hour of occurred_at)';

CREATE TABLE flagmeter.rollup_day (
	tenant		text NOT NULL,
	meter		text NOT NULL,
	bucket_start timestamptz NOT NULL,
	counter		flagmeter.quota_counter NOT NULL,
	PRIMARY KEY (tenant, meter, bucket_start)
);
COMMENT ON TABLE flagmeter.rollup_day IS
'folded usage per tenant, meter and UTC day (the day of occurred_at)';

SELECT pg_catalog.pg_extension_config_dump('flagmeter.rollup_hour', '');
SELECT pg_catalog.pg_extension_config_dump('flagmeter.rollup_day', '');

-- Retention deletes by age: BRIN indexes cost next to nothing on append-only
-- tables.
CREATE INDEX event_keys_recorded_at ON flagmeter.event_keys USING brin (recorded_at);
CREATE INDEX voids_voided_at ON flagmeter.voids USING brin (voided_at);

-- Partitions ---------------------------------------------------------------------

-- Creates the daily partitions of events for the partitions_ahead days after
-- today (UTC); returns how many it created.  Never today's: an insert that
-- had already chosen the default partition for today's rows when the new
-- partition was attached would then fail its partition check, so a day is
-- attached only while no event can be recorded for it yet.  Attaching must
-- lock the default partition, which takes events only on days without a
-- partition (the day flagmeter is installed): the lock is asked with NOWAIT
-- so that ingest never queues behind it, and a busy default partition means
-- "try again next run".  Each partition is made as a table and then
-- attached, which does not block inserts into the other partitions.
CREATE FUNCTION flagmeter.create_partitions()
RETURNS integer
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	ahead integer := (SELECT s.partitions_ahead FROM flagmeter.current_settings s);
	today timestamptz := date_trunc('day', now(), 'UTC');
	day timestamptz;
	name text;
	lower_bound text;
	upper_bound text;
	created integer := 0;
BEGIN
	IF NOT EXISTS (
		SELECT FROM generate_series(1, ahead) i
		WHERE to_regclass('flagmeter.events_p'
		                  || to_char((today + make_interval(days => i)) AT TIME ZONE 'UTC', 'YYYYMMDD')) IS NULL)
	THEN
		RETURN 0;
	END IF;
	BEGIN
		LOCK TABLE flagmeter.events_default IN ACCESS EXCLUSIVE MODE NOWAIT;
	EXCEPTION WHEN lock_not_available THEN
		RETURN 0;
	END;

	FOR i IN 1..ahead LOOP
		day := today + make_interval(days => i);
		name := 'events_p' || to_char(day AT TIME ZONE 'UTC', 'YYYYMMDD');
		CONTINUE WHEN to_regclass('flagmeter.' || quote_ident(name)) IS NOT NULL;
		CONTINUE WHEN EXISTS (SELECT FROM flagmeter.events_default d
		                      WHERE d.recorded_at >= day
		                        AND d.recorded_at < day + interval '1 day');
		lower_bound := to_char(day AT TIME ZONE 'UTC', 'YYYY-MM-DD') || ' 00:00:00+00';
		upper_bound := to_char((day + interval '1 day') AT TIME ZONE 'UTC', 'YYYY-MM-DD') || ' 00:00:00+00';
		EXECUTE format('CREATE TABLE flagmeter.%I (LIKE flagmeter.events INCLUDING DEFAULTS)', name);
		PERFORM flagmeter.index_event_partition(('flagmeter.' || quote_ident(name))::regclass);
		EXECUTE format('ALTER TABLE flagmeter.events ATTACH PARTITION flagmeter.%I FOR VALUES FROM (%L) TO (%L)',
		               name, lower_bound, upper_bound);
		created := created + 1;
	END LOOP;
	RETURN created;
END $$;
COMMENT ON FUNCTION flagmeter.create_partitions() IS
'creates the daily partitions of flagmeter.events for the days after today (settings.partitions_ahead); returns how many it created (0 when the default partition is busy: the next run tries again)';

-- Drops the daily partitions that ended before the retention cut-off and hold
-- no event still to fold.  Dropping a partition locks events exclusively
-- until the end of the transaction (maintain() does it last): inserts wait
-- for that moment, and when the lock is not had within 50 ms the partition
-- is left for the next run rather than stalling ingest longer.
CREATE FUNCTION flagmeter.drop_expired_partitions(folded_through xid8)
RETURNS integer
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	cutoff timestamptz := now() - (SELECT s.retention FROM flagmeter.current_settings s);
	part record;
	unfolded boolean;
	saved_timeout text := current_setting('lock_timeout');
	dropped integer := 0;
BEGIN
	FOR part IN
		SELECT c.oid::regclass AS rel, c.relname,
		       to_date(substr(c.relname, 9), 'YYYYMMDD')::timestamp AT TIME ZONE 'UTC' AS day
		FROM pg_inherits i
		JOIN pg_class c ON c.oid = i.inhrelid
		WHERE i.inhparent = 'flagmeter.events'::regclass
		  AND c.relname ~ '^events_p[0-9]{8}$'
		ORDER BY c.relname
	LOOP
		CONTINUE WHEN part.day + interval '1 day' > cutoff;
		EXECUTE format('SELECT EXISTS (SELECT FROM %s WHERE xid >= $1)', part.rel)
			INTO unfolded USING flagmeter.xid_int(folded_through);
		CONTINUE WHEN unfolded;
		BEGIN
			PERFORM set_config('lock_timeout', '50ms', true);
			EXECUTE format('DROP TABLE %s', part.rel);
			PERFORM set_config('lock_timeout', saved_timeout, true);
			dropped := dropped + 1;
		EXCEPTION WHEN lock_not_available THEN
			RAISE NOTICE 'partition % is busy; it will be dropped by a later run', part.relname;
		END;
	END LOOP;
	-- events that went to the default partition age out row by row
	DELETE FROM flagmeter.events_default d WHERE d.recorded_at < cutoff AND d.xid < flagmeter.xid_int(folded_through);
	RETURN dropped;
END $$;
COMMENT ON FUNCTION flagmeter.drop_expired_partitions(xid8) IS
'drops daily partitions of flagmeter.events older than the retention whose events are all folded; returns how many';

-- Folding ---------------------------------------------------------------------------

-- Folds the events and voids of transactions in [low, high) into the rollups.
CREATE FUNCTION flagmeter.fold_band(low xid8, high xid8, OUT events_folded bigint, OUT voids_folded bigint)
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	WITH band AS (
		SELECT e.tenant, e.meter, date_trunc('hour', e.occurred_at, 'UTC') AS hour,
		       flagmeter.quota_counter_agg(e.amount, e.occurred_at) AS counter
		FROM flagmeter.events e
		WHERE e.xid >= flagmeter.xid_int(low) AND e.xid < flagmeter.xid_int(high)
		GROUP BY 1, 2, 3
	), hours AS (
		INSERT INTO flagmeter.rollup_hour AS r (tenant, meter, bucket_start, counter)
		SELECT b.tenant, b.meter, b.hour, b.counter FROM band b
		ON CONFLICT (tenant, meter, bucket_start) DO UPDATE
			SET counter = r.counter OPERATOR(flagmeter.+) EXCLUDED.counter
	), days AS (
		INSERT INTO flagmeter.rollup_day AS r (tenant, meter, bucket_start, counter)
		SELECT b.tenant, b.meter, date_trunc('day', b.hour, 'UTC'), flagmeter.merge_agg(b.counter)
		FROM band b GROUP BY 1, 2, 3
		ON CONFLICT (tenant, meter, bucket_start) DO UPDATE
			SET counter = r.counter OPERATOR(flagmeter.+) EXCLUDED.counter
	)
	SELECT COALESCE(sum(flagmeter.events(b.counter)), 0) INTO events_folded FROM band b;

	-- Voids come after events: a void's transaction started after its
	-- event committed, so its event is folded in this band or before.
	WITH band AS (
		SELECT v.tenant, v.meter, date_trunc('hour', v.occurred_at, 'UTC') AS hour,
		       sum(v.amount)::bigint AS amount, count(*) AS n
		FROM flagmeter.voids v
		WHERE v.xid >= low AND v.xid < high
		GROUP BY 1, 2, 3
	), hours AS (
		UPDATE flagmeter.rollup_hour r
		SET counter = flagmeter.subtract_events(r.counter, b.amount, b.n)
		FROM band b
		WHERE r.tenant = b.tenant AND r.meter = b.meter AND r.bucket_start = b.hour
	), days AS (
		UPDATE flagmeter.rollup_day r
		SET counter = flagmeter.subtract_events(r.counter, d.amount, d.n)
		FROM (SELECT b.tenant, b.meter, date_trunc('day', b.hour, 'UTC') AS day,
		             sum(b.amount)::bigint AS amount, sum(b.n)::bigint AS n
		      FROM band b GROUP BY 1, 2, 3) d
		WHERE r.tenant = d.tenant AND r.meter = d.meter AND r.bucket_start = d.day
	)
	SELECT COALESCE(sum(b.n), 0) INTO voids_folded FROM band b;
END $$;
COMMENT ON FUNCTION flagmeter.fold_band(xid8, xid8) IS
'folds the events and voids of the transactions with ids in [low, high) into rollup_hour and rollup_day';

-- Summarizes the page ranges of the events' xid (BRIN) indexes that have no
-- summary yet, so that the next fold reads only the pages written after this
-- run rather than every page since autovacuum last summarized (autosummarize
-- asks autovacuum to, but it gets there when it gets there).  An index whose
-- table is busy (VACUUM, ANALYZE, CREATE INDEX) is left for the next run.
CREATE FUNCTION flagmeter.summarize_event_partitions()
RETURNS integer
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	idx regclass;
	ranges integer := 0;
	saved_timeout text := current_setting('lock_timeout');
BEGIN
	FOR idx IN
		SELECT i.indexrelid::regclass
		FROM pg_inherits h
		JOIN pg_index i ON i.indrelid = h.inhrelid
		JOIN pg_class c ON c.oid = i.indexrelid
		WHERE h.inhparent = 'flagmeter.events'::regclass
		  AND c.relam = (SELECT a.oid FROM pg_am a WHERE a.amname = 'brin')
	LOOP
		BEGIN
			PERFORM set_config('lock_timeout', '50ms', true);
			ranges := ranges + brin_summarize_new_values(idx);
			PERFORM set_config('lock_timeout', saved_timeout, true);
		EXCEPTION WHEN lock_not_available THEN
			NULL;
		END;
	END LOOP;
	RETURN ranges;
END $$;
COMMENT ON FUNCTION flagmeter.summarize_event_partitions() IS
'summarizes the new page ranges of the events'' xid indexes (maintain() calls it after folding); returns how many';

-- Turns the rows of each period that has ended (more than a minute ago)
-- into its stripe 0 alone: the stripes merged into one row, and a lone
-- track stripe moved there, so that the period leaves the index
-- counters_track_stripes, where this and merge_idle_stripes() look for
-- work.  Open periods are left alone: their stripes are what keeps
-- concurrent writers apart, and there are at most stripes + 1 of them.
-- Lifetime periods (period_start -infinity) never end.  A period one of
-- whose rows a transaction holds (a void, a late event) is left for the
-- next run: its rows are locked without waiting first, since a DELETE that
-- waited for them could deadlock with a void, which locks the track stripes
-- in stripe order and stripe 0 last.
--
-- jit is off here and in merge_idle_stripes: the planner costs the search
-- for work by the open periods it may visit (a limit lookup each), so at
-- about 10 000 of them it JIT-compiled a query that finds nothing in half a
-- millisecond: 95 ms of a run spent compiling, in every fresh session.
CREATE FUNCTION flagmeter.compact_counters()
RETURNS bigint
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
DECLARE
	g record;
	merged flagmeter.quota_counter;
	compacted bigint := 0;
	nrows bigint;
	nlocked bigint;
BEGIN
	FOR g IN
		SELECT s.tenant, s.meter, s.period_start
		FROM (SELECT c.tenant, c.meter, c.period_start
		      FROM flagmeter.counters c
		      WHERE c.stripe > 0
		        AND c.period_start > '-infinity' AND c.period_start < now() - interval '1 hour'
		      GROUP BY 1, 2, 3) s,
		     LATERAL flagmeter.limit_config(s.tenant, s.meter) cfg
		WHERE (flagmeter.period_bounds(s.period_start, cfg.period, cfg.anchor, cfg.timezone)).period_end
		      <= now() - interval '1 minute'
		LIMIT 10000
	LOOP
		SELECT count(*) INTO nrows FROM flagmeter.counters c
		WHERE c.tenant = g.tenant AND c.meter = g.meter AND c.period_start = g.period_start;
		SELECT count(*) INTO nlocked FROM (
			SELECT FROM flagmeter.counters c
			WHERE c.tenant = g.tenant AND c.meter = g.meter AND c.period_start = g.period_start
			FOR UPDATE SKIP LOCKED) l;
		CONTINUE WHEN nlocked < nrows;

		WITH moved AS (
			DELETE FROM flagmeter.counters c
			WHERE c.tenant = g.tenant AND c.meter = g.meter AND c.period_start = g.period_start
			RETURNING c.counter)
		SELECT flagmeter.merge_agg(moved.counter) INTO merged FROM moved;
		INSERT INTO flagmeter.counters (tenant, meter, period_start, stripe, counter)
		VALUES (g.tenant, g.meter, g.period_start, 0, merged);
		compacted := compacted + 1;
	END LOOP;
	RETURN compacted;
END $$;
COMMENT ON FUNCTION flagmeter.compact_counters() IS
'turns the counter rows of each period that has ended into its stripe 0 alone; returns how many periods it compacted';

-- Merges the idle track stripes of every period, open ones included, into
-- the period's merged stripe (32767), so that a read of a tenant whose
-- concurrent writers have gone merges about as many rows as it has writers
-- now, not as many as it ever had at once.  Idle: last written by a
-- transaction below written_before (maintain() passes where the previous
-- run's fold stopped, a minute or more ago) and held by no transaction
-- (locked without waiting).
--
-- No track writes the merged stripe (theirs are 1 .. 2 * flagmeter.stripes,
-- at most 2048), so no REPEATABLE READ track finds it changed after its
-- snapshot; one whose own stripe was merged after its snapshot inserts the
-- row again (and sets recheck_at on the version it wrote, src/track_alerts.h).
-- A track that writes a stripe at the moment a run merges it (it took the
-- stripe's tag, or it is its own stripe, then found the row locked) waits
-- for the end of that run, which is why maintain() calls this near its end.
-- Stripe 0 stays: usage moved into the row consume decides on would be
-- counted twice by a consume that read the track stripes in its snapshot
-- (spec void_consume_race).
CREATE FUNCTION flagmeter.merge_idle_stripes(written_before xid8)
RETURNS bigint
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
SET jit = off	-- see compact_counters
AS $$
DECLARE
	merged_stripe CONSTANT smallint := 32767;
	-- age(xmin) > span: written by a transaction below written_before
	span bigint := flagmeter.xid_int(pg_current_xact_id()) - flagmeter.xid_int(written_before);
	g record;
	locked tid[];
	merged flagmeter.quota_counter;
	has_merged_row boolean;
	periods bigint := 0;
BEGIN
	IF written_before IS NULL OR written_before = '0'::xid8 OR span <= 0 THEN
		RETURN 0;
	END IF;
	FOR g IN
		SELECT c.tenant, c.meter, c.period_start
		FROM flagmeter.counters c
		WHERE c.stripe > 0 AND (c.stripe = merged_stripe OR age(c.xmin) > span)
		GROUP BY 1, 2, 3
		HAVING count(*) > 1
		LIMIT 10000
	LOOP
		SELECT array_agg(l.ctid), bool_or(l.stripe = merged_stripe), flagmeter.merge_agg(l.counter)
		INTO locked, has_merged_row, merged
		FROM (SELECT c.ctid, c.stripe, c.counter FROM flagmeter.counters c
		      WHERE c.tenant = g.tenant AND c.meter = g.meter AND c.period_start = g.period_start
		        AND c.stripe > 0 AND (c.stripe = merged_stripe OR age(c.xmin) > span)
		      FOR UPDATE SKIP LOCKED) l;
		CONTINUE WHEN coalesce(cardinality(locked), 0) < 2;
		-- a merged row held by a void: left for the next run
		CONTINUE WHEN NOT has_merged_row AND EXISTS (
			SELECT FROM flagmeter.counters c
			WHERE c.tenant = g.tenant AND c.meter = g.meter AND c.period_start = g.period_start
			  AND c.stripe = merged_stripe);

		DELETE FROM flagmeter.counters c
		WHERE c.ctid = ANY (locked) AND c.stripe <> merged_stripe;
		IF has_merged_row THEN
			UPDATE flagmeter.counters c SET counter = merged, recheck_at = NULL, recheck_for = NULL
			WHERE c.ctid = ANY (locked) AND c.stripe = merged_stripe;
		ELSE
			INSERT INTO flagmeter.counters (tenant, meter, period_start, stripe, counter)
			VALUES (g.tenant, g.meter, g.period_start, merged_stripe, merged);
		END IF;
		periods := periods + 1;
	END LOOP;
	RETURN periods;
END $$;
COMMENT ON FUNCTION flagmeter.merge_idle_stripes(xid8) IS
'merges the track stripes of each period that no transaction holds and that were last written below written_before into its merged stripe (32767); returns how many periods it merged';

-- Pending usage (src/pending*.c): track's amounts that no counter row holds
-- yet, in shared memory when flagmeter is preloaded, always in the events
-- (period_start not NULL, xid at or above counted_through).
CREATE FUNCTION flagmeter.fold_pending()
RETURNS xid8
AS 'MODULE_PATHNAME', 'fm_fold_pending'
LANGUAGE C VOLATILE STRICT PARALLEL UNSAFE;
COMMENT ON FUNCTION flagmeter.fold_pending() IS
'maintain()''s fold of the pending usage shared memory holds into the merged stripes; returns the new counted_through, NULL when there is nothing it may fold now';

CREATE FUNCTION flagmeter.pending_in_memory()
RETURNS boolean
AS 'MODULE_PATHNAME', 'fm_pending_in_memory'
LANGUAGE C VOLATILE STRICT PARALLEL UNSAFE;
COMMENT ON FUNCTION flagmeter.pending_in_memory() IS
'whether shared memory holds this database''s pending usage (flagmeter preloaded, rebuilt since the start)';

CREATE FUNCTION flagmeter.pending_forget()
RETURNS void
AS 'MODULE_PATHNAME', 'fm_pending_forget'
LANGUAGE C VOLATILE STRICT PARALLEL UNSAFE;
COMMENT ON FUNCTION flagmeter.pending_forget() IS
'empties shared memory of this database''s pending usage, to be rebuilt from the events at the next call (after_restore)';

CREATE FUNCTION flagmeter.pending_events_folded()
RETURNS void
AS 'MODULE_PATHNAME', 'fm_pending_events_folded'
LANGUAGE C VOLATILE STRICT PARALLEL UNSAFE;
COMMENT ON FUNCTION flagmeter.pending_events_folded() IS
'after fold_pending_events: shared memory holds this database''s (now empty) pending usage once the transaction commits';

CREATE FUNCTION flagmeter.pending_usage_stats(
	OUT status text, OUT periods bigint, OUT transactions bigint,
	OUT added bigint, OUT no_room bigint, OUT folded bigint, OUT rebuilt bigint,
	OUT slots bigint)
RETURNS record
AS 'MODULE_PATHNAME', 'fm_pending_usage_stats'
LANGUAGE C VOLATILE STRICT PARALLEL UNSAFE;
COMMENT ON FUNCTION flagmeter.pending_usage_stats() IS
'where this database''s pending usage is read from, its periods and unsettled transactions in shared memory, and since the server started: amounts added, tracks sent to a stripe for want of room, periods folded, rebuilds';

-- The pending events of transactions in [low, high) into the merged stripes:
-- maintain() when shared memory does not hold them.
CREATE FUNCTION flagmeter.fold_pending_events(low xid8, high xid8)
RETURNS bigint
LANGUAGE sql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
	WITH folded AS (
		INSERT INTO flagmeter.counters AS c (tenant, meter, period_start, stripe, counter)
		SELECT e.tenant, e.meter, e.period_start, 32767,
		       flagmeter.quota_counter_agg(e.amount, e.occurred_at)
		FROM flagmeter.events e
		WHERE e.period_start IS NOT NULL
		  AND e.xid >= flagmeter.xid_int(low) AND e.xid < flagmeter.xid_int(high)
		GROUP BY e.tenant, e.meter, e.period_start
		ON CONFLICT (tenant, meter, period_start, stripe) DO UPDATE
		SET counter = c.counter OPERATOR(flagmeter.+) excluded.counter
		RETURNING 1)
	SELECT count(*) FROM folded;
$$;
COMMENT ON FUNCTION flagmeter.fold_pending_events(xid8, xid8) IS
'adds the pending events of transactions in [low, high) to their periods'' merged stripes; returns how many periods it wrote';

CREATE FUNCTION flagmeter.maintain(
	OUT events_folded bigint, OUT voids_folded bigint,
	OUT partitions_created integer, OUT partitions_dropped integer,
	OUT keys_expired bigint, OUT periods_compacted bigint,
	OUT duration interval)
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	started timestamptz := clock_timestamp();
	low xid8;
	high xid8;
	counted_low xid8;
	counted xid8;
	cluster bigint;
	cutoff timestamptz;
BEGIN
	-- One run at a time: a concurrent run waits here, then starts from the
	-- watermark this one leaves.
	INSERT INTO flagmeter.maintenance_state (system_identifier)
	SELECT c.system_identifier FROM pg_control_system() c
	ON CONFLICT ON CONSTRAINT maintenance_state_pkey DO NOTHING;
	SELECT m.folded_through, m.system_identifier INTO low, cluster
	FROM flagmeter.maintenance_state m FOR UPDATE;

	-- Transaction ids only mean something in the cluster that assigned them.
	IF cluster IS DISTINCT FROM (SELECT c.system_identifier FROM pg_control_system() c) THEN
		RAISE EXCEPTION 'flagmeter''s usage was folded in another cluster'
			USING ERRCODE = 'object_not_in_prerequisite_state',
			      DETAIL = 'The data was restored from a dump or copied from another cluster; '
			               'the fold watermark refers to that cluster''s transaction ids.',
			      HINT = 'Run SELECT flagmeter.after_restore() once, before tracking resumes.';
	END IF;
	-- Every transaction with an id below the xmin has ended.
	high := pg_snapshot_xmin(pg_current_snapshot());

	IF high > low THEN
		SELECT f.events_folded, f.voids_folded INTO events_folded, voids_folded
		FROM flagmeter.fold_band(low, high) f;
	ELSE
		high := low;
		events_folded := 0;
		voids_folded := 0;
	END IF;

	-- Pending usage into the counter rows, before compaction reads them.
	SELECT m.counted_through INTO counted_low FROM flagmeter.maintenance_state m;
	IF flagmeter.pending_in_memory() THEN
		counted := flagmeter.fold_pending();
	ELSIF pg_snapshot_xmin(pg_current_snapshot()) > counted_low THEN
		counted := pg_snapshot_xmin(pg_current_snapshot());
		PERFORM flagmeter.fold_pending_events(counted_low, counted);
		PERFORM flagmeter.pending_events_folded();
	END IF;
	IF counted > counted_low THEN
		UPDATE flagmeter.maintenance_state SET counted_through = counted;
	END IF;

	cutoff := now() - (SELECT s.retention FROM flagmeter.current_settings s);
	DELETE FROM flagmeter.event_keys k WHERE k.recorded_at < cutoff;
	GET DIAGNOSTICS keys_expired = ROW_COUNT;
	DELETE FROM flagmeter.voids v WHERE v.voided_at < cutoff AND v.xid < high;
	DELETE FROM flagmeter.reservations r WHERE r.expires_at < cutoff;
	DELETE FROM flagmeter.rollovers r WHERE r.expires_at < cutoff;
	-- the sets of unique meters' periods and their sightings, like events
	DELETE FROM flagmeter.unique_values u WHERE u.period_end < cutoff;
	DELETE FROM flagmeter.value_sightings s WHERE s.day < (cutoff AT TIME ZONE 'UTC')::date;

	periods_compacted := flagmeter.compact_counters();
	PERFORM flagmeter.summarize_event_partitions();

	-- Tenants blocked in periods that have ended are unblocked, and app
	-- instances that missed notifications (queue too full) are told to
	-- resync; both announce at commit.
	PERFORM flagmeter.review_blocks();
	-- the unused quota of periods that have ended, as credit grants
	PERFORM flagmeter.roll_over();
	PERFORM flagmeter.announce_expired_grants();
	PERFORM flagmeter.send_resync_hint();
	-- A threshold row is what makes a threshold announced once per period:
	-- it goes only when its period has surely ended (the longest periods
	-- but lifetime last a year); lifetime thresholds stay.
	-- Events skipped under backpressure stay until a hint announced them.
	DELETE FROM flagmeter.outbox o
	WHERE o.created_at < cutoff
	  AND (o.kind <> 'threshold' OR o.period_start < cutoff - interval '1 year 1 day')
	  AND (o.notified OR o.version <= (SELECT m.resync_sent_through FROM flagmeter.maintenance_state m));
	DELETE FROM flagmeter.notification_skips k WHERE k.skipped_at < cutoff;

	-- Near the end: a track that writes a stripe being merged waits for
	-- the commit.  Before the partitions, which hold inserts until then
	-- (and give up on a lock after 50 ms rather than wait for such a track).
	periods_compacted := periods_compacted + flagmeter.merge_idle_stripes(low);

	-- Last, since they hold table locks until the commit that follows.
	partitions_created := flagmeter.create_partitions();
	partitions_dropped := flagmeter.drop_expired_partitions(high);

	duration := clock_timestamp() - started;
	UPDATE flagmeter.maintenance_state m
	SET folded_through = high,
	    runs = m.runs + 1,
	    last_run_at = started,
	    last_run_duration = maintain.duration,
	    last_run_folded = maintain.events_folded,
	    total_folded = m.total_folded + maintain.events_folded,
	    total_voids_folded = m.total_voids_folded + maintain.voids_folded;
END $$;
COMMENT ON FUNCTION flagmeter.maintain() IS
'folds pending usage into the hourly and daily rollups, creates upcoming partitions, drops expired ones, expires idempotency keys, compacts ended periods, merges idle stripes, rolls unused quota over into credit grants (roll_over); idempotent, cheap when idle, one run at a time';

-- Scheduling with pg_cron ---------------------------------------------------------

CREATE FUNCTION flagmeter.schedule(schedule text DEFAULT '* * * * *')
RETURNS bigint
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	job bigint;
BEGIN
	IF NOT EXISTS (SELECT FROM pg_extension e WHERE e.extname = 'pg_cron') THEN
		RAISE EXCEPTION 'extension "pg_cron" is not installed in this database'
			USING ERRCODE = 'undefined_object',
			      HINT = 'Add pg_cron to shared_preload_libraries, set cron.database_name to this database, '
			             'restart and run CREATE EXTENSION pg_cron; or call flagmeter.maintain() every minute '
			             'from any scheduler.';
	END IF;
	-- dynamic SQL: flagmeter must not depend on the cron schema existing
	EXECUTE 'SELECT cron.schedule($1, $2, $3)'
		INTO job USING 'flagmeter-maintain', schedule, 'SELECT flagmeter.maintain()';
	RETURN job;
END $$;
COMMENT ON FUNCTION flagmeter.schedule(text) IS
'registers flagmeter.maintain() as the pg_cron job "flagmeter-maintain" (every minute by default); returns the job id; an error with a hint when pg_cron is not installed here';

CREATE FUNCTION flagmeter.unschedule()
RETURNS boolean
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	found_job boolean;
BEGIN
	IF NOT EXISTS (SELECT FROM pg_extension e WHERE e.extname = 'pg_cron') THEN
		RAISE EXCEPTION 'extension "pg_cron" is not installed in this database'
			USING ERRCODE = 'undefined_object';
	END IF;
	EXECUTE 'SELECT EXISTS (SELECT FROM cron.job WHERE jobname = $1 AND username = current_user)'
		INTO found_job USING 'flagmeter-maintain';
	IF NOT found_job THEN
		RETURN false;
	END IF;
	EXECUTE 'SELECT cron.unschedule($1)' USING 'flagmeter-maintain';
	RETURN true;
END $$;
COMMENT ON FUNCTION flagmeter.unschedule() IS
'removes the pg_cron job "flagmeter-maintain"; false when there was none';

-- After pg_dump/pg_restore (or any copy into another cluster) the events'
-- transaction ids and the watermark come from the old cluster, where they
-- were assigned; this cluster's ids are unrelated.  after_restore() folds
-- what the old cluster had not folded yet, then renumbers the copied rows
-- so that they all lie below this cluster's current xmin, and moves the
-- watermark there.  Run it once after restoring, before tracking resumes:
-- it takes the events' tables exclusively while it runs.
CREATE FUNCTION flagmeter.after_restore(OUT events_folded bigint, OUT voids_folded bigint,
	OUT rows_renumbered bigint)
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	low xid8;
	here bigint := (SELECT c.system_identifier FROM pg_control_system() c);
	cluster bigint;
	n bigint;
BEGIN
	SELECT m.folded_through, m.system_identifier INTO low, cluster
	FROM flagmeter.maintenance_state m FOR UPDATE;
	IF NOT FOUND OR cluster = here THEN
		RAISE EXCEPTION 'flagmeter''s data was not restored from another cluster'
			USING ERRCODE = 'object_not_in_prerequisite_state',
			      HINT = 'after_restore() is for the first run after a restore; use maintain().';
	END IF;
	LOCK TABLE flagmeter.events, flagmeter.voids IN EXCLUSIVE MODE;

	-- everything the old cluster had not folded: all of it has committed
	SELECT f.events_folded, f.voids_folded INTO events_folded, voids_folded
	FROM flagmeter.fold_band(low, '18446744073709551615'::xid8) f;
	-- and its pending usage into the counter rows; what shared memory read
	-- of it here (old ids) is rebuilt from the renumbered events
	PERFORM flagmeter.fold_pending_events(
		(SELECT m.counted_through FROM flagmeter.maintenance_state m),
		'18446744073709551615'::xid8);
	PERFORM flagmeter.pending_forget();

	-- below this cluster's xmin, so that no copied row looks unfolded
	UPDATE flagmeter.events e SET xid = 0 WHERE e.xid <> 0;
	GET DIAGNOSTICS rows_renumbered = ROW_COUNT;
	UPDATE flagmeter.voids v SET xid = '0' WHERE v.xid <> '0';
	GET DIAGNOSTICS n = ROW_COUNT;
	rows_renumbered := rows_renumbered + n;

	UPDATE flagmeter.maintenance_state
	SET system_identifier = here,
	    folded_through = pg_snapshot_xmin(pg_current_snapshot()),
	    counted_through = pg_snapshot_xmin(pg_current_snapshot());
END $$;
COMMENT ON FUNCTION flagmeter.after_restore() IS
'run once after restoring a dump into another cluster, before tracking resumes: folds what was not folded and renumbers the copied events so maintain() can go on';
-- ---------------------------------------------------------------------------
-- Dashboard and operator views: status, usage_series, top_tenants, stats.
-- They read the counters and the rollups (plus the events not folded yet),
-- never all raw events, so a dashboard over a year stays fast.
-- ---------------------------------------------------------------------------

CREATE VIEW flagmeter.status AS
SELECT l.tenant, l.meter, b.period_start, b.period_end,
       flagmeter.used_by(u.counter, l.aggregation) AS used,
       l.quota,
       GREATEST(l.quota - flagmeter.used_by(u.counter, l.aggregation), 0) AS remaining,
       flagmeter.used_by(u.counter, l.aggregation)::double precision / l.quota AS ratio,
       CASE
           WHEN flagmeter.used_by(u.counter, l.aggregation) >= l.quota THEN 'exceeded'
           WHEN flagmeter.used_by(u.counter, l.aggregation) * 100 >= l.quota * l.thresholds[1] THEN 'warning'
           ELSE 'ok'
       END AS state,
       l.mode, l.period, l.plan
FROM flagmeter.effective_limits l
CROSS JOIN LATERAL flagmeter.period_bounds(now(), l.period, l.anchor, l.timezone) b
CROSS JOIN LATERAL (SELECT flagmeter.usage(l.tenant, l.meter) AS counter) u;
COMMENT ON VIEW flagmeter.status IS
'one row per tenant and limited meter for the current period: used, quota, remaining, ratio, and state (ok below the lowest threshold, warning from it, exceeded once used >= quota); exact';

-- The status of one tenant, as a call that takes the tenant first: what a
-- PL/Proxy proxy routes to the tenant's shard (a view cannot be routed).
CREATE FUNCTION flagmeter.status(tenant text)
RETURNS SETOF flagmeter.status
LANGUAGE sql STABLE PARALLEL SAFE
AS $$
SELECT s.* FROM flagmeter.status s WHERE s.tenant OPERATOR(pg_catalog.=) $1 ORDER BY s.meter
$$;
COMMENT ON FUNCTION flagmeter.status(text) IS
'the rows of the status view for one tenant, by meter';

CREATE FUNCTION flagmeter.top_tenants(meter text, n integer DEFAULT 10, by text DEFAULT 'used')
RETURNS SETOF flagmeter.status
LANGUAGE plpgsql STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	PERFORM flagmeter.check_meter_exists(meter);
	IF n IS NULL OR n < 1 THEN
		RAISE EXCEPTION 'n must be a positive number of tenants' USING ERRCODE = 'invalid_parameter_value';
	END IF;
	IF by IS NULL OR NOT by = ANY (ARRAY['used', 'ratio']) THEN
		RAISE EXCEPTION 'invalid ranking "%"', left(by, 64) USING ERRCODE = 'invalid_parameter_value',
			HINT = 'Rank by "used" or by "ratio".';
	END IF;
	RETURN QUERY
	SELECT s.* FROM flagmeter.status s
	WHERE s.meter = top_tenants.meter
	ORDER BY CASE WHEN by = 'used' THEN s.used::double precision ELSE s.ratio END DESC, s.tenant
	LIMIT n;
END $$;
COMMENT ON FUNCTION flagmeter.top_tenants(text, integer, text) IS
'the n tenants with a limit on the meter that use the most in their current period, ranked by used or by ratio';

-- The usage of one tenant (NULL: of all tenants together) and meter per
-- bucket, zero buckets included: the body of usage_series and
-- usage_series_all.  Folded usage comes from the rollups (hourly for hour
-- buckets and for time zones other than UTC, daily otherwise); events not
-- folded yet are added from the raw events above the watermark.  Minute
-- buckets are finer than any rollup: they are counted from the raw events
-- alone, folded or not, less every void, so they reach back only as far as
-- the retention keeps raw events (and voids), and span at most a week
-- (10 080 buckets) to keep a mistaken call from reading months of events.
-- The tenant test is "IS NULL OR =": the plans of a call for one tenant are
-- custom plans with that test folded, so they keep the primary-key scans.
CREATE FUNCTION flagmeter.series(tenant text, meter text, "from" timestamptz, "to" timestamptz,
	bucket text, timezone text)
RETURNS TABLE (bucket_start timestamptz, used bigint, counter flagmeter.quota_counter)
LANGUAGE plpgsql STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	aggregation text;
	step interval;
	first_bucket timestamptz;
	watermark xid8 := (SELECT m.folded_through FROM flagmeter.current_state m);
BEGIN
	PERFORM flagmeter.check_meter_exists(meter);
	SELECT m.aggregation INTO aggregation FROM flagmeter.meters m WHERE m.meter = series.meter;
	IF "from" IS NULL OR "to" IS NULL OR NOT isfinite("from") OR NOT isfinite("to") THEN
		RAISE EXCEPTION 'from and to must be finite timestamps' USING ERRCODE = 'invalid_parameter_value';
	END IF;
	IF bucket IS NULL OR NOT bucket = ANY (ARRAY['minute', 'hour', 'day', 'week', 'month']) THEN
		RAISE EXCEPTION 'invalid bucket "%"', left(bucket, 64) USING ERRCODE = 'invalid_parameter_value',
			HINT = 'Valid buckets are "minute", "hour", "day", "week" and "month".';
	END IF;
	PERFORM flagmeter.check_timezone(timezone);	-- a zone name, NULL refused
	IF "to" <= "from" THEN
		RETURN;
	END IF;
	IF "to" - "from" > interval '3660 days' THEN
		RAISE EXCEPTION 'a series spans at most ten years' USING ERRCODE = 'program_limit_exceeded';
	END IF;
	step := ('1 ' || bucket)::interval;
	first_bucket := date_trunc(bucket, "from", timezone);
	IF aggregation = 'unique' THEN
		RETURN QUERY SELECT * FROM flagmeter.unique_series(tenant, meter, first_bucket, "to", bucket, timezone);
		RETURN;
	END IF;
	IF bucket = 'minute' THEN
		IF "to" - "from" > interval '7 days' THEN
			RAISE EXCEPTION 'a series of minute buckets spans at most 7 days' USING ERRCODE = 'program_limit_exceeded',
				HINT = 'Use hour buckets for longer series.';
		END IF;
		-- raw events recorded before the cut-off may be gone (drop_expired_partitions)
		IF first_bucket < now() - (SELECT s.retention FROM flagmeter.current_settings s) THEN
			RAISE EXCEPTION 'minute buckets reach back only as far as the retention'
				USING ERRCODE = 'invalid_parameter_value',
				DETAIL = 'Minute buckets are counted from the raw events, which are kept only for the retention (flagmeter.current_settings).',
				HINT = 'Use hour buckets for older usage.';
		END IF;
	END IF;

	RETURN QUERY
	WITH buckets AS (
		-- local-time steps, so day and month buckets follow DST and month lengths
		SELECT (s.local_start AT TIME ZONE timezone) AS b
		FROM generate_series(first_bucket AT TIME ZONE timezone,
		                     ("to" - interval '1 microsecond') AT TIME ZONE timezone,
		                     step) AS s(local_start)
	), folded AS (
		SELECT date_trunc(bucket, r.bucket_start, timezone) AS b, r.counter
		FROM flagmeter.rollup_hour r
		WHERE bucket <> 'minute' AND (bucket = 'hour' OR timezone <> 'UTC')
		  AND (series.tenant IS NULL OR r.tenant = series.tenant) AND r.meter = series.meter
		  AND r.bucket_start >= first_bucket AND r.bucket_start < "to"
		UNION ALL
		SELECT date_trunc(bucket, r.bucket_start, timezone), r.counter
		FROM flagmeter.rollup_day r
		WHERE bucket <> ALL (ARRAY['minute', 'hour']) AND timezone = 'UTC'
		  AND (series.tenant IS NULL OR r.tenant = series.tenant) AND r.meter = series.meter
		  AND r.bucket_start >= first_bucket AND r.bucket_start < "to"
		UNION ALL
		SELECT date_trunc(bucket, e.occurred_at, timezone),
		       flagmeter.event_counter(e.amount, e.occurred_at)
		FROM flagmeter.events e
		WHERE bucket <> 'minute'
		  AND (series.tenant IS NULL OR e.tenant = series.tenant) AND e.meter = series.meter
		  AND e.occurred_at >= first_bucket AND e.occurred_at < "to"
		  AND e.xid >= flagmeter.xid_int(watermark)
		UNION ALL
		-- minute buckets: every raw event, one aggregate per minute
		SELECT date_trunc('minute', e.occurred_at, timezone),
		       flagmeter.quota_counter_agg(e.amount, e.occurred_at)
		FROM flagmeter.events e
		WHERE bucket = 'minute'
		  AND (series.tenant IS NULL OR e.tenant = series.tenant) AND e.meter = series.meter
		  AND e.occurred_at >= first_bucket AND e.occurred_at < "to"
		GROUP BY 1
	), pending_voids AS (
		-- the voids the rollups read do not hold yet (minute buckets: every void)
		SELECT date_trunc(bucket, v.occurred_at, timezone) AS b, sum(v.amount)::bigint AS amount, count(*) AS n
		FROM (SELECT v.occurred_at, v.amount FROM flagmeter.voids v
		      WHERE bucket <> 'minute' AND v.xid >= watermark
		        AND (series.tenant IS NULL OR v.tenant = series.tenant) AND v.meter = series.meter
		      UNION ALL
		      SELECT v.occurred_at, v.amount FROM flagmeter.voids v
		      WHERE bucket = 'minute'
		        AND (series.tenant IS NULL OR v.tenant = series.tenant) AND v.meter = series.meter) v
		WHERE v.occurred_at >= first_bucket AND v.occurred_at < "to"
		GROUP BY 1
	), merged AS (
		SELECT f.b, flagmeter.merge_agg(f.counter) AS counter FROM folded f GROUP BY f.b
	), net AS (
		SELECT m.b, CASE WHEN p.n IS NULL THEN m.counter
		                 ELSE flagmeter.subtract_events(m.counter, p.amount, p.n) END AS counter
		FROM merged m LEFT JOIN pending_voids p ON p.b = m.b
	)
	SELECT k.b,
	       COALESCE(flagmeter.used_by(n.counter, aggregation), 0),
	       COALESCE(n.counter, 'used=0 events=0 max=0'::flagmeter.quota_counter)
	FROM buckets k
	LEFT JOIN net n ON n.b = k.b
	ORDER BY k.b;
END $$;
COMMENT ON FUNCTION flagmeter.series(text, text, timestamptz, timestamptz, text, text) IS
'usage of a tenant (NULL: all tenants) and meter per bucket: the body of usage_series and usage_series_all';

CREATE FUNCTION flagmeter.usage_series(tenant text, meter text, "from" timestamptz, "to" timestamptz,
	bucket text DEFAULT 'day', timezone text DEFAULT 'UTC')
RETURNS TABLE (bucket_start timestamptz, used bigint, counter flagmeter.quota_counter)
LANGUAGE plpgsql STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	PERFORM flagmeter.check_tenant(tenant);
	RETURN QUERY SELECT * FROM flagmeter.series(tenant, meter, "from", "to", bucket, timezone);
END $$;
COMMENT ON FUNCTION flagmeter.usage_series(text, text, timestamptz, timestamptz, text, text) IS
'usage of a tenant and meter per minute, hour, day, week (from Monday) or month bucket (in the given time zone) from "from" up to "to", zero buckets included; includes events not folded yet; minute buckets from the raw events, within the retention and at most 7 days';

CREATE FUNCTION flagmeter.usage_series_all(meter text, "from" timestamptz, "to" timestamptz,
	bucket text DEFAULT 'day', timezone text DEFAULT 'UTC')
RETURNS TABLE (bucket_start timestamptz, used bigint, counter flagmeter.quota_counter)
LANGUAGE sql STABLE PARALLEL SAFE
AS $$
SELECT * FROM flagmeter.series(NULL, $1, $2, $3, $4, $5)
$$;
COMMENT ON FUNCTION flagmeter.usage_series_all(text, timestamptz, timestamptz, text, text) IS
'usage of all tenants together of a meter per minute, hour, day, week or month bucket, like usage_series: counter merges every tenant''s events of the bucket';

-- ---------------------------------------------------------------------------
-- "What may this tenant do": every feature and every limited meter of each
-- assigned tenant in one relation, the one query an app or a dashboard needs.
-- ---------------------------------------------------------------------------

CREATE VIEW flagmeter.entitlements AS
SELECT f.tenant, 'feature'::pg_catalog.text AS kind, f.feature AS name, f.plan,
       f.enabled, f.config, f.source,
       NULL::bigint AS quota, NULL::bigint AS used, NULL::bigint AS remaining,
       NULL::timestamptz AS resets_at, NULL::pg_catalog.text AS state
FROM flagmeter.tenant_features f
UNION ALL
SELECT s.tenant, 'meter', s.meter, s.plan,
       s.mode OPERATOR(pg_catalog.=) 'soft' OR s.used OPERATOR(pg_catalog.<) s.quota,
       NULL, CASE WHEN o.tenant IS NOT NULL THEN 'override' ELSE 'plan' END,
       s.quota, s.used, s.remaining,
       CASE WHEN pg_catalog.isfinite(s.period_end) THEN s.period_end END, s.state
FROM flagmeter.status s
LEFT JOIN flagmeter.overrides o
       ON o.tenant OPERATOR(pg_catalog.=) s.tenant AND o.meter OPERATOR(pg_catalog.=) s.meter;
COMMENT ON VIEW flagmeter.entitlements IS
'per assigned tenant: every feature (kind feature: enabled, config, source override, plan or none) and every limited meter of its current period (kind meter: quota, used, remaining, resets_at, state; enabled is false once a hard limit is reached)';
-- ---------------------------------------------------------------------------
-- Notifications: the outbox of quota events, block state, the invalidate
-- trigger for app tables, and the operator stats.
--
-- Channel "flagmeter"; JSON payloads under 1 kB.  Quota events are written
-- to the outbox at commit (src/notify.c) with versions in commit order, so
-- "what changed since version V" misses nothing; notifications are hints,
-- the outbox is the record.
-- ---------------------------------------------------------------------------

CREATE SEQUENCE flagmeter.outbox_version;
COMMENT ON SEQUENCE flagmeter.outbox_version IS
'versions of outbox rows, drawn at commit in commit order';

CREATE TABLE flagmeter.outbox (
	version			bigint PRIMARY KEY,
	created_at		timestamptz NOT NULL DEFAULT pg_catalog.now(),
	kind			text NOT NULL
		CONSTRAINT outbox_kind_valid
		CHECK (kind OPERATOR(pg_catalog.=) ANY (ARRAY['threshold', 'blocked', 'unblocked',
		                                              'limit_changed', 'plan_changed',
		                                              'feature_changed', 'grant_low', 'grant_exhausted',
		                                              'grant_expired'])),
	tenant			text,
	meter			text,
	plan			text,
	period_start	timestamptz,
	threshold		integer,
	used			bigint,
	quota			bigint,
	resets_at		timestamptz,
	period			text,
	mode			text,
	thresholds		integer[],
	feature			text,
	enabled			boolean,
	config			jsonb,
	notified		boolean NOT NULL,
	grant_id		bigint			-- grant events (47_credits.sql)
);
-- a threshold is announced once per tenant, meter and period
CREATE UNIQUE INDEX outbox_threshold_once ON flagmeter.outbox (tenant, meter, period_start, threshold)
	WHERE kind OPERATOR(pg_catalog.=) 'threshold'::pg_catalog.text;
CREATE INDEX outbox_created_at ON flagmeter.outbox USING brin (created_at);
-- a grant event is announced once per grant and kind
CREATE UNIQUE INDEX outbox_grant_once ON flagmeter.outbox (grant_id, kind) WHERE grant_id IS NOT NULL;
COMMENT ON TABLE flagmeter.outbox IS
'every quota event (threshold reached, blocked, unblocked, limit, plan or feature changed, a credit grant low, exhausted or expired: grant_id, used = drawn, quota = amount, threshold = the low percent) with a version in commit order; resets_at: when a blocked period ends; quota, period, mode, thresholds of limit_changed: the limit now in force; feature, enabled, config of feature_changed: the plan''s row for the feature (tenant NULL) or the tenant''s override of it (enabled NULL: the row is gone); notified is false when the notification was skipped under backpressure; a negative version marks a threshold row copied from another shard by a tenant move (kept so that the threshold is not announced twice, never replayed)';

CREATE TABLE flagmeter.blocked (
	tenant			text NOT NULL,
	meter			text NOT NULL,
	period_start	timestamptz NOT NULL,
	blocked_at		timestamptz NOT NULL,
	resets_at		timestamptz,
	PRIMARY KEY (tenant, meter, period_start)
);
COMMENT ON TABLE flagmeter.blocked IS
'tenants whose usage reached a hard limit in a period, until a void, a limit change or the end of the period (resets_at, NULL for lifetime) brings them back under it';

CREATE TABLE flagmeter.notification_skips (
	skipped_at		timestamptz NOT NULL DEFAULT pg_catalog.now(),
	kind			text NOT NULL,
	detail			text
);
COMMENT ON TABLE flagmeter.notification_skips IS
'invalidations not sent because the NOTIFY queue was fuller than flagmeter.notify_queue_limit';

SELECT pg_catalog.pg_extension_config_dump('flagmeter.outbox', '');
SELECT pg_catalog.pg_extension_config_dump('flagmeter.outbox_version', '');
SELECT pg_catalog.pg_extension_config_dump('flagmeter.blocked', '');

CREATE FUNCTION flagmeter.announce(kind text, tenant text, meter text, plan text DEFAULT NULL,
	period_start timestamptz DEFAULT NULL, used bigint DEFAULT NULL, quota bigint DEFAULT NULL,
	period text DEFAULT NULL, mode text DEFAULT NULL, thresholds integer[] DEFAULT NULL)
RETURNS void
AS 'MODULE_PATHNAME', 'fm_announce'
LANGUAGE C VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE;
COMMENT ON FUNCTION flagmeter.announce(text, text, text, text, timestamptz, bigint, bigint, text, text, integer[]) IS
'queues a quota event (blocked, unblocked, limit_changed, plan_changed) to be recorded and announced when the transaction commits; quota, period, mode and thresholds of limit_changed give the limit now in force';

-- feature_changed, queued as announce queues the other kinds (src/notify.c).
-- It announces the rows a client caches, not derived answers:
--   - set_feature: the plan's row (tenant NULL), when it changed; it
--     decides for every tenant of the plan that does not override the
--     feature, and a client applies it to those it caches;
--   - override_feature: the tenant's override, when it changed;
--   - drop_feature_override: the tenant's override gone (enabled NULL);
--   - drop_plan: each of the plan's rows gone (enabled NULL), so that a
--     plan defined again under the name starts without them.
-- A tenant's plan moves with plan_changed (assign_plan, unassign_tenant,
-- whose tenant loses its overrides with its row): the features are then
-- the new plan's rows, and its overrides.
CREATE FUNCTION flagmeter.announce_feature(tenant text, plan text, feature text,
	enabled boolean, config jsonb DEFAULT NULL)
RETURNS void
AS 'MODULE_PATHNAME', 'fm_announce_feature'
LANGUAGE C VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE;
COMMENT ON FUNCTION flagmeter.announce_feature(text, text, text, boolean, jsonb) IS
'queues a feature_changed event, recorded and announced when the transaction commits: a plan''s row for a feature (tenant NULL) or a tenant''s override (plan NULL); enabled NULL: the row is gone';

-- What the current usage reaches after a configuration change (src/review.c).
CREATE FUNCTION flagmeter.review_usage(tenant text, meter text)
RETURNS void
AS 'MODULE_PATHNAME', 'fm_review_usage'
LANGUAGE C VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE;
COMMENT ON FUNCTION flagmeter.review_usage(text, text) IS
'queues the thresholds and the blocked event that the current period''s usage of a tenant and meter reaches under the limit in force (after a configuration change), announced at commit';

-- Unblocks the blocked tenants (optionally of one tenant, meter or plan)
-- whose usage is back under their hard limit, or whose period has ended,
-- or whose limit is gone or soft.
CREATE FUNCTION flagmeter.review_blocks(tenant text DEFAULT NULL, meter text DEFAULT NULL,
	plan text DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	b record;
	cfg record;
	used bigint;
	unblocked integer := 0;
BEGIN
	FOR b IN
		SELECT bl.tenant, bl.meter, bl.period_start
		FROM flagmeter.blocked bl
		LEFT JOIN flagmeter.tenants t ON t.tenant = bl.tenant
		WHERE (review_blocks.tenant IS NULL OR bl.tenant = review_blocks.tenant)
		  AND (review_blocks.meter IS NULL OR bl.meter = review_blocks.meter)
		  AND (review_blocks.plan IS NULL OR t.plan = review_blocks.plan)
		ORDER BY 1, 2, 3
	LOOP
		SELECT * INTO cfg FROM flagmeter.limit_config(b.tenant, b.meter);
		-- the usage of the blocked period (lifetime periods start at -infinity);
		-- none for a tenant with no plan any more, whose usage() may be refused
		used := CASE WHEN cfg.aggregation IS NULL OR cfg.plan IS NULL THEN NULL
		             ELSE flagmeter.used_by(flagmeter.usage(b.tenant, b.meter,
		                      CASE WHEN isfinite(b.period_start) THEN b.period_start ELSE now() END),
		                      cfg.aggregation) END;
		IF cfg.aggregation IS NULL OR cfg.quota IS NULL OR cfg.mode = 'soft'
		   OR (flagmeter.period_bounds(now(), cfg.period, cfg.anchor, cfg.timezone)).period_start <> b.period_start
		   OR used < cfg.quota
		THEN
			PERFORM flagmeter.announce('unblocked', b.tenant, b.meter, NULL, b.period_start, used, cfg.quota);
			unblocked := unblocked + 1;
		END IF;
	END LOOP;
	RETURN unblocked;
END $$;
COMMENT ON FUNCTION flagmeter.review_blocks(text, text, text) IS
'announces "unblocked" for blocked tenants that are back under their hard limit (limit raised or removed, usage voided, period ended); returns how many';

-- After notifications were skipped under backpressure (quota events kept in
-- the outbox, or invalidations), one hint tells app instances to resync,
-- once the queue has room again: {"kind":"resync","version":S} where S is
-- the greatest version skipped so far, with "invalidations":true when
-- invalidations were skipped since the last hint.  An instance whose last
-- version is below S replays changes_since(its version).  (One that
-- received a later notification already saw the gap in its prev_version.)
CREATE FUNCTION flagmeter.send_resync_hint()
RETURNS boolean
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	state flagmeter.current_state;
	skipped_through bigint;
	invalidations boolean;
	limit_setting double precision :=
		COALESCE(current_setting('flagmeter.notify_queue_limit', true)::double precision, 0.5);
BEGIN
	SELECT * INTO state FROM flagmeter.current_state;
	SELECT max(o.version) INTO skipped_through
	FROM flagmeter.outbox o
	WHERE NOT o.notified AND o.version > state.resync_sent_through;
	invalidations := EXISTS (SELECT FROM flagmeter.notification_skips k
	                         WHERE k.skipped_at > COALESCE(state.resync_sent_at, '-infinity'));
	IF skipped_through IS NULL AND NOT invalidations THEN
		RETURN false;
	END IF;
	IF pg_notification_queue_usage() > limit_setting THEN
		RETURN false;
	END IF;
	skipped_through := COALESCE(skipped_through, state.resync_sent_through);
	PERFORM pg_notify('flagmeter', format('{"kind":"resync","version":%s%s}', skipped_through,
	                                      CASE WHEN invalidations THEN ',"invalidations":true' ELSE '' END));
	UPDATE flagmeter.maintenance_state
	SET resync_sent_through = skipped_through, resync_sent_at = now();
	RETURN true;
END $$;
COMMENT ON FUNCTION flagmeter.send_resync_hint() IS
'sends one "resync" notification ({"kind":"resync","version":S}, S the greatest skipped version, "invalidations":true when invalidations were skipped) when notifications were skipped under backpressure and the queue has room again';

CREATE FUNCTION flagmeter.changes_since(version bigint)
RETURNS SETOF flagmeter.outbox
LANGUAGE plpgsql STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	-- a client that lost its version must resync, not believe it is in sync
	IF version IS NULL THEN
		RAISE EXCEPTION 'version must not be NULL' USING ERRCODE = 'null_value_not_allowed',
			HINT = 'Start from flagmeter.latest_version() after reading the state you cache.';
	END IF;
	-- rows a tenant move copied here have negative versions: history, not news
	RETURN QUERY SELECT o.* FROM flagmeter.outbox o
	WHERE o.version > changes_since.version AND o.version > 0
	ORDER BY o.version;
END $$;
COMMENT ON FUNCTION flagmeter.changes_since(bigint) IS
'the quota events recorded after version, in version (= commit) order: what an app instance that was disconnected must replay';

CREATE FUNCTION flagmeter.latest_version()
RETURNS bigint
LANGUAGE sql STABLE PARALLEL SAFE
AS $$
SELECT GREATEST(pg_catalog.max(o.version), 0) FROM flagmeter.outbox o
$$;
COMMENT ON FUNCTION flagmeter.latest_version() IS
'the version of the latest recorded quota event (0 when none): where a fresh app instance starts';

CREATE FUNCTION flagmeter.invalidate()
RETURNS trigger
AS 'MODULE_PATHNAME', 'fm_invalidate'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION flagmeter.invalidate() IS
'trigger for app tables: AFTER INSERT OR UPDATE OR DELETE (OR TRUNCATE), per row or per statement (with transition tables for keys); arguments name the key columns (default: the primary key); one notification per table per transaction at commit';

CREATE VIEW flagmeter.stats AS
SELECT (SELECT count(*) FROM flagmeter.events e WHERE e.xid >= flagmeter.xid_int(m.folded_through)) AS pending_events,
       (SELECT count(*) FROM flagmeter.voids v WHERE v.xid >= m.folded_through) AS pending_voids,
       m.folded_through,
       m.runs,
       m.last_run_at,
       m.last_run_duration,
       m.last_run_folded,
       m.total_folded,
       m.total_voids_folded,
       (SELECT count(*) FROM pg_catalog.pg_inherits i
        WHERE i.inhparent = 'flagmeter.events'::regclass) AS partitions,
       (SELECT count(*) FROM flagmeter.events_default) AS default_partition_events,
       (SELECT count(*) FROM flagmeter.outbox o WHERE o.notified) AS notifications_sent,
       (SELECT count(*) FROM flagmeter.outbox o WHERE NOT o.notified)
         + (SELECT count(*) FROM flagmeter.notification_skips) AS notifications_skipped,
       (SELECT count(*) FROM flagmeter.blocked) AS blocked
FROM flagmeter.current_state m;
COMMENT ON VIEW flagmeter.stats IS
'for operators: events and voids not folded yet, the last maintain() run, totals folded, partitions, quota notifications sent, notifications skipped under backpressure, tenants blocked';
-- ---------------------------------------------------------------------------
-- Shards: what a database needs to give tenants away to another one.
--
-- Past one machine, a PL/Proxy proxy routes every per-tenant call by
-- hashtext(tenant) to one of P partitions (P a power of two), several of
-- which may live in one database (contrib/plproxy, README "Scale-out").
-- Moving partition K to another database is: fence it here (its tenants'
-- writes are refused from the moment the fence commits, after the writes in
-- flight), copy its rows from one snapshot, point the proxy at the copy,
-- wait for the proxy transactions that began before, then forget it here.
-- The fence is a set of triggers, so it costs nothing when no move is on.
-- ---------------------------------------------------------------------------

CREATE FUNCTION flagmeter.partition_of(tenant text, partitions integer)
RETURNS integer
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$
SELECT pg_catalog.hashtext($1) OPERATOR(pg_catalog.&) ($2 OPERATOR(pg_catalog.-) 1)
$$;
COMMENT ON FUNCTION flagmeter.partition_of(text, integer) IS
'the PL/Proxy partition (of partitions, a power of two) a tenant is routed to: hashtext(tenant) & (partitions - 1)';

CREATE FUNCTION flagmeter.check_partition(partitions integer, partition integer)
RETURNS void
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	IF partitions IS NULL OR partitions < 1 OR partitions > 1073741824
	   OR partitions & (partitions - 1) <> 0 THEN
		RAISE EXCEPTION 'partitions must be a power of two: %', partitions
			USING ERRCODE = 'invalid_parameter_value',
			      DETAIL = 'PL/Proxy maps hashtext(tenant) to a partition with a bit mask.';
	END IF;
	IF partition IS NULL OR partition < 0 OR partition >= partitions THEN
		RAISE EXCEPTION 'partition must be between 0 and %: %', partitions - 1, partition
			USING ERRCODE = 'invalid_parameter_value';
	END IF;
END $$;
COMMENT ON FUNCTION flagmeter.check_partition(integer, integer) IS
'raises a clear error unless partitions is a power of two and partition one of them';

-- A partition's fence is six triggers named after it; the one on tenants
-- stands for them all.
CREATE FUNCTION flagmeter.is_fenced(partitions integer, partition integer)
RETURNS boolean
LANGUAGE plpgsql STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	PERFORM flagmeter.check_partition(partitions, partition);
	RETURN EXISTS (SELECT FROM pg_trigger t
	               WHERE t.tgname = format('flagmeter_moving_%s_of_%s_new', partition, partitions)
	                 AND t.tgrelid = 'flagmeter.tenants'::regclass);
END $$;
COMMENT ON FUNCTION flagmeter.is_fenced(integer, integer) IS
'whether a partition is fenced here (being moved away)';

-- The fence's trigger: with arguments (partitions, partition) on the rows
-- of tenants, whose WHEN clause has already matched the partition; without,
-- on the catalog, which must not change while a partition is away (a new
-- period kind would recount tenants the copy has already taken).
CREATE FUNCTION flagmeter.refuse_moving()
RETURNS trigger
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	IF TG_NARGS = 0 THEN
		RAISE EXCEPTION 'flagmeter''s catalog cannot change while tenants are being moved'
			USING ERRCODE = 'object_not_in_prerequisite_state',
			      DETAIL = format('Table %s is fenced until the move is finished.', TG_TABLE_NAME),
			      HINT = 'Change the catalog once the move is done (flagmeter.forget_partition() or flagmeter.unfence_partition()).';
	END IF;
	RAISE EXCEPTION 'tenant "%" is being moved to another shard',
		left(CASE WHEN TG_OP = 'DELETE' THEN OLD.tenant ELSE NEW.tenant END, 64)
		USING ERRCODE = 'object_not_in_prerequisite_state',
		      DETAIL = format('Partition %s of %s is fenced here: its tenants'' writes are refused until the proxy routes them to their new shard.',
		                      TG_ARGV[1], TG_ARGV[0]),
		      HINT = 'Retry in a moment, with the same idempotency key.';
END $$;
COMMENT ON FUNCTION flagmeter.refuse_moving() IS
'trigger of the fence of a partition being moved: refuses the writes of its tenants (and, without arguments, changes of the catalog)';

-- Fenced tables, with the trigger events on which a tenant's row is
-- refused.  Every write of a call lands in one of them in its transaction:
-- track, track_batch and consume insert events, void inserts voids, the
-- per-tenant catalog calls write tenants, overrides or feature_overrides,
-- grant_credits and void_grant write credit_grants.
CREATE FUNCTION flagmeter.fence_partition(partitions integer, partition integer)
RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	name text := format('flagmeter_moving_%s_of_%s', partition, partitions);
	f record;
BEGIN
	IF flagmeter.is_fenced(partitions, partition) THEN
		RETURN;
	END IF;
	-- Creating a trigger waits for the transactions writing the table and
	-- holds new ones until this commits; from then on they see the fence.
	FOR f IN
		SELECT * FROM (VALUES ('events', 'INSERT', 'NEW', '_new'),
		                      ('voids', 'INSERT', 'NEW', '_new'),
		                      ('tenants', 'INSERT OR UPDATE', 'NEW', '_new'),
		                      ('tenants', 'DELETE', 'OLD', '_old'),
		                      ('overrides', 'INSERT OR UPDATE', 'NEW', '_new'),
		                      ('overrides', 'DELETE', 'OLD', '_old'),
		                      ('feature_overrides', 'INSERT OR UPDATE', 'NEW', '_new'),
		                      ('feature_overrides', 'DELETE', 'OLD', '_old'),
		                      ('credit_grants', 'INSERT OR UPDATE', 'NEW', '_new'),
		                      ('reservations', 'INSERT OR UPDATE', 'NEW', '_new'),
		                      ('rollovers', 'INSERT OR UPDATE', 'NEW', '_new')) v(tbl, ops, rec, suffix)
	LOOP
		EXECUTE format('CREATE TRIGGER %I BEFORE %s ON flagmeter.%I FOR EACH ROW'
		               ' WHEN (flagmeter.partition_of(%s.tenant, %s) OPERATOR(pg_catalog.=) %s)'
		               ' EXECUTE FUNCTION flagmeter.refuse_moving(%L, %L)',
		               name || f.suffix, f.ops, f.tbl, f.rec, partitions, partition,
		               partitions, partition);
	END LOOP;
	FOR f IN SELECT * FROM unnest(ARRAY['meters', 'plans', 'limits', 'features', 'plan_features']) v(tbl) LOOP
		CONTINUE WHEN EXISTS (SELECT FROM pg_trigger t WHERE t.tgname = 'flagmeter_moving_catalog'
		                      AND t.tgrelid = ('flagmeter.' || f.tbl)::regclass);
		EXECUTE format('CREATE TRIGGER flagmeter_moving_catalog BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE'
		               ' ON flagmeter.%I FOR EACH STATEMENT EXECUTE FUNCTION flagmeter.refuse_moving()', f.tbl);
	END LOOP;
END $$;
COMMENT ON FUNCTION flagmeter.fence_partition(integer, integer) IS
'fences a partition that is being moved away: once this commits (after the writes in flight), writes of its tenants and changes of the catalog are refused; does nothing when it is already fenced';

-- Drops the fence of a partition, and the catalog's once no partition is
-- fenced any more; false when the partition was not fenced.
CREATE FUNCTION flagmeter.unfence_partition(partitions integer, partition integer)
RETURNS boolean
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	name text := format('flagmeter_moving_%s_of_%s', partition, partitions);
	t record;
BEGIN
	IF NOT flagmeter.is_fenced(partitions, partition) THEN
		RETURN false;
	END IF;
	FOR t IN
		SELECT tg.tgname, tg.tgrelid::regclass AS rel FROM pg_trigger tg
		WHERE tg.tgname IN (name || '_new', name || '_old')
		  AND tg.tgrelid IN ('flagmeter.events'::regclass, 'flagmeter.voids'::regclass,
		                     'flagmeter.tenants'::regclass, 'flagmeter.overrides'::regclass,
		                     'flagmeter.feature_overrides'::regclass,
		                     'flagmeter.credit_grants'::regclass, 'flagmeter.reservations'::regclass,
		                     'flagmeter.rollovers'::regclass)
	LOOP
		EXECUTE format('DROP TRIGGER %I ON %s', t.tgname, t.rel);
	END LOOP;
	IF NOT EXISTS (SELECT FROM pg_trigger tg WHERE tg.tgname ~ '^flagmeter_moving_[0-9]+_of_[0-9]+_new$'
	               AND tg.tgrelid = 'flagmeter.tenants'::regclass) THEN
		FOR t IN
			SELECT tg.tgrelid::regclass AS rel FROM pg_trigger tg
			WHERE tg.tgname = 'flagmeter_moving_catalog'
			  AND tg.tgrelid IN ('flagmeter.meters'::regclass, 'flagmeter.plans'::regclass,
			                     'flagmeter.limits'::regclass, 'flagmeter.features'::regclass,
			                     'flagmeter.plan_features'::regclass)
		LOOP
			EXECUTE format('DROP TRIGGER flagmeter_moving_catalog ON %s', t.rel);
		END LOOP;
	END IF;
	RETURN true;
END $$;
COMMENT ON FUNCTION flagmeter.unfence_partition(integer, integer) IS
'drops the fence of a partition (a move given up: its tenants are served here again); false when it was not fenced';

-- After the proxy routes the partition elsewhere: its rows go, and so does
-- the fence.  Only a fenced partition can be forgotten, so that a slip of
-- the partition number cannot delete tenants still served here.  The bulk
-- goes first, under the fence (it refuses inserts, not deletes); dropping
-- the triggers locks their tables until the commit, so only the tenants'
-- catalog rows are deleted after it.
CREATE FUNCTION flagmeter.forget_partition(partitions integer, partition integer)
RETURNS bigint
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	tbl text;
	n bigint;
	deleted bigint := 0;
BEGIN
	IF NOT flagmeter.is_fenced(partitions, partition) THEN
		RAISE EXCEPTION 'partition % of % is not fenced', partition, partitions
			USING ERRCODE = 'object_not_in_prerequisite_state',
			      HINT = 'Fence it with flagmeter.fence_partition() and copy its tenants to their new shard first.';
	END IF;
	-- every table with a tenant column (the regression test shards lists them)
	FOREACH tbl IN ARRAY ARRAY['events', 'voids', 'counters', 'event_keys', 'rollup_hour', 'rollup_day',
	                           'unique_values', 'value_sightings',
	                           'blocked', 'outbox', 'reservations', 'rollovers', 'credit_grants', 'credit_accounts',
	                           'overrides',
	                           'feature_overrides', 'tenants']
	LOOP
		IF tbl = 'overrides' THEN
			PERFORM flagmeter.unfence_partition(partitions, partition);
		END IF;
		EXECUTE format('DELETE FROM flagmeter.%I r WHERE flagmeter.partition_of(r.tenant, $1) = $2', tbl)
			USING partitions, partition;
		GET DIAGNOSTICS n = ROW_COUNT;
		deleted := deleted + n;
	END LOOP;
	RETURN deleted;
END $$;
COMMENT ON FUNCTION flagmeter.forget_partition(integer, integer) IS
'deletes every row of the tenants of a fenced partition (moved to another shard) and drops its fence; returns how many rows';
-- ---------------------------------------------------------------------------
-- Privileges: the least-privilege role layout.
--
-- Nothing in schema flagmeter is reachable until an administrator grants
-- USAGE on the schema (PostgreSQL grants it to nobody), and no table,
-- view or sequence is readable or writable without a grant either.  What
-- remains is EXECUTE, which PostgreSQL gives PUBLIC on every new function:
-- it is taken back below from every function that writes, runs its SQL as
-- the owner of schema flagmeter, or changes configuration, so that a role
-- can do exactly what it was granted.
--
-- Why the C calls matter most: track, track_batch, consume, check, usage,
-- void and announce run their statements as the owner of schema flagmeter
-- (src/statements.c), so a role needs EXECUTE on them and no privilege on
-- the tables; EXECUTE on them is therefore the whole permission to write
-- usage or to read any tenant's usage, and row-level security on the
-- tables does not apply to them.  announce (and announce_feature) writes
-- the outbox and the blocked table at commit: it is for the catalog
-- functions, not for apps.
--
-- The functions left to PUBLIC are pure (the quota_counter type, its
-- operators, accessors and aggregates, period_bounds, the validators) or
-- read with the caller's own privileges (limit_config, usage_series,
-- top_tenants, changes_since, latest_version), so they are subject to the
-- caller's table grants and to row-level security.
--
-- The role layouts the README documents are shipped as data, in
-- access_privileges() below, and granted by grant_access(role, access) (or
-- taken back by revoke_access): request (the app's calls), listener (the
-- client protocol of app instances), dashboard (status, top_tenants,
-- usage_series, stats) and admin (the catalog functions).  The regression
-- test security runs each path as a role that has exactly one of them.
--
-- A layout for reporting roles that read the usage tables themselves,
-- isolated per tenant by row-level security, as an administrator grants it
-- (role names are examples; the test security runs it too):
--
--   -- a reporting role that reads usage tables directly, one tenant at a
--   -- time, isolated by row-level security keyed on a setting
--   GRANT USAGE ON SCHEMA flagmeter TO reporting;
--   GRANT SELECT ON flagmeter.meters, flagmeter.maintenance_state,
--       flagmeter.counters, flagmeter.events, flagmeter.event_keys,
--       flagmeter.voids, flagmeter.rollup_hour, flagmeter.rollup_day TO reporting;
--   ALTER TABLE flagmeter.counters ENABLE ROW LEVEL SECURITY;	-- and the others
--   CREATE POLICY tenant_rows ON flagmeter.counters FOR SELECT TO reporting
--       USING (tenant OPERATOR(pg_catalog.=) pg_catalog.current_setting('app.tenant', true));
--   CREATE POLICY all_rows ON flagmeter.counters TO billing_admin USING (true);
--
-- Row-level security binds the roles that read the tables themselves
-- (reporting, usage_series called by them, the admin's recounts: hence
-- its all_rows policy).  It does not bind the C calls, which run as the
-- owner of the tables, nor views, which read as their owner: flagmeter's own
-- cross-tenant work (consume's reads, maintain()) keeps working, and the
-- reporting role must not get EXECUTE on usage or check, nor SELECT on
-- status.  Do not FORCE row-level security on these tables.  A setting is
-- chosen by whoever holds the session: it isolates tenants from a
-- reporting query that forgets its WHERE clause, not from a role that can
-- run arbitrary SQL.
--
-- maintain(), schedule(), unschedule(), configure() and after_restore() run
-- as the owner of the extension (maintain() creates and drops partitions of
-- flagmeter.events, which only its owner may): schedule the pg_cron job as
-- that role.
-- ---------------------------------------------------------------------------

-- The calls that run their SQL as the owner of schema flagmeter.
REVOKE ALL ON FUNCTION flagmeter.track(text, text, bigint, timestamptz, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.track(text, text, bigint, text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.track_batch(text[], text[], bigint[], timestamptz[], text[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.consume(text, text, bigint, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.consume(text, text, text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.consume(text, text[], bigint[], text) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.check(text, text, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.limit_in_force(text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.usage(text, text, timestamptz) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.void(text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.track_value(text, text, text, timestamptz) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.consume_value(text, text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.forget_value(text, text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.recount_unique_values(text, text, timestamptz, timestamptz) FROM PUBLIC;
-- the rate limiters live in shared memory: spending from one is a write
REVOKE ALL ON FUNCTION flagmeter.limit(text, bigint, interval, bigint, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.limit_batch(text[], bigint[], interval[], bigint[], bigint[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.set_test_clock(timestamptz) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.announce(text, text, text, text, timestamptz, bigint, bigint, text, text, integer[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.review_usage(text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.announce_feature(text, text, text, boolean, jsonb) FROM PUBLIC;

-- Configuration.
REVOKE ALL ON FUNCTION flagmeter.define_meter(text, text, text, text, numeric) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.define_plan(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.set_limit(text, text, bigint, text, text, integer[], integer, bigint, integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.store_limit(text, text, bigint, text, text, integer[], integer, bigint, integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.announce_limit(text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.assign_plan(text, text, timestamptz, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.override_limit(text, text, bigint, text, text, integer[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.drop_override(text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.set_rate_limit(text, text, bigint, interval, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.override_rate_limit(text, text, bigint, interval, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.store_rate_limit(text, text, text, bigint, interval, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.drop_rate_limit(text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.drop_rate_override(text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.delete_rate_limit(text, text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.announce_rate_limit(text, text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.unassign_tenant(text, boolean) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.drop_plan(text, boolean) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.drop_meter(text, boolean) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.delete_usage(text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.recount_current_period(text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.review_blocks(text, text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.apply_limit_changes(jsonb) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.grant_credits(text, text, bigint, timestamptz, integer, timestamptz, text, integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.void_grant(bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.reserve(text, text, bigint, interval, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.settle(bigint, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.release(bigint) FROM PUBLIC;

-- Maintenance, run as the owner.
REVOKE ALL ON FUNCTION flagmeter.maintain() FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.fold_band(xid8, xid8) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.compact_counters() FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.merge_idle_stripes(xid8) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.fold_pending() FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.fold_pending_events(xid8, xid8) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.pending_events_folded() FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.pending_forget() FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.summarize_event_partitions() FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.create_partitions() FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.drop_expired_partitions(xid8) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.send_resync_hint() FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.announce_expired_grants() FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.roll_over() FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.schedule(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.unschedule() FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.configure(interval, integer, text, interval, interval) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.after_restore() FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.index_event_partition(regclass) FROM PUBLIC;

-- Role layouts --------------------------------------------------------------------

-- Every privilege of a layout, one per row: what grant_access grants.  The
-- views and functions below read tables with the caller's privileges (a SQL
-- function inlined into a view reads as the caller, plpgsql as its caller),
-- which is why a layout lists tables that its paths never name:
-- effective_limits and status read meters, tenants, limits and overrides
-- through limit_config(); usage_series reads current_state, and
-- current_settings (the retention) for minute buckets and unique meters.
CREATE FUNCTION flagmeter.access_privileges(access text)
RETURNS TABLE (privilege text, object text)
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	config_tables text[] := ARRAY['flagmeter.meters', 'flagmeter.tenants', 'flagmeter.limits',
	                              'flagmeter.overrides', 'flagmeter.rate_limits',
	                              'flagmeter.rate_overrides'];
	-- entitlements and tenant_features read these with the caller's privileges
	feature_tables text[] := ARRAY['flagmeter.features', 'flagmeter.plan_features',
	                               'flagmeter.feature_overrides'];
BEGIN
	IF access IS NULL THEN
		RAISE EXCEPTION 'access must not be NULL' USING ERRCODE = 'null_value_not_allowed';
	END IF;
	IF NOT access = ANY (ARRAY['request', 'listener', 'dashboard', 'admin']) THEN
		RAISE EXCEPTION 'invalid access "%"', left(access, 64) USING ERRCODE = 'invalid_parameter_value',
			HINT = 'Valid accesses are "request", "listener", "dashboard" and "admin".';
	END IF;
	privilege := 'USAGE'; object := 'SCHEMA flagmeter';
	RETURN NEXT;
	IF access = 'request' THEN
		-- the calls run their statements as the owner: no table privilege
		RETURN QUERY SELECT 'EXECUTE', 'FUNCTION ' || f FROM unnest(ARRAY[
			'flagmeter.track(text, text, bigint, timestamptz, text)',
			'flagmeter.track(text, text, bigint, text, text)',
			'flagmeter.track_batch(text[], text[], bigint[], timestamptz[], text[])',
			'flagmeter.consume(text, text, bigint, text)',
			'flagmeter.consume(text, text, text, text)',
			'flagmeter.consume(text, text[], bigint[], text)',
			'flagmeter.check(text, text, bigint)',
			'flagmeter.usage(text, text, timestamptz)',
			'flagmeter.void(text, text)',
			'flagmeter.track_value(text, text, text, timestamptz)',
			'flagmeter.consume_value(text, text, text)',
			'flagmeter.forget_value(text, text, text)',
			'flagmeter.track_events(text[], text[], bigint[], timestamptz[], text[])',
			'flagmeter.consume_batch(text[], text[], bigint[], text[], integer[])',
			'flagmeter.has_feature(text, text)',
			'flagmeter.feature_config(text, text)',
			'flagmeter.balance(text, text)',
			'flagmeter.reserve(text, text, bigint, interval, text)',
			'flagmeter.settle(bigint, bigint)',
			'flagmeter.release(bigint)',
			'flagmeter.limit(text, bigint, interval, bigint, bigint)',
			'flagmeter.limit_batch(text[], bigint[], interval[], bigint[], bigint[])']) f;
	ELSIF access = 'listener' THEN
		-- step 2 of the client protocol reads blocked and effective_limits,
		-- latest_version() and changes_since() read the outbox; a client
		-- caching features reads a tenant's overrides and its plan's rows
		RETURN QUERY SELECT 'SELECT', 'TABLE ' || t FROM unnest(ARRAY[
			'flagmeter.outbox', 'flagmeter.blocked', 'flagmeter.effective_limits'] || config_tables
			|| feature_tables) t;
	ELSIF access = 'dashboard' THEN
		RETURN QUERY SELECT 'EXECUTE', 'FUNCTION flagmeter.usage(text, text, timestamptz)';
		RETURN QUERY SELECT 'SELECT', 'TABLE ' || t FROM unnest(ARRAY[
			'flagmeter.status', 'flagmeter.effective_limits', 'flagmeter.stats',
			'flagmeter.current_state', 'flagmeter.current_settings', 'flagmeter.rollup_hour', 'flagmeter.rollup_day',
			'flagmeter.events', 'flagmeter.voids', 'flagmeter.value_sightings', 'flagmeter.tenant_features',
			'flagmeter.entitlements', 'flagmeter.grants'] || config_tables || feature_tables) t;
	ELSE
		-- the catalog functions are PL/pgSQL run as the caller; recounts,
		-- unassign_tenant(forget_usage) and drop_meter(force) rewrite usage
		RETURN QUERY SELECT 'EXECUTE', 'FUNCTION ' || f FROM unnest(ARRAY[
			'flagmeter.define_meter(text, text, text, text, numeric)',
			'flagmeter.define_plan(text)',
			'flagmeter.set_limit(text, text, bigint, text, text, integer[], integer, bigint, integer)',
			'flagmeter.store_limit(text, text, bigint, text, text, integer[], integer, bigint, integer)',
			'flagmeter.announce_limit(text, text)',
			'flagmeter.assign_plan(text, text, timestamptz, text)',
			'flagmeter.override_limit(text, text, bigint, text, text, integer[])',
			'flagmeter.drop_override(text, text)',
			'flagmeter.set_rate_limit(text, text, bigint, interval, bigint)',
			'flagmeter.override_rate_limit(text, text, bigint, interval, bigint)',
			'flagmeter.store_rate_limit(text, text, text, bigint, interval, bigint)',
			'flagmeter.drop_rate_limit(text, text)',
			'flagmeter.drop_rate_override(text, text)',
			'flagmeter.delete_rate_limit(text, text, text)',
			'flagmeter.announce_rate_limit(text, text, text)',
			'flagmeter.define_feature(text, text)',
			'flagmeter.set_feature(text, text, boolean, jsonb)',
			'flagmeter.store_feature(text, text, boolean, jsonb)',
			'flagmeter.announce_plan_feature(text, text)',
			'flagmeter.override_feature(text, text, boolean, jsonb)',
			'flagmeter.drop_feature_override(text, text)',
			'flagmeter.unassign_tenant(text, boolean)',
			'flagmeter.drop_plan(text, boolean)',
			'flagmeter.drop_meter(text, boolean)',
			'flagmeter.delete_usage(text, text)',
			'flagmeter.recount_current_period(text, text)',
			'flagmeter.recount_unique_values(text, text, timestamptz, timestamptz)',
			'flagmeter.review_blocks(text, text, text)',
			'flagmeter.review_usage(text, text)',
			'flagmeter.apply_limit_changes(jsonb)',
			'flagmeter.announce(text, text, text, text, timestamptz, bigint, bigint, text, text, integer[])',
			'flagmeter.announce_feature(text, text, text, boolean, jsonb)',
			'flagmeter.usage(text, text, timestamptz)',
			'flagmeter.grant_credits(text, text, bigint, timestamptz, integer, timestamptz, text, integer)',
			'flagmeter.void_grant(bigint)']) f;
		-- grant_credits and void_grant write the grants with the caller's privileges
		RETURN QUERY SELECT 'SELECT, INSERT, UPDATE', 'TABLE ' || t FROM unnest(ARRAY[
			'flagmeter.credit_accounts', 'flagmeter.credit_grants']) t;
		RETURN QUERY SELECT 'USAGE', 'SEQUENCE flagmeter.credit_grant_id';
		RETURN QUERY SELECT 'SELECT, INSERT, UPDATE, DELETE', 'TABLE ' || t FROM unnest(ARRAY[
			'flagmeter.plans', 'flagmeter.counters', 'flagmeter.pending_limit_changes',
			'flagmeter.unique_values'] || config_tables || feature_tables) t;
		RETURN QUERY SELECT 'SELECT, DELETE', 'TABLE ' || t FROM unnest(ARRAY[
			'flagmeter.events', 'flagmeter.event_keys', 'flagmeter.voids', 'flagmeter.rollup_hour',
			'flagmeter.rollup_day', 'flagmeter.outbox', 'flagmeter.value_sightings']) t;
		RETURN QUERY SELECT 'SELECT', 'TABLE ' || t FROM unnest(ARRAY[
			'flagmeter.blocked', 'flagmeter.effective_limits', 'flagmeter.grants',
			'flagmeter.rollovers']) t;
	END IF;
END $$;
COMMENT ON FUNCTION flagmeter.access_privileges(text) IS
'the privileges of a role layout (request, listener, dashboard, admin), one per row, as grant_access grants them';

-- GRANT or REVOKE, privilege by privilege, a layout: the body of
-- grant_access and revoke_access.
CREATE FUNCTION flagmeter.change_access(role regrole, access text, action text)
RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	p record;
BEGIN
	IF role IS NULL THEN
		RAISE EXCEPTION 'role must not be NULL' USING ERRCODE = 'null_value_not_allowed';
	END IF;
	IF action IS NULL OR NOT action = ANY (ARRAY['GRANT', 'REVOKE']) THEN
		RAISE EXCEPTION 'invalid action "%"', left(action, 64) USING ERRCODE = 'invalid_parameter_value';
	END IF;
	FOR p IN SELECT * FROM flagmeter.access_privileges(access) LOOP
		EXECUTE format('%s %s ON %s %s %s', action, p.privilege, p.object,
		               CASE WHEN action = 'GRANT' THEN 'TO' ELSE 'FROM' END, role);
	END LOOP;
END $$;
COMMENT ON FUNCTION flagmeter.change_access(regrole, text, text) IS
'grants (action GRANT) or revokes (REVOKE) the privileges of a layout (see access_privileges); the body of grant_access and revoke_access';

CREATE FUNCTION flagmeter.grant_access(role regrole, access text)
RETURNS void
LANGUAGE sql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT flagmeter.change_access($1, $2, 'GRANT') $$;
COMMENT ON FUNCTION flagmeter.grant_access(regrole, text) IS
'grants a role the privileges of a layout: request (track, consume, check, usage, void, balance), listener (the client protocol), dashboard (status, top_tenants, usage_series, stats, grants) or admin (the catalog functions, grant_credits, void_grant); see access_privileges()';

CREATE FUNCTION flagmeter.revoke_access(role regrole, access text)
RETURNS void
LANGUAGE sql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT flagmeter.change_access($1, $2, 'REVOKE') $$;
COMMENT ON FUNCTION flagmeter.revoke_access(regrole, text) IS
'takes back from a role the privileges grant_access gave it for a layout (USAGE on the schema included: revoke the other layouts the role holds last)';

REVOKE ALL ON FUNCTION flagmeter.grant_access(regrole, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.revoke_access(regrole, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.change_access(regrole, text, text) FROM PUBLIC;

-- Moving tenants to another shard, run as the owner (they create and drop
-- triggers on flagmeter's tables).
REVOKE ALL ON FUNCTION flagmeter.fence_partition(integer, integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.unfence_partition(integer, integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.forget_partition(integer, integer) FROM PUBLIC;
