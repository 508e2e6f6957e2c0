-- flagmeter_proxy 0.3.0 -> 0.4.0: assign_plan_batch split by shard
-- (CHANGELOG.md).

\echo Use "ALTER EXTENSION flagmeter_proxy UPDATE TO '0.4.0'" to load this file. \quit

CREATE FUNCTION flagmeter.assign_plan_batch_split(tenants text[], plan text,
	anchor timestamptz, timezone text)
RETURNS SETOF bigint
LANGUAGE plproxy VOLATILE
AS $$
	CLUSTER 'flagmeter';
	SPLIT tenants;
	RUN ON flagmeter.tenant_hash(tenants);
	TARGET flagmeter.assign_plan_batch;
$$;
COMMENT ON FUNCTION flagmeter.assign_plan_batch_split(text[], text, timestamptz, text) IS
'assign_plan_batch''s tenants split by shard, one assign_plan_batch per shard in parallel; how many each assigned';

CREATE FUNCTION flagmeter.assign_plan_batch_whole(tenants text[], plan text,
	anchor timestamptz, timezone text)
RETURNS bigint
LANGUAGE plproxy VOLATILE
AS $$
	CLUSTER 'flagmeter';
	RUN ON 0;
	TARGET flagmeter.assign_plan_batch;
$$;
COMMENT ON FUNCTION flagmeter.assign_plan_batch_whole(text[], text, timestamptz, text) IS
'assign_plan_batch''s arguments, unsplit, to the shard of partition 0: for tenants one node would refuse, which the shard reports as flagmeter does';

CREATE FUNCTION flagmeter.assign_plan_batch(tenants text[], plan text,
	anchor timestamptz DEFAULT NULL, timezone text DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	n integer := cardinality(tenants);
BEGIN
	IF n IS NULL OR n = 0 OR array_ndims(tenants) <> 1
	   OR EXISTS (SELECT FROM unnest(tenants) t(tenant)
	              WHERE t.tenant IS NULL OR t.tenant = '' OR octet_length(t.tenant) > 256)
	   OR (SELECT count(DISTINCT t.tenant) FROM unnest(tenants) t(tenant)) <> n THEN
		RETURN flagmeter.assign_plan_batch_whole(tenants, plan, anchor, timezone);
	END IF;
	RETURN (SELECT COALESCE(sum(c), 0)::bigint
	        FROM flagmeter.assign_plan_batch_split(tenants, plan, anchor, timezone) c);
END $$;
COMMENT ON FUNCTION flagmeter.assign_plan_batch(text[], text, timestamptz, text) IS
'flagmeter.assign_plan_batch on each shard with its tenants; how many were assigned';

REVOKE ALL ON FUNCTION flagmeter.assign_plan_batch(text[], text, timestamptz, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.assign_plan_batch_split(text[], text, timestamptz, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.assign_plan_batch_whole(text[], text, timestamptz, text) FROM PUBLIC;
