-- flagmeter_proxy 0.1.0 -> 0.2.0: rate limits (CHANGELOG.md).  What
-- proxy.sql and the shared parts changed: the decision gains retry_after,
-- rate_decision is new, reserve, consume_batch and consume_batch_on return
-- retry_after (dropped and created again), and the rate limits' calls are
-- routed (set_rate_limit on every shard, the tenant's calls and limit() by
-- hash).

\echo Use "ALTER EXTENSION flagmeter_proxy UPDATE TO '0.2.0'" to load this file. \quit

ALTER TYPE flagmeter.decision ADD ATTRIBUTE retry_after interval;
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

-- dropped and created again; the roles that could execute them can again
SELECT pg_catalog.set_config('flagmeter_upgrade.grants', COALESCE(pg_catalog.string_agg(
           pg_catalog.format('GRANT EXECUTE ON FUNCTION %s TO %I', p.oid::pg_catalog.regprocedure,
                             a.grantee::pg_catalog.regrole::pg_catalog.text), ';'), ''), false)
FROM pg_catalog.pg_proc p, pg_catalog.aclexplode(p.proacl) a
WHERE p.oid OPERATOR(pg_catalog.=) ANY (ARRAY[
          'flagmeter.consume_batch(text[], text[], bigint[], text[], integer[])'::pg_catalog.regprocedure,
          'flagmeter.reserve(text, text, bigint, interval, text)'::pg_catalog.regprocedure])
  AND a.privilege_type OPERATOR(pg_catalog.=) 'EXECUTE'
  AND a.grantee OPERATOR(pg_catalog.<>) 0 AND a.grantee OPERATOR(pg_catalog.<>) p.proowner;
DROP FUNCTION flagmeter.reserve(text, text, bigint, interval, text);
DROP FUNCTION flagmeter.consume_batch(text[], text[], bigint[], text[], integer[]);
DROP FUNCTION flagmeter.consume_batch_on(integer, text[], text[], bigint[], text[], integer[]);

CREATE FUNCTION flagmeter.reserve(tenant text, meter text, amount bigint,
	ttl interval DEFAULT '5 minutes', idempotency_key text DEFAULT NULL,
	OUT granted boolean, OUT reservation_id bigint, OUT reserved bigint,
	OUT expires_at timestamptz, OUT balance bigint, OUT retry_after interval)
RETURNS record
LANGUAGE plproxy VOLATILE
AS $$
	CLUSTER 'flagmeter';
	RUN ON flagmeter.tenant_hash(tenant);
$$;
COMMENT ON FUNCTION flagmeter.reserve(text, text, bigint, interval, text) IS
'flagmeter.reserve on the tenant''s shard; the reservation id is that shard''s';

CREATE FUNCTION flagmeter.override_rate_limit(tenant text, meter text, rate bigint, per interval,
	burst bigint DEFAULT NULL)
RETURNS void
LANGUAGE plproxy VOLATILE
AS $$
	CLUSTER 'flagmeter';
	RUN ON flagmeter.tenant_hash(tenant);
$$;
COMMENT ON FUNCTION flagmeter.override_rate_limit(text, text, bigint, interval, bigint) IS
'flagmeter.override_rate_limit on the tenant''s shard';

CREATE FUNCTION flagmeter.drop_rate_override(tenant text, meter text)
RETURNS boolean
LANGUAGE plproxy VOLATILE
AS $$
	CLUSTER 'flagmeter';
	RUN ON flagmeter.tenant_hash(tenant);
$$;
COMMENT ON FUNCTION flagmeter.drop_rate_override(text, text) IS
'flagmeter.drop_rate_override on the tenant''s shard';

CREATE FUNCTION flagmeter.rate_limit_config(tenant text, meter text,
	OUT rate bigint, OUT per interval, OUT burst bigint, OUT source text)
RETURNS SETOF record
LANGUAGE plproxy VOLATILE ROWS 1
AS $$
	CLUSTER 'flagmeter';
	RUN ON flagmeter.tenant_hash(tenant);
$$;
COMMENT ON FUNCTION flagmeter.rate_limit_config(text, text) IS
'flagmeter.rate_limit_config on the tenant''s shard';

CREATE FUNCTION flagmeter.limit(key text, rate bigint, per interval, burst bigint DEFAULT NULL,
	cost bigint DEFAULT 1)
RETURNS flagmeter.rate_decision
LANGUAGE plproxy VOLATILE
AS $$
	CLUSTER 'flagmeter';
	RUN ON flagmeter.tenant_hash(key);
$$;
COMMENT ON FUNCTION flagmeter.limit(text, bigint, interval, bigint, bigint) IS
'flagmeter.limit on the shard the key hashes to';

CREATE FUNCTION flagmeter.consume_batch_on(part integer, tenants text[], meters text[], amounts bigint[],
	idempotency_keys text[], items integer[])
RETURNS TABLE (item integer, granted boolean, used bigint, quota bigint, remaining bigint,
	resets_at timestamptz, overage bigint, meter text, reason text, from_grants bigint,
	balance bigint, retry_after interval)
