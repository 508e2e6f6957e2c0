-- Distinct counts (issue 38): meters of aggregation 'unique', whose usage in
-- a period is the number of distinct values recorded in it: track_value,
-- consume_value and forget_value, their errors, and the rest of flagmeter
-- (check, usage, thresholds, blocks, the outbox, usage_series, recounts,
-- retention) on such meters.  A property test at the end compares random
-- streams with count(DISTINCT ...) of the raw input.
SET search_path = flagmeter, public;
-- day buckets and periods are UTC days here, as the sightings' days are
SET TimeZone = 'UTC';
SELECT configure(unassigned_tenants => 'unlimited') IS NOT NULL AS configured;

SELECT define_meter('uv_mau', aggregation => 'unique', unit => 'users');
SELECT define_meter('uv_seats', 'unique');
SELECT define_meter('uv_calls');
SELECT define_plan('uv_team');
SELECT set_limit('uv_team', 'uv_mau', 4, 'month', thresholds => '{50,100}');
SELECT set_limit('uv_team', 'uv_seats', 3, 'lifetime');
SELECT assign_plan('uv-acme', 'uv_team');
SELECT meter, aggregation, unit FROM meters WHERE meter LIKE 'uv\_%' ORDER BY meter;

-- track_value: true when new in its period, once per value ------------------------------------
SELECT track_value('uv-acme', 'uv_mau', 'alice') AS new,
       track_value('uv-acme', 'uv_mau', 'alice') AS again,
       track_value('uv-acme', 'uv_mau', 'bob') AS other;
SELECT used(usage('uv-acme', 'uv_mau')) AS mau;
-- values are compared byte for byte: case and spaces make another value
SELECT track_value('uv-acme', 'uv_mau', 'Alice') AS upper_case, track_value('uv-acme', 'uv_mau', 'alice ') AS space;
SELECT used(usage('uv-acme', 'uv_mau')) AS mau;
-- track_value is never refused: past the quota of 4 it counts on
SELECT track_value('uv-acme', 'uv_mau', 'carol') AS over_quota;
SELECT granted, used, quota, remaining, overage, reason FROM "check"('uv-acme', 'uv_mau', 1);
SELECT tenant, meter, used, quota FROM status WHERE tenant = 'uv-acme' AND meter = 'uv_mau';
-- the set holds hashes, 16 bytes each, never the values
SELECT count(*) AS rows, count(DISTINCT value_hash) AS hashes,
       bool_and(period_end > period_start) AS bounded
FROM unique_values WHERE tenant = 'uv-acme' AND meter = 'uv_mau';
-- a value of an earlier period counts in that period, not in this one
SELECT track_value('uv-acme', 'uv_mau', 'dave', now() - interval '33 days') AS last_month;
SELECT used(usage('uv-acme', 'uv_mau', now() - interval '33 days')) AS then_used,
       used(usage('uv-acme', 'uv_mau')) AS now_used;

-- consume_value: the 4th seat is refused, the 3 counted keep working ---------------------------
SELECT granted, used, quota, remaining, reason FROM consume_value('uv-acme', 'uv_seats', 'ann');
SELECT granted, used, quota, remaining, reason FROM consume_value('uv-acme', 'uv_seats', 'ben');
SELECT granted, used, quota, remaining, reason FROM consume_value('uv-acme', 'uv_seats', 'cid');
SELECT granted, used, quota, remaining, reason, retry_after FROM consume_value('uv-acme', 'uv_seats', 'dan');
SELECT granted, used, quota, remaining, reason FROM consume_value('uv-acme', 'uv_seats', 'ann');
-- the refused value left nothing behind: no set row, no event, no sighting
SELECT count(*) AS seats FROM unique_values WHERE tenant = 'uv-acme' AND meter = 'uv_seats';
SELECT count(*) AS events FROM events WHERE tenant = 'uv-acme' AND meter = 'uv_seats';
SELECT count(*) AS sightings FROM value_sightings WHERE tenant = 'uv-acme' AND meter = 'uv_seats';
-- forget_value frees a seat: true once, then false
SELECT forget_value('uv-acme', 'uv_seats', 'ben') AS freed, forget_value('uv-acme', 'uv_seats', 'ben') AS again,
       forget_value('uv-acme', 'uv_seats', 'nobody') AS unknown;
