-- flagmeter_proxy 0.2.0 -> 0.3.0: the distinct counts' calls, routed by
-- tenant (CHANGELOG.md).

\echo Use "ALTER EXTENSION flagmeter_proxy UPDATE TO '0.3.0'" to load this file. \quit

CREATE FUNCTION flagmeter.track_value(tenant text, meter text, value text,
	occurred_at timestamptz DEFAULT now())
RETURNS boolean
LANGUAGE plproxy VOLATILE
AS $$
	CLUSTER 'flagmeter';
	RUN ON flagmeter.tenant_hash(tenant);
$$;
COMMENT ON FUNCTION flagmeter.track_value(text, text, text, timestamptz) IS
'flagmeter.track_value on the tenant''s shard; committed there when it returns';

CREATE FUNCTION flagmeter.consume_value(tenant text, meter text, value text)
RETURNS flagmeter.decision
LANGUAGE plproxy VOLATILE
AS $$
	CLUSTER 'flagmeter';
	RUN ON flagmeter.tenant_hash(tenant);
$$;
COMMENT ON FUNCTION flagmeter.consume_value(text, text, text) IS
'flagmeter.consume_value on the tenant''s shard, where the tenant''s limit is enforced; committed there when it returns';

CREATE FUNCTION flagmeter.forget_value(tenant text, meter text, value text)
RETURNS boolean
LANGUAGE plproxy VOLATILE
AS $$
	CLUSTER 'flagmeter';
	RUN ON flagmeter.tenant_hash(tenant);
$$;
COMMENT ON FUNCTION flagmeter.forget_value(text, text, text) IS
'flagmeter.forget_value on the tenant''s shard';

REVOKE ALL ON FUNCTION flagmeter.track_value(text, text, text, timestamptz) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.consume_value(text, text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.forget_value(text, text, text) FROM PUBLIC;
