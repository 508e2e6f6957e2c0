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
