-- Security: no SECURITY DEFINER and pinned search paths; a hostile schema
-- first on the search_path changes nothing flagmeter computes; the
-- least-privilege role layout of sql/parts/80_security.sql holds; tenants'
-- rows are isolated by row-level security keyed on a setting; a role with
-- EXECUTE on the calls cannot run code as the owner of schema flagmeter.
-- Every test file runs in the same database: start from a fresh extension.
SET client_min_messages = warning;
DROP EXTENSION flagmeter CASCADE;
CREATE EXTENSION flagmeter;
-- this file meters tenants never assigned a plan and tracks events at
-- fixed dates, which a new database refuses (QT001, QT002): it turns
-- both off
SELECT flagmeter.configure(unassigned_tenants => 'unlimited', late_events => '100 years',
	future_events => '100 years') \gset
-- the rows below are the stripes a track writes (not its pending usage)
SET flagmeter.one_write_track = off;
-- Roles are cluster-wide: unique names, and leftovers of an aborted run go.
DO $$
DECLARE
	r text;
BEGIN
	FOR r IN SELECT rolname FROM pg_roles
	         WHERE rolname IN ('regress_flagmeter_app', 'regress_flagmeter_admin', 'regress_flagmeter_report',
	                           'regress_flagmeter_listener', 'regress_flagmeter_dashboard')
	LOOP
		EXECUTE format('DROP OWNED BY %I CASCADE', r);
		EXECUTE format('DROP ROLE %I', r);
	END LOOP;
END $$;
DROP SCHEMA IF EXISTS regress_hostile CASCADE;
RESET client_min_messages;
SET TimeZone = 'UTC';
\set SHOW_CONTEXT never

