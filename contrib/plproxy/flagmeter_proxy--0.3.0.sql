\echo Use "CREATE EXTENSION flagmeter_proxy" to load this file. \quit
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
-- flagmeter_proxy: flagmeter's API in a PL/Proxy proxy database.
--
-- The install script flagmeter_proxy--0.1.0.sql is this file after
-- sql/parts/10_counter.sql and 15_decision.sql (the Makefile concatenates
-- them): a proxy has the quota_counter and decision types, so that usage()
-- and the merges below return real counters, and nothing of the tables.
--
-- Every shard is an ordinary database with flagmeter.  The cluster is the
-- plproxy SQL/MED server "flagmeter", with options partition_0 ..
-- partition_<P-1> (P a power of two) naming the shards' connection strings;
-- several partitions may name one shard (that is how a shard is added
-- later: README "Scale-out").  Here, in schema flagmeter:
--
--   routed by tenant   RUN ON tenant_hash(tenant): track, consume (both),
--                      check, usage, void, track_value, consume_value,
--                      forget_value, assign_plan, override_limit,
--                      drop_override, override_rate_limit,
--                      drop_rate_override, rate_limit_config, limit (by
--                      its key), limit_config, status(tenant),
--                      usage_series, unassign_tenant, override_feature,
--                      drop_feature_override, has_feature, feature_config
--   split by shard     track_batch (SPLIT on its arrays); track_events and
--                      consume_batch (one call per partition, the answers
--                      put back in argument order)
--   run on all shards  and merged here: the view status, top_tenants,
--                      usage_series_all
--   every shard or none, by two-phase commit (on_every_shard):
--                      define_meter, define_plan, set_limit, set_rate_limit,
--                      define_feature, set_feature
--   not yet proxied    drop_plan, drop_meter, drop_rate_limit, configure
--                      (every shard or none), limit_batch (route each key
--                      with limit),
--                      the untyped overloads consume(text, text, text, text)
--                      and track(text, text, bigint, text, text), the views
--                      tenant_features and entitlements, grant_access
--
-- Adding a later per-tenant call: a plproxy function of the same signature
-- whose body is "CLUSTER 'flagmeter'; RUN ON flagmeter.tenant_hash(tenant);"
-- (the tenant first, as every per-tenant call of flagmeter takes it), its
-- COMMENT, and in the list above; a call that changes what every shard
-- must agree on (a plan's features, say) is a plpgsql function that passes
-- the shard-side call to flagmeter.on_every_shard(), with what it announces
-- as the second argument when it announces anything.  Then an update
-- script, and a line in test/t/080_plproxy.pl.  `make check-proxy`
-- (tools/check_proxy_stubs.py) fails while a per-tenant or granted call
-- of flagmeter has no function here of its signature (or is not listed
-- there as not proxied, with why), or while one here differs from the
-- flagmeter function it routes to: argument names, types, defaults,
-- result, REVOKE from PUBLIC.
--
-- What PL/Proxy does not give: a transaction across calls.  Each call
-- commits on its shard when it returns, whatever the proxy transaction
-- does after; the caller's unit of retry is the call, and idempotency keys
-- make a retry safe.
-- ---------------------------------------------------------------------------

-- Routing ---------------------------------------------------------------------

-- hashtext(tenant), as PL/Proxy maps it to a partition and as the shards'
-- flagmeter.partition_of() does; a NULL tenant goes to the partition of ''
-- so that a shard reports it as flagmeter does (22004), not PL/Proxy.
-- SETOF and SQL, so that the query PL/Proxy runs for it is inlined.
CREATE FUNCTION flagmeter.tenant_hash(tenant text)
RETURNS SETOF integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE ROWS 1
AS $$
SELECT pg_catalog.hashtext(COALESCE($1, ''::pg_catalog.text))
$$;
COMMENT ON FUNCTION flagmeter.tenant_hash(text) IS
'the hash PL/Proxy routes a tenant''s calls by: hashtext(tenant), NULL as the empty string (so that the shard reports it)';

-- Calls routed to the tenant's shard ---------------------------------------------
-- The defaults are evaluated here: occurred_at defaults to the proxy's now().
-- PL/Proxy functions must be VOLATILE, the readers too.

CREATE FUNCTION flagmeter.track(tenant text, meter text, amount bigint DEFAULT 1,
	occurred_at timestamptz DEFAULT now(), idempotency_key text DEFAULT NULL)
RETURNS boolean
LANGUAGE plproxy VOLATILE
AS $$
	CLUSTER 'flagmeter';
	RUN ON flagmeter.tenant_hash(tenant);
$$;
COMMENT ON FUNCTION flagmeter.track(text, text, bigint, timestamptz, text) IS
'flagmeter.track on the tenant''s shard; committed there when it returns';

CREATE FUNCTION flagmeter.consume(tenant text, meter text, amount bigint DEFAULT 1,
	idempotency_key text DEFAULT NULL)
RETURNS flagmeter.decision
LANGUAGE plproxy VOLATILE
AS $$
	CLUSTER 'flagmeter';
	RUN ON flagmeter.tenant_hash(tenant);
$$;
COMMENT ON FUNCTION flagmeter.consume(text, text, bigint, text) IS
'flagmeter.consume on the tenant''s shard, where the tenant''s limit is enforced; committed there when it returns';

CREATE FUNCTION flagmeter.consume(tenant text, meters text[], amounts bigint[],
	idempotency_key text DEFAULT NULL)
RETURNS SETOF flagmeter.decision
LANGUAGE plproxy VOLATILE ROWS 2
AS $$
	CLUSTER 'flagmeter';
	RUN ON flagmeter.tenant_hash(tenant);
$$;
COMMENT ON FUNCTION flagmeter.consume(text, text[], bigint[], text) IS
'flagmeter.consume across several meters on the tenant''s shard: all or nothing there';

CREATE FUNCTION flagmeter."check"(tenant text, meter text, amount bigint DEFAULT 1)
RETURNS flagmeter.decision
LANGUAGE plproxy VOLATILE
AS $$
	CLUSTER 'flagmeter';
	RUN ON flagmeter.tenant_hash(tenant);
$$;
COMMENT ON FUNCTION flagmeter."check"(text, text, bigint) IS
'flagmeter.check on the tenant''s shard';

CREATE FUNCTION flagmeter.usage(tenant text, meter text, at timestamptz DEFAULT now())
RETURNS flagmeter.quota_counter
LANGUAGE plproxy VOLATILE
AS $$
	CLUSTER 'flagmeter';
	RUN ON flagmeter.tenant_hash(tenant);
$$;
COMMENT ON FUNCTION flagmeter.usage(text, text, timestamptz) IS
'flagmeter.usage on the tenant''s shard';

CREATE FUNCTION flagmeter.void(tenant text, idempotency_key text)
RETURNS boolean
LANGUAGE plproxy VOLATILE
AS $$
	CLUSTER 'flagmeter';
	RUN ON flagmeter.tenant_hash(tenant);
$$;
COMMENT ON FUNCTION flagmeter.void(text, text) IS
'flagmeter.void on the tenant''s shard';

-- Distinct counts: a tenant's sets of values live on its shard.
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

-- Credit grants and reservations (issue 19): the calls that name a tenant
-- are routed by it.  void_grant, settle and release take only an id, which
-- names no shard: call them on the tenant's shard (keep the id with its
-- tenant; partition_of says where it lives).
CREATE FUNCTION flagmeter.grant_credits(tenant text, meter text, amount bigint,
	expires_at timestamptz DEFAULT NULL, priority integer DEFAULT 0,
	starts_at timestamptz DEFAULT now(), idempotency_key text DEFAULT NULL,
	low_balance_percent integer DEFAULT 10)