SELECT used(usage('uv-acme', 'uv_seats')) AS seats;
SELECT granted, used, remaining FROM consume_value('uv-acme', 'uv_seats', 'dan');
-- a forgotten value can come back, and is counted again
SELECT forget_value('uv-acme', 'uv_seats', 'dan') AS freed;
SELECT granted, used FROM consume_value('uv-acme', 'uv_seats', 'dan');
SELECT used(usage('uv-acme', 'uv_seats')) AS seats;
-- soft limits grant past the quota and report the overage
SELECT assign_plan('uv-soft', 'uv_team');
SELECT override_limit('uv-soft', 'uv_seats', 1, mode => 'soft');
SELECT granted, used, quota, overage, reason FROM consume_value('uv-soft', 'uv_seats', 'a');
SELECT granted, used, quota, overage, reason FROM consume_value('uv-soft', 'uv_seats', 'b');
-- an unlimited tenant is granted every value
SELECT granted, used, quota FROM consume_value('uv-free', 'uv_seats', 'x');

-- what was announced: thresholds at 50 % and 100 %, blocked at the hard quota,
-- unblocked when a seat was freed
SELECT kind, meter, used, quota, threshold FROM outbox
WHERE tenant = 'uv-acme' AND kind <> 'limit_changed' AND kind <> 'plan_changed' ORDER BY version;
SELECT tenant, meter FROM blocked WHERE tenant = 'uv-acme' ORDER BY meter;

-- the entitlements view reads unique meters as any other
SELECT name, used, quota, remaining, state FROM entitlements WHERE tenant = 'uv-acme' AND kind = 'meter' AND name LIKE 'uv\_%' ORDER BY name;

-- a quota lowered below the count: the seats counted keep working, a new one is refused
SELECT override_limit('uv-acme', 'uv_seats', 1);
SELECT granted, used, quota, reason FROM consume_value('uv-acme', 'uv_seats', 'ann');
SELECT granted, used, quota, reason FROM consume_value('uv-acme', 'uv_seats', 'eve');
SELECT drop_override('uv-acme', 'uv_seats');
-- several calls in one statement see each other's values
SELECT v, (consume_value('uv-multi', 'uv_seats', v)).used
FROM (VALUES (1, 'a'), (2, 'b'), (3, 'a')) s(n, v) ORDER BY n;

-- Errors: specific SQLSTATEs, nothing written -------------------------------------------------
\set VERBOSITY sqlstate
SELECT track_value('uv-acme', 'uv_mau', NULL);
SELECT track_value('uv-acme', 'uv_mau', '');
SELECT track_value('uv-acme', 'uv_mau', repeat('x', 1025));
SELECT track_value('uv-acme', 'uv_calls', 'x');
SELECT consume_value('uv-acme', 'uv_calls', 'x');
SELECT forget_value('uv-acme', 'uv_calls', 'x');
SELECT track_value('uv-acme', 'uv_nope', 'x');
SELECT track_value(NULL, 'uv_mau', 'x');
SELECT track_value('uv-acme', NULL, 'x');
SELECT track_value('uv-acme', 'uv_mau', 'x', NULL);
SELECT track_value('uv-acme', 'uv_mau', 'x', now() - interval '400 days');
SELECT track('uv-acme', 'uv_mau', 1);
SELECT consume('uv-acme', 'uv_mau', 1);
SELECT consume('uv-acme', ARRAY['uv_mau'], ARRAY[1]);
SELECT track_batch(ARRAY['uv-acme'], ARRAY['uv_mau'], ARRAY[1]);
SELECT consume_batch(ARRAY['uv-acme'], ARRAY['uv_mau'], ARRAY[1]);
SELECT reserve('uv-acme', 'uv_seats', 1);
SELECT grant_credits('uv-acme', 'uv_seats', 10);
SELECT define_meter('uv_pool_drawer', 'unique', draws => 'uv_calls');
SELECT define_meter('uv_bad', 'distinct');
\set VERBOSITY default
SELECT track_value('uv-acme', 'uv_calls', 'x');
SELECT track('uv-acme', 'uv_mau', 1);
-- a 1024-byte value is fine
SELECT track_value('uv-acme', 'uv_mau', repeat('x', 1024)) AS longest;
-- none of the failed calls wrote anything
SELECT count(*) AS rows FROM unique_values WHERE tenant = 'uv-acme' AND meter = 'uv_mau';
SELECT count(*) AS calls_events FROM events WHERE tenant = 'uv-acme' AND meter = 'uv_calls';
-- an aggregation with values cannot change: the meter has usage
SELECT define_meter('uv_mau', 'sum');