-- try(sql): 'ok', or the SQLSTATE and message of the error it raised
CREATE FUNCTION pg_temp.try(sql text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
	EXECUTE sql;
	RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
	RETURN SQLSTATE || ': ' || SQLERRM;
END $$;

-- 1. No function is SECURITY DEFINER ------------------------------------------------
SELECT p.oid::regprocedure AS security_definer
FROM pg_proc p WHERE p.pronamespace = 'flagmeter'::regnamespace AND p.prosecdef;

-- Every PL/pgSQL function pins search_path to pg_catalog, pg_temp (pg_temp
-- last, so temporary objects never shadow anything):
SELECT p.oid::regprocedure AS plpgsql_not_pinned, p.proconfig
FROM pg_proc p
WHERE p.pronamespace = 'flagmeter'::regnamespace
  AND p.prolang = (SELECT oid FROM pg_language WHERE lanname = 'plpgsql')
  AND NOT COALESCE(p.proconfig @> ARRAY['search_path=pg_catalog, pg_temp'], false);
-- and sets nothing else but jit = off, where the planner's estimate of a
-- small query would JIT-compile it on every call (30_catalog.sql and
-- 50_maintenance.sql say why):
SELECT p.oid::regprocedure AS sets_more, c AS setting
FROM pg_proc p, unnest(p.proconfig) c
WHERE p.pronamespace = 'flagmeter'::regnamespace
  AND c <> 'search_path=pg_catalog, pg_temp'
ORDER BY p.oid::regprocedure::text;
-- SQL functions without a SET clause (so that the planner inlines them):
-- their bodies are parsed with the caller's search_path, so every name in
-- them must be schema-qualified (section 2 checks that it is).
SELECT p.oid::regprocedure AS sql_inlinable
FROM pg_proc p
WHERE p.pronamespace = 'flagmeter'::regnamespace
  AND p.prolang = (SELECT oid FROM pg_language WHERE lanname = 'sql')
  AND p.proconfig IS NULL
ORDER BY p.oid::regprocedure::text COLLATE "C";

-- What PUBLIC may not execute (sql/parts/80_security.sql): every call that
-- writes, runs its SQL as the owner, or changes configuration.
SELECT p.oid::regprocedure AS not_executable_by_public
FROM pg_proc p
WHERE p.pronamespace = 'flagmeter'::regnamespace
  AND NOT EXISTS (SELECT FROM aclexplode(COALESCE(p.proacl, acldefault('f', p.proowner))) a
                  WHERE a.grantee = 0 AND a.privilege_type = 'EXECUTE')
ORDER BY p.oid::regprocedure::text COLLATE "C";
-- Tables, views and sequences: nothing for PUBLIC, nor USAGE on the schema.
SELECT c.oid::regclass::text AS public_can_use
FROM pg_class c
WHERE c.relnamespace = 'flagmeter'::regnamespace
  AND EXISTS (SELECT FROM aclexplode(c.relacl) a WHERE a.grantee = 0)
UNION ALL
SELECT n.oid::regnamespace::text FROM pg_namespace n
WHERE n.nspname = 'flagmeter'
  AND EXISTS (SELECT FROM aclexplode(n.nspacl) a WHERE a.grantee = 0);

-- 2. A hostile schema first on the search_path -----------------------------------------
-- The same workload runs twice, on tenants and plans prefixed 'a-' with a
-- clean search_path and 'h-' with a schema full of traps first (as public
-- would be for a user whose search_path starts with it, and who lets others
-- create there); the results, with the prefixes taken out, must be
-- identical.  The test itself avoids the trapped names from then on
-- (OPERATOR(pg_catalog.=), pg_catalog.* functions and types).
SET search_path = flagmeter, public;
SELECT define_meter('api_calls'), define_meter('tokens'), define_meter('seats', 'max'),
       define_meter('requests', 'count');

CREATE FUNCTION pg_temp.workload(p pg_catalog.text)
RETURNS TABLE (step pg_catalog.text, result pg_catalog.text)
LANGUAGE plpgsql AS $$
DECLARE
	acme pg_catalog.text := p OPERATOR(pg_catalog.||) 'acme';
	hooli pg_catalog.text := p OPERATOR(pg_catalog.||) 'hooli';
	free pg_catalog.text := p OPERATOR(pg_catalog.||) 'free';
	pro pg_catalog.text := p OPERATOR(pg_catalog.||) 'pro';
BEGIN
	PERFORM flagmeter.define_plan(free), flagmeter.define_plan(pro);
	PERFORM flagmeter.set_limit(free, 'api_calls', 10, 'lifetime'),
	        flagmeter.set_limit(free, 'tokens', 100, 'lifetime', 'soft', '{50,90}'),
	        flagmeter.set_limit(free, 'seats', 5, 'lifetime'),
	        flagmeter.set_limit(free, 'requests', 3, 'lifetime'),
	        flagmeter.set_limit(pro, 'api_calls', 1000, 'lifetime');
	PERFORM flagmeter.assign_plan(acme, free, '2026-01-31 10:00:00+00', 'UTC'),
	        flagmeter.assign_plan(hooli, free, '2026-01-31 10:00:00+00', 'Europe/Berlin');

	step := 'track'; result := flagmeter.track(acme, 'api_calls', 2, '2026-02-01 10:00:00+00', 'k-1')::pg_catalog.text;
	RETURN NEXT;
	step := 'track again'; result := flagmeter.track(acme, 'api_calls', 2, '2026-02-01 10:00:00+00', 'k-1')::pg_catalog.text;
	RETURN NEXT;
	step := 'track_batch';
	result := flagmeter.track_batch(ARRAY[acme, acme, hooli, acme],
	                                ARRAY['tokens', 'seats', 'api_calls', 'requests'],
	                                ARRAY[40, 3, 7, 1]::pg_catalog.int8[],
	                                ARRAY['2026-02-02 00:00:00+00', '2026-02-02 01:00:00+00',
	                                      '2026-02-03 00:00:00+00', '2026-02-03 00:00:00+00']::pg_catalog.timestamptz[],
	                                ARRAY['b-1', NULL, 'b-2', NULL])::pg_catalog.text;
	RETURN NEXT;
	step := 'consume';
	SELECT ROW(d.granted, d.used, d.quota, d.remaining, d.overage, d.meter)::pg_catalog.text
	INTO result FROM flagmeter.consume(acme, 'api_calls', 5, 'c-1') d;
	RETURN NEXT;
	step := 'consume denied';
	SELECT ROW(d.granted, d.used, d.quota, d.remaining, d.overage, d.meter)::pg_catalog.text
	INTO result FROM flagmeter.consume(acme, 'api_calls', 4) d;
	RETURN NEXT;
	step := 'consume retried';
	SELECT ROW(d.granted, d.used, d.quota, d.remaining, d.overage, d.meter)::pg_catalog.text
	INTO result FROM flagmeter.consume(acme, 'api_calls', 5, 'c-1') d;
	RETURN NEXT;
	step := 'consume multi';
	SELECT pg_catalog.string_agg(ROW(d.granted, d.used, d.quota, d.remaining, d.overage, d.meter)::pg_catalog.text, ' ')
	INTO result FROM flagmeter.consume(acme, ARRAY['tokens', 'seats'], ARRAY[55, 1]::pg_catalog.int8[], 'm-1') d;
	RETURN NEXT;
	step := 'check';
	SELECT ROW(d.granted, d.used, d.quota, d.remaining, d.overage, d.meter)::pg_catalog.text
	INTO result FROM flagmeter.check(acme, 'requests', 3) d;
	RETURN NEXT;
	step := 'void'; result := flagmeter.void(hooli, 'b-2')::pg_catalog.text;
	RETURN NEXT;
	step := 'usage';
	SELECT pg_catalog.string_agg(ROW(m.meter, flagmeter.used(u), flagmeter.events(u),
	                                            flagmeter.max_amount(u), flagmeter.quota(u),
	                                            flagmeter.remaining(u), flagmeter.exceeded(u))::pg_catalog.text,
	                             ' ' ORDER BY m.meter)
	INTO result
	FROM flagmeter.meters m CROSS JOIN LATERAL flagmeter.usage(acme, m.meter) u;
	RETURN NEXT;
	step := 'status';
	SELECT pg_catalog.string_agg(ROW(pg_catalog.substr(s.tenant, 3), s.meter, s.used, s.quota,
	                                            s.remaining, s.ratio, s.state, s.mode, s.period)::pg_catalog.text,
	                             ' ' ORDER BY s.tenant, s.meter)
	INTO result FROM flagmeter.status s WHERE pg_catalog.starts_with(s.tenant, p);
	RETURN NEXT;
	step := 'top_tenants';
	SELECT pg_catalog.string_agg(pg_catalog.substr(t.tenant, 3), ' ' ORDER BY t.used DESC, t.tenant)
	INTO result FROM flagmeter.top_tenants('api_calls', 100) t WHERE pg_catalog.starts_with(t.tenant, p);
	RETURN NEXT;
	step := 'usage_series';
	SELECT pg_catalog.string_agg(ROW(s.bucket_start, s.used)::pg_catalog.text, ' ' ORDER BY s.bucket_start)
	INTO result FROM flagmeter.usage_series(acme, 'tokens', '2026-02-01', '2026-02-04', 'day', 'Europe/Berlin') s;
	RETURN NEXT;
	step := 'period_bounds';
	SELECT ROW(b.period_start, b.period_end)::pg_catalog.text INTO result
	FROM flagmeter.period_bounds('2026-03-30 12:00:00+00', 'month', '2026-01-31 10:00:00+00', 'Europe/Berlin') b;
	RETURN NEXT;
	step := 'override_limit';
	PERFORM flagmeter.override_limit(acme, 'api_calls', 20);
	SELECT ROW(d.granted, d.used, d.quota, d.remaining)::pg_catalog.text
	INTO result FROM flagmeter.check(acme, 'api_calls', 1) d;
	RETURN NEXT;
	step := 'drop_override'; result := flagmeter.drop_override(acme, 'api_calls')::pg_catalog.text;
	RETURN NEXT;
	step := 'assign_plan pro';
	PERFORM flagmeter.assign_plan(acme, pro, '2026-01-31 10:00:00+00', 'UTC');
	SELECT ROW(d.granted, d.used, d.quota, d.remaining)::pg_catalog.text
	INTO result FROM flagmeter.check(acme, 'api_calls', 1) d;
	RETURN NEXT;
	step := 'effective_limits';
	SELECT pg_catalog.string_agg(ROW(pg_catalog.substr(l.tenant, 3), l.meter, l.quota, l.period,
	                                            l.mode, l.thresholds, pg_catalog.substr(l.plan, 3))::pg_catalog.text,
	                             ' ' ORDER BY l.tenant, l.meter)
	INTO result FROM flagmeter.effective_limits l WHERE pg_catalog.starts_with(l.tenant, p);
	RETURN NEXT;
	step := 'limit_config unassigned';
	SELECT ROW(c.aggregation, c.plan, c.quota, c.period, c.mode, c.thresholds, c.anchor, c.timezone)::pg_catalog.text
	INTO result FROM flagmeter.limit_config(p OPERATOR(pg_catalog.||) 'stranger', 'api_calls') c;
	RETURN NEXT;
	step := 'counters';
	SELECT pg_catalog.string_agg(ROW(pg_catalog.substr(c.tenant, 3), c.meter, c.used, c.events)::pg_catalog.text,
	                             ' ' ORDER BY c.tenant, c.meter)
	INTO result
	FROM (SELECT k.tenant, k.meter, flagmeter.used(flagmeter.merge_agg(k.counter)) AS used,
	             flagmeter.events(flagmeter.merge_agg(k.counter)) AS events
	      FROM flagmeter.counters k
	      WHERE pg_catalog.starts_with(k.tenant, p) AND k.period_start OPERATOR(pg_catalog.=) '-infinity'
	      GROUP BY k.tenant, k.meter) c;
	RETURN NEXT;
	step := 'used_by';
	SELECT pg_catalog.string_agg(ROW(a.agg, flagmeter.used_by('used=7 events=2 max=5 latest=2@2026-02-01T00:00:00Z', a.agg))::pg_catalog.text, ' ')
	INTO result FROM (VALUES ('sum'::pg_catalog.text), ('count'), ('max'), ('latest')) a(agg);
	RETURN NEXT;
END $$;

-- Quota events reach the outbox when the transaction commits: read after.
CREATE FUNCTION pg_temp.committed(p pg_catalog.text)
RETURNS TABLE (step pg_catalog.text, result pg_catalog.text)
LANGUAGE plpgsql AS $$
BEGIN
	step := 'outbox';
	SELECT pg_catalog.string_agg(ROW(o.kind, pg_catalog.substr(o.tenant, 3), o.meter,
	                                 pg_catalog.substr(o.plan, 3), o.threshold, o.used, o.quota)::pg_catalog.text,
	                             ' ' ORDER BY o.version)
	INTO result FROM flagmeter.outbox o
	WHERE pg_catalog.starts_with(o.tenant, p) OR pg_catalog.starts_with(o.plan, p);
	RETURN NEXT;
	step := 'changes_since';
	SELECT pg_catalog.count(*)::pg_catalog.text INTO result
	FROM flagmeter.changes_since(0) c
	WHERE pg_catalog.starts_with(c.tenant, p) OR pg_catalog.starts_with(c.plan, p);
	RETURN NEXT;
	step := 'latest_version';
	SELECT (flagmeter.latest_version() OPERATOR(pg_catalog.=) pg_catalog.max(o.version))::pg_catalog.text
	INTO result FROM flagmeter.outbox o;
	RETURN NEXT;
END $$;

CREATE SCHEMA regress_hostile;
GRANT USAGE ON SCHEMA regress_hostile TO PUBLIC;
CREATE TABLE regress_hostile.pwned (what text, by_role name DEFAULT current_user);
GRANT INSERT ON regress_hostile.pwned TO PUBLIC;
CREATE TEMP TABLE run_a AS SELECT * FROM pg_temp.workload('a-');
INSERT INTO run_a SELECT * FROM pg_temp.committed('a-');
SELECT step, result FROM run_a;

-- The traps: operators and functions shadowing built-ins, and types named
-- like built-ins; each records in regress_hostile.pwned that it ran, and as whom.
CREATE FUNCTION regress_hostile.pwn(what text) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
	INSERT INTO regress_hostile.pwned (what) VALUES (what);
	RETURN true;
END $$;
CREATE FUNCTION regress_hostile.eq_text(a text, b text) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN RETURN regress_hostile.pwn('= (text, text)'); END $$;
CREATE OPERATOR regress_hostile.= (LEFTARG = text, RIGHTARG = text, FUNCTION = regress_hostile.eq_text);
CREATE FUNCTION regress_hostile.eq_int8(a bigint, b bigint) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN RETURN regress_hostile.pwn('= (bigint, bigint)'); END $$;
CREATE OPERATOR regress_hostile.= (LEFTARG = bigint, RIGHTARG = bigint, FUNCTION = regress_hostile.eq_int8);
CREATE FUNCTION regress_hostile.plus_int8(a bigint, b bigint) RETURNS bigint LANGUAGE plpgsql AS $$
BEGIN PERFORM regress_hostile.pwn('+ (bigint, bigint)'); RETURN 0; END $$;
CREATE OPERATOR regress_hostile.+ (LEFTARG = bigint, RIGHTARG = bigint, FUNCTION = regress_hostile.plus_int8);
CREATE FUNCTION regress_hostile.lt_tstz(a timestamptz, b timestamptz) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN RETURN regress_hostile.pwn('< (timestamptz, timestamptz)'); END $$;
CREATE OPERATOR regress_hostile.< (LEFTARG = timestamptz, RIGHTARG = timestamptz, FUNCTION = regress_hostile.lt_tstz);
CREATE FUNCTION regress_hostile.now() RETURNS timestamptz LANGUAGE plpgsql AS $$
BEGIN PERFORM regress_hostile.pwn('now()'); RETURN '1999-12-31 00:00:00+00'; END $$;
CREATE FUNCTION regress_hostile.lower(text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN PERFORM regress_hostile.pwn('lower(text)'); RETURN 'pwned'; END $$;
CREATE FUNCTION regress_hostile.length(text) RETURNS integer LANGUAGE plpgsql AS $$
BEGIN PERFORM regress_hostile.pwn('length(text)'); RETURN 0; END $$;
CREATE FUNCTION regress_hostile.date_trunc(text, timestamptz, text) RETURNS timestamptz LANGUAGE plpgsql AS $$
BEGIN PERFORM regress_hostile.pwn('date_trunc(text, timestamptz, text)'); RETURN '1999-12-31 00:00:00+00'; END $$;
CREATE FUNCTION regress_hostile.unnest(anyarray) RETURNS SETOF anyelement LANGUAGE plpgsql AS $$
BEGIN PERFORM regress_hostile.pwn('unnest(anyarray)'); END $$;
CREATE FUNCTION regress_hostile.nextval(regclass) RETURNS bigint LANGUAGE plpgsql AS $$
BEGIN PERFORM regress_hostile.pwn('nextval(regclass)'); RETURN 0; END $$;
CREATE FUNCTION regress_hostile.pg_notify(text, text) RETURNS void LANGUAGE plpgsql AS $$
BEGIN PERFORM regress_hostile.pwn('pg_notify(text, text)'); END $$;
CREATE FUNCTION regress_hostile.isfinite(timestamptz) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN RETURN regress_hostile.pwn('isfinite(timestamptz)'); END $$;
CREATE FUNCTION regress_hostile.jsonb_build_array(VARIADIC text[]) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN PERFORM regress_hostile.pwn('jsonb_build_array(text[])'); RETURN '[]'; END $$;
CREATE FUNCTION regress_hostile.hostile_max(bigint, bigint) RETURNS bigint LANGUAGE plpgsql AS $$
BEGIN PERFORM regress_hostile.pwn('max(bigint)'); RETURN -42; END $$;
CREATE AGGREGATE regress_hostile.max(bigint) (SFUNC = regress_hostile.hostile_max, STYPE = bigint);
CREATE AGGREGATE regress_hostile.sum(bigint) (SFUNC = regress_hostile.hostile_max, STYPE = bigint);
CREATE FUNCTION regress_hostile.hostile_count(bigint) RETURNS bigint LANGUAGE plpgsql AS $$
BEGIN PERFORM regress_hostile.pwn('count(*)'); RETURN -42; END $$;
CREATE AGGREGATE regress_hostile.count(*) (SFUNC = regress_hostile.hostile_count, STYPE = bigint, INITCOND = '0');
-- types named like built-ins (a domain's check runs on every cast to it)
CREATE DOMAIN regress_hostile.text AS pg_catalog.text CHECK (regress_hostile.pwn('type text'));
CREATE DOMAIN regress_hostile.timestamptz AS pg_catalog.timestamptz CHECK (regress_hostile.pwn('type timestamptz'));
CREATE DOMAIN regress_hostile.jsonb AS pg_catalog.jsonb CHECK (regress_hostile.pwn('type jsonb'));

SET search_path = regress_hostile, pg_catalog, flagmeter;
CREATE TEMP TABLE run_h AS SELECT * FROM pg_temp.workload('h-');
INSERT INTO run_h SELECT * FROM pg_temp.committed('h-');
-- maintain() under the same search_path, then the folded usage of both runs
SELECT events_folded OPERATOR(pg_catalog.>) 0 AS folded, partitions_created OPERATOR(pg_catalog.>) 0 AS partitions_created
FROM flagmeter.maintain();
CREATE TEMP TABLE folded AS
SELECT pg_catalog.substr(s.tenant, 1, 2) AS run, s.result
FROM (VALUES ('a-acme'), ('h-acme')) t(tenant)
CROSS JOIN LATERAL (
	SELECT t.tenant, pg_catalog.string_agg(ROW(u.bucket_start, u.used)::pg_catalog.text, ' ' ORDER BY u.bucket_start) AS result
	FROM flagmeter.usage_series(t.tenant, 'tokens', '2026-02-01', '2026-02-04', 'hour', 'UTC') u
	WHERE u.used OPERATOR(pg_catalog.>) 0) s;
RESET search_path;
SET search_path = flagmeter, pg_catalog;

-- Identical results, step by step (no rows: nothing differs):
SELECT COALESCE(a.step, h.step) AS step, a.result AS clean, h.result AS hostile
FROM run_a a FULL JOIN run_h h USING (step)
WHERE a.result IS DISTINCT FROM h.result;
SELECT pg_catalog.count(*) AS steps_compared FROM run_a a JOIN run_h h USING (step);
SELECT run, result FROM folded ORDER BY run;
-- and no trap ran
SELECT what, pg_catalog.count(*) FROM regress_hostile.pwned GROUP BY what ORDER BY what;
TRUNCATE regress_hostile.pwned;

-- The traps stay for the rest of the file: every later call may trip them.
SET search_path = regress_hostile, pg_catalog, flagmeter;

-- 3. The role layouts ------------------------------------------------------------------
-- Each path runs as a role that has exactly one shipped layout, granted by
-- flagmeter.grant_access() (sql/parts/80_security.sql), under the hostile
-- search_path:
-- regress_flagmeter_app: request (track, track_batch, consume, check, usage, void)
-- regress_flagmeter_listener: listener (the README's client protocol)
-- regress_flagmeter_dashboard: dashboard (status, top_tenants, usage_series, stats)
-- regress_flagmeter_admin: admin (meters, plans, limits, tenants)
-- regress_flagmeter_report: reads usage tables directly, isolated by RLS
-- (the layout sketched in sql/parts/80_security.sql, granted by hand).
CREATE ROLE regress_flagmeter_app;
CREATE ROLE regress_flagmeter_admin;
CREATE ROLE regress_flagmeter_report;
CREATE ROLE regress_flagmeter_listener;
CREATE ROLE regress_flagmeter_dashboard;
SELECT flagmeter.grant_access('regress_flagmeter_app', 'request'),
       flagmeter.grant_access('regress_flagmeter_admin', 'admin'),
       flagmeter.grant_access('regress_flagmeter_listener', 'listener'),
       flagmeter.grant_access('regress_flagmeter_dashboard', 'dashboard');
-- what each layout is, as the README lists it
SELECT a.access, pg_catalog.string_agg(p.privilege OPERATOR(pg_catalog.||) ' ' OPERATOR(pg_catalog.||) p.object,
                                       ', ' ORDER BY p.object COLLATE "C") AS privileges
FROM (VALUES ('request'), ('listener'), ('dashboard'), ('admin')) a(access)
CROSS JOIN LATERAL flagmeter.access_privileges(a.access) p
GROUP BY a.access ORDER BY a.access COLLATE "C";
SELECT pg_temp.try($$SELECT flagmeter.grant_access('regress_flagmeter_app', 'superuser')$$),
       pg_temp.try($$SELECT flagmeter.grant_access('regress_flagmeter_app', NULL)$$),
       pg_temp.try($$SELECT flagmeter.grant_access(NULL, 'request')$$),
       pg_temp.try($$SELECT flagmeter.grant_access('regress_no_such_role', 'request')$$);

GRANT USAGE ON SCHEMA flagmeter TO regress_flagmeter_report;
GRANT SELECT ON flagmeter.meters, flagmeter.maintenance_state, flagmeter.counters,
	flagmeter.events, flagmeter.event_keys, flagmeter.voids, flagmeter.rollup_hour,
	flagmeter.rollup_day TO regress_flagmeter_report;
-- usage_series reads the fold watermark through this view where it exists
DO $$
BEGIN
	IF pg_catalog.to_regclass('flagmeter.current_state') IS NOT NULL THEN
		GRANT SELECT ON flagmeter.current_state TO regress_flagmeter_report;
	END IF;
END $$;

-- The admin changes the configuration.
SET ROLE regress_flagmeter_admin;
SELECT flagmeter.define_meter('storage_gb', 'latest');
SELECT flagmeter.define_plan('r-free');
SELECT flagmeter.set_limit('r-free', 'api_calls', 100, 'lifetime'),
       flagmeter.set_limit('r-free', 'storage_gb', 10, 'lifetime');
SELECT flagmeter.assign_plan('r-acme', 'r-free', '2026-01-31 10:00:00+00', 'UTC'),
       flagmeter.assign_plan('r-hooli', 'r-free', '2026-01-31 10:00:00+00', 'UTC'),
       flagmeter.assign_plan('r-leaver', 'r-free');
SELECT flagmeter.override_limit('r-hooli', 'api_calls', 200), flagmeter.drop_override('r-hooli', 'api_calls');
-- a meter of distinct values (issue 38)
SELECT flagmeter.define_meter('r-users', 'unique'), flagmeter.set_limit('r-free', 'r-users', 2, 'lifetime');
SELECT flagmeter.define_plan('r-gone'), flagmeter.drop_plan('r-gone'),
       flagmeter.define_meter('r-gone'), flagmeter.drop_meter('r-gone');
-- features, announced as feature_changed (announce_feature is in the layout)
SELECT flagmeter.define_feature('r-sso'),
       flagmeter.set_feature('r-free', 'r-sso', true, '{"idp": "okta"}'),
       flagmeter.override_feature('r-hooli', 'r-sso', false),
       flagmeter.override_feature('r-leaver', 'r-sso', false),
       flagmeter.drop_feature_override('r-leaver', 'r-sso');
-- and grants credits (issue 19), and voids a grant
SELECT flagmeter.grant_credits('r-acme', 'api_calls', 50, idempotency_key => 'r-g1') OPERATOR(pg_catalog.>) 0 AS granted,
       flagmeter.grant_credits('r-acme', 'api_calls', 50, idempotency_key => 'r-g1') OPERATOR(pg_catalog.=)
       flagmeter.grant_credits('r-acme', 'api_calls', 50, idempotency_key => 'r-g1') AS same_grant;
SELECT flagmeter.void_grant(flagmeter.grant_credits('r-leaver', 'api_calls', 5));
SELECT tenant, meter, amount, state FROM flagmeter.grants WHERE tenant OPERATOR(pg_catalog.~~) 'r-%' ORDER BY grant_id;
RESET ROLE;

-- The app meters and enforces, for any tenant, and nothing else.
SET ROLE regress_flagmeter_app;
SELECT flagmeter.track('r-acme', 'api_calls', 3, '2026-02-01 00:00:00+00', 'r-k1'),
       flagmeter.track('r-hooli', 'api_calls', 4, '2026-02-01 00:00:00+00'),
       flagmeter.track_batch(ARRAY['r-acme', 'r-hooli'], ARRAY['storage_gb', 'storage_gb'],
                             ARRAY[5, 6], ARRAY['2026-02-02', '2026-02-02']::pg_catalog.timestamptz[]);
SELECT granted, used, remaining FROM flagmeter.consume('r-acme', 'api_calls', 10, 'r-c1');
SELECT meter, granted, used FROM flagmeter.consume('r-hooli', ARRAY['api_calls', 'storage_gb'], ARRAY[1, 1]);
SELECT granted, used FROM flagmeter.check('r-hooli', 'api_calls', 1);
SELECT flagmeter.used(flagmeter.usage('r-acme', 'api_calls'));
SELECT flagmeter.balance('r-acme', 'api_calls');
SELECT granted, reserved FROM flagmeter.reserve('r-acme', 'api_calls', 5, idempotency_key => 'r-res1');
SELECT granted, used FROM flagmeter.settle((flagmeter.reserve('r-acme', 'api_calls', 5, idempotency_key => 'r-res1')).reservation_id, 2);
SELECT flagmeter.release((flagmeter.reserve('r-acme', 'api_calls', 1)).reservation_id);
SELECT flagmeter.void('r-acme', 'r-k1');
-- distinct values: tracked, consumed up to the quota, forgotten
SELECT flagmeter.track_value('r-acme', 'r-users', 'ann') AS new_value,
       (flagmeter.consume_value('r-acme', 'r-users', 'bob')).granted AS bob,
       (flagmeter.consume_value('r-acme', 'r-users', 'cid')).granted AS cid,
       flagmeter.forget_value('r-acme', 'r-users', 'bob') AS freed;
-- but cannot change limits or plans, nor touch the tables
SELECT sql, pg_temp.try(sql) AS result FROM (VALUES
	($$SELECT flagmeter.set_limit('r-free', 'api_calls', 1000000, 'lifetime')$$),
	($$SELECT flagmeter.assign_plan('r-acme', 'h-pro')$$),
	($$SELECT flagmeter.override_limit('r-acme', 'api_calls', 1000000)$$),
	($$SELECT flagmeter.drop_override('r-acme', 'api_calls')$$),
	($$SELECT flagmeter.unassign_tenant('r-acme')$$),
	($$SELECT flagmeter.drop_plan('r-free', true)$$),
	($$SELECT flagmeter.drop_meter('api_calls', true)$$),
	($$SELECT flagmeter.define_meter('free_money')$$),
	($$SELECT flagmeter.define_plan('unlimited')$$),
	($$SELECT flagmeter.recount_current_period('r-acme', 'api_calls')$$),
	($$SELECT flagmeter.review_blocks()$$),
	($$SELECT flagmeter.review_usage('r-acme', 'api_calls')$$),
	($$SELECT flagmeter.announce('unblocked', 'r-acme', 'api_calls', NULL, '-infinity')$$),
	($$SELECT flagmeter.announce_feature('r-acme', NULL, 'r-sso', true)$$),
	($$SELECT flagmeter.set_feature('r-free', 'r-sso', false)$$),
	($$SELECT flagmeter.maintain()$$),
	($$SELECT flagmeter.schedule()$$),
	($$SELECT flagmeter.configure(unassigned_tenants => 'unlimited')$$),
	($$SELECT flagmeter.grant_access('regress_flagmeter_app', 'admin')$$),
	($$SELECT flagmeter.grant_credits('r-acme', 'api_calls', 1000000)$$),
	($$SELECT flagmeter.void_grant(1)$$),
	($$UPDATE flagmeter.credit_grants SET drawn = 0$$),
	($$SELECT * FROM flagmeter.grants$$),
	($$SELECT * FROM flagmeter.reservations$$),
	($$UPDATE flagmeter.limits SET quota = 1000000$$),
	($$INSERT INTO flagmeter.overrides VALUES ('r-acme', 'api_calls', 1000000)$$),
	($$DELETE FROM flagmeter.counters$$),
	($$SELECT * FROM flagmeter.events$$),
	($$SELECT * FROM flagmeter.counters$$),
	($$SELECT * FROM flagmeter.event_keys$$),
	($$SELECT * FROM flagmeter.unique_values$$),
	($$DELETE FROM flagmeter.value_sightings$$),
	($$TRUNCATE flagmeter.blocked$$),
	($$SELECT * FROM flagmeter.rollup_day$$),
	($$SELECT * FROM flagmeter.status$$),
	($$SELECT flagmeter.latest_version()$$),
	($$SELECT pg_catalog.nextval('flagmeter.outbox_version')$$)
) v(sql);
RESET ROLE;
SELECT plan, meter, quota FROM flagmeter.limits WHERE plan OPERATOR(pg_catalog.~~) 'r-%' ORDER BY 1, 2;

-- The listener follows the README's client protocol: LISTEN, then in one
-- REPEATABLE READ transaction the version and the state it caches (issue
-- 15: this was "permission denied for view effective_limits", then for
-- table meters), then changes_since.
SET ROLE regress_flagmeter_listener;
LISTEN flagmeter;
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT flagmeter.latest_version() OPERATOR(pg_catalog.>) 0 AS has_version;
SELECT tenant, meter FROM flagmeter.blocked ORDER BY 1, 2;
SELECT tenant, meter, quota, period, mode, plan FROM flagmeter.effective_limits
WHERE tenant OPERATOR(pg_catalog.~~) 'r-%' ORDER BY tenant, meter;
COMMIT;
SELECT kind, tenant, meter, quota FROM flagmeter.changes_since(0)
WHERE kind OPERATOR(pg_catalog.=) 'limit_changed' AND tenant OPERATOR(pg_catalog.=) 'r-hooli'
ORDER BY version;
-- what a client caching features reads: a tenant's plan and overrides, the
-- plan's rows, the features defined, and feature_changed in the outbox
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT plan FROM flagmeter.tenants WHERE tenant OPERATOR(pg_catalog.=) 'r-hooli';
SELECT feature, enabled, config FROM flagmeter.feature_overrides
WHERE tenant OPERATOR(pg_catalog.=) 'r-hooli';
SELECT feature, enabled, config FROM flagmeter.plan_features
WHERE plan OPERATOR(pg_catalog.=) 'r-free';
SELECT feature FROM flagmeter.features WHERE feature OPERATOR(pg_catalog.~~) 'r-%';
COMMIT;
SELECT kind, tenant, plan, feature, enabled, config FROM flagmeter.changes_since(0)
WHERE kind OPERATOR(pg_catalog.=) 'feature_changed'
ORDER BY version;
UNLISTEN *;
SELECT sql, pg_temp.try(sql) AS result FROM (VALUES
	($$SELECT flagmeter.track('r-acme', 'api_calls')$$),
	($$SELECT flagmeter.check('r-acme', 'api_calls')$$),
	($$SELECT * FROM flagmeter.status$$),
	($$SELECT * FROM flagmeter.counters$$),
	($$SELECT flagmeter.set_limit('r-free', 'api_calls', 1)$$),
	($$DELETE FROM flagmeter.outbox$$)
) v(sql);
RESET ROLE;

-- The dashboard reads status, top_tenants, usage_series and stats (issue
-- 15: usage_series was "permission denied for view current_state").
SET ROLE regress_flagmeter_dashboard;
SELECT tenant, meter, used, quota, state FROM flagmeter.status
WHERE tenant OPERATOR(pg_catalog.~~) 'r-%' ORDER BY tenant, meter;
SELECT tenant, used FROM flagmeter.top_tenants('storage_gb', 2);
SELECT bucket_start, used FROM flagmeter.usage_series('r-hooli', 'storage_gb', '2026-02-01', '2026-02-03');
SELECT pg_catalog.sum(used) AS distinct_users FROM flagmeter.usage_series('r-acme', 'r-users', pg_catalog.now() - interval '1 day', pg_catalog.now());
SELECT pending_events OPERATOR(pg_catalog.>) 0 AS has_pending, blocked FROM flagmeter.stats;
SELECT tenant, amount, remaining, state FROM flagmeter.grants WHERE tenant OPERATOR(pg_catalog.~~) 'r-%' ORDER BY grant_id;
SELECT sql, pg_temp.try(sql) AS result FROM (VALUES
	($$SELECT flagmeter.grant_credits('r-acme', 'api_calls', 1000000)$$),
	($$SELECT flagmeter.track('r-acme', 'api_calls')$$),
	($$SELECT flagmeter.consume('r-acme', 'api_calls')$$),
	($$SELECT flagmeter.assign_plan('r-acme', 'r-free')$$),
	($$SELECT * FROM flagmeter.outbox$$),
	($$DELETE FROM flagmeter.events$$)
) v(sql);
RESET ROLE;

-- The admin takes a tenant off its plan, forgetting its usage
SET ROLE regress_flagmeter_app;
SELECT flagmeter.track('r-leaver', 'api_calls', 1, idempotency_key => 'r-l1');
SET ROLE regress_flagmeter_admin;
SELECT flagmeter.unassign_tenant('r-leaver', forget_usage => true);
RESET ROLE;
SELECT (SELECT pg_catalog.count(*) FROM flagmeter.events WHERE tenant OPERATOR(pg_catalog.=) 'r-leaver') AS events,
       (SELECT pg_catalog.count(*) FROM flagmeter.tenants WHERE tenant OPERATOR(pg_catalog.=) 'r-leaver') AS assigned;

-- What flagmeter runs as the owner takes only parameters: hostile text in
-- any argument is data.
SET ROLE regress_flagmeter_app;
SELECT flagmeter.track($$r-x'); DROP TABLE flagmeter.limits; --$$, 'api_calls', 1, '2026-02-01');
SELECT pg_temp.try($$SELECT flagmeter.track('r-acme', 'api_calls''); DROP TABLE flagmeter.limits; --')$$);
RESET ROLE;
SELECT pg_catalog.count(*) AS limits_still_there FROM flagmeter.limits WHERE plan OPERATOR(pg_catalog.~~) 'r-%';

-- A role with EXECUTE on the calls cannot make them run its code as the
-- owner: types it creates in pg_temp (searched first for type names unless
-- pg_temp is placed explicitly) would otherwise capture the built-in type
-- names in the SQL flagmeter runs as the owner.
SET ROLE regress_flagmeter_app;
CREATE FUNCTION pg_temp.note(what pg_catalog.text) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
	INSERT INTO regress_hostile.pwned (what) VALUES (what);
	RETURN true;
END $$;
CREATE DOMAIN pg_temp.text AS pg_catalog.text CHECK (pg_temp.note('temporary type text'));
CREATE DOMAIN pg_temp.timestamptz AS pg_catalog.timestamptz CHECK (pg_temp.note('temporary type timestamptz'));
CREATE DOMAIN pg_temp.jsonb AS pg_catalog.jsonb CHECK (pg_temp.note('temporary type jsonb'));
SELECT flagmeter.track('r-stranger', 'api_calls', 1, '2026-02-01'),
       flagmeter.track('r-acme', 'storage_gb', 1, '2026-02-01');
SELECT granted FROM flagmeter.consume('r-stranger', 'api_calls', 1);
SELECT granted FROM flagmeter.check('r-stranger', 'api_calls', 1);
SELECT flagmeter.used(flagmeter.usage('r-stranger', 'api_calls'));
DROP DOMAIN pg_temp.text, pg_temp.timestamptz, pg_temp.jsonb;
RESET ROLE;
SELECT what, by_role OPERATOR(pg_catalog.=) 'regress_flagmeter_app' AS as_the_app,
       (SELECT r.rolsuper FROM pg_catalog.pg_roles r WHERE r.rolname OPERATOR(pg_catalog.=) by_role) AS as_superuser,
       pg_catalog.count(*)
FROM regress_hostile.pwned GROUP BY 1, 2, 3 ORDER BY 1, 2, 3;
TRUNCATE regress_hostile.pwned;

-- 4. Row-level security keyed on a setting ----------------------------------------
-- Enabled (not forced) on the usage tables: it binds the roles that read
-- them directly; the C calls and maintain() run as the owner and keep
-- seeing every tenant.  The admin's recounts read counters and events, so
-- the admin gets a policy that lets it see all rows.
ALTER TABLE flagmeter.counters ENABLE ROW LEVEL SECURITY;
ALTER TABLE flagmeter.events ENABLE ROW LEVEL SECURITY;
ALTER TABLE flagmeter.event_keys ENABLE ROW LEVEL SECURITY;
ALTER TABLE flagmeter.voids ENABLE ROW LEVEL SECURITY;
ALTER TABLE flagmeter.rollup_hour ENABLE ROW LEVEL SECURITY;
ALTER TABLE flagmeter.rollup_day ENABLE ROW LEVEL SECURITY;
DO $$
DECLARE
	t pg_catalog.text;
BEGIN
	FOREACH t IN ARRAY ARRAY['counters', 'events', 'event_keys', 'voids', 'rollup_hour', 'rollup_day']
	LOOP
		EXECUTE pg_catalog.format(
			'CREATE POLICY tenant_rows ON flagmeter.%I FOR SELECT TO regress_flagmeter_report'
			' USING (tenant OPERATOR(pg_catalog.=) pg_catalog.current_setting(%L, true))', t, 'app.tenant');
	END LOOP;
	FOREACH t IN ARRAY ARRAY['counters', 'events', 'event_keys']
	LOOP
		EXECUTE pg_catalog.format('CREATE POLICY all_rows ON flagmeter.%I TO regress_flagmeter_admin USING (true)', t);
	END LOOP;
END $$;
SELECT events_folded OPERATOR(pg_catalog.>) 0 AS folded FROM flagmeter.maintain();

SET ROLE regress_flagmeter_report;
SET app.tenant = 'r-acme';
SELECT * FROM (
	SELECT 'counters' AS relation, tenant FROM flagmeter.counters
	UNION SELECT 'events', tenant FROM flagmeter.events
	UNION SELECT 'event_keys', tenant FROM flagmeter.event_keys
	UNION SELECT 'voids', tenant FROM flagmeter.voids
	UNION SELECT 'rollup_hour', tenant FROM flagmeter.rollup_hour
	UNION SELECT 'rollup_day', tenant FROM flagmeter.rollup_day) v
ORDER BY relation COLLATE "C", tenant COLLATE "C";
-- usage_series reads with the caller's rights: another tenant's series is empty
SELECT bucket_start, used FROM flagmeter.usage_series('r-acme', 'storage_gb', '2026-02-01', '2026-02-03');
SELECT bucket_start, used FROM flagmeter.usage_series('r-hooli', 'storage_gb', '2026-02-01', '2026-02-03');
-- and the calls that read as the owner are not granted to it
SELECT sql, pg_temp.try(sql) AS result FROM (VALUES
	($$SELECT flagmeter.usage('r-hooli', 'api_calls')$$),
	($$SELECT flagmeter.check('r-hooli', 'api_calls')$$),
	($$SELECT * FROM flagmeter.status$$),
	($$SELECT * FROM flagmeter.top_tenants('api_calls')$$),
	($$SELECT flagmeter.track('r-hooli', 'api_calls')$$),
	($$SELECT * FROM flagmeter.outbox$$),
	($$SELECT * FROM flagmeter.events_default$$)
) v(sql);
-- Without the setting, nothing; the setting is the key (whoever can set it
-- chooses the tenant: it guards against a query that forgets its filter,
-- not against a role that may run any SQL).
RESET app.tenant;
SELECT pg_catalog.count(*) AS rows_without_setting FROM flagmeter.counters;
SET app.tenant = 'r-hooli';
SELECT DISTINCT tenant FROM flagmeter.events;
RESET app.tenant;
RESET ROLE;

-- RLS does not bind flagmeter's own work: the app still meters and
-- enforces on every tenant's full usage, and the admin's recount (a new
-- period kind) still sees every event.
SET ROLE regress_flagmeter_app;
SELECT granted, used, remaining FROM flagmeter.consume('r-hooli', 'api_calls', 1);
RESET ROLE;
SET ROLE regress_flagmeter_admin;
SELECT flagmeter.set_limit('r-free', 'storage_gb', 10, 'year');
SELECT flagmeter.set_limit('r-free', 'storage_gb', 10, 'lifetime');
RESET ROLE;
SELECT tenant, flagmeter.used(flagmeter.merge_agg(counter)) AS used FROM flagmeter.counters
WHERE meter OPERATOR(pg_catalog.=) 'storage_gb' AND tenant OPERATOR(pg_catalog.~~) 'r-%'
  AND period_start OPERATOR(pg_catalog.=) '-infinity'
GROUP BY tenant ORDER BY 1;
SELECT what, pg_catalog.count(*) FROM regress_hostile.pwned GROUP BY what ORDER BY what;

-- Clean up: roles are cluster-wide.  The extension stays (the next file
-- starts by dropping it); its tables keep row-level security until then.
RESET search_path;
SET client_min_messages = warning;
DROP SCHEMA regress_hostile CASCADE;
-- revoke_access takes back what grant_access gave
SELECT flagmeter.revoke_access('regress_flagmeter_dashboard', 'dashboard');
SELECT pg_catalog.count(*) AS dashboard_privileges_left
FROM flagmeter.access_privileges('dashboard') p
WHERE (p.object OPERATOR(pg_catalog.~~) 'TABLE %'
       AND pg_catalog.has_table_privilege('regress_flagmeter_dashboard', pg_catalog.substr(p.object, 7), 'SELECT'))
   OR (p.object OPERATOR(pg_catalog.~~) 'FUNCTION %'
       AND pg_catalog.has_function_privilege('regress_flagmeter_dashboard', pg_catalog.substr(p.object, 10), 'EXECUTE'))
   OR (p.object OPERATOR(pg_catalog.=) 'SCHEMA flagmeter'
       AND pg_catalog.has_schema_privilege('regress_flagmeter_dashboard', 'flagmeter', 'USAGE'));
DROP OWNED BY regress_flagmeter_app, regress_flagmeter_admin, regress_flagmeter_report,
	regress_flagmeter_listener, regress_flagmeter_dashboard CASCADE;
DROP ROLE regress_flagmeter_app, regress_flagmeter_admin, regress_flagmeter_report,
	regress_flagmeter_listener, regress_flagmeter_dashboard;
RESET client_min_messages;
