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
-- tables does not apply to them.  announce writes the outbox and the
-- blocked table at commit: it is for the catalog functions, not for apps.
--
-- The functions left to PUBLIC are pure (the quota_counter type, its
-- operators, accessors and aggregates, period_bounds, the validators) or
-- read with the caller's own privileges (limit_config, usage_series,
-- top_tenants, changes_since, latest_version), so they are subject to the
-- caller's table grants and to row-level security.
--
-- The layout the README documents, as an administrator grants it (role
-- names are examples):
--
--   -- the app's runtime role: meters, enforces, reads status; cannot
--   -- change limits or plans, cannot touch the tables
--   GRANT USAGE ON SCHEMA flagmeter TO app;
--   GRANT EXECUTE ON FUNCTION
--       flagmeter.track(text, text, bigint, timestamptz, text),
--       flagmeter.track_batch(text[], text[], bigint[], timestamptz[], text[]),
--       flagmeter.consume(text, text, bigint, text),
--       flagmeter.consume(text, text[], bigint[], text),
--       flagmeter.check(text, text, bigint),
--       flagmeter.usage(text, text, timestamptz),
--       flagmeter.void(text, text) TO app;
--   GRANT SELECT ON flagmeter.status, flagmeter.outbox TO app;	-- dashboard, resync
--   -- status reads the limit in force through flagmeter.limit_config(), a
--   -- SQL function inlined into the view and so read with the caller's
--   -- privileges: reading status needs the configuration tables too
--   GRANT SELECT ON flagmeter.meters, flagmeter.limits, flagmeter.tenants,
--       flagmeter.overrides TO app;
--
--   -- the people or jobs that change meters, plans, limits, tenants
--   GRANT USAGE ON SCHEMA flagmeter TO billing_admin;
--   GRANT EXECUTE ON FUNCTION
--       flagmeter.define_meter(text, text, text), flagmeter.define_plan(text),
--       flagmeter.set_limit(text, text, bigint, text, text, integer[]),
--       flagmeter.store_limit(text, text, bigint, text, text, integer[]),
--       flagmeter.announce_limit(text, text),		-- the two halves of set_limit
--       flagmeter.assign_plan(text, text, timestamptz, text),
--       flagmeter.override_limit(text, text, bigint, text, text, integer[]),
--       flagmeter.drop_override(text, text),
--       flagmeter.recount_current_period(text, text),
--       flagmeter.review_blocks(text, text, text),
--       flagmeter.announce(text, text, text, text, timestamptz, bigint, bigint),
--       flagmeter.usage(text, text, timestamptz) TO billing_admin;
--   GRANT SELECT, INSERT, UPDATE, DELETE ON flagmeter.meters, flagmeter.plans,
--       flagmeter.limits, flagmeter.tenants, flagmeter.overrides,
--       flagmeter.counters TO billing_admin;			-- counters: recounts
--   GRANT SELECT ON flagmeter.events, flagmeter.event_keys, flagmeter.blocked
--       TO billing_admin;
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
-- (reporting, usage_series called by them, billing_admin's recounts: hence
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
REVOKE ALL ON FUNCTION flagmeter.track_batch(text[], text[], bigint[], timestamptz[], text[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.consume(text, text, bigint, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.consume(text, text[], bigint[], text) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.check(text, text, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.limit_in_force(text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.usage(text, text, timestamptz) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.void(text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.announce(text, text, text, text, timestamptz, bigint, bigint) FROM PUBLIC;

-- Configuration.
REVOKE ALL ON FUNCTION flagmeter.define_meter(text, text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.define_plan(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.set_limit(text, text, bigint, text, text, integer[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.store_limit(text, text, bigint, text, text, integer[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.announce_limit(text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.assign_plan(text, text, timestamptz, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.override_limit(text, text, bigint, text, text, integer[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.drop_override(text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.recount_current_period(text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.review_blocks(text, text, text) FROM PUBLIC;

-- Maintenance, run as the owner.
REVOKE ALL ON FUNCTION flagmeter.maintain() FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.fold_band(xid8, xid8) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.compact_counters() FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.summarize_event_partitions() FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.create_partitions() FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.drop_expired_partitions(xid8) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.send_resync_hint() FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.schedule(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.unschedule() FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.configure(interval, integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.after_restore() FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.index_event_partition(regclass) FROM PUBLIC;

-- Moving tenants to another shard, run as the owner (they create and drop
-- triggers on flagmeter's tables).
REVOKE ALL ON FUNCTION flagmeter.fence_partition(integer, integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.unfence_partition(integer, integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.forget_partition(integer, integer) FROM PUBLIC;
