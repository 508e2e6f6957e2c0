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
REVOKE ALL ON FUNCTION flagmeter.assign_plan_batch(text[], text, timestamptz, text) FROM PUBLIC;
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
