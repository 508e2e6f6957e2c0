-- Usage accounting: track, track_batch, consume, check, usage and void.
-- Every test file runs in the same database: start from a fresh extension.
SET client_min_messages = warning;
DROP EXTENSION flagmeter CASCADE;
CREATE EXTENSION flagmeter;
RESET client_min_messages;
SET search_path = flagmeter, public;
-- this file meters tenants never assigned a plan and tracks events at
-- fixed dates, which a new database refuses (QT001, QT002): it turns
-- both off
SELECT flagmeter.configure(unassigned_tenants => 'unlimited', late_events => '100 years',
	future_events => '100 years') \gset
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

SELECT define_meter('api_calls'), define_meter('tokens'), define_meter('seats', 'max'),
       define_meter('storage_gb', 'latest'), define_meter('requests', 'count');
SELECT define_plan('free'), define_plan('flex'), define_plan('monthly'), define_plan('daily');
-- lifetime limits keep this file independent of the day it runs on
SELECT set_limit('free', 'api_calls', 10, 'lifetime'),
       set_limit('free', 'tokens', 100, 'lifetime'),
       set_limit('free', 'seats', 50, 'lifetime'),
       set_limit('flex', 'api_calls', 10, 'lifetime', 'soft'),
       set_limit('monthly', 'api_calls', 1000000, 'month'),
       set_limit('daily', 'api_calls', 1000000, 'day');
SELECT assign_plan('acme', 'free', '2026-01-31 10:00:00+00', 'UTC'),
       assign_plan('hooli', 'flex'),
       assign_plan('initech', 'monthly', '2026-01-31 10:00:00-05', 'America/New_York'),
       assign_plan('umbrella', 'daily', '2026-01-01 00:00:00+00', 'Europe/Berlin');

-- track ------------------------------------------------------------------------
SELECT track('acme', 'api_calls');
SELECT track('acme', 'api_calls', 4, '2026-03-01 00:00:00+00', 'evt-1');
SELECT track('acme', 'api_calls', 4, '2026-03-01 00:00:00+00', 'evt-1');	-- duplicate: false
SELECT used(u), events(u), quota(u), remaining(u) FROM usage('acme', 'api_calls') u;
-- a rollback leaves nothing; the caller sees its own uncommitted usage
BEGIN;
SELECT track('acme', 'api_calls', 100);
SELECT used(usage('acme', 'api_calls')) AS inside;
ROLLBACK;
SELECT used(usage('acme', 'api_calls')) AS after_rollback;
-- a key rolled back can be used again
BEGIN;
SELECT track('acme', 'tokens', 1, idempotency_key => 'rolled-back');
ROLLBACK;
SELECT track('acme', 'tokens', 1, idempotency_key => 'rolled-back');
-- zero is a valid amount for track (a gauge going to zero)
SELECT track('acme', 'tokens', 0);
SELECT used(u), events(u) FROM usage('acme', 'tokens') u;
-- a tenant with no plan is tracked, unlimited, in calendar months (UTC)
SELECT track('stranger', 'api_calls', 7, '2026-05-31 23:59:59+00'),
       track('stranger', 'api_calls', 9, '2026-06-01 00:00:00+00');
SELECT used(usage('stranger', 'api_calls', '2026-05-15')) AS may,
       used(usage('stranger', 'api_calls', '2026-06-15')) AS june,
       quota(usage('stranger', 'api_calls', '2026-06-15')) AS quota;

-- Periods: late events land in the period they belong to ----------------------
-- initech: months anchored on Jan 31 10:00 New York time; DST starts Mar 8.
SELECT track('initech', 'api_calls', 1, '2026-02-28 14:59:59+00'),	-- Feb 28 09:59:59 EST
       track('initech', 'api_calls', 10, '2026-02-28 15:00:00+00'),	-- Feb 28 10:00 EST
       track('initech', 'api_calls', 100, '2026-03-31 13:59:59+00'),	-- Mar 31 09:59:59 EDT
       track('initech', 'api_calls', 1000, '2026-03-31 14:00:00+00');	-- Mar 31 10:00 EDT