-- usage_series: distinct values per UTC day, week and month --------------------------------------
-- (lifetime periods: a month's end between the days below changes nothing)
SELECT define_plan('uv_life');
SELECT set_limit('uv_life', 'uv_mau', 1000, 'lifetime');
SELECT assign_plan(t, 'uv_life', '2020-01-01 00:00+00', 'UTC') FROM (VALUES ('uv-series'), ('uv-series2'), ('uv-move')) s(t);
SELECT track_value('uv-series', 'uv_mau', v, date_trunc('day', now()) - d * interval '1 day' + interval '1 hour')
FROM (VALUES ('a', 1), ('b', 1), ('a', 2), ('a', 3), ('b', 3), ('c', 3)) AS s(v, d)
ORDER BY d DESC, v;
SELECT bucket_start = date_trunc('day', now()) - interval '3 days' AS three_days_ago, used,
       used = events(counter) AND max_amount(counter) = 1 AS counter_agrees
FROM usage_series('uv-series', 'uv_mau', date_trunc('day', now()) - interval '3 days',
                  date_trunc('day', now()) - interval '1 day' + interval '1 second', 'day')
ORDER BY bucket_start;
-- over the three days, a, b and c: three distinct values, not six sightings
SELECT sum(used) AS daily_sum,
       (SELECT count(DISTINCT value_hash) FROM value_sightings WHERE tenant = 'uv-series') AS distinct_values
FROM usage_series('uv-series', 'uv_mau', date_trunc('day', now()) - interval '3 days', now(), 'day');
-- usage_series_all counts a value once per tenant
SELECT track_value('uv-series2', 'uv_mau', 'a', date_trunc('day', now()) - interval '3 days' + interval '2 hours');
SELECT used FROM usage_series_all('uv_mau', date_trunc('day', now()) - interval '3 days',
                                  date_trunc('day', now()) - interval '2 days', 'day');
-- finer buckets, other zones and buckets before the retention are refused
\set VERBOSITY sqlstate
SELECT * FROM usage_series('uv-series', 'uv_mau', now() - interval '1 day', now(), 'hour');
SELECT * FROM usage_series('uv-series', 'uv_mau', now() - interval '1 day', now(), 'day', 'Europe/Paris');
SELECT * FROM usage_series('uv-series', 'uv_mau', now() - interval '200 days', now(), 'month');
\set VERBOSITY default
SELECT * FROM usage_series('uv-series', 'uv_mau', now() - interval '1 day', now(), 'minute');

-- maintain(): the rollups take the values' events in, and a forget out -------------------------
SELECT events_folded >= 0 AS folded FROM maintain();
SELECT used(usage('uv-acme', 'uv_seats')) AS seats_after_maintain;
SELECT forget_value('uv-acme', 'uv_seats', 'cid') AS freed_after_fold;
SELECT used(usage('uv-acme', 'uv_seats')) AS seats;
SELECT voids_folded > 0 AS void_folded FROM maintain();
SELECT used(merge_agg(counter)) AS rollup_seats FROM rollup_hour WHERE tenant = 'uv-acme' AND meter = 'uv_seats';

-- A plan change that moves the period: the set of the new period is rebuilt --------------------
SELECT define_plan('uv_daily');
SELECT set_limit('uv_daily', 'uv_mau', 100, 'day');
SELECT track_value('uv-move', 'uv_mau', v, date_trunc('day', now()) - interval '1 day') FROM (VALUES ('old1'), ('old2')) s(v);
SELECT track_value('uv-move', 'uv_mau', v) FROM (VALUES ('new1'), ('new2'), ('new3')) s(v);
SELECT used(usage('uv-move', 'uv_mau')) AS lifetime;
SELECT assign_plan('uv-move', 'uv_daily', '2020-01-01 00:00+00', 'UTC');
SELECT used(usage('uv-move', 'uv_mau')) AS today, quota(usage('uv-move', 'uv_mau'));
-- old1 was first counted yesterday: seen today, it counts today
SELECT track_value('uv-move', 'uv_mau', 'old1') AS recounted, track_value('uv-move', 'uv_mau', 'new1') AS known;
SELECT used(usage('uv-move', 'uv_mau')) AS today;
-- and back: the values move back into the lifetime set, and one forgotten
-- meanwhile stays forgotten (old1 is there from yesterday already)
SELECT forget_value('uv-move', 'uv_mau', 'new2') AS forgotten;
SELECT assign_plan('uv-move', 'uv_life', '2020-01-01 00:00+00', 'UTC');
SELECT used(usage('uv-move', 'uv_mau')) AS lifetime_again,
       (SELECT count(*) FROM unique_values WHERE tenant = 'uv-move') AS set_rows,
       (SELECT count(*) FROM unique_values WHERE tenant = 'uv-move' AND period_end <> 'infinity') AS old_bounds;

-- Retention: sets of periods that ended before it and sightings older than it go ----------------
INSERT INTO unique_values VALUES
	('uv-old', 'uv_mau', '2020-01-01', gen_random_uuid(), '2020-01-02', '2020-02-01'),
	('uv-old', 'uv_seats', '-infinity', gen_random_uuid(), '2020-01-02', 'infinity');
INSERT INTO value_sightings VALUES ('uv-old', 'uv_mau', '2020-01-02', '2020-01-01', gen_random_uuid());
SELECT count(*) FILTER (WHERE true) AS before FROM unique_values WHERE tenant = 'uv-old';
SELECT partitions_dropped >= 0 AS ran FROM maintain();
SELECT meter, period_end FROM unique_values WHERE tenant = 'uv-old';
SELECT count(*) AS old_sightings FROM value_sightings WHERE tenant = 'uv-old';

-- delete_usage and drop_meter take the values with them ----------------------------------------
SELECT delete_usage('uv-series2', NULL);
SELECT count(*) AS left_values FROM unique_values WHERE tenant = 'uv-series2';
SELECT count(*) AS left_sightings FROM value_sightings WHERE tenant = 'uv-series2';

-- Property: random streams against count(DISTINCT ...) of the raw input -------------------------
-- 2 000 values drawn from 300, over 4 tenants and 20 days (day periods), some
-- forgotten in the current period; every period's usage must equal the
-- distinct values of the input in it, less the forgotten ones.
SELECT define_meter('uv_prop', 'unique');
SELECT define_plan('uv_prop_plan');
SELECT set_limit('uv_prop_plan', 'uv_prop', 1000000, 'day');
SELECT assign_plan('uv-p' || t, 'uv_prop_plan', '2020-01-01 00:00+00', 'UTC') FROM generate_series(1, 4) t;
SELECT setseed(0.38);
-- 1 800 events on the 20 days before today, 200 now: the same stream
-- whatever the time of day the test runs at
CREATE TEMP TABLE uv_input AS
SELECT 'uv-p' || (1 + floor(random() * 4))::int AS tenant,
       'v' || floor(random() * 300)::int AS value,
       CASE WHEN g <= 1800
            THEN date_trunc('day', now()) - (1 + floor(random() * 20)::int) * interval '1 day'
                 + floor(random() * 86400)::int * interval '1 second'
            ELSE now() END AS at
FROM generate_series(1, 2000) g;
SELECT count(*) FILTER (WHERE track_value(tenant, 'uv_prop', value, at)) AS new_values FROM uv_input;
CREATE TEMP TABLE uv_forgotten AS
SELECT DISTINCT tenant, value FROM uv_input
WHERE at >= date_trunc('day', now()) AND random() < 0.3;
SELECT count(*) FILTER (WHERE forget_value(tenant, 'uv_prop', value)) = count(*) AS all_forgotten FROM uv_forgotten;
WITH expected AS (
	SELECT i.tenant, date_trunc('day', i.at) AS day, count(DISTINCT i.value) AS n
	FROM uv_input i
	WHERE NOT (i.at >= date_trunc('day', now())
	           AND EXISTS (SELECT FROM uv_forgotten f WHERE f.tenant = i.tenant AND f.value = i.value))
	GROUP BY 1, 2
), counted AS (
	SELECT e.tenant, e.day, e.n, used(usage(e.tenant, 'uv_prop', e.day + interval '12 hours')) AS used
	FROM expected e
)
SELECT count(*) AS periods, count(*) FILTER (WHERE n = used) AS equal,
       sum(n) = (SELECT sum(used) FROM counted) AS totals_equal
FROM counted;
-- the first count(DISTINCT) in the input equals the number of true answers
SELECT (SELECT count(*) FROM (SELECT DISTINCT tenant, value, date_trunc('day', at) FROM uv_input) d)
       = (SELECT count(*) FROM unique_values WHERE meter = 'uv_prop')
         + (SELECT count(*) FROM uv_forgotten) AS sets_match;
-- and usage_series of each tenant agrees, day by day
WITH expected AS (
	SELECT tenant, date_trunc('day', at) AS day, count(DISTINCT value) AS n
	FROM uv_input GROUP BY 1, 2
)
SELECT count(*) FILTER (WHERE e.n = s.used) = count(*) AS series_equal
FROM expected e,
     LATERAL usage_series(e.tenant, 'uv_prop', e.day, e.day + interval '1 day', 'day') s;