LANGUAGE plproxy VOLATILE
AS $$
	CLUSTER 'flagmeter';
	RUN ON part;
	SELECT * FROM flagmeter.consume_batch($2, $3, $4, $5, $6);
$$;
COMMENT ON FUNCTION flagmeter.consume_batch_on(integer, text[], text[], bigint[], text[], integer[]) IS
'internal: flagmeter.consume_batch on one partition''s shard';

CREATE FUNCTION flagmeter.consume_batch(tenants text[], meters text[], amounts bigint[],
	idempotency_keys text[] DEFAULT NULL, items integer[] DEFAULT NULL)
RETURNS TABLE (item integer, granted boolean, used bigint, quota bigint, remaining bigint,
	resets_at timestamptz, overage bigint, meter text, reason text, from_grants bigint,
	balance bigint, retry_after interval)
LANGUAGE plpgsql VOLATILE ROWS 16
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	n integer := cardinality(tenants);
	p integer := flagmeter.partition_count();
	ids integer[];
BEGIN
	IF n IS NULL OR n = 0 OR meters IS NULL OR amounts IS NULL
	   OR array_ndims(tenants) <> 1 OR array_ndims(meters) IS DISTINCT FROM 1
	   OR array_ndims(amounts) IS DISTINCT FROM 1
	   OR cardinality(meters) <> n OR cardinality(amounts) <> n
	   OR cardinality(idempotency_keys) <> n OR cardinality(items) <> n
	   OR array_ndims(idempotency_keys) <> 1 OR array_ndims(items) <> 1
	   OR array_position(items, NULL) IS NOT NULL THEN
		RETURN QUERY SELECT * FROM flagmeter.consume_batch_on(0, tenants, meters, amounts, idempotency_keys, items);
		RETURN;
	END IF;
	-- NULL items: every row its own item, numbered from 1, as on one node
	ids := COALESCE(items, ARRAY(SELECT generate_series(1, n)));
	-- an item's rows must be adjacent and have one tenant: an item over two
	-- partitions has two tenants, which one node refuses too
	IF EXISTS (SELECT FROM generate_series(1, n) i
	           GROUP BY ids[i]
	           HAVING count(DISTINCT flagmeter.tenant_partition(tenants[i], p)) > 1
	               OR max(i) - min(i) + 1 <> count(*)) THEN
		RETURN QUERY SELECT * FROM flagmeter.consume_batch_on(0, tenants, meters, amounts, idempotency_keys, items);
		RETURN;
	END IF;
	RETURN QUERY
	SELECT d.item, d.granted, d.used, d.quota, d.remaining, d.resets_at, d.overage, d.meter, d.reason,
	       d.from_grants, d.balance, d.retry_after
	FROM flagmeter.elements_by_partition(tenants) e,
	     LATERAL flagmeter.consume_batch_on(e.part, flagmeter.pick(tenants, e.idx),
	         flagmeter.pick(meters, e.idx), flagmeter.pick(amounts, e.idx),
	         flagmeter.pick(idempotency_keys, e.idx), flagmeter.pick(ids, e.idx))
	         WITH ORDINALITY d
	ORDER BY e.idx[d.ordinality];
END $$;
COMMENT ON FUNCTION flagmeter.consume_batch(text[], text[], bigint[], text[], integer[]) IS
'flagmeter.consume_batch by partition, one decision per row in argument order; an item is all or nothing (its rows have one tenant, so one partition); all or nothing per partition, not across partitions';

CREATE FUNCTION flagmeter.set_rate_limit(plan text, meter text, rate bigint, per interval,
	burst bigint DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	PERFORM flagmeter.on_every_shard(
		format('SELECT flagmeter.store_rate_limit(%L::text, %L::text, %L::text, %L::bigint, '
		       '%L::interval, %L::bigint)', plan, NULL::text, meter, rate, per, burst),
		format('SELECT flagmeter.announce_rate_limit(%L::text, %L::text, %L::text)',
		       plan, NULL::text, meter));
END $$;
COMMENT ON FUNCTION flagmeter.set_rate_limit(text, text, bigint, interval, bigint) IS
'flagmeter.set_rate_limit on every shard or on none: the plan''s rate limit by two-phase commit, then each shard announces it; each shard limits its own tenants';
REVOKE ALL ON FUNCTION flagmeter.set_rate_limit(text, text, bigint, interval, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.override_rate_limit(text, text, bigint, interval, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.drop_rate_override(text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.limit(text, bigint, interval, bigint, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.reserve(text, text, bigint, interval, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.consume_batch(text[], text[], bigint[], text[], integer[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.consume_batch_on(integer, text[], text[], bigint[], text[], integer[]) FROM PUBLIC;
DO $$
BEGIN
	IF pg_catalog.current_setting('flagmeter_upgrade.grants') <> '' THEN
		EXECUTE pg_catalog.current_setting('flagmeter_upgrade.grants');
	END IF;
	PERFORM pg_catalog.set_config('flagmeter_upgrade.grants', '', false);
END $$;