SELECT at, b.period_start, b.period_end, used(usage('initech', 'api_calls', at))
FROM (VALUES ('2026-02-15 00:00:00+00'::timestamptz), ('2026-03-15 00:00:00+00'),
             ('2026-04-15 00:00:00+00')) v(at),
     period_bounds(at, 'month', '2026-01-31 10:00:00-05', 'America/New_York') b;
-- umbrella: Berlin days; 2026-03-29 has 23 hours
SELECT track('umbrella', 'api_calls', 1, '2026-03-28 22:59:59+00'),	-- Mar 28 23:59:59 CET
       track('umbrella', 'api_calls', 2, '2026-03-28 23:00:00+00'),	-- Mar 29 00:00 CET
       track('umbrella', 'api_calls', 4, '2026-03-29 21:59:59+00'),	-- Mar 29 23:59:59 CEST
       track('umbrella', 'api_calls', 8, '2026-03-29 22:00:00+00');	-- Mar 30 00:00 CEST
SELECT b.period_start, b.period_end, b.period_end - b.period_start AS length,
       used(usage('umbrella', 'api_calls', '2026-03-29 12:00:00+00'))
FROM period_bounds('2026-03-29 12:00:00+00', 'day', '2026-01-01 00:00:00+00', 'Europe/Berlin') b;
-- changing the period kind recounts the current period from the raw events
SELECT track('umbrella', 'api_calls', 16);
SELECT used(usage('umbrella', 'api_calls')) AS today_before;
SELECT set_limit('daily', 'api_calls', 1000000, 'lifetime');
SELECT used(usage('umbrella', 'api_calls')) AS lifetime_after;
SELECT set_limit('daily', 'api_calls', 1000000, 'day');
SELECT used(usage('umbrella', 'api_calls')) AS today_again;

-- consume: hard, soft, unlimited --------------------------------------------------
-- acme has used 5 of 10 api_calls (lifetime)
SELECT granted, used, quota, remaining, resets_at, overage, meter FROM consume('acme', 'api_calls', 5);
SELECT count(*) AS events_before FROM events \gset
SELECT granted, used, quota, remaining, overage FROM consume('acme', 'api_calls', 1);	-- refused
-- a refusal writes nothing: consume inserts its event before it locks stripe 0
-- and deletes it when refused (src/consume.c, consume_one); also on the
-- period's first consume (no stripe 0 yet), and for a count meter
SELECT assign_plan('newco', 'free', '2026-01-31 10:00:00+00', 'UTC'),
       override_limit('newco', 'requests', 2, 'lifetime');
SELECT granted, used, remaining FROM consume('newco', 'api_calls', 11);	-- refused
SELECT granted, used, remaining FROM consume('newco', 'api_calls', 10);
SELECT granted, used, remaining FROM consume('newco', 'requests', 5);
SELECT granted, used, remaining FROM consume('newco', 'requests', 5);
SELECT granted, used, remaining FROM consume('newco', 'requests', 5);	-- refused: 3 events > 2
SELECT count(*) - :events_before AS events_written FROM events;	-- the three granted
SELECT granted, used, quota, remaining, overage FROM consume('hooli', 'api_calls', 15);	-- soft: overage
SELECT granted, used, quota, remaining, overage FROM consume('hooli', 'api_calls', 1);
SELECT granted, used, quota, remaining, overage FROM consume('stranger', 'api_calls', 1000);
SELECT (consume('initech', 'api_calls', 1)).resets_at =
       (period_bounds(now(), 'month', '2026-01-31 10:00:00-05', 'America/New_York')).period_end
       AS resets_at_period_end;
-- track is metering, not enforcement: it records past a hard limit
SELECT track('acme', 'api_calls', 3);
SELECT granted, used, quota, remaining, overage FROM flagmeter.check('acme', 'api_calls', 1);
-- a retried key returns the original decision, even after the limit changed
SELECT granted, used, remaining FROM consume('acme', 'api_calls', 1, 'req-1');
SELECT override_limit('acme', 'api_calls', 100);
SELECT granted, used, remaining FROM consume('acme', 'api_calls', 1, 'req-1');
SELECT granted, used, remaining FROM consume('acme', 'api_calls', 1, 'req-2');
SELECT granted, used, remaining FROM consume('acme', 'api_calls', 1, 'req-2');
SELECT used(usage('acme', 'api_calls')) AS used_once;
SELECT pg_temp.try($$SELECT consume('acme', 'api_calls', 1, 'evt-1')$$);	-- a track key

