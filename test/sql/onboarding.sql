-- Onboarding: assign_plan_batch, and catalog calls whose cost does not
-- grow with the history of events (issue 39).
SET search_path = flagmeter, public;
SET client_min_messages = warning;

SELECT define_meter('api_calls'), define_meter('storage', 'max');
SELECT define_plan('pro'), define_plan('daily');
SELECT set_limit('pro', 'api_calls', 1000), set_limit('pro', 'storage', 50, 'month', 'soft'),
       set_limit('daily', 'api_calls', 10, 'day');

-- Bad input: a clear error, nothing written ---------------------------------------

CREATE TEMP TABLE bad(call text);
INSERT INTO bad VALUES
	($$SELECT assign_plan_batch(NULL, 'pro')$$),
	($$SELECT assign_plan_batch(ARRAY[['a'],['b']], 'pro')$$),
	($$SELECT assign_plan_batch(ARRAY['a', NULL], 'pro')$$),
	($$SELECT assign_plan_batch(ARRAY['a', ''], 'pro')$$),
	($$SELECT assign_plan_batch(ARRAY['a', 'b', 'a'], 'pro')$$),
	($$SELECT assign_plan_batch(ARRAY['a'], 'nope')$$),
	($$SELECT assign_plan_batch(ARRAY['a'], NULL)$$),
	($$SELECT assign_plan_batch(ARRAY['a'], 'pro', 'infinity')$$),
	($$SELECT assign_plan_batch(ARRAY['a'], 'pro', NULL, '+05:30')$$),
	($$SELECT assign_plan_batch(ARRAY['a'], 'pro', NULL, 'Mars/Olympus')$$);
DO $$
DECLARE
	b record;
	e_state text; e_message text;
BEGIN
	FOR b IN SELECT call FROM bad LOOP
		BEGIN
			EXECUTE b.call;
			RAISE NOTICE '% succeeded', b.call;
		EXCEPTION WHEN OTHERS THEN
			GET STACKED DIAGNOSTICS e_state = RETURNED_SQLSTATE, e_message = MESSAGE_TEXT;
			RAISE WARNING '%: % %', b.call, e_state, e_message;
		END;
	END LOOP;
END $$;
SELECT count(*) AS tenants, (SELECT count(*) FROM outbox) AS announced FROM tenants;
SELECT assign_plan_batch('{}', 'pro') AS none;

-- One call does what one assign_plan per tenant does ------------------------------

-- 'ob-old' and 'ol-old' are on plan pro with usage in their current period;
-- the others are new.  The batch's tenants start with 'ob-', the loop's
-- with 'ol-'.  The move to daily periods anchored two hours ago recounts
-- the old ones' usage of the new period.
SELECT assign_plan_batch(ARRAY['ob-old', 'ol-old'], 'pro', now() - interval '3 days');
SELECT track('ob-old', 'api_calls', 5, now() - interval '1 day'),
       track('ob-old', 'api_calls', 7, now() - interval '1 minute'),
       track('ol-old', 'api_calls', 5, now() - interval '1 day'),
       track('ol-old', 'api_calls', 7, now() - interval '1 minute');
-- one anchor for both: two statements' now() can fall in different minutes
CREATE TEMP TABLE daily_anchor AS SELECT now() - interval '2 hours' AS anchor;
SELECT assign_plan_batch(ARRAY['ob-3', 'ob-old', 'ob-1', 'ob-2'], 'daily', (SELECT anchor FROM daily_anchor));
SELECT assign_plan(t, 'daily', (SELECT anchor FROM daily_anchor)) FROM unnest(ARRAY['ol-3', 'ol-old', 'ol-1', 'ol-2']) t;

-- the same rows, plans, periods and usage
SELECT substr(t.tenant, 4) AS tenant, t.plan, t.timezone,
       t.anchor = l.anchor AS same_anchor,
       (SELECT used FROM flagmeter.check(t.tenant, 'api_calls')) AS used,
       (SELECT used FROM flagmeter.check(l.tenant, 'api_calls')) AS used_by_loop
FROM tenants t JOIN tenants l ON l.tenant = 'ol-' || substr(t.tenant, 4)
WHERE t.tenant LIKE 'ob-%' ORDER BY 1;

-- the same announcements: a plan_changed per tenant and a limit_changed per
-- tenant and limited meter whose limit changed
SELECT o.kind, substr(o.tenant, 4) AS tenant, o.meter, o.plan, o.quota, o.period,
       count(*) FILTER (WHERE o.tenant LIKE 'ob-%') AS batch,
       count(*) FILTER (WHERE o.tenant LIKE 'ol-%') AS loop
FROM outbox o WHERE o.tenant LIKE 'ob-%' OR o.tenant LIKE 'ol-%'
GROUP BY 1, 2, 3, 4, 5, 6 ORDER BY 2, 1, 3, 4;

