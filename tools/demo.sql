-- tools/demo.sql -- the main job of `make demo`.
--
-- Run by tools/demo.sh with `psql -X -v ON_ERROR_STOP=1` against a fresh
-- database in which `CREATE EXTENSION flagmeter` has been done.  It defines
-- meters, plans and tenants, generates a month of usage with track_batch,
-- makes consume calls (granted, refused at a hard limit, all-or-nothing
-- across meters, retried with an idempotency key), voids an event, and
-- prints a dashboard computed with plain SQL from flagmeter.usage() and
-- flagmeter.effective_limits.
--
-- Usage is spread over each tenant's current billing period up to now(), so
-- the figures are the same on every run; only the dates follow the clock.

\set QUIET on
\pset null '-'
\pset footer off
SET TimeZone = 'UTC';
SET client_min_messages = warning;

-- try(sql): 'ok', or the SQLSTATE and message of the error it raised
CREATE FUNCTION pg_temp.try(sql text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
	EXECUTE sql;
	RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
	RETURN SQLSTATE || ': ' || SQLERRM;
END $$;

\echo
\echo '== 1. Catalog: meters, plans, limits, tenants ======================================'
\echo
\echo 'define_meter(api_calls), define_meter(tokens)'
\echo 'free: 1 000 api_calls/month hard, 50 000 tokens/month soft'
\echo 'pro:  100 000 api_calls/month hard, 5 000 000 tokens/month soft'
\echo 'stark (pro) gets its own api_calls limit with override_limit'
\o /dev/null
SELECT flagmeter.define_meter('api_calls', 'sum', 'call'),
       flagmeter.define_meter('tokens', 'sum', 'token');
SELECT flagmeter.define_plan('free'), flagmeter.define_plan('pro');
SELECT flagmeter.set_limit('free', 'api_calls', 1000),
       flagmeter.set_limit('free', 'tokens', 50000, 'month', 'soft'),
       flagmeter.set_limit('pro', 'api_calls', 100000, 'month', 'hard', '{75,90,100}'),
       flagmeter.set_limit('pro', 'tokens', 5000000, 'month', 'soft');
-- billing anchors and time zones: a month starts at the anchor's local date
-- and time of day, clamped at month ends (Jan 31 -> Feb 28, Mar 31, ...)
SELECT flagmeter.assign_plan('acme', 'free', '2026-01-31 10:00 America/New_York', 'America/New_York'),
       flagmeter.assign_plan('initech', 'free', '2025-06-01 00:00 UTC', 'UTC'),
       flagmeter.assign_plan('globex', 'free', '2026-03-15 09:00 Europe/Berlin', 'Europe/Berlin'),
       flagmeter.assign_plan('hooli', 'pro', '2025-11-30 00:00 America/Los_Angeles', 'America/Los_Angeles'),
       flagmeter.assign_plan('umbrella', 'pro', '2024-02-29 00:00 Asia/Tokyo', 'Asia/Tokyo'),
       flagmeter.assign_plan('stark', 'pro', '2026-07-04 12:00 America/Chicago', 'America/Chicago');
SELECT flagmeter.override_limit('stark', 'api_calls', 250000);
\o

SELECT plan, meter, quota, period, mode, thresholds
FROM flagmeter.limits ORDER BY plan, meter;

\echo 'Each tenant''s current period, on its own clock:'
SELECT t.tenant, t.plan, t.timezone,
       to_char(t.anchor AT TIME ZONE t.timezone, 'YYYY-MM-DD HH24:MI') AS anchor_local,
       to_char(b.period_start AT TIME ZONE t.timezone, 'YYYY-MM-DD HH24:MI') AS period_start_local,
       to_char(b.period_end AT TIME ZONE t.timezone, 'YYYY-MM-DD HH24:MI') AS period_end_local
FROM flagmeter.tenants t
CROSS JOIN LATERAL flagmeter.limit_config(t.tenant, 'api_calls') c
CROSS JOIN LATERAL flagmeter.period_bounds(now(), c.period, c.anchor, c.timezone) b
ORDER BY t.plan, t.tenant;

\echo
\echo '== 2. Ingest: one track_batch call, events spread over each current period =========='
\echo
WITH spec(tenant, meter, n, amount) AS (VALUES
	('acme',     'api_calls',  480,     2), ('acme',     'tokens', 200,   100),
	('initech',  'api_calls',  520,     2), ('initech',  'tokens', 150,   200),
	('globex',   'api_calls',  310,     1), ('globex',   'tokens', 248,   250),
	('hooli',    'api_calls',  700,    30), ('hooli',    'tokens', 300,  5000),
	('umbrella', 'api_calls', 1200,    70), ('umbrella', 'tokens', 400, 10000),
	('stark',    'api_calls',  600,    50), ('stark',    'tokens', 100,  2000)
), ev AS (
	SELECT s.tenant, s.meter, s.amount::bigint AS amount,
	       b.period_start + (now() - b.period_start) * ((g - 0.5) / s.n)::float8 AS occurred_at
	FROM spec s
	CROSS JOIN LATERAL flagmeter.limit_config(s.tenant, s.meter) c
	CROSS JOIN LATERAL flagmeter.period_bounds(now(), c.period, c.anchor, c.timezone) b
	CROSS JOIN LATERAL generate_series(1, s.n) g
)
SELECT flagmeter.track_batch(array_agg(tenant), array_agg(meter), array_agg(amount),
                             array_agg(occurred_at)) AS events_counted
FROM ev;

\echo 'A batch with idempotency keys, sent twice (the retry counts nothing):'
SELECT flagmeter.track_batch(ARRAY['hooli', 'hooli'], ARRAY['api_calls', 'tokens'],
                             ARRAY[3, 1200], NULL, ARRAY['hooli-sync-1', 'hooli-sync-2']) AS first_send,
       flagmeter.track_batch(ARRAY['hooli', 'hooli'], ARRAY['api_calls', 'tokens'],
                             ARRAY[3, 1200], NULL, ARRAY['hooli-sync-1', 'hooli-sync-2']) AS retry;

\echo
\echo '== 3. Enforcement: consume ============================================================'
\echo
\echo 'acme (free, 1 000 api_calls hard) has used:'
SELECT flagmeter.used(flagmeter.usage('acme', 'api_calls')) AS api_calls_used;

\echo 'consume 30 with idempotency key req-7f3a: granted'
SELECT granted, used, quota, remaining, resets_at, overage
FROM flagmeter.consume('acme', 'api_calls', 30, 'req-7f3a');

\echo 'the same request retried (same key): the original decision, nothing recorded'
SELECT granted, used, quota, remaining, resets_at, overage
FROM flagmeter.consume('acme', 'api_calls', 30, 'req-7f3a');

\echo 'check 20 more (records nothing), then consume 20: refused at the hard limit'
SELECT granted, used, quota, remaining FROM flagmeter.check('acme', 'api_calls', 20);
SELECT granted, used, quota, remaining FROM flagmeter.consume('acme', 'api_calls', 20);

\echo 'one request costing 20 api_calls + 800 tokens: all or nothing, so tokens are not'
\echo 'recorded either (tokens is a soft limit and alone would be granted)'
SELECT meter, granted, used, quota, remaining
FROM flagmeter.consume('acme', ARRAY['api_calls', 'tokens'], ARRAY[20, 800]);
SELECT flagmeter.used(flagmeter.usage('acme', 'api_calls')) AS api_calls_used,
       flagmeter.used(flagmeter.usage('acme', 'tokens')) AS tokens_used;

\echo 'the same request for hooli (pro): granted on both meters'
SELECT meter, granted, used, quota, remaining
FROM flagmeter.consume('hooli', ARRAY['api_calls', 'tokens'], ARRAY[20, 800]);

\echo 'globex is past its soft tokens limit: consume is granted and reports the overage'
SELECT granted, used, quota, remaining, overage FROM flagmeter.consume('globex', 'tokens', 1500);

\echo 'initech: track is metering, not enforcement, so tracked usage went past the hard'
\echo 'limit; consume is refused while it is there'
SELECT granted, used, quota, remaining, overage FROM flagmeter.consume('initech', 'api_calls', 1);

\echo
\echo '== 4. Corrections: void ==============================================================='
\echo
\echo 'globex: an import tracked 500 api_calls under key import-42 by mistake'
SELECT flagmeter.track('globex', 'api_calls', 500, now(), 'import-42') AS tracked,
       flagmeter.track('globex', 'api_calls', 500, now(), 'import-42') AS tracked_again;
SELECT flagmeter.used(flagmeter.usage('globex', 'api_calls')) AS api_calls_used;
SELECT flagmeter.void('globex', 'import-42') AS voided,
       flagmeter.void('globex', 'import-42') AS voided_again;
SELECT flagmeter.used(flagmeter.usage('globex', 'api_calls')) AS api_calls_used;
SELECT pg_temp.try($$SELECT flagmeter.void('globex', 'import-43')$$) AS unknown_key;

\echo
\echo '== 5. Dashboard (plain SQL over flagmeter.usage() and flagmeter.effective_limits) ======'
\echo
\echo 'state: ok below the lowest threshold, warning from it, exceeded at 100 %'
SELECT l.tenant, l.plan, l.meter, l.mode,
       flagmeter.used(u) AS used, l.quota, flagmeter.remaining(u) AS remaining,
       to_char(100 * flagmeter.usage_ratio(u), 'FM990.0') || ' %' AS ratio,
       CASE WHEN flagmeter.used(u) >= l.quota THEN 'exceeded'
            WHEN 100 * flagmeter.used(u) >= l.quota::numeric * l.thresholds[1] THEN 'warning'
            ELSE 'ok' END AS state
FROM flagmeter.effective_limits l
CROSS JOIN LATERAL flagmeter.usage(l.tenant, l.meter) u
ORDER BY l.plan, l.tenant, l.meter;

\echo 'The flagmeter.status view gives the same figures:'
SELECT count(*) AS rows, count(*) FILTER (WHERE s.used = flagmeter.used(u) AND s.quota = l.quota
                                               AND s.remaining = flagmeter.remaining(u)) AS agree
FROM flagmeter.effective_limits l
CROSS JOIN LATERAL flagmeter.usage(l.tenant, l.meter) u
JOIN flagmeter.status s ON s.tenant = l.tenant AND s.meter = l.meter;

\echo 'Over quota, hard limits first:'
SELECT l.tenant, l.meter, l.mode, flagmeter.used(u) - l.quota AS over_by
FROM flagmeter.effective_limits l
CROSS JOIN LATERAL flagmeter.usage(l.tenant, l.meter) u
WHERE flagmeter.exceeded(u)
ORDER BY l.mode, l.tenant, l.meter;

\echo
\echo '== 6. The quota_counter type ==========================================================='
\echo
\echo 'usage() returns the counter of the current period, carrying the limit in force:'
SELECT flagmeter.usage('hooli', 'api_calls') AS hooli_api_calls;

\echo 'the same counter aggregated from the raw events with quota_counter_agg:'
SELECT flagmeter.with_limit(flagmeter.quota_counter_agg(e.amount, e.occurred_at), c.quota) AS from_raw_events,
       flagmeter.with_limit(flagmeter.quota_counter_agg(e.amount, e.occurred_at), c.quota)
           OPERATOR(flagmeter.=) flagmeter.usage('hooli', 'api_calls') AS equal
FROM flagmeter.limit_config('hooli', 'api_calls') c
CROSS JOIN LATERAL flagmeter.period_bounds(now(), c.period, c.anchor, c.timezone) b
JOIN flagmeter.events e
  ON e.tenant = 'hooli' AND e.meter = 'api_calls'
 AND e.occurred_at >= b.period_start AND e.occurred_at < b.period_end
GROUP BY c.quota;

\echo 'every tenant and meter: used and events from usage() equal the raw events of the'
\echo 'period (voided events excluded)'
WITH raw AS (
	SELECT t.tenant, m.meter,
	       flagmeter.quota_counter_agg(e.amount, e.occurred_at) AS c
	FROM flagmeter.tenants t
	CROSS JOIN flagmeter.meters m
	CROSS JOIN LATERAL flagmeter.limit_config(t.tenant, m.meter) cfg
	CROSS JOIN LATERAL flagmeter.period_bounds(now(), cfg.period, cfg.anchor, cfg.timezone) b
	LEFT JOIN flagmeter.events e
	       ON e.tenant = t.tenant AND e.meter = m.meter
	      AND e.occurred_at >= b.period_start AND e.occurred_at < b.period_end
	      AND NOT EXISTS (SELECT FROM flagmeter.event_keys k
	                      WHERE k.tenant = e.tenant AND k.idempotency_key = e.idempotency_key
	                        AND k.meter = e.meter AND k.voided_at IS NOT NULL)
	GROUP BY t.tenant, m.meter
)
SELECT count(*) AS tenant_meters,
       count(*) FILTER (WHERE flagmeter.used(r.c) = flagmeter.used(u)
                          AND flagmeter.events(r.c) = flagmeter.events(u)) AS equal,
       sum(flagmeter.events(u)) AS events,
       sum(flagmeter.used(u)) FILTER (WHERE r.meter = 'api_calls') AS api_calls,
       sum(flagmeter.used(u)) FILTER (WHERE r.meter = 'tokens') AS tokens
FROM raw r
CROSS JOIN LATERAL flagmeter.usage(r.tenant, r.meter) u;