-- other aggregations: max (seats) and latest (storage_gb) and count
SELECT granted, used, remaining FROM consume('acme', 'seats', 30);
SELECT granted, used, remaining FROM consume('acme', 'seats', 60);	-- max would be 60 > 50
SELECT granted, used, remaining FROM consume('acme', 'seats', 40);	-- max 40 <= 50
SELECT track('acme', 'storage_gb', 10, '2026-02-01 00:00:00+00'),
       track('acme', 'storage_gb', 5, '2026-02-02 00:00:00+00'),
       track('acme', 'storage_gb', 7, '2026-01-30 00:00:00+00');	-- late: not the latest
SELECT used(u), latest(u), latest_at(u), quota(u) FROM usage('acme', 'storage_gb', '2026-02-05') u;
SELECT track('acme', 'requests', 7), track('acme', 'requests', 7);
SELECT used FROM flagmeter.check('acme', 'requests', 0);

-- multi-meter consume: all or nothing, one decision per meter in argument order
SELECT used(usage('acme', 'tokens')) AS tokens_before;
SELECT granted, used, quota, remaining, meter FROM consume('acme', ARRAY['tokens', 'api_calls'], ARRAY[200, 1]);
SELECT used(usage('acme', 'tokens')) AS tokens, used(usage('acme', 'api_calls')) AS api_calls;
SELECT granted, used, quota, remaining, meter FROM consume('acme', ARRAY['tokens', 'api_calls'], ARRAY[50, 1], 'multi-1');
SELECT granted, used, quota, remaining, meter FROM consume('acme', ARRAY['tokens', 'api_calls'], ARRAY[50, 1], 'multi-1');
SELECT used(usage('acme', 'tokens')) AS tokens, used(usage('acme', 'api_calls')) AS api_calls;

-- void -----------------------------------------------------------------------------
SELECT void('acme', 'evt-1');		-- 4 api_calls recorded by track
SELECT void('acme', 'evt-1');		-- already voided
SELECT void('acme', 'req-1');		-- a refused consume recorded nothing
SELECT void('acme', 'multi-1');		-- both meters of a multi-meter consume
SELECT used(usage('acme', 'tokens')) AS tokens, used(usage('acme', 'api_calls')) AS api_calls;
SELECT pg_temp.try($$SELECT void('acme', 'never-seen')$$);
SELECT pg_temp.try($$SELECT void('acme', NULL)$$);
SELECT tenant, idempotency_key, meter, amount, granted, voided_at IS NOT NULL AS voided
FROM event_keys WHERE tenant = 'acme' ORDER BY idempotency_key, seq;

-- track_batch -----------------------------------------------------------------------
SELECT track_batch(ARRAY['b1', 'b2', 'b1', 'b1'], ARRAY['api_calls', 'api_calls', 'tokens', 'tokens'],
                   ARRAY[1, 2, 3, 4],
                   ARRAY['2026-02-01 00:00:00+00', NULL, '2026-02-01 00:00:00+00', '2026-02-01 00:00:00+00']::timestamptz[],
                   ARRAY[NULL, 'k-b2', 'k-b1', 'k-b1']);	-- the repeated key counts once
SELECT track_batch(ARRAY['b2'], ARRAY['api_calls'], ARRAY[2], NULL, ARRAY['k-b2']);	-- already recorded
SELECT track_batch('{}', '{}', '{}');
SELECT used(usage('b1', 'api_calls', '2026-02-01')) AS b1_calls,
       used(usage('b1', 'tokens', '2026-02-01')) AS b1_tokens,
       used(usage('b2', 'api_calls')) AS b2_calls;

