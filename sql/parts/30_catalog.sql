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
BEGIN
	-- its errors are raised without the CONTEXT of the helpers (raise_plain)
	PERFORM flagmeter.assign_plan_batch(ARRAY[tenant], plan, anchor, timezone);
END $$;
COMMENT ON FUNCTION flagmeter.assign_plan(text, text, timestamptz, text) IS
'puts a tenant on a plan; a NULL anchor or time zone keeps the tenant''s (now() and UTC for a new tenant), so a plan change keeps its periods and usage; usage of the current period is recounted when its boundaries move';

-- assign_plan for many tenants: the same checks, rows and announcements as
-- one assign_plan per tenant (every plan_changed of a chunk before its
-- limit_changed), a chunk of 1 000 tenants per statement instead of one
-- tenant per statement: onboarding a million tenants takes a thousand
-- statements, not a million (docs/guides/operations.md).  Nothing it does reads a tenant's events
-- (current_period_has_usage), so a call costs the same whatever the
-- history.  The rows are written in tenant order, as concurrent calls
-- with tenants in common should take them.
CREATE FUNCTION flagmeter.assign_plan_batch(tenants text[], plan text,
	anchor timestamptz DEFAULT NULL, timezone text DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
SET jit = off	-- see apply_limit_changes
AS $$
DECLARE
	e_state text; e_message text; e_detail text; e_hint text;	-- the error, raised again
	chunk_size constant integer := 1000;
	chunk text[];
	before jsonb;
	twice text;
BEGIN
	IF tenants IS NULL THEN
		RAISE EXCEPTION 'tenants must not be NULL' USING ERRCODE = 'null_value_not_allowed';
	END IF;
	IF array_ndims(tenants) > 1 THEN
		RAISE EXCEPTION 'tenants must be a one-dimensional array' USING ERRCODE = 'invalid_parameter_value';
	END IF;
	PERFORM flagmeter.check_tenant(t.tenant) FROM unnest(tenants) t(tenant);
	SELECT t.tenant INTO twice FROM unnest(tenants) t(tenant)
	GROUP BY t.tenant HAVING count(*) > 1 ORDER BY t.tenant LIMIT 1;
	IF FOUND THEN
		RAISE EXCEPTION 'tenant "%" is listed more than once', twice
			USING ERRCODE = 'invalid_parameter_value',
			      HINT = 'A call assigns each tenant one plan: list it once.';
	END IF;
	PERFORM flagmeter.check_plan_exists(plan);
	-- a zone name, not a POSIX offset such as '+05:30' (which reads as UTC-05:30)
	IF timezone IS NOT NULL THEN
		PERFORM flagmeter.check_timezone(timezone);
	END IF;
	IF anchor IS NOT NULL AND NOT isfinite(anchor) THEN
		RAISE EXCEPTION 'anchor must be a finite timestamp' USING ERRCODE = 'invalid_parameter_value';
	END IF;
	IF timezone IS NOT NULL THEN
		-- raises "time zone ... not recognized" for a bad name
		PERFORM flagmeter.period_bounds(now(), 'day', now(), timezone);
	END IF;

	FOR i IN 1 .. cardinality(tenants) BY chunk_size LOOP
		chunk := tenants[i : i + chunk_size - 1];
		SELECT jsonb_object_agg(c.tenant, flagmeter.limit_configs(c.tenant)) INTO before
		FROM unnest(chunk) c(tenant);

		-- a NULL anchor or time zone keeps the tenant's (now() and UTC for a new tenant)
		INSERT INTO flagmeter.tenants AS t (tenant, plan, anchor, timezone)
		SELECT c.tenant, assign_plan_batch.plan,
		       COALESCE(assign_plan_batch.anchor, o.anchor, now()),
		       COALESCE(assign_plan_batch.timezone, o.timezone, 'UTC')
		FROM unnest(chunk) c(tenant)
		LEFT JOIN flagmeter.tenants o ON o.tenant = c.tenant
		ORDER BY c.tenant
		ON CONFLICT ON CONSTRAINT tenants_pkey DO UPDATE
			SET plan = EXCLUDED.plan, anchor = EXCLUDED.anchor, timezone = EXCLUDED.timezone,
			    assigned_at = now();

		PERFORM flagmeter.announce('plan_changed', c.tenant, NULL, assign_plan_batch.plan)
		FROM unnest(chunk) WITH ORDINALITY c(tenant, n) ORDER BY c.n;
		PERFORM flagmeter.apply_limit_changes(before);
	END LOOP;
	RETURN cardinality(tenants);
EXCEPTION WHEN OTHERS THEN	-- without the CONTEXT of the helpers (raise_plain)
	GET STACKED DIAGNOSTICS e_state = RETURNED_SQLSTATE, e_message = MESSAGE_TEXT,
	                        e_detail = PG_EXCEPTION_DETAIL, e_hint = PG_EXCEPTION_HINT;
	PERFORM flagmeter.raise_plain(e_state, e_message, e_detail, e_hint);
END $$;
COMMENT ON FUNCTION flagmeter.assign_plan_batch(text[], text, timestamptz, text) IS
'assign_plan for each tenant of an array (each listed once), in chunks of 1 000 tenants per statement; how many were assigned';

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
LANGUAGE plpgsql STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	-- PL/pgSQL for its cached plan: as LANGUAGE sql it was planned at every
	-- call (assign_plan calls it once per tenant)
	RETURN (SELECT COALESCE(jsonb_object_agg(m.meter, to_jsonb(c)), '{}'::jsonb)
	        FROM flagmeter.meters m
	        CROSS JOIN LATERAL flagmeter.limit_config(limit_configs.tenant, m.meter) c
	        WHERE limit_configs.meter IS NULL OR m.meter = limit_configs.meter);
END $$;
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
	review_tenants text[] := '{}';
	review_meters text[] := '{}';
BEGIN
	-- has_usage: asked once per row (index probes, whatever the history),
	-- since a tenant assigned at signup has none and needs neither a
	-- recount nor a review; a recount does not change it
	FOR r IN
		SELECT b.tenant, m.meter, m.old, to_jsonb(c) AS new,
		       flagmeter.current_period_has_usage(b.tenant, m.meter) AS has_usage
		FROM jsonb_each(COALESCE(before, '{}')) b(tenant, limits)
		CROSS JOIN jsonb_each(b.limits) m(meter, old)
		CROSS JOIN LATERAL flagmeter.limit_config(b.tenant, m.meter) c
		WHERE m.old IS DISTINCT FROM to_jsonb(c)
		ORDER BY 1, 2
	LOOP
		IF r.has_usage AND (r.old -> 'period', r.old -> 'anchor', r.old -> 'timezone')
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
		IF r.has_usage
		   OR EXISTS (SELECT FROM flagmeter.counters k WHERE k.tenant = r.tenant AND k.meter = r.meter) THEN
			review_tenants := review_tenants || r.tenant;
			review_meters := review_meters || r.meter;
		END IF;
	END LOOP;

	FOR r IN
		SELECT DISTINCT bl.tenant FROM flagmeter.blocked bl
		WHERE bl.tenant IN (SELECT jsonb_object_keys(COALESCE(before, '{}')))
		ORDER BY 1
	LOOP
		PERFORM flagmeter.review_blocks(r.tenant);
	END LOOP;

	FOR r IN
		SELECT u.tenant, u.meter FROM unnest(review_tenants, review_meters) u(tenant, meter)
	LOOP
		PERFORM flagmeter.review_usage(r.tenant, r.meter);
	END LOOP;
END $$;
COMMENT ON FUNCTION flagmeter.apply_limit_changes(jsonb) IS
'after a configuration change: recounts moved periods, announces limit_changed with the new limit, unblocks and blocks, and announces thresholds now reached, for each tenant and meter of before whose limit in force changed';