RETURNS bigint
LANGUAGE plproxy VOLATILE
AS $$
	CLUSTER 'flagmeter';
	RUN ON flagmeter.tenant_hash(tenant);
$$;
COMMENT ON FUNCTION flagmeter.grant_credits(text, text, bigint, timestamptz, integer, timestamptz, text, integer) IS
'flagmeter.grant_credits on the tenant''s shard; the id is that shard''s';

CREATE FUNCTION flagmeter.balance(tenant text, meter text)
RETURNS bigint
LANGUAGE plproxy VOLATILE
AS $$
	CLUSTER 'flagmeter';
	RUN ON flagmeter.tenant_hash(tenant);
$$;
COMMENT ON FUNCTION flagmeter.balance(text, text) IS
'flagmeter.balance on the tenant''s shard';

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

CREATE FUNCTION flagmeter.assign_plan(tenant text, plan text,
	anchor timestamptz DEFAULT NULL, timezone text DEFAULT NULL)
RETURNS void
LANGUAGE plproxy VOLATILE
AS $$
	CLUSTER 'flagmeter';
	RUN ON flagmeter.tenant_hash(tenant);
$$;
COMMENT ON FUNCTION flagmeter.assign_plan(text, text, timestamptz, text) IS
'flagmeter.assign_plan on the tenant''s shard, which holds the tenant''s row and announces plan_changed to its listeners';

CREATE FUNCTION flagmeter.override_limit(tenant text, meter text, quota bigint,
	period text DEFAULT NULL, mode text DEFAULT NULL, thresholds integer[] DEFAULT NULL)
RETURNS void
LANGUAGE plproxy VOLATILE
AS $$
	CLUSTER 'flagmeter';
	RUN ON flagmeter.tenant_hash(tenant);
$$;
COMMENT ON FUNCTION flagmeter.override_limit(text, text, bigint, text, text, integer[]) IS
'flagmeter.override_limit on the tenant''s shard';

-- A tenant's rate limit lives on its shard, with its usage: the limiter of
-- one shard's shared memory decides for it.
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

-- limit(key): one key's limiter is on one shard, the one its key hashes to
-- as a tenant would.
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

CREATE FUNCTION flagmeter.drop_override(tenant text, meter text)
RETURNS boolean
LANGUAGE plproxy VOLATILE
AS $$
	CLUSTER 'flagmeter';
	RUN ON flagmeter.tenant_hash(tenant);
$$;
COMMENT ON FUNCTION flagmeter.drop_override(text, text) IS
'flagmeter.drop_override on the tenant''s shard';

CREATE FUNCTION flagmeter.unassign_tenant(tenant text, forget_usage boolean DEFAULT false)
RETURNS boolean
LANGUAGE plproxy VOLATILE
AS $$
	CLUSTER 'flagmeter';
	RUN ON flagmeter.tenant_hash(tenant);
$$;
COMMENT ON FUNCTION flagmeter.unassign_tenant(text, boolean) IS
'flagmeter.unassign_tenant on the tenant''s shard';

CREATE FUNCTION flagmeter.override_feature(tenant text, feature text, enabled boolean,
	config jsonb DEFAULT NULL)
RETURNS void
LANGUAGE plproxy VOLATILE
AS $$
	CLUSTER 'flagmeter';
	RUN ON flagmeter.tenant_hash(tenant);
$$;
COMMENT ON FUNCTION flagmeter.override_feature(text, text, boolean, jsonb) IS
'flagmeter.override_feature on the tenant''s shard';

CREATE FUNCTION flagmeter.drop_feature_override(tenant text, feature text)
RETURNS boolean
LANGUAGE plproxy VOLATILE
AS $$
	CLUSTER 'flagmeter';
	RUN ON flagmeter.tenant_hash(tenant);
$$;
COMMENT ON FUNCTION flagmeter.drop_feature_override(text, text) IS
'flagmeter.drop_feature_override on the tenant''s shard';