-- Which stripe a track writes (src/stripes.c) ------------------------------------------
-- READ COMMITTED: the lowest shared stripe (1..flagmeter.stripes) whose tag no
-- other transaction holds, kept for the rest of the transaction; past 16
-- periods in one transaction (each tag is a lock table entry), and always in
-- REPEATABLE READ and track_batch: the backend's own stripe, above the shared ones.
-- (A track whose amount goes to shared memory writes no stripe: src/pending.c.)
SET flagmeter.one_write_track = off;
SET flagmeter.stripes = 4;
BEGIN;
SELECT count(track('striped-' || i, 'api_calls')) FROM generate_series(1, 20) i;
SELECT count(*) AS stripe_tags FROM pg_locks
WHERE locktype = 'advisory' AND pid = pg_backend_pid();
SELECT track('striped-1', 'api_calls'), track('striped-20', 'api_calls');
SELECT count(*) AS stripe_tags FROM pg_locks
WHERE locktype = 'advisory' AND pid = pg_backend_pid();
COMMIT;
SELECT CASE WHEN stripe = 1 THEN 'shared 1' WHEN stripe BETWEEN 5 AND 8 THEN 'own'
            ELSE stripe::text END AS stripe,
       count(*) AS periods, sum(used(counter)) AS used
FROM counters WHERE tenant LIKE 'striped-%' GROUP BY 1 ORDER BY 1;
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT track('striped-1', 'api_calls');
COMMIT;
SELECT track_batch(ARRAY['striped-1'], ARRAY['api_calls'], ARRAY[1]);
SELECT stripe BETWEEN 5 AND 8 AS own_stripe, used(counter)
FROM counters WHERE tenant = 'striped-1' ORDER BY stripe;
-- A tag taken in a subtransaction that rolls back is released with it: the
-- next track of the period takes one again rather than trusting it holds it.
BEGIN;
SAVEPOINT s;
SELECT track('striped-sub', 'api_calls');
ROLLBACK TO SAVEPOINT s;
SELECT count(*) AS stripe_tags FROM pg_locks
WHERE locktype = 'advisory' AND pid = pg_backend_pid();
SELECT track('striped-sub', 'api_calls');
SELECT count(*) AS stripe_tags FROM pg_locks
WHERE locktype = 'advisory' AND pid = pg_backend_pid();
COMMIT;
SELECT stripe, used(counter) FROM counters WHERE tenant = 'striped-sub';
RESET flagmeter.stripes;
RESET flagmeter.one_write_track;

