-- tools/demo.sql -- the SQL of `make demo`, in three parts.
--
-- tools/demo.sh runs it with `psql -X -v ON_ERROR_STOP=1 -v part=...` against
-- a fresh database in which `CREATE EXTENSION flagmeter` has been done:
--
--   part=setup      meters, plans and eight tenants; two weeks of usage
--                   history in one track_batch call; consume calls (granted,
--                   retried with an idempotency key, refused at a hard
--                   limit, all or nothing across two meters, soft overage);
--                   rate limits (a plan's on consume, and limit() for a key);
--                   a void; the app table app_settings with the
--                   flagmeter.invalidate() trigger; the role demo_app that
--                   the load and the listening app instance connect as.
--   part=upgrade    run by demo.sh while the load runs: sales raises
--                   hooli's api_calls limit and updates its app_settings row
--                   in one transaction.
--   part=dashboard  after the load: maintain(), the status table, blocked
--                   tenants, top tenants by used and by ratio, a day and an
--                   hour series for one tenant, stats, and what the
--                   listening app instance received (its psql output file
--                   is read with pg_read_file; :listener_log is its path).
--
-- Every anchor is a local midnight 15 to 25 days ago, so the history of the
-- last two weeks lies in each tenant's current month and the figures of the
-- setup are the same on every run; only the dates follow the clock.

\set QUIET on
\pset null '-'
\pset footer off
SET TimeZone = 'UTC';
SET client_min_messages = warning;

\if :{?part}
\else
\set part setup
\endif
SELECT :'part' = 'setup' AS part_setup, :'part' = 'upgrade' AS part_upgrade,
       :'part' = 'dashboard' AS part_dashboard \gset

-- ===========================================================================
\if :part_setup
-- ===========================================================================

-- try(sql): 'ok', or the SQLSTATE and message of the error it raised
CREATE FUNCTION pg_temp.try(sql text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
	EXECUTE sql;
	RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
	RETURN SQLSTATE || ': ' || SQLERRM;
END $$;

\echo
\echo '== 1. Catalog: meters, plans, limits, tenants ==========================================='
\echo
\echo 'two meters (api_calls, tokens), two plans (free, pro), eight tenants, each with its own'
\echo 'billing anchor and time zone'
\o /dev/null
SELECT flagmeter.define_meter('api_calls', 'sum', 'call'),
       flagmeter.define_meter('tokens', 'sum', 'token');
SELECT flagmeter.define_plan('free'), flagmeter.define_plan('pro');
SELECT flagmeter.set_limit('free', 'api_calls', 1000),
       flagmeter.set_limit('free', 'tokens', 50000, 'month', 'soft'),
       flagmeter.set_limit('pro', 'api_calls', 100000),
       flagmeter.set_limit('pro', 'tokens', 5000000, 'month', 'soft', '{75,90,100}');
SELECT flagmeter.assign_plan(t.tenant, t.plan,
                             (date_trunc('day', now() AT TIME ZONE t.tz)
                              - make_interval(days => t.days_ago)) AT TIME ZONE t.tz,
                             t.tz)
FROM (VALUES ('acme',     'free', 'America/New_York',    20),
             ('globex',   'free', 'Europe/Berlin',       16),
             ('initech',  'free', 'UTC',                 25),
             ('hooli',    'free', 'America/Los_Angeles', 18),
             ('umbrella', 'pro',  'Asia/Tokyo',          22),
             ('stark',    'pro',  'America/Chicago',     17),
             ('wayne',    'pro',  'UTC',                 24),
             ('wonka',    'pro',  'Europe/London',       15)) t(tenant, plan, tz, days_ago);
\o

SELECT plan, meter, quota, period, mode, thresholds
FROM flagmeter.limits ORDER BY plan, meter;

\echo 'Each tenant''s current month, on its own clock:'
SELECT t.tenant, t.plan, t.timezone,
       to_char(b.period_start AT TIME ZONE t.timezone, 'YYYY-MM-DD HH24:MI') AS period_start_local,
       to_char(b.period_end AT TIME ZONE t.timezone, 'YYYY-MM-DD HH24:MI') AS period_end_local
FROM flagmeter.tenants t
CROSS JOIN LATERAL flagmeter.limit_config(t.tenant, 'api_calls') c
CROSS JOIN LATERAL flagmeter.period_bounds(now(), c.period, c.anchor, c.timezone) b
ORDER BY t.plan, t.tenant;

\echo
\echo '== 2. History: two weeks of usage in one track_batch call ================================'
\echo
WITH spec(tenant, meter, total, n) AS (VALUES
	('acme',     'api_calls',     760, 190), ('acme',     'tokens',   10000, 100),
	('globex',   'api_calls',     700, 175), ('globex',   'tokens',    8000,  80),
	('initech',  'api_calls',     990, 198), ('initech',  'tokens',   12000, 120),
	('hooli',    'api_calls',    1000, 200), ('hooli',    'tokens',   60000, 150),
	('umbrella', 'api_calls',   42000, 420), ('umbrella', 'tokens', 3700000, 370),
	('stark',    'api_calls',   61000, 305), ('stark',    'tokens', 2100000, 210),
	('wayne',    'api_calls',   18000, 180), ('wayne',    'tokens',  900000, 180),
	('wonka',    'api_calls',   27000, 270), ('wonka',    'tokens', 1300000, 260)
), ev AS (
	-- n equal events per tenant and meter, denser towards now (usage grows)
	SELECT s.tenant, s.meter, (s.total / s.n)::bigint AS amount,
	       now() - interval '14 days'
	       + (interval '14 days' - interval '30 minutes') * power((g - 0.5) / s.n, 0.7) AS occurred_at
	FROM spec s CROSS JOIN LATERAL generate_series(1, s.n) g
)
SELECT flagmeter.track_batch(array_agg(tenant), array_agg(meter), array_agg(amount),
                             array_agg(occurred_at)) AS events_counted
FROM ev;

\echo 'A batch with idempotency keys, sent twice (the retry counts nothing):'
SELECT flagmeter.track_batch(ARRAY['wonka', 'wonka'], ARRAY['api_calls', 'tokens'],
                             ARRAY[3, 1200], NULL, ARRAY['wonka-sync-1', 'wonka-sync-2']) AS first_send,
       flagmeter.track_batch(ARRAY['wonka', 'wonka'], ARRAY['api_calls', 'tokens'],
                             ARRAY[3, 1200], NULL, ARRAY['wonka-sync-1', 'wonka-sync-2']) AS retry;

\echo
\echo '== 3. Enforcement: consume ================================================================'
\echo
\echo 'initech (free, 1 000 api_calls a month, hard) has used:'
SELECT flagmeter.used(flagmeter.usage('initech', 'api_calls')) AS api_calls_used;

\echo 'consume 5 with idempotency key req-7f3a: granted'
SELECT granted, used, quota, remaining, overage
FROM flagmeter.consume('initech', 'api_calls', 5, 'req-7f3a');

\echo 'the same request retried (same key): the original decision, nothing recorded'
SELECT granted, used, quota, remaining, overage
FROM flagmeter.consume('initech', 'api_calls', 5, 'req-7f3a');

\echo 'check 10 more (records nothing), then consume 10: refused at the hard limit'
SELECT granted, used, quota, remaining FROM flagmeter.check('initech', 'api_calls', 10);
SELECT granted, used, quota, remaining FROM flagmeter.consume('initech', 'api_calls', 10);

\echo 'one request costing 10 api_calls + 800 tokens: all or nothing, so tokens are not'
\echo 'recorded either (tokens is a soft limit and alone would be granted)'
SELECT meter, granted, used, quota, remaining
FROM flagmeter.consume('initech', ARRAY['api_calls', 'tokens'], ARRAY[10, 800]);

\echo 'hooli used its 1 000 api_calls (it is blocked) and is past its soft tokens limit:'
\echo 'api_calls are refused, tokens are granted with the overage reported'
SELECT meter, granted, used, quota, remaining, overage FROM flagmeter.consume('hooli', 'api_calls', 1)
UNION ALL
SELECT meter, granted, used, quota, remaining, overage FROM flagmeter.consume('hooli', 'tokens', 1500);

\echo 'a tenant never assigned a plan (a typo of initech) is refused, and nothing is recorded'
SELECT pg_temp.try($$SELECT flagmeter.consume('initek', 'api_calls', 1)$$) AS unassigned;

\echo
\echo '== 3b. Rate limits: per second or minute, beside the monthly quota ========================'
\echo
\echo 'pro tenants may export twice a minute (a rate limit needs no quota); stark asks three'
\echo 'times: the third is refused for the rate, and told when to retry'
\o /dev/null
SELECT flagmeter.define_meter('exports', 'count', 'export');
SELECT flagmeter.set_rate_limit('pro', 'exports', 2, '1 minute');
\o
SELECT 1 AS request, granted, reason, date_trunc('second', retry_after) AS retry_after
FROM flagmeter.consume('stark', 'exports')
UNION ALL
SELECT 2, granted, reason, date_trunc('second', retry_after) FROM flagmeter.consume('stark', 'exports')
UNION ALL
SELECT 3, granted, reason, date_trunc('second', retry_after) FROM flagmeter.consume('stark', 'exports');

\echo 'any key, with no catalog row: an API key allowed 3 requests a second (limit is a'
\echo 'reserved word of SQL: call it as flagmeter.limit)'
SELECT 1 AS request, allowed, remaining, retry_after IS NOT NULL AS told_when
FROM flagmeter.limit('api-key:k_live_42', 3, '1 second')
UNION ALL
SELECT 2, allowed, remaining, retry_after IS NOT NULL FROM flagmeter.limit('api-key:k_live_42', 3, '1 second')
UNION ALL
SELECT 3, allowed, remaining, retry_after IS NOT NULL FROM flagmeter.limit('api-key:k_live_42', 3, '1 second')
UNION ALL
SELECT 4, allowed, remaining, retry_after IS NOT NULL FROM flagmeter.limit('api-key:k_live_42', 3, '1 second');

\echo
\echo '== 3c. Distinct counts: seats and monthly active users ===================================='
\echo
\echo 'free plans have 3 seats (a lifetime limit on a unique meter) and count monthly active'
\echo 'users; initech adds four members: the fourth is refused, the three others keep working'
\o /dev/null
SELECT flagmeter.define_meter('seats', 'unique', 'seat'),
       flagmeter.define_meter('active_users', 'unique', 'user');
SELECT flagmeter.set_limit('free', 'seats', 3, 'lifetime'),
       flagmeter.set_limit('free', 'active_users', 100);
\o
SELECT m.member, d.granted, d.used, d.quota, d.reason
FROM (VALUES (1, 'ann@initech.example'), (2, 'bob@initech.example'), (3, 'cid@initech.example'),
             (4, 'dan@initech.example'), (5, 'ann@initech.example')) m(n, member),
     LATERAL flagmeter.consume_value('initech', 'seats', m.member) d
ORDER BY m.n;
\echo 'bob leaves: his seat is free again, and dan gets it'
SELECT flagmeter.forget_value('initech', 'seats', 'bob@initech.example') AS freed,
       (flagmeter.consume_value('initech', 'seats', 'dan@initech.example')).granted AS dan;
\echo 'every request tracks its user: 5 requests of 3 users are 3 active users this month'
SELECT count(*) FILTER (WHERE flagmeter.track_value('initech', 'active_users', u)) AS new_users
FROM unnest(ARRAY['u1', 'u2', 'u1', 'u3', 'u2']) u;
SELECT flagmeter.used(flagmeter.usage('initech', 'active_users')) AS active_users,
       flagmeter.quota(flagmeter.usage('initech', 'active_users')) AS quota;

\echo
\echo '== 4. Corrections: void ====================================================================='
\echo
\echo 'wayne: an import tracked 500 api_calls under key import-42 by mistake'
SELECT flagmeter.track('wayne', 'api_calls', 500, now(), 'import-42') AS tracked,
       flagmeter.track('wayne', 'api_calls', 500, now(), 'import-42') AS tracked_again;
SELECT flagmeter.used(flagmeter.usage('wayne', 'api_calls')) AS api_calls_used;
SELECT flagmeter.void('wayne', 'import-42') AS voided,
       flagmeter.void('wayne', 'import-42') AS voided_again;
SELECT flagmeter.used(flagmeter.usage('wayne', 'api_calls')) AS api_calls_used;
SELECT pg_temp.try($$SELECT flagmeter.void('wayne', 'import-43')$$) AS unknown_key;
\echo 'an event older than the accepted window (35 days by default) is refused too'
SELECT pg_temp.try($$SELECT flagmeter.track('wayne', 'api_calls', 1, now() - interval '40 days')$$) AS too_late;

\echo
\echo '== 5. An app table that app instances cache, and the app''s role ========================='
\echo
\echo 'CREATE TABLE app_settings (tenant text PRIMARY KEY, plan_label text, flags jsonb);'
\echo 'CREATE TRIGGER app_settings_invalidate AFTER INSERT OR UPDATE OR DELETE ON app_settings'
\echo '    FOR EACH ROW EXECUTE FUNCTION flagmeter.invalidate();'
CREATE TABLE public.app_settings (tenant text PRIMARY KEY, plan_label text, flags jsonb NOT NULL);
INSERT INTO public.app_settings
SELECT t.tenant, t.plan, '{"bulk_export": false}' FROM flagmeter.tenants t;
CREATE TRIGGER app_settings_invalidate AFTER INSERT OR UPDATE OR DELETE ON public.app_settings
	FOR EACH ROW EXECUTE FUNCTION flagmeter.invalidate();

\echo
\echo 'The load and the listening app instance connect as demo_app, a role with USAGE on schema'
\echo 'flagmeter, EXECUTE on track and consume, and no privilege on its tables except SELECT on'
\echo 'outbox and blocked (to resync): track and consume run their own statements as the owner'
\echo 'of the schema.'
CREATE ROLE demo_app LOGIN;
GRANT USAGE ON SCHEMA flagmeter TO demo_app;
GRANT EXECUTE ON FUNCTION flagmeter.track(text, text, bigint, timestamptz, text),
                          flagmeter.consume(text, text[], bigint[], text) TO demo_app;
GRANT SELECT ON flagmeter.outbox, flagmeter.blocked TO demo_app;
GRANT SELECT ON public.app_settings TO demo_app;
SELECT has_table_privilege('demo_app', 'flagmeter.counters', 'INSERT') AS may_write_counters,
       has_table_privilege('demo_app', 'flagmeter.limits', 'UPDATE') AS may_change_limits;

\echo 'Quota events so far (announced before any app instance listened; they stay in the outbox):'
SELECT kind, count(*) AS events, max(version) AS up_to_version
FROM flagmeter.outbox GROUP BY kind ORDER BY min(version);

\endif

-- ===========================================================================
\if :part_upgrade
-- ===========================================================================
-- Sales moves hooli to a 5 000 api_calls deal and turns on bulk export, in
-- one transaction: one quota notification (limit_changed, and unblocked as
-- hooli is back under its limit) and one invalidation of app_settings.
BEGIN;
SELECT flagmeter.override_limit('hooli', 'api_calls', 5000) \gset
UPDATE public.app_settings
SET plan_label = 'free + 5k calls', flags = flags || '{"bulk_export": true}'
WHERE tenant = 'hooli';
COMMIT;
\endif

-- ===========================================================================
\if :part_dashboard
-- ===========================================================================

\echo
\echo '== 7. maintain(): fold, expire, compact, partitions ========================================='
\echo
SELECT events_folded, voids_folded, partitions_created, partitions_dropped, keys_expired,
       periods_compacted
FROM flagmeter.maintain();

\echo
\echo '== 8. Dashboard ===================================================================================='
\echo
\echo 'flagmeter.status: state is ok below the lowest threshold, warning from it, exceeded at 100 %'
SELECT tenant, plan, meter, mode, used, quota, remaining,
       to_char(100 * ratio, 'FM9990.0') || ' %' AS ratio, state
FROM flagmeter.status ORDER BY plan, tenant, meter;

\echo 'Blocked at a hard limit (flagmeter.blocked):'
SELECT tenant, meter, to_char(blocked_at, 'HH24:MI:SS') AS blocked_at_utc FROM flagmeter.blocked
ORDER BY tenant, meter;

\echo 'Top tenants on api_calls, by used: top_tenants(''api_calls'', 3)'
SELECT tenant, plan, used, quota, to_char(100 * ratio, 'FM9990.0') || ' %' AS ratio, state
FROM flagmeter.top_tenants('api_calls', 3);
\echo '... and by ratio: top_tenants(''api_calls'', 3, ''ratio'')'
SELECT tenant, plan, used, quota, to_char(100 * ratio, 'FM9990.0') || ' %' AS ratio, state
FROM flagmeter.top_tenants('api_calls', 3, 'ratio');

\echo 'umbrella''s api_calls per day of the last two weeks, in its time zone (Asia/Tokyo):'
\echo 'usage_series(''umbrella'', ''api_calls'', now() - interval ''13 days'', now(), ''day'', ''Asia/Tokyo'')'
SELECT to_char(bucket_start AT TIME ZONE 'Asia/Tokyo', 'Dy YYYY-MM-DD') AS tokyo_day, used,
       repeat('#', (40 * used / NULLIF(max(used) OVER (), 0))::int) AS chart
FROM flagmeter.usage_series('umbrella', 'api_calls', now() - interval '13 days', now(), 'day',
                            'Asia/Tokyo');

\echo '... and per hour of the last eight hours (the last one includes the load just run):'
SELECT to_char(bucket_start AT TIME ZONE 'Asia/Tokyo', 'MM-DD HH24:00') AS tokyo_hour, used,
       repeat('#', (40 * used / NULLIF(max(used) OVER (), 0))::int) AS chart
FROM flagmeter.usage_series('umbrella', 'api_calls', now() - interval '7 hours', now(), 'hour',
                            'Asia/Tokyo');

\echo 'flagmeter.stats, for operators:'
\x on
SELECT * FROM flagmeter.stats;
\x off

\echo
\echo '== 9. Notifications received by the listening app instance =================================='
\echo
-- The listener is psql, which prints each notification as
--   Asynchronous notification "flagmeter" with payload "..." received from server process with PID n.
-- and, when it started, "resync|<latest_version()>" and "blocked|tenant/meter" lines.
CREATE TEMP TABLE received AS
SELECT l.n,
       substring(l.line from '^Asynchronous notification "flagmeter" with payload "(.*)" received from server process with PID [0-9]+\.$') AS payload
FROM regexp_split_to_table(pg_read_file(:'listener_log'), E'\n') WITH ORDINALITY AS l(line, n)
WHERE l.line LIKE 'Asynchronous notification "flagmeter" %';
-- json, not jsonb: keys keep the order and spacing they were sent with
CREATE TEMP TABLE received_events AS
SELECT dense_rank() OVER (ORDER BY r.n) AS notification, e.ev
FROM received r
CROSS JOIN LATERAL (
	SELECT x FROM json_array_elements(r.payload::json -> 'events') x
	WHERE r.payload::json ->> 'kind' = 'batch'
	UNION ALL
	SELECT r.payload::json WHERE r.payload::json ->> 'kind' <> 'batch') e(ev);
SELECT COALESCE(max(substring(l.line from '^resync\|([0-9]+)$')::bigint), 0) AS resync_version,
       COALESCE(string_agg(substring(l.line from '^blocked\|(.*)$'), ', '), 'none') AS blocked_at_start
FROM regexp_split_to_table(pg_read_file(:'listener_log'), E'\n') AS l(line) \gset

\echo 'At start it ran LISTEN flagmeter, then in one REPEATABLE READ transaction read'
\echo 'flagmeter.latest_version() and the state it caches (here: flagmeter.blocked):'
SELECT :resync_version AS latest_version, :'blocked_at_start' AS blocked;

\echo 'What it received since then (a batch notification carries several events):'
SELECT ev ->> 'kind' AS kind, count(DISTINCT notification) AS notifications, count(*) AS events
FROM received_events GROUP BY 1 ORDER BY min(notification);

\echo 'Each event, in the order received (# numbers the notifications):'
SELECT notification AS "#", ev ->> 'version' AS version, ev ->> 'kind' AS kind,
       COALESCE(ev ->> 'tenant', ev ->> 'table') AS tenant_or_table, ev ->> 'meter' AS meter,
       CASE ev ->> 'kind'
           WHEN 'threshold' THEN (ev ->> 'threshold') || ' % reached: ' || (ev ->> 'used') || ' of ' || (ev ->> 'quota')
           WHEN 'blocked' THEN 'hard limit reached: ' || (ev ->> 'used') || ' of ' || (ev ->> 'quota')
           WHEN 'unblocked' THEN 'back under the limit: ' || (ev ->> 'used') || ' of ' || (ev ->> 'quota')
           WHEN 'limit_changed' THEN 'limit changed' || COALESCE(' (plan ' || (ev ->> 'plan') || ')', '')
           WHEN 'plan_changed' THEN 'now on plan ' || (ev ->> 'plan')
           WHEN 'invalidate' THEN (SELECT string_agg(o, ', ') FROM json_array_elements_text(ev -> 'ops') o)
                                  || ' of ' || COALESCE(ev ->> 'keys', 'all rows')
           WHEN 'resync' THEN 'resync from the outbox'
       END AS what
FROM received_events ORDER BY notification, (ev ->> 'version')::bigint NULLS LAST;

\echo 'The payloads as received (the first eight):'
\pset format unaligned
\pset tuples_only on
SELECT payload FROM received ORDER BY n LIMIT 8;
\pset tuples_only off
\pset format aligned

\echo
\echo 'Nothing missed: every quota event recorded since the listener''s latest_version() came in a'
\echo 'notification (flagmeter.changes_since() is what an instance replays after a reconnect):'
SELECT (SELECT count(*) FROM flagmeter.changes_since(:resync_version)) AS in_outbox_since_listen,
       (SELECT count(*) FROM received_events WHERE ev ->> 'version' IS NOT NULL) AS received,
       (SELECT count(*) FROM flagmeter.changes_since(:resync_version) c
        WHERE NOT EXISTS (SELECT FROM received_events r
                          WHERE (r.ev ->> 'version')::bigint = c.version)) AS missed;

\endif
