-- Rollover (issue 19): set_limit(..., rollover, rollover_cap, rollover_periods)
-- and roll_over(), which maintain() calls: a share of each ended period's
-- unused quota becomes a credit grant for the next periods.
-- Every test file runs in the same database: start from a fresh extension.
SET client_min_messages = warning;
DROP EXTENSION flagmeter CASCADE;
CREATE EXTENSION flagmeter;
RESET client_min_messages;
SET search_path = flagmeter, public;
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

SELECT define_meter('api_calls'), define_meter('requests', 'count'), define_meter('seats', 'max'),
       define_meter('gauge', 'latest');
SELECT define_plan('roll'), define_plan('capped'), define_plan('short'), define_plan('counted'),
       define_plan('plain'), define_plan('errs');

-- 1. set_limit stores the rollover ---------------------------------------------------
SELECT set_limit('roll', 'api_calls', 100, 'day', rollover => 50, rollover_periods => 2),
       set_limit('capped', 'api_calls', 100, 'day', rollover => 100, rollover_cap => 30),
       set_limit('short', 'api_calls', 100, 'day', rollover => 100),
       set_limit('counted', 'requests', 10, 'day', 'soft', '{100}', 50),
       set_limit('plain', 'api_calls', 100, 'day');
-- store_limit (the proxy's half of set_limit) takes them too
SELECT store_limit('plain', 'requests', 5, 'week', 'hard', '{80,100}', 25, 7, 3);
SELECT plan, meter, quota, period, rollover, rollover_cap, rollover_periods
FROM limits ORDER BY plan, meter;
-- a limit set again without rollover loses it
SELECT set_limit('plain', 'requests', 5, 'week');
SELECT plan, meter, rollover, rollover_cap, rollover_periods FROM limits WHERE plan = 'plain' ORDER BY meter;

-- 2. bad arguments: a clear error, nothing written -----------------------------------
SELECT sql, pg_temp.try(sql) AS result FROM (VALUES
	($$SELECT set_limit('errs', 'api_calls', 100, 'day', rollover => 0)$$),
	($$SELECT set_limit('errs', 'api_calls', 100, 'day', rollover => 101)$$),
	($$SELECT set_limit('errs', 'api_calls', 100, 'day', rollover => -5)$$),
	($$SELECT set_limit('errs', 'api_calls', 100, 'day', rollover => 50, rollover_cap => 0)$$),
	($$SELECT set_limit('errs', 'api_calls', 100, 'day', rollover => 50, rollover_cap => -1)$$),
	($$SELECT set_limit('errs', 'api_calls', 100, 'day', rollover => 50, rollover_periods => 0)$$),
	($$SELECT set_limit('errs', 'api_calls', 100, 'day', rollover => 50, rollover_periods => 121)$$),
	($$SELECT set_limit('errs', 'api_calls', 100, 'day', rollover => 50, rollover_periods => NULL)$$),
	($$SELECT set_limit('errs', 'api_calls', 100, 'day', rollover_periods => NULL)$$),
	($$SELECT set_limit('errs', 'api_calls', 100, 'day', rollover_cap => 10)$$),
	($$SELECT set_limit('errs', 'api_calls', 100, 'day', rollover_periods => 3)$$),
	($$SELECT set_limit('errs', 'api_calls', 100, 'lifetime', rollover => 50)$$),
	($$SELECT set_limit('errs', 'seats', 100, 'day', rollover => 50)$$),
	($$SELECT set_limit('errs', 'gauge', 100, 'day', rollover => 50)$$),
	($$SELECT store_limit('errs', 'api_calls', 100, 'day', 'hard', '{100}', 200)$$),
	-- an existing limit stays as it was
	($$SELECT set_limit('roll', 'api_calls', 100, 'day', rollover => 50, rollover_periods => 500)$$)
) v(sql);
SELECT count(*) AS errs_limits FROM limits WHERE plan = 'errs';
SELECT quota, rollover, rollover_cap, rollover_periods FROM limits WHERE plan = 'roll';
-- the CHECK constraint holds the line for direct writes
SELECT pg_temp.try($$UPDATE flagmeter.limits SET rollover = 0 WHERE plan = 'roll'$$) AS zero,
       pg_temp.try($$UPDATE flagmeter.limits SET rollover_periods = NULL WHERE plan = 'roll'$$) AS no_lifetime,
       pg_temp.try($$UPDATE flagmeter.limits SET period = 'lifetime' WHERE plan = 'roll'$$) AS lifetime;

-- 3. roll_over through maintain() ------------------------------------------------------
-- Daily periods in UTC: d0 is today, d1 yesterday, d2 the day before.  The
-- tenants signed up ten days ago (assigned_at moved back by hand), but for
-- midway (assigned in the middle of yesterday) and late (assigned now).
SELECT date_trunc('day', now(), 'UTC') AS d0,
       date_trunc('day', now(), 'UTC') - interval '1 day' AS d1,
       date_trunc('day', now(), 'UTC') - interval '2 days' AS d2,
       date_trunc('day', now(), 'UTC') - interval '3 days' AS d3 \gset
SELECT assign_plan('acme', 'roll'), assign_plan('idle', 'roll'), assign_plan('vip', 'roll'),
       assign_plan('midway', 'roll'), assign_plan('late', 'roll'), assign_plan('capped', 'capped'),
       assign_plan('short', 'short'), assign_plan('counted', 'counted');
UPDATE tenants SET assigned_at = :'d0'::timestamptz - interval '10 days' WHERE tenant <> 'late';
UPDATE tenants SET assigned_at = :'d1'::timestamptz + interval '12 hours' WHERE tenant = 'midway';
-- vip's own quota (an override) is what rolls over
SELECT override_limit('vip', 'api_calls', 1000);

-- acme: yesterday 60 of 100 (40 unused: 20 roll over), the day before all
-- 100 (nothing), three days ago 0 (past the two-period lifetime: none)
SELECT track('acme', 'api_calls', 60, :'d1'::timestamptz + interval '1 hour'),
       track('acme', 'api_calls', 70, :'d2'::timestamptz + interval '1 hour'),
       track('acme', 'api_calls', 30, :'d2'::timestamptz + interval '23 hours');
-- track records into the period containing occurred_at
SELECT used(usage('acme', 'api_calls', :'d1')) AS d1, used(usage('acme', 'api_calls', :'d2')) AS d2,
       used(usage('acme', 'api_calls', :'d3')) AS d3, used(usage('acme', 'api_calls')) AS d0;
-- capped: 90 unused, 100 % of it, capped at 30
SELECT track('capped', 'api_calls', 10, :'d1'::timestamptz + interval '5 hours');
-- counted: a count meter counts events (3 of 10: 7 unused, 50 % is 3), not amounts
SELECT track('counted', 'requests', 100, :'d1'::timestamptz + interval '1 hour'),
       track('counted', 'requests', 100, :'d1'::timestamptz + interval '2 hours'),
       track('counted', 'requests', 100, :'d1'::timestamptz + interval '3 hours');
-- vip: the day before yesterday used its whole 1000
SELECT track('vip', 'api_calls', 1000, :'d2'::timestamptz + interval '1 hour');
-- midway, late, idle, short: no usage at all

SELECT count(*) AS grants_before FROM credit_grants;
SELECT events_folded >= 0 AS maintained FROM maintain();

-- the grants made: from the period's end, until the end of the
-- rollover_periods-th period after it
SELECT g.tenant, g.meter, g.amount, g.drawn, g.priority,
       g.starts_at - :'d0'::timestamptz AS starts_after_d0,
       g.expires_at - :'d0'::timestamptz AS expires_after_d0,
       g.idempotency_key = 'rollover:' || g.meter || ':'
           || to_char(g.starts_at - interval '1 day', 'YYYY-MM-DD"T"00:00:00"Z"') AS key_ok
FROM credit_grants g ORDER BY g.tenant, g.starts_at DESC;

-- every period decided, with what roll_over saw (0: nothing rolled over)
SELECT r.tenant, r.meter, r.period_start - :'d0'::timestamptz AS period_start_from_d0,
       r.period_end - r.period_start AS length, r.quota, r.used, r.amount,
       r.grant_id IS NOT NULL AS granted, r.expires_at - :'d0'::timestamptz AS expires_after_d0
FROM rollovers r ORDER BY r.tenant, r.period_start DESC;

-- 4. a second run makes nothing -------------------------------------------------------
SELECT roll_over() AS second_run;
SELECT events_folded >= 0 AS maintained FROM maintain();
SELECT count(*) AS grants_after FROM credit_grants;
-- even when the decisions are gone: the grant's key is found, none is made twice
DELETE FROM rollovers WHERE tenant = 'acme';
SELECT roll_over() AS rerun;
SELECT r.amount, r.grant_id = g.grant_id AS same_grant
FROM rollovers r JOIN credit_grants g ON g.tenant = r.tenant
WHERE r.tenant = 'acme' AND r.amount > 0;
SELECT count(*) AS grants_after_rerun FROM credit_grants;

-- 5. the rollover grant is drawn after today's quota --------------------------------
SELECT granted, used, quota, remaining, overage, reason, from_grants, balance
FROM consume('acme', 'api_calls', 100);
SELECT granted, used, quota, remaining, overage, reason, from_grants, balance
FROM consume('acme', 'api_calls', 15);
SELECT granted, used, quota, reason, from_grants, balance
FROM consume('acme', 'api_calls', 10);
SELECT amount, drawn, remaining, state FROM grants WHERE tenant = 'acme';

-- 6. rollover taken off: nothing more rolls over (with it, the decision would be
-- made again and find its grant), what was granted stays -------------------------
SELECT set_limit('short', 'api_calls', 100, 'day');
DELETE FROM rollovers WHERE tenant = 'short';
SELECT roll_over() AS without_rollover;
SELECT (SELECT count(*) FROM rollovers WHERE tenant = 'short') AS short_rows,
       (SELECT count(*) FROM credit_grants WHERE tenant = 'short') AS short_grants;