-- Bad input: a specific SQLSTATE, and nothing written --------------------------------
SELECT count(*) AS events_before FROM events \gset
SELECT sql, pg_temp.try(sql) AS result FROM (VALUES
	($$SELECT track(NULL, 'api_calls')$$),
	($$SELECT track('acme', NULL)$$),
	($$SELECT track('acme', 'api_calls', NULL)$$),
	($$SELECT track('acme', 'api_calls', 1, NULL)$$),
	($$SELECT track('acme', 'nope')$$),
	($$SELECT track('', 'api_calls')$$),
	($$SELECT track(repeat('t', 257), 'api_calls')$$),
	($$SELECT track('acme', repeat('m', 64))$$),
	($$SELECT track('acme', 'api_calls', -1)$$),
	($$SELECT track('acme', 'api_calls', 1, 'infinity')$$),
	($$SELECT track('acme', 'api_calls', 1, '-infinity')$$),
	($$SELECT track('acme', 'api_calls', 1, now(), '')$$),
	($$SELECT track('acme', 'api_calls', 1, now(), repeat('k', 257))$$),
	($$SELECT track('acme', 'tokens', 9223372036854775807)$$),
	($$SELECT track('acme', 'storage_gb', 9223372036854775807, '2026-01-01'),
	          track('acme', 'storage_gb', 1, '2026-01-02')$$),
	($$SELECT consume('acme', 'api_calls', 0)$$),
	($$SELECT consume('acme', 'api_calls', -3)$$),
	($$SELECT consume('acme', 'api_calls', NULL::bigint)$$),
	($$SELECT consume(NULL, 'api_calls')$$),
	($$SELECT consume('acme', 'nope')$$),
	($$SELECT consume('acme', 'api_calls', 9223372036854775807)$$),
	($$SELECT consume('acme', ARRAY['tokens', 'api_calls'], ARRAY[1])$$),
	($$SELECT consume('acme', ARRAY['tokens', 'tokens'], ARRAY[1, 1])$$),
	($$SELECT consume('acme', '{}'::text[], '{}'::bigint[])$$),
	($$SELECT consume('acme', ARRAY['tokens', NULL], ARRAY[1, 1])$$),
	($$SELECT consume('acme', ARRAY['tokens'], ARRAY[NULL]::bigint[])$$),
	($$SELECT consume('acme', NULL::text[], ARRAY[1])$$),
	($$SELECT consume('acme', ARRAY[['tokens']], ARRAY[[1]])$$),
	($$SELECT consume('acme', ARRAY['tokens', 'nope'], ARRAY[1, 1])$$),
	($$SELECT flagmeter.check('acme', 'api_calls', -1)$$),
	($$SELECT flagmeter.check('acme', 'nope')$$),
	($$SELECT usage('acme', 'api_calls', NULL)$$),
	($$SELECT usage('acme', 'api_calls', 'infinity')$$),
	($$SELECT track_batch(ARRAY['a'], ARRAY['api_calls', 'tokens'], ARRAY[1])$$),
	($$SELECT track_batch(ARRAY['a'], ARRAY['api_calls'], ARRAY[1, 2])$$),
	($$SELECT track_batch(ARRAY['a', NULL], ARRAY['api_calls', 'api_calls'], ARRAY[1, 2])$$),
	($$SELECT track_batch(ARRAY['a'], ARRAY['api_calls'], ARRAY[NULL]::bigint[])$$),
	($$SELECT track_batch(ARRAY['a', 'b'], ARRAY['api_calls', 'nope'], ARRAY[1, 2])$$),
	($$SELECT track_batch(ARRAY['a', 'b'], ARRAY['api_calls', 'api_calls'], ARRAY[1, -2])$$),
	($$SELECT track_batch(ARRAY['a'], ARRAY['api_calls'], ARRAY[1], ARRAY['infinity']::timestamptz[])$$),
	($$SELECT track_batch(ARRAY['a'], ARRAY['api_calls'], ARRAY[1], NULL, ARRAY['k', 'l'])$$),
	($$SELECT track_batch(NULL, ARRAY['api_calls'], ARRAY[1])$$),
	($$SELECT track_batch(ARRAY[['a']], ARRAY[['api_calls']], ARRAY[[1]])$$),
	($$SELECT track_batch(ARRAY['a', 'a'], ARRAY['tokens', 'tokens'], ARRAY[9223372036854775807, 1])$$)
) v(sql);
SELECT count(*) - :events_before AS events_written FROM events;

-- Changing a tenant's plan mid-period (issue 15): the anchor and time zone
-- stay, so the period and its usage stay; the new plan's limit applies at
-- once; thresholds of the new quota that the usage reaches are announced,
-- and a hard limit now below the usage blocks at once.  Only an anchor
-- passed on purpose moves the periods (and restarts the count here).
SELECT define_plan('starter'), set_limit('starter', 'api_calls', 200),
       define_plan('growth'), set_limit('growth', 'api_calls', 1000),
       define_plan('tiny'), set_limit('tiny', 'api_calls', 100);
SELECT assign_plan('mover', 'starter', now() - interval '3 days', 'Europe/Berlin');
SELECT track('mover', 'api_calls', 110);
SELECT anchor AS mover_anchor FROM tenants WHERE tenant = 'mover' \gset
SELECT assign_plan('mover', 'growth');
SELECT plan, anchor = :'mover_anchor' AS anchor_kept, timezone FROM tenants WHERE tenant = 'mover';
SELECT granted, used, quota, remaining FROM flagmeter.check('mover', 'api_calls', 1);
SELECT assign_plan('mover', 'tiny');
SELECT granted, used, quota FROM flagmeter.check('mover', 'api_calls', 1);
SELECT kind, threshold, used, quota FROM outbox
WHERE tenant = 'mover' AND kind <> 'plan_changed' ORDER BY version;
SELECT assign_plan('mover', 'growth', now(), 'UTC');
SELECT used, quota FROM flagmeter.check('mover', 'api_calls', 0);