CREATE FUNCTION flagmeter.has_feature(tenant text, feature text)
RETURNS boolean
LANGUAGE plproxy VOLATILE
AS $$
	CLUSTER 'flagmeter';
	RUN ON flagmeter.tenant_hash(tenant);
$$;
COMMENT ON FUNCTION flagmeter.has_feature(text, text) IS
'flagmeter.has_feature on the tenant''s shard';

CREATE FUNCTION flagmeter.feature_config(tenant text, feature text)
RETURNS jsonb
LANGUAGE plproxy VOLATILE
AS $$
	CLUSTER 'flagmeter';
	RUN ON flagmeter.tenant_hash(tenant);
$$;
COMMENT ON FUNCTION flagmeter.feature_config(text, text) IS
'flagmeter.feature_config on the tenant''s shard';

CREATE FUNCTION flagmeter.limit_config(tenant text, meter text,
	OUT aggregation text, OUT plan text, OUT quota bigint, OUT period text,
	OUT mode text, OUT thresholds integer[], OUT anchor timestamptz, OUT timezone text)
RETURNS SETOF record
LANGUAGE plproxy VOLATILE ROWS 1
AS $$
	CLUSTER 'flagmeter';
	RUN ON flagmeter.tenant_hash(tenant);
$$;
COMMENT ON FUNCTION flagmeter.limit_config(text, text) IS
'flagmeter.limit_config on the tenant''s shard';

CREATE FUNCTION flagmeter.usage_series(tenant text, meter text, "from" timestamptz, "to" timestamptz,
	bucket text DEFAULT 'day', timezone text DEFAULT 'UTC')
RETURNS TABLE (bucket_start timestamptz, used bigint, counter flagmeter.quota_counter)
LANGUAGE plproxy VOLATILE
AS $$
	CLUSTER 'flagmeter';
	RUN ON flagmeter.tenant_hash(tenant);
$$;
COMMENT ON FUNCTION flagmeter.usage_series(text, text, timestamptz, timestamptz, text, text) IS
'flagmeter.usage_series on the tenant''s shard';

-- track_batch: one call per shard with that shard's events ---------------------------

CREATE FUNCTION flagmeter.track_batch_split(tenants text[], meters text[], amounts bigint[],
	occurred_at timestamptz[], idempotency_keys text[])
RETURNS SETOF bigint
LANGUAGE plproxy VOLATILE
AS $$
	CLUSTER 'flagmeter';
	SPLIT tenants, meters, amounts, occurred_at, idempotency_keys;
	RUN ON flagmeter.tenant_hash(tenants);
	TARGET flagmeter.track_batch;
$$;
COMMENT ON FUNCTION flagmeter.track_batch_split(text[], text[], bigint[], timestamptz[], text[]) IS
'track_batch''s events split by shard, one track_batch per shard in parallel; how many each counted';

CREATE FUNCTION flagmeter.track_batch_whole(tenants text[], meters text[], amounts bigint[],
	occurred_at timestamptz[], idempotency_keys text[])
RETURNS bigint
LANGUAGE plproxy VOLATILE
AS $$
	CLUSTER 'flagmeter';
	RUN ON 0;
	TARGET flagmeter.track_batch;
$$;
COMMENT ON FUNCTION flagmeter.track_batch_whole(text[], text[], bigint[], timestamptz[], text[]) IS
'track_batch''s arguments, unsplit, to the shard of partition 0: for arguments the split cannot take, which the shard reports as flagmeter does';