-- a tenant's plan_changed comes before its limit_changed
SELECT bool_and(p.version < l.version) AS plan_changed_first
FROM outbox p JOIN outbox l ON l.tenant = p.tenant AND l.kind = 'limit_changed'
  AND l.plan = p.plan
WHERE p.kind = 'plan_changed' AND p.tenant LIKE 'ob-%';

-- a NULL anchor keeps an assigned tenant's, as assign_plan does; a new
-- tenant's is now()
CREATE TEMP TABLE anchor_before AS SELECT anchor FROM tenants WHERE tenant = 'ob-1';
SELECT assign_plan_batch(ARRAY['ob-1', 'ob-9'], 'pro', NULL, 'Europe/Berlin');
SELECT tenant, plan, timezone,
       anchor = (SELECT anchor FROM anchor_before) AS kept_anchor,
       anchor > now() - interval '1 minute' AS anchor_now
FROM tenants WHERE tenant IN ('ob-1', 'ob-9') ORDER BY 1;

-- more than a chunk (1 000 tenants) in one call
SELECT assign_plan_batch(array_agg('oc-' || i), 'pro') FROM generate_series(1, 2500) i;
SELECT count(*) AS assigned, count(DISTINCT plan) AS plans FROM tenants WHERE tenant LIKE 'oc-%';
SELECT count(*) AS plan_changed FROM outbox WHERE kind = 'plan_changed' AND tenant LIKE 'oc-%';

-- A catalog call reads no events of the history ----------------------------------

-- 20 000 events of 200 other tenants, folded by maintain(), then new
-- tenants assigned one by one (past the five custom plans a PL/pgSQL
-- statement starts with) and by the batch: not one event row or index
-- entry may be read, so the calls cost the same with 10 or 10 000 000
-- events.  (Once, has_pending_events() read the events with a generic plan
-- that could not use an index: two sequential scans of the history per
-- assign_plan.)  Scans are not counted: once the empty partitions of the
-- coming days have statistics, the planner may scan them rather than probe
-- their indexes, and that reads nothing.
SELECT assign_plan_batch(array_agg('oh-' || i), 'pro') FROM generate_series(0, 199) i;
SELECT sum(track_batch(ts, ms, am)) AS tracked FROM (
	SELECT array_agg('oh-' || (i % 200)) ts, array_agg('api_calls'::text) ms, array_agg(1::bigint) am
	FROM generate_series(1, 20000) i GROUP BY i / 1000) s;
-- maintain() folds the events of transactions older than the oldest one
-- running in the cluster, so any transaction elsewhere (an autovacuum
-- ANALYZE writing its statistics, say) can leave this history pending for
-- a moment, and a tenant's pending events are found by an index probe
-- (current_period_has_usage): fold until nothing is pending, since the
-- claim is about a folded history.
DO $$
BEGIN
	FOR attempt IN 1..300 LOOP
		PERFORM flagmeter.maintain();
		COMMIT;
		EXIT WHEN NOT flagmeter.has_pending_events(NULL, 'api_calls');
		PERFORM pg_sleep(0.1);
	END LOOP;
END $$;
SELECT has_pending_events(NULL, 'api_calls') AS pending_after_maintain;
-- the statistics of what came before, sent when this statement ends
SELECT pg_stat_force_next_flush();

CREATE TEMP TABLE events_read_before AS
SELECT sum(COALESCE(seq_tup_read, 0) + COALESCE(idx_tup_fetch, 0)) AS tuples
FROM pg_stat_user_tables WHERE schemaname = 'flagmeter' AND relname LIKE 'events%';
CREATE TEMP TABLE index_read_before AS
SELECT sum(idx_tup_read) AS entries FROM pg_stat_user_indexes
WHERE schemaname = 'flagmeter' AND relname LIKE 'events%';

SELECT count(assign_plan('on-' || i, 'pro')) AS assigned FROM generate_series(1, 20) i;
SELECT assign_plan_batch(array_agg('om-' || i), 'daily') FROM generate_series(1, 20) i;
SELECT set_limit('pro', 'api_calls', 2000, 'month', 'hard', '{50,100}');

-- the statistics of the calls, sent when this statement ends
SELECT pg_stat_force_next_flush();
SELECT s.tuples - b.tuples AS event_rows_read, i.entries - ib.entries AS index_entries_read
FROM (SELECT sum(COALESCE(seq_tup_read, 0) + COALESCE(idx_tup_fetch, 0)) AS tuples
      FROM pg_stat_user_tables WHERE schemaname = 'flagmeter' AND relname LIKE 'events%') s,
     (SELECT sum(idx_tup_read) AS entries FROM pg_stat_user_indexes
      WHERE schemaname = 'flagmeter' AND relname LIKE 'events%') i,
     events_read_before b, index_read_before ib;
