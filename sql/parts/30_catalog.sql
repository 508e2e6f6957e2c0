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
		CHECK (aggregation OPERATOR(pg_catalog.=) ANY (ARRAY['sum', 'count', 'max', 'latest'])),
	unit		text CONSTRAINT meters_unit_length CHECK (pg_catalog.length(unit) OPERATOR(pg_catalog.<=) 63),
	created_at	timestamptz NOT NULL DEFAULT pg_catalog.now()
);
COMMENT ON TABLE flagmeter.meters IS
'what is counted; aggregation says which figure of the counter is "used": sum of amounts, count of events, max amount, or latest amount';

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
	PRIMARY KEY (plan, meter)
);
COMMENT ON TABLE flagmeter.limits IS
'the quota of a plan for one meter per period, hard (consume refuses past it) or soft (grants and reports overage), with alert thresholds in percent';

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

CREATE FUNCTION flagmeter.define_meter(meter text, aggregation text DEFAULT 'sum', unit text DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	PERFORM flagmeter.check_name('meter', meter);
	IF aggregation IS NULL THEN
		RAISE EXCEPTION 'aggregation must not be NULL' USING ERRCODE = 'null_value_not_allowed';
	END IF;
	IF NOT aggregation = ANY (ARRAY['sum', 'count', 'max', 'latest']) THEN
		RAISE EXCEPTION 'invalid aggregation "%"', left(aggregation, 64)
			USING ERRCODE = 'invalid_parameter_value',
			      HINT = 'Valid aggregations are "sum", "count", "max" and "latest".';
	END IF;
	IF length(unit) > 63 THEN
		RAISE EXCEPTION 'unit is too long' USING ERRCODE = 'string_data_right_truncation',
			DETAIL = 'A unit is at most 63 characters.';
	END IF;
	INSERT INTO flagmeter.meters AS m (meter, aggregation, unit)
	VALUES (define_meter.meter, define_meter.aggregation, define_meter.unit)
	ON CONFLICT ON CONSTRAINT meters_pkey DO UPDATE
		SET aggregation = EXCLUDED.aggregation, unit = EXCLUDED.unit;
END $$;
COMMENT ON FUNCTION flagmeter.define_meter(text, text, text) IS
'defines a meter (aggregation sum, count, max or latest) or changes its aggregation and unit';

CREATE FUNCTION flagmeter.define_plan(plan text)
RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	PERFORM flagmeter.check_name('plan', plan);
	INSERT INTO flagmeter.plans (plan) VALUES (define_plan.plan)
	ON CONFLICT ON CONSTRAINT plans_pkey DO NOTHING;
END $$;
COMMENT ON FUNCTION flagmeter.define_plan(text) IS 'defines a plan; defining an existing plan does nothing';

-- set_limit is store_limit then announce_limit: a change that must reach
-- several shards at once (contrib/plproxy) commits the first with two-phase
-- commit on every shard and runs the second after, because a transaction
-- with announcements pending cannot be prepared.
CREATE FUNCTION flagmeter.store_limit(plan text, meter text, quota bigint,
	period text DEFAULT 'month', mode text DEFAULT 'hard',
	thresholds integer[] DEFAULT '{80,100}')
RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	old_period text;
	sorted integer[] := flagmeter.check_thresholds(thresholds);
	t text;
BEGIN
	PERFORM flagmeter.check_limit_args(quota, period, mode, thresholds, false);
	IF plan IS NULL THEN
		RAISE EXCEPTION 'plan must not be NULL' USING ERRCODE = 'null_value_not_allowed';
	END IF;
	IF NOT EXISTS (SELECT FROM flagmeter.plans p WHERE p.plan = store_limit.plan) THEN
		RAISE EXCEPTION 'plan "%" does not exist', left(plan, 64) USING ERRCODE = 'undefined_object',
			HINT = 'Define it first with flagmeter.define_plan().';
	END IF;
	PERFORM flagmeter.check_meter_exists(meter);

	SELECT l.period INTO old_period FROM flagmeter.limits l
	WHERE l.plan = store_limit.plan AND l.meter = store_limit.meter;

	INSERT INTO flagmeter.limits AS l (plan, meter, quota, period, mode, thresholds)
	VALUES (store_limit.plan, store_limit.meter, store_limit.quota, store_limit.period,
	        store_limit.mode, sorted)
	ON CONFLICT ON CONSTRAINT limits_pkey DO UPDATE
		SET quota = EXCLUDED.quota, period = EXCLUDED.period, mode = EXCLUDED.mode,
		    thresholds = EXCLUDED.thresholds, updated_at = now();

	-- A new period kind moves the current period's boundaries: recount it.
	IF COALESCE(old_period, 'month') <> period THEN
		FOR t IN
			SELECT tn.tenant FROM flagmeter.tenants tn
			WHERE tn.plan = store_limit.plan
			  AND NOT EXISTS (SELECT FROM flagmeter.overrides o
			                  WHERE o.tenant = tn.tenant AND o.meter = store_limit.meter
			                    AND o.period IS NOT NULL)
		LOOP
			PERFORM flagmeter.recount_current_period(t, meter);
		END LOOP;
	END IF;
END $$;
COMMENT ON FUNCTION flagmeter.store_limit(text, text, bigint, text, text, integer[]) IS
'the part of set_limit that announces nothing: validates and stores the limit, recounts the current period when its kind changed';

CREATE FUNCTION flagmeter.announce_limit(plan text, meter text)
RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	-- announced at commit; a raised limit may unblock tenants of the plan
	PERFORM flagmeter.announce('limit_changed', NULL, meter, plan);
	PERFORM flagmeter.review_blocks(NULL, meter, plan);
END $$;
COMMENT ON FUNCTION flagmeter.announce_limit(text, text) IS
'the part of set_limit that announces: limit_changed for the plan and meter, and unblocked for its tenants back under the limit';

CREATE FUNCTION flagmeter.set_limit(plan text, meter text, quota bigint,
	period text DEFAULT 'month', mode text DEFAULT 'hard',
	thresholds integer[] DEFAULT '{80,100}')
RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	PERFORM flagmeter.store_limit(plan, meter, quota, period, mode, thresholds);
	PERFORM flagmeter.announce_limit(plan, meter);
END $$;
COMMENT ON FUNCTION flagmeter.set_limit(text, text, bigint, text, text, integer[]) IS
'sets or replaces the limit of a plan for a meter; applies to the current period at once';

CREATE FUNCTION flagmeter.assign_plan(tenant text, plan text,
	anchor timestamptz DEFAULT now(), timezone text DEFAULT 'UTC')
RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	before jsonb;
	m text;
BEGIN
	PERFORM flagmeter.check_tenant(tenant);
	IF plan IS NULL THEN
		RAISE EXCEPTION 'plan must not be NULL' USING ERRCODE = 'null_value_not_allowed';
	END IF;
	IF NOT EXISTS (SELECT FROM flagmeter.plans p WHERE p.plan = assign_plan.plan) THEN
		RAISE EXCEPTION 'plan "%" does not exist', left(plan, 64) USING ERRCODE = 'undefined_object',
			HINT = 'Define it first with flagmeter.define_plan().';
	END IF;
	IF anchor IS NULL OR NOT isfinite(anchor) THEN
		RAISE EXCEPTION 'anchor must be a finite timestamp' USING ERRCODE = 'invalid_parameter_value';
	END IF;
	IF timezone IS NULL THEN
		RAISE EXCEPTION 'time zone must not be NULL' USING ERRCODE = 'null_value_not_allowed';
	END IF;
	-- raises "time zone ... not recognized" for a bad name
	PERFORM flagmeter.period_bounds(anchor, 'day', anchor, timezone);

	before := flagmeter.period_configs(tenant);

	INSERT INTO flagmeter.tenants AS t (tenant, plan, anchor, timezone)
	VALUES (assign_plan.tenant, assign_plan.plan, assign_plan.anchor, assign_plan.timezone)
	ON CONFLICT ON CONSTRAINT tenants_pkey DO UPDATE
		SET plan = EXCLUDED.plan, anchor = EXCLUDED.anchor, timezone = EXCLUDED.timezone,
		    assigned_at = now();

	FOR m IN SELECT key FROM jsonb_each(flagmeter.period_configs(tenant)) n
	         WHERE n.value IS DISTINCT FROM before -> n.key
	LOOP
		PERFORM flagmeter.recount_current_period(tenant, m);
	END LOOP;

	PERFORM flagmeter.announce('plan_changed', tenant, NULL, plan);
	PERFORM flagmeter.review_blocks(tenant);
END $$;
COMMENT ON FUNCTION flagmeter.assign_plan(text, text, timestamptz, text) IS
'puts a tenant on a plan with its billing anchor and time zone; usage of the current period is recounted when its boundaries move';

CREATE FUNCTION flagmeter.override_limit(tenant text, meter text, quota bigint,
	period text DEFAULT NULL, mode text DEFAULT NULL, thresholds integer[] DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
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

	before := flagmeter.period_configs(tenant);

	INSERT INTO flagmeter.overrides AS o (tenant, meter, quota, period, mode, thresholds)
	VALUES (override_limit.tenant, override_limit.meter, override_limit.quota,
	        override_limit.period, override_limit.mode, sorted)
	ON CONFLICT ON CONSTRAINT overrides_pkey DO UPDATE
		SET quota = EXCLUDED.quota, period = EXCLUDED.period, mode = EXCLUDED.mode,
		    thresholds = EXCLUDED.thresholds, updated_at = now();

	IF flagmeter.period_configs(tenant) -> meter IS DISTINCT FROM before -> meter THEN
		PERFORM flagmeter.recount_current_period(tenant, meter);
	END IF;

	PERFORM flagmeter.announce('limit_changed', tenant, meter);
	PERFORM flagmeter.review_blocks(tenant, meter);
END $$;
COMMENT ON FUNCTION flagmeter.override_limit(text, text, bigint, text, text, integer[]) IS
'gives one tenant its own limit for a meter, winning over its plan''s; NULL period, mode or thresholds inherit the plan''s';

CREATE FUNCTION flagmeter.drop_override(tenant text, meter text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	before jsonb;
BEGIN
	PERFORM flagmeter.check_tenant(tenant);
	PERFORM flagmeter.check_meter_exists(meter);
	before := flagmeter.period_configs(tenant);
	DELETE FROM flagmeter.overrides o
	WHERE o.tenant = drop_override.tenant AND o.meter = drop_override.meter;
	IF NOT FOUND THEN
		RETURN false;
	END IF;
	IF flagmeter.period_configs(tenant) -> meter IS DISTINCT FROM before -> meter THEN
		PERFORM flagmeter.recount_current_period(tenant, meter);
	END IF;
	PERFORM flagmeter.announce('limit_changed', tenant, meter);
	PERFORM flagmeter.review_blocks(tenant, meter);
	RETURN true;
END $$;
COMMENT ON FUNCTION flagmeter.drop_override(text, text) IS
'removes a tenant''s override so its plan''s limit applies again; false when there was none';

-- Helpers of the catalog API ---------------------------------------------------

-- The C check every call makes (src/args.c), so that one bound holds everywhere.
CREATE FUNCTION flagmeter.check_tenant(tenant text)
RETURNS void
AS 'MODULE_PATHNAME', 'fm_check_tenant_sql'
LANGUAGE C IMMUTABLE PARALLEL SAFE;
COMMENT ON FUNCTION flagmeter.check_tenant(text) IS
'raises a clear error unless tenant is a valid tenant id (1 to 256 bytes)';

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

-- {meter: [period, anchor, timezone]} for every meter: what decides the
-- boundaries of the tenant's periods, compared before and after a change.
CREATE FUNCTION flagmeter.period_configs(tenant text)
RETURNS jsonb
LANGUAGE sql STABLE PARALLEL SAFE
AS $$
SELECT COALESCE(pg_catalog.jsonb_object_agg(m.meter,
           pg_catalog.jsonb_build_array(c.period, c.anchor, c.timezone)), '{}'::pg_catalog.jsonb)
FROM flagmeter.meters m
CROSS JOIN LATERAL flagmeter.limit_config($1, m.meter) c
$$;
COMMENT ON FUNCTION flagmeter.period_configs(text) IS
'per meter, the period kind, anchor and time zone that bound a tenant''s periods';