-- All or nothing per shard: a shard that fails rolls back its part, the
-- others' parts are committed.  Retrying the whole batch with its
-- idempotency keys counts what is missing and skips what was counted.
CREATE FUNCTION flagmeter.track_batch(tenants text[], meters text[], amounts bigint[],
	occurred_at timestamptz[] DEFAULT NULL, idempotency_keys text[] DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	n integer := cardinality(tenants);
BEGIN
	-- NULL, empty, uneven or multi-dimensional arrays: one shard says what
	-- is wrong (or counts nothing) exactly as one node would
	IF n IS NULL OR n = 0 OR meters IS NULL OR amounts IS NULL
	   OR array_ndims(tenants) <> 1 OR array_ndims(meters) IS DISTINCT FROM 1
	   OR array_ndims(amounts) IS DISTINCT FROM 1
	   OR cardinality(meters) <> n OR cardinality(amounts) <> n
	   OR cardinality(occurred_at) <> n OR cardinality(idempotency_keys) <> n
	   OR array_ndims(occurred_at) <> 1 OR array_ndims(idempotency_keys) <> 1 THEN
		RETURN flagmeter.track_batch_whole(tenants, meters, amounts, occurred_at, idempotency_keys);
	END IF;
	-- SPLIT needs arrays; NULL elements mean what the NULL array meant
	RETURN (SELECT COALESCE(sum(c), 0)::bigint
	        FROM flagmeter.track_batch_split(tenants, meters, amounts,
	                 COALESCE(occurred_at, array_fill(NULL::timestamptz, ARRAY[n])),
	                 COALESCE(idempotency_keys, array_fill(NULL::text, ARRAY[n]))) c);
END $$;
COMMENT ON FUNCTION flagmeter.track_batch(text[], text[], bigint[], timestamptz[], text[]) IS
'flagmeter.track_batch split by shard, the parts run in parallel; how many events were counted; all or nothing per shard, not across shards';

-- The client's batched calls: one call per partition -----------------------------
-- track_events and consume_batch answer per element, in argument order,
-- which SPLIT cannot give back (its rows come per shard, in no order).  So
-- the proxy groups the elements by partition itself, calls each partition
-- with its elements in their order, and puts the answers back in place.
-- Each part commits on its shard when it returns: all or nothing per
-- partition, not across them; a retry with the same idempotency keys counts
-- what is missing.  Arguments one node refuses as a whole (NULL or uneven
-- arrays, an item's rows not adjacent or on two partitions) go unsplit to
-- partition 0, which refuses them as one node does.

-- The partition PL/Proxy runs a tenant's calls on: the low bits of its hash.
CREATE FUNCTION flagmeter.tenant_partition(tenant text, partitions integer)
RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
SELECT pg_catalog.hashtext(COALESCE($1, ''::pg_catalog.text)) OPERATOR(pg_catalog.&) ($2 OPERATOR(pg_catalog.-) 1)
$$;
COMMENT ON FUNCTION flagmeter.tenant_partition(text, integer) IS
'the partition (0 .. partitions - 1, a power of two) that PL/Proxy routes the tenant''s calls to';

CREATE FUNCTION flagmeter.partition_count()
RETURNS integer
LANGUAGE sql STABLE
AS $$
SELECT pg_catalog.count(*)::integer
FROM pg_catalog.pg_foreign_server s, pg_catalog.unnest(s.srvoptions) o
WHERE s.srvname OPERATOR(pg_catalog.=) 'flagmeter' AND o OPERATOR(pg_catalog.~) '^partition_[0-9]+='
$$;
COMMENT ON FUNCTION flagmeter.partition_count() IS
'how many partitions the PL/Proxy cluster "flagmeter" has';

-- The elements of the tenants' array by partition: their subscripts, in order.
CREATE FUNCTION flagmeter.elements_by_partition(tenants text[], OUT part integer, OUT idx integer[])
RETURNS SETOF record
LANGUAGE sql STABLE
AS $$
SELECT flagmeter.tenant_partition($1[i], flagmeter.partition_count()) AS part,
       pg_catalog.array_agg(i ORDER BY i)
FROM pg_catalog.generate_subscripts($1, 1) i
GROUP BY 1
$$;
COMMENT ON FUNCTION flagmeter.elements_by_partition(text[]) IS
'internal: per partition, the subscripts of the tenants routed to it, in order';

-- The elements of an array at the given subscripts, in their order.
CREATE FUNCTION flagmeter.pick(elements anyarray, idx integer[])
RETURNS anyarray
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$
SELECT pg_catalog.array_agg($1[x.i] ORDER BY x.o) FROM pg_catalog.unnest($2) WITH ORDINALITY x(i, o)
$$;
COMMENT ON FUNCTION flagmeter.pick(anyarray, integer[]) IS
'internal: elements[idx[1]], elements[idx[2]], ... as an array (NULL for a NULL array)';

-- part is a partition number, which RUN ON takes as a hash: the low bits
-- of 0 .. P-1 are the number itself.
CREATE FUNCTION flagmeter.track_events_on(part integer, tenants text[], meters text[], amounts bigint[],
	occurred_at timestamptz[], idempotency_keys text[])
RETURNS boolean[]
LANGUAGE plproxy VOLATILE
AS $$
	CLUSTER 'flagmeter';
	RUN ON part;
	SELECT flagmeter.track_events($2, $3, $4, $5, $6);
$$;
COMMENT ON FUNCTION flagmeter.track_events_on(integer, text[], text[], bigint[], timestamptz[], text[]) IS
'internal: flagmeter.track_events on one partition''s shard';

CREATE FUNCTION flagmeter.track_events(tenants text[], meters text[], amounts bigint[],
	occurred_at timestamptz[] DEFAULT NULL, idempotency_keys text[] DEFAULT NULL)
RETURNS boolean[]
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	n integer := cardinality(tenants);
	answers boolean[];
BEGIN
	IF n IS NULL OR n = 0 OR meters IS NULL OR amounts IS NULL
	   OR array_ndims(tenants) <> 1 OR array_ndims(meters) IS DISTINCT FROM 1
	   OR array_ndims(amounts) IS DISTINCT FROM 1
	   OR cardinality(meters) <> n OR cardinality(amounts) <> n
	   OR cardinality(occurred_at) <> n OR cardinality(idempotency_keys) <> n
	   OR array_ndims(occurred_at) <> 1 OR array_ndims(idempotency_keys) <> 1 THEN
		RETURN flagmeter.track_events_on(0, tenants, meters, amounts, occurred_at, idempotency_keys);
	END IF;
	SELECT array_agg(a.answer ORDER BY e.idx[a.k]) INTO answers
	FROM flagmeter.elements_by_partition(tenants) e,
	     LATERAL unnest(flagmeter.track_events_on(e.part, flagmeter.pick(tenants, e.idx),
	         flagmeter.pick(meters, e.idx), flagmeter.pick(amounts, e.idx),
	         flagmeter.pick(occurred_at, e.idx), flagmeter.pick(idempotency_keys, e.idx)))
	         WITH ORDINALITY a(answer, k);
	RETURN answers;
END $$;
COMMENT ON FUNCTION flagmeter.track_events(text[], text[], bigint[], timestamptz[], text[]) IS
'flagmeter.track_events by partition, the answers in argument order; all or nothing per partition, not across partitions';

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

-- Dashboards across shards ------------------------------------------------------------

CREATE FUNCTION flagmeter.status_on_shards()
RETURNS TABLE (tenant text, meter text, period_start timestamptz, period_end timestamptz,
	used bigint, quota bigint, remaining bigint, ratio double precision, state text,
	mode text, period text, plan text)
LANGUAGE plproxy VOLATILE
AS $$
	CLUSTER 'flagmeter';
	RUN ON ALL;
	SELECT * FROM flagmeter.status;
$$;
COMMENT ON FUNCTION flagmeter.status_on_shards() IS
'the status view of every shard';

CREATE VIEW flagmeter.status AS
SELECT s.tenant, s.meter, s.period_start, s.period_end, s.used, s.quota, s.remaining,
       s.ratio, s.state, s.mode, s.period, s.plan
FROM flagmeter.status_on_shards() s;
COMMENT ON VIEW flagmeter.status IS
'flagmeter.status of every shard (each tenant is on one shard): a filter on tenant still asks every shard; flagmeter.status(tenant) asks one';

CREATE FUNCTION flagmeter.status(tenant text)
RETURNS SETOF flagmeter.status
LANGUAGE plproxy VOLATILE
AS $$
	CLUSTER 'flagmeter';
	RUN ON flagmeter.tenant_hash(tenant);
$$;
COMMENT ON FUNCTION flagmeter.status(text) IS
'flagmeter.status(tenant) on the tenant''s shard';

CREATE FUNCTION flagmeter.top_tenants_on_shards(meter text, n integer, by text)
RETURNS SETOF flagmeter.status
LANGUAGE plproxy VOLATILE
AS $$
	CLUSTER 'flagmeter';
	RUN ON ALL;
	TARGET flagmeter.top_tenants;
$$;
COMMENT ON FUNCTION flagmeter.top_tenants_on_shards(text, integer, text) IS
'flagmeter.top_tenants of every shard';

-- Exact: the n first of all tenants are among the n first of their shards.
-- The order is the shards' (used or ratio, descending, then tenant).  No
-- LIMIT for an n below 1, which the shards refuse: LIMIT 0 would not even
-- ask them.
CREATE FUNCTION flagmeter.top_tenants(meter text, n integer DEFAULT 10, by text DEFAULT 'used')
RETURNS SETOF flagmeter.status
LANGUAGE sql STABLE
AS $$
SELECT s.* FROM flagmeter.top_tenants_on_shards($1, $2, $3) s
ORDER BY CASE WHEN $3 OPERATOR(pg_catalog.=) 'used' THEN s.used::double precision ELSE s.ratio END DESC,
         s.tenant
LIMIT CASE WHEN $2 OPERATOR(pg_catalog.>) 0 THEN $2 END
$$;
COMMENT ON FUNCTION flagmeter.top_tenants(text, integer, text) IS
'the n tenants of all shards with a limit on the meter that use the most in their current period, by used or by ratio';

-- Each shard's series with the meter's aggregation, so that "used" of the
-- merged counter is what one node would compute (the max of a max meter,
-- the latest of a latest meter, not their sums).
-- (Arguments named apart from SQL's words: PL/Proxy replaces an argument's
-- name wherever it stands in the query, FROM included.)
CREATE FUNCTION flagmeter.usage_series_all_on_shards(series_meter text, series_from timestamptz,
	series_to timestamptz, series_bucket text, series_timezone text)
RETURNS TABLE (bucket_start timestamptz, used bigint, counter flagmeter.quota_counter, aggregation text)
LANGUAGE plproxy VOLATILE
AS $$
	CLUSTER 'flagmeter';
	RUN ON ALL;
	SELECT s.bucket_start, s.used, s.counter, m.aggregation
	FROM flagmeter.usage_series_all($1, $2, $3, $4, $5) s
	JOIN flagmeter.meters m ON m.meter OPERATOR(pg_catalog.=) $1;
$$;
COMMENT ON FUNCTION flagmeter.usage_series_all_on_shards(text, timestamptz, timestamptz, text, text) IS
'flagmeter.usage_series_all of every shard, with the meter''s aggregation';

CREATE FUNCTION flagmeter.usage_series_all(meter text, "from" timestamptz, "to" timestamptz,
	bucket text DEFAULT 'day', timezone text DEFAULT 'UTC')
RETURNS TABLE (bucket_start timestamptz, used bigint, counter flagmeter.quota_counter)
LANGUAGE sql STABLE
AS $$
SELECT s.bucket_start, flagmeter.used_by(flagmeter.merge_agg(s.counter), pg_catalog.min(s.aggregation)),
       flagmeter.merge_agg(s.counter)
FROM flagmeter.usage_series_all_on_shards($1, $2, $3, $4, $5) s
GROUP BY s.bucket_start
ORDER BY s.bucket_start
$$;
COMMENT ON FUNCTION flagmeter.usage_series_all(text, timestamptz, timestamptz, text, text) IS
'usage of all tenants of all shards per bucket: the shards'' series merged bucket by bucket (quota_counter merges are exact for sum, count, max and latest)';

-- The shards -----------------------------------------------------------------------

-- The distinct connection strings of the cluster's partitions, numbered in
-- the order of their first partition, with the user mapping's user and
-- password when they are visible to the caller (as PL/Proxy adds them).
CREATE FUNCTION flagmeter.shards(OUT shard integer, OUT partitions integer[], OUT connstr text)
RETURNS SETOF record
LANGUAGE sql STABLE
AS $$
WITH server AS (
	SELECT s.oid, s.srvoptions FROM pg_catalog.pg_foreign_server s
	WHERE s.srvname OPERATOR(pg_catalog.=) 'flagmeter'
), parts AS (
	SELECT (pg_catalog.regexp_match(o, '^partition_([0-9]+)='))[1]::integer AS partition,
	       pg_catalog.substr(o, pg_catalog.strpos(o, '=') OPERATOR(pg_catalog.+) 1) AS connstr
	FROM server, pg_catalog.unnest(server.srvoptions) o
	WHERE o OPERATOR(pg_catalog.~) '^partition_[0-9]+='
), mapping AS (
	SELECT pg_catalog.string_agg(pg_catalog.quote_ident(pg_catalog.split_part(o, '=', 1))
	                             OPERATOR(pg_catalog.||) '=' OPERATOR(pg_catalog.||)
	                             pg_catalog.quote_literal(pg_catalog.substr(o, pg_catalog.strpos(o, '=') OPERATOR(pg_catalog.+) 1)),
	                             ' ') AS options
	FROM (SELECT u.umoptions FROM pg_catalog.pg_user_mappings u, server
	      WHERE u.srvid OPERATOR(pg_catalog.=) server.oid
	        AND u.usename OPERATOR(pg_catalog.=) ANY (ARRAY[CURRENT_USER::pg_catalog.text, 'public'])
	      ORDER BY u.usename OPERATOR(pg_catalog.=) 'public' LIMIT 1) m,
	     pg_catalog.unnest(m.umoptions) o
	WHERE pg_catalog.split_part(o, '=', 1) OPERATOR(pg_catalog.=) ANY (ARRAY['user', 'password'])
)
SELECT (pg_catalog.row_number() OVER (ORDER BY pg_catalog.min(p.partition)))::integer,
       pg_catalog.array_agg(p.partition ORDER BY p.partition),
       pg_catalog.concat_ws(' ', p.connstr, (SELECT mapping.options FROM mapping))
FROM parts p
GROUP BY p.connstr
ORDER BY 1
$$;
COMMENT ON FUNCTION flagmeter.shards() IS
'the shards of the PL/Proxy cluster "flagmeter": each distinct partition connection string (with the user mapping''s user and password when the caller can see them), its partitions, numbered in the order of its first partition';

-- One dblink session per shard, named after its number.  dblink is called
-- through the schema it was installed in, wherever that is.
--   connect     argument: the connection string (a stale session of the
--               same name, left by an interrupted call, is closed first)
--   exec        argument: a command (a SELECT returns one column); returns
--               its status, or its rows
--   prepared    argument: an interval; the gids of flagmeter's prepared
--               transactions in the shard's database at least that old
--   disconnect  closes the session if it is open
CREATE FUNCTION flagmeter.shard_link(action text, shard integer, argument text DEFAULT NULL)
RETURNS SETOF text
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	dblink name := (SELECT n.nspname FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace
	                WHERE e.extname = 'dblink');
	conn text := 'flagmeter_shard_' || shard;
	is_open boolean;
BEGIN
	IF dblink IS NULL THEN
		RAISE EXCEPTION 'extension "dblink" is not installed in this database'
			USING ERRCODE = 'undefined_object', HINT = 'CREATE EXTENSION dblink;';
	END IF;
	EXECUTE format('SELECT $1 = ANY (COALESCE(%I.dblink_get_connections(), ''{}''))', dblink)
		INTO is_open USING conn;
	CASE action
	WHEN 'connect' THEN
		IF is_open THEN
			EXECUTE format('SELECT %I.dblink_disconnect($1)', dblink) USING conn;
		END IF;
		EXECUTE format('SELECT %I.dblink_connect($1, $2)', dblink) USING conn, argument;
	WHEN 'exec' THEN
		-- dblink(), not dblink_exec(), which refuses a SELECT: a command's
		-- status, or the one column of each row a SELECT returns
		RETURN QUERY EXECUTE format('SELECT t.r FROM %I.dblink($1, $2) AS t(r text)', dblink)
			USING conn, argument;
	WHEN 'prepared' THEN
		RETURN QUERY EXECUTE format('SELECT t.gid FROM %I.dblink($1, $2) AS t(gid text)', dblink)
			USING conn, format('SELECT gid FROM pg_catalog.pg_prepared_xacts'
			                   ' WHERE gid LIKE ''flagmeter:%%'' AND database = pg_catalog.current_database()'
			                   '   AND prepared <= pg_catalog.now() - %L::interval ORDER BY gid', argument);
	WHEN 'disconnect' THEN
		IF is_open THEN
			EXECUTE format('SELECT %I.dblink_disconnect($1)', dblink) USING conn;
		END IF;
	END CASE;
END $$;
COMMENT ON FUNCTION flagmeter.shard_link(text, integer, text) IS
'the dblink session of on_every_shard and resolve_prepared with one shard: connect, exec, prepared (gids of flagmeter''s prepared transactions), disconnect';

-- Catalog changes on every shard or on none -------------------------------------------

-- Two-phase commit over the shards, in their order: every shard runs
-- command in a transaction and prepares it; once all have, each commits;
-- then each runs after_commit (what the change announces to that shard's
-- listeners, which a prepared transaction cannot carry) on its own.
-- The order is what makes an interrupted change decidable afterwards
-- (resolve_prepared): shards prepare and commit first to last and roll back
-- last to first, so a change still prepared on the first shard was
-- committed nowhere, and one the first shard no longer holds while others
-- do was being committed.
-- The shards need max_prepared_transactions above 0, and flagmeter not
-- preloaded or preloaded with flagmeter.shared_limits = 0: with the shared
-- limit cache, a transaction that changed the catalog cannot be prepared.
CREATE FUNCTION flagmeter.on_every_shard(command text, after_commit text DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	connstrs text[];
	partitions text[];
	n integer;
	i integer;
	current integer;
	prepared integer := 0;
	committed integer := 0;
	-- one gid per shard: gids are unique per server, which may hold
	-- several shards
	gid text := 'flagmeter:' || gen_random_uuid() || ':';
	state text;
	message text;
	detail text;
	hint text;
BEGIN
	IF command IS NULL THEN
		RAISE EXCEPTION 'command must not be NULL' USING ERRCODE = 'null_value_not_allowed';
	END IF;
	SELECT array_agg(x.connstr ORDER BY x.shard), array_agg(x.partitions::text ORDER BY x.shard)
	INTO connstrs, partitions FROM flagmeter.shards() x;
	n := COALESCE(cardinality(connstrs), 0);
	IF n = 0 THEN
		RAISE EXCEPTION 'the PL/Proxy cluster "flagmeter" has no partitions'
			USING ERRCODE = 'undefined_object',
			      HINT = 'CREATE SERVER flagmeter FOREIGN DATA WRAPPER plproxy OPTIONS (partition_0 ''...'', ...).';
	END IF;

	BEGIN
		FOR i IN 1..n LOOP
			current := i;
			PERFORM flagmeter.shard_link('connect', i, connstrs[i]);
			PERFORM flagmeter.shard_link('exec', i, 'BEGIN');
			PERFORM flagmeter.shard_link('exec', i, command);
		END LOOP;
		FOR i IN 1..n LOOP
			current := i;
			PERFORM flagmeter.shard_link('exec', i, format('PREPARE TRANSACTION %L', gid || i));
			prepared := i;
		END LOOP;
	EXCEPTION WHEN OTHERS THEN
		GET STACKED DIAGNOSTICS state = RETURNED_SQLSTATE, message = MESSAGE_TEXT,
		                        detail = PG_EXCEPTION_DETAIL, hint = PG_EXCEPTION_HINT;
		FOR i IN REVERSE prepared..1 LOOP
			BEGIN
				PERFORM flagmeter.shard_link('exec', i, format('ROLLBACK PREPARED %L', gid || i));
			EXCEPTION WHEN OTHERS THEN
				RAISE WARNING 'shard % keeps transaction % prepared: %', i, gid || i, SQLERRM
					USING HINT = 'SELECT flagmeter.resolve_prepared() rolls it back.';
			END;
		END LOOP;
		FOR i IN 1..n LOOP
			PERFORM flagmeter.shard_link('disconnect', i);
		END LOOP;
		detail := concat_ws(' ', NULLIF(detail, ''),
		                    format('No shard was changed (partitions %s, %s).', partitions[current],
		                           regexp_replace(connstrs[current], 'password=\S+', 'password=...')));
		IF hint = '' THEN
			RAISE EXCEPTION 'shard % of %: %', current, n, message USING ERRCODE = state, DETAIL = detail;
		END IF;
		RAISE EXCEPTION 'shard % of %: %', current, n, message
			USING ERRCODE = state, DETAIL = detail, HINT = hint;
	END;

	BEGIN
		FOR i IN 1..n LOOP
			current := i;
			PERFORM flagmeter.shard_link('exec', i, format('COMMIT PREPARED %L', gid || i));
			committed := i;
		END LOOP;
	EXCEPTION WHEN OTHERS THEN
		message := SQLERRM;
		FOR i IN 1..n LOOP
			PERFORM flagmeter.shard_link('disconnect', i);
		END LOOP;
		RAISE EXCEPTION 'the change is prepared on every shard but committed on % of %', committed, n
			USING ERRCODE = 'transaction_resolution_unknown',
			      DETAIL = format('Shard %s: %s. Transaction %s<shard> stays prepared on the shards after %s; it holds its locks there.',
			                      current, message, gid, committed),
			      HINT = format('Once shard %s answers, SELECT flagmeter.resolve_prepared() commits it on the rest.', current);
	END;

	FOR i IN 1..n LOOP
		IF after_commit IS NOT NULL THEN
			BEGIN
				PERFORM flagmeter.shard_link('exec', i, after_commit);
			EXCEPTION WHEN OTHERS THEN
				RAISE WARNING 'the change is committed on every shard, but shard % did not run: %', i, after_commit
					USING DETAIL = SQLERRM,
					      HINT = 'Run it on that shard: its listeners have not heard of the change.';
			END;
		END IF;
		PERFORM flagmeter.shard_link('disconnect', i);
	END LOOP;
	RETURN n;
END $$;
COMMENT ON FUNCTION flagmeter.on_every_shard(text, text) IS
'runs command on every shard with two-phase commit (all commit or none does), then after_commit on each on its own; returns the number of shards; an interrupted commit is finished by resolve_prepared()';

-- Finishes the two-phase commits on_every_shard left prepared (a shard or
-- the proxy went away between PREPARE and the last COMMIT PREPARED): the
-- first shard decides, by the order above.  Only transactions at least
-- older_than old, so as not to race an on_every_shard still running.
CREATE FUNCTION flagmeter.resolve_prepared(older_than interval DEFAULT '1 minute',
	OUT gid text, OUT shard integer, OUT action text)
RETURNS SETOF record
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	connstrs text[];
	n integer;
	i integer;
	found_on jsonb := '{}';		-- change -> {shard: its gid there}
	reachable boolean[] := '{}';
	g text;
	change text;
	first_has boolean;
BEGIN
	SELECT array_agg(x.connstr ORDER BY x.shard) INTO connstrs FROM flagmeter.shards() x;
	n := COALESCE(cardinality(connstrs), 0);
	FOR i IN 1..n LOOP
		BEGIN
			PERFORM flagmeter.shard_link('connect', i, connstrs[i]);
			FOR g IN SELECT * FROM flagmeter.shard_link('prepared', i, older_than::text) LOOP
				change := regexp_replace(g, ':[0-9]+$', '');
				found_on := jsonb_set(found_on, ARRAY[change],
				                      COALESCE(found_on -> change, '{}') || jsonb_build_object(i::text, g));
			END LOOP;
			reachable[i] := true;
		EXCEPTION WHEN OTHERS THEN
			reachable[i] := false;
			RAISE WARNING 'shard % does not answer: %', i, SQLERRM;
		END;
	END LOOP;
	FOR change IN SELECT k FROM jsonb_object_keys(found_on) k ORDER BY k LOOP
		IF NOT reachable[1] THEN
			gid := change;
			shard := 1;
			action := 'undecided: the first shard does not answer';
			RETURN NEXT;
			CONTINUE;
		END IF;
		first_has := (found_on -> change) ? '1';
		FOR shard, gid IN SELECT e.key::integer, e.value FROM jsonb_each_text(found_on -> change) e
		                  ORDER BY 1 DESC LOOP
			IF first_has THEN
				PERFORM flagmeter.shard_link('exec', shard, format('ROLLBACK PREPARED %L', gid));
				action := 'rolled back';
			ELSE
				PERFORM flagmeter.shard_link('exec', shard, format('COMMIT PREPARED %L', gid));
				action := 'committed';
			END IF;
			RETURN NEXT;
		END LOOP;
	END LOOP;
	FOR i IN 1..n LOOP
		PERFORM flagmeter.shard_link('disconnect', i);
	END LOOP;
END $$;
COMMENT ON FUNCTION flagmeter.resolve_prepared(interval) IS
'finishes the two-phase commits of on_every_shard left prepared at least older_than ago: rolled back on every shard while the first shard still holds it (committed nowhere), else committed on the shards that hold it';

-- The catalog calls that every shard must agree on ----------------------------------

CREATE FUNCTION flagmeter.define_meter(meter text, aggregation text DEFAULT 'sum', unit text DEFAULT NULL,
	draws text DEFAULT NULL, rate numeric DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	PERFORM flagmeter.on_every_shard(
		format('SELECT flagmeter.define_meter(%L::text, %L::text, %L::text, %L::text, %L::numeric)',
		       meter, aggregation, unit, draws, rate));
END $$;
COMMENT ON FUNCTION flagmeter.define_meter(text, text, text, text, numeric) IS
'flagmeter.define_meter on every shard or on none (two-phase commit)';

CREATE FUNCTION flagmeter.define_plan(plan text)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	PERFORM flagmeter.on_every_shard(format('SELECT flagmeter.define_plan(%L::text)', plan));
END $$;
COMMENT ON FUNCTION flagmeter.define_plan(text) IS
'flagmeter.define_plan on every shard or on none (two-phase commit)';

CREATE FUNCTION flagmeter.define_feature(feature text, description text DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	PERFORM flagmeter.on_every_shard(
		format('SELECT flagmeter.define_feature(%L::text, %L::text)', feature, description));
END $$;
COMMENT ON FUNCTION flagmeter.define_feature(text, text) IS
'flagmeter.define_feature on every shard or on none (two-phase commit)';

-- store_feature under two-phase commit, announce_plan_feature after it,
-- as set_limit below; a row written again unchanged is announced again
-- (the client applies the same row twice, harmlessly).
CREATE FUNCTION flagmeter.set_feature(plan text, feature text, enabled boolean DEFAULT true,
	config jsonb DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	PERFORM flagmeter.on_every_shard(
		format('SELECT flagmeter.store_feature(%L::text, %L::text, %L::boolean, %L::jsonb)',
		       plan, feature, enabled, config),
		format('SELECT flagmeter.announce_plan_feature(%L::text, %L::text)', plan, feature));
END $$;
COMMENT ON FUNCTION flagmeter.set_feature(text, text, boolean, jsonb) IS
'flagmeter.set_feature on every shard or on none: the plan''s row by two-phase commit, then each shard announces it';

-- store_limit under two-phase commit, announce_limit after it: every
-- shard tells its own listeners, and unblocks its own tenants.
CREATE FUNCTION flagmeter.set_limit(plan text, meter text, quota bigint,
	period text DEFAULT 'month', mode text DEFAULT 'hard',
	thresholds integer[] DEFAULT '{80,100}', rollover integer DEFAULT NULL,
	rollover_cap bigint DEFAULT NULL, rollover_periods integer DEFAULT 1)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	PERFORM flagmeter.on_every_shard(
		format('SELECT flagmeter.store_limit(%L::text, %L::text, %L::bigint, %L::text, %L::text, %L::integer[], '
		       '%L::integer, %L::bigint, %L::integer)',
		       plan, meter, quota, period, mode, thresholds, rollover, rollover_cap, rollover_periods),
		format('SELECT flagmeter.announce_limit(%L::text, %L::text)', plan, meter));
END $$;
COMMENT ON FUNCTION flagmeter.set_limit(text, text, bigint, text, text, integer[], integer, bigint, integer) IS
'flagmeter.set_limit on every shard or on none: the limit (and its rollover) by two-phase commit, then each shard announces it; each shard''s maintain() makes its own tenants'' rollover grants';

-- store_rate_limit under two-phase commit, announce_rate_limit after it.
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

-- Privileges, as on a shard: what writes or changes configuration is not
-- for PUBLIC.
REVOKE ALL ON FUNCTION flagmeter.track(text, text, bigint, timestamptz, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.track_batch(text[], text[], bigint[], timestamptz[], text[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.track_batch_split(text[], text[], bigint[], timestamptz[], text[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.track_batch_whole(text[], text[], bigint[], timestamptz[], text[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.consume(text, text, bigint, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.consume(text, text[], bigint[], text) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter."check"(text, text, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.usage(text, text, timestamptz) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.void(text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.track_value(text, text, text, timestamptz) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.consume_value(text, text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.forget_value(text, text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.define_meter(text, text, text, text, numeric) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.define_plan(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.set_limit(text, text, bigint, text, text, integer[], integer, bigint, integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.assign_plan(text, text, timestamptz, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.override_limit(text, text, bigint, text, text, integer[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.drop_override(text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.set_rate_limit(text, text, bigint, interval, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.override_rate_limit(text, text, bigint, interval, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.drop_rate_override(text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.limit(text, bigint, interval, bigint, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.unassign_tenant(text, boolean) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.define_feature(text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.set_feature(text, text, boolean, jsonb) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.override_feature(text, text, boolean, jsonb) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.drop_feature_override(text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.has_feature(text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.feature_config(text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.grant_credits(text, text, bigint, timestamptz, integer, timestamptz, text, integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.reserve(text, text, bigint, interval, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.track_events(text[], text[], bigint[], timestamptz[], text[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.track_events_on(integer, text[], text[], bigint[], timestamptz[], text[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.consume_batch(text[], text[], bigint[], text[], integer[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.consume_batch_on(integer, text[], text[], bigint[], text[], integer[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.on_every_shard(text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.resolve_prepared(interval) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.shard_link(text, integer, text) FROM PUBLIC;