-- Tenants never assigned a plan (issue 15): metered without limit with
-- unassigned_tenants 'unlimited' (set at the top of this file; 'refuse' is
-- the default, issue 36); with configure(unassigned_tenants => 'refuse') every call for
-- one fails with QT001 and writes nothing (a typo such as 'Acme' or
-- 'acme ' is caught), while void still corrects what such a tenant
-- recorded before.  The setting is read from the calls' cached
-- configuration, emptied by any change of flagmeter.settings.
SELECT granted, quota FROM consume('Mover', 'api_calls', 1);
SELECT track('stranger2', 'api_calls', 4, idempotency_key => 'before-refuse');
SELECT unassigned_tenants FROM configure(unassigned_tenants => 'refuse');
SELECT count(*) AS events_before FROM events \gset
SELECT sql, pg_temp.try(sql) AS result FROM (VALUES
	($$SELECT track('Mover', 'api_calls', 1)$$),
	($$SELECT track('mover ', 'api_calls', 1)$$),
	($$SELECT track_batch(ARRAY['mover', 'Mover'], ARRAY['api_calls', 'api_calls'], ARRAY[1, 1])$$),
	($$SELECT consume('Mover', 'api_calls', 1)$$),
	($$SELECT consume('Mover', 'api_calls', 1, 'k-refused')$$),
	($$SELECT consume('Mover', ARRAY['api_calls', 'tokens'], ARRAY[1, 1])$$),
	($$SELECT flagmeter.check('Mover', 'api_calls')$$),
	($$SELECT usage('Mover', 'api_calls')$$),
	($$SELECT limit_in_force('Mover', 'api_calls')$$),
	($$SELECT track('mover', 'api_calls', 1)$$),
	($$SELECT void('stranger2', 'before-refuse')$$)
) v(sql);
SELECT count(*) - :events_before AS events_written FROM events;	-- mover's one track
SELECT count(*) AS keys_written FROM event_keys WHERE idempotency_key = 'k-refused';
SELECT granted FROM consume('Acme', 'api_calls', 1);
\echo :LAST_ERROR_SQLSTATE
SELECT unassigned_tenants FROM configure(retention => '90 days');	-- kept
SELECT configure(unassigned_tenants => 'sometimes');
SELECT unassigned_tenants FROM configure(unassigned_tenants => 'unlimited');
SELECT granted, quota FROM consume('Mover', 'api_calls', 1);

-- Untyped arguments (issue 15).  consume(t, m, NULL) and an untyped driver
-- parameter for the amount matched both consume(text, text, bigint, text)
-- and consume(text, text[], bigint[], text) ("function is not unique"): a
-- text overload takes them.  track's fourth argument is occurred_at (the
-- order is fixed); an idempotency key passed there is refused with a hint
-- to name it, and untyped times still work.
SELECT consume('acme', 'api_calls', NULL);
SELECT granted, used FROM consume('untyped', 'api_calls', '2');
PREPARE consume_untyped(unknown, unknown, unknown, unknown) AS
	SELECT granted, used FROM flagmeter.consume($1, $2, $3, $4);
EXECUTE consume_untyped('untyped', 'api_calls', '3', 'u-1');
EXECUTE consume_untyped('untyped', 'api_calls', '3', 'u-1');	-- a retry
SELECT track('untyped', 'api_calls', 1, 'req-1');
SELECT track('untyped', 'api_calls', 1, '2026-02-01 10:00:00+00'),
       track('untyped', 'api_calls', 1, idempotency_key => 'req-1');
SELECT occurred_at = '2026-02-01 10:00:00+00' AS at_the_given_time, idempotency_key
FROM events WHERE tenant = 'untyped' AND meter = 'api_calls' AND amount = 1
ORDER BY idempotency_key NULLS FIRST;

