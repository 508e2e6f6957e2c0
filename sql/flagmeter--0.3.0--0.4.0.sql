-- flagmeter 0.3.0 -> 0.4.0: onboarding at scale (CHANGELOG.md).
-- What sql/parts changed between the two, in install order: the catalog
-- calls ask current_period_has_usage (index probes) instead of reading the
-- events, limit_configs is PL/pgSQL, assign_plan is assign_plan_batch of
-- one tenant; the privileges of the new call.  Roles given the admin layout
-- with grant_access before the update get assign_plan_batch by running
-- grant_access again.

\echo Use "ALTER EXTENSION flagmeter UPDATE TO '0.4.0'" to load this file. \quit

-- 40_usage.sql (current_period_has_usage first: the catalog calls below use it)

CREATE FUNCTION flagmeter.current_period_has_usage(tenant text, meter text)
RETURNS boolean
LANGUAGE plpgsql STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	-- PL/pgSQL for its cached plan: as LANGUAGE sql it was planned at every
	-- call, 80 of the 350 us an assign_plan_batch spent per tenant
	RETURN EXISTS (
		SELECT FROM flagmeter.limit_config(tenant, meter) c
		CROSS JOIN LATERAL flagmeter.period_bounds(now(), c.period, c.anchor, c.timezone) b
		WHERE EXISTS (SELECT FROM flagmeter.counters k
		              WHERE k.tenant = current_period_has_usage.tenant
		                AND k.meter = current_period_has_usage.meter
		                AND k.period_start = b.period_start)
		   OR EXISTS (SELECT FROM flagmeter.events e
		              WHERE e.tenant = current_period_has_usage.tenant
		                AND e.meter = current_period_has_usage.meter
		                AND e.occurred_at >= b.period_start AND e.occurred_at < b.period_end));
END $$;
COMMENT ON FUNCTION flagmeter.current_period_has_usage(text, text) IS
'whether the current period of a tenant and meter (under the limit in force) has a counter row or an event; index probes only, whatever the history';

CREATE OR REPLACE FUNCTION flagmeter.recount_current_period(tenant text, meter text)
RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	cfg record;
	b record;
BEGIN
	-- Nothing counted in the new period and no event within it (the common
	-- case: a tenant assigned at signup): nothing to recount, and no reason
	-- to pause anyone's ingest.  A track of this tenant in flight right now
	-- counts in the period its occurred_at had under the old boundaries.
	IF NOT flagmeter.current_period_has_usage(tenant, meter) THEN
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

-- 30_catalog.sql
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

CREATE OR REPLACE FUNCTION flagmeter.assign_plan(tenant text, plan text,
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

CREATE OR REPLACE FUNCTION flagmeter.limit_configs(tenant text, meter text DEFAULT NULL)
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

CREATE OR REPLACE FUNCTION flagmeter.apply_limit_changes(before jsonb)
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

-- 80_security.sql
REVOKE ALL ON FUNCTION flagmeter.assign_plan_batch(text[], text, timestamptz, text) FROM PUBLIC;

CREATE OR REPLACE FUNCTION flagmeter.access_privileges(access text)
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
			'flagmeter.assign_plan_batch(text[], text, timestamptz, text)',
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
