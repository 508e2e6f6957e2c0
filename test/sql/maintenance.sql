-- maintain(): folding into rollups, late events, voids, partitions,
-- retention, compaction; the dashboard functions; scheduling.
SET client_min_messages = warning;
DROP EXTENSION flagmeter CASCADE;
CREATE EXTENSION flagmeter;
RESET client_min_messages;
SET search_path = flagmeter, public;
-- this file tracks events at fixed dates, outside the window of event
-- times a new database accepts (QT002): it accepts any time
SELECT flagmeter.configure(late_events => '100 years', future_events => '100 years') \gset
SET TimeZone = 'UTC';
\set SHOW_CONTEXT never
-- The rows maintain() merges and compacts are the stripes a track writes;
-- the fold of usage pending in shared memory is tested in pending.sql.
SET flagmeter.one_write_track = off;

SELECT define_meter('api_calls'), define_meter('seats', 'max'),
       define_plan('free'), set_limit('free', 'api_calls', 100, 'month', 'hard', '{50,80,100}'),
       assign_plan('acme', 'free', '2026-01-01 00:00:00+00', 'UTC'),
       assign_plan('globex', 'free', '2026-01-01 00:00:00+00', 'UTC'),
       assign_plan('initech', 'free', '2026-01-01 00:00:00+00', 'UTC');

-- Nothing to do: cheap and idempotent
SELECT events_folded, voids_folded, partitions_dropped, keys_expired, periods_compacted FROM maintain();
SELECT events_folded, voids_folded, partitions_created, partitions_dropped FROM maintain();

-- Events in March 2026 (hours 10 and 11 of two days), one of them keyed
SELECT track('acme', 'api_calls', 1, '2026-03-01 10:15:00+00'),
       track('acme', 'api_calls', 2, '2026-03-01 10:45:00+00'),
       track('acme', 'api_calls', 4, '2026-03-01 11:00:00+00'),
       track('acme', 'api_calls', 8, '2026-03-03 23:59:59+00', 'late-key');
SELECT pending_events, pending_voids FROM stats;
SELECT events_folded, voids_folded FROM maintain();
SELECT pending_events, total_folded, runs FROM stats;
SELECT tenant, meter, bucket_start, counter FROM rollup_hour ORDER BY bucket_start;
SELECT tenant, meter, bucket_start, counter FROM rollup_day ORDER BY bucket_start;

-- A late event lands in its closed bucket; a void takes an event back out
SELECT track('acme', 'api_calls', 16, '2026-03-01 10:59:59+00');
SELECT void('acme', 'late-key');
-- before folding, the series already includes both (exact)
SELECT bucket_start, used FROM usage_series('acme', 'api_calls', '2026-03-01', '2026-03-04', 'day');
SELECT events_folded, voids_folded FROM maintain();
SELECT bucket_start, used FROM usage_series('acme', 'api_calls', '2026-03-01', '2026-03-04', 'day');
SELECT bucket_start, counter FROM rollup_hour WHERE bucket_start = '2026-03-01 10:00:00+00';

-- Hour buckets with gaps, month buckets, and a time zone
SELECT bucket_start, used FROM usage_series('acme', 'api_calls', '2026-03-01 09:00:00+00', '2026-03-01 13:00:00+00', 'hour');
SELECT bucket_start, used FROM usage_series('acme', 'api_calls', '2026-01-15', '2026-05-01', 'month');
SELECT bucket_start, used FROM usage_series('acme', 'api_calls', '2026-03-01', '2026-03-03', 'day', 'America/Los_Angeles');
-- bucket starts follow DST in the series' time zone (2026-03-08 in Los Angeles)
SELECT bucket_start, used FROM usage_series('acme', 'api_calls', '2026-03-07 08:00:00+00', '2026-03-10 07:00:00+00', 'day', 'America/Los_Angeles');
SELECT count(*) AS empty_series FROM usage_series('acme', 'api_calls', '2026-03-02', '2026-03-01');
-- week buckets start on Monday, in the series' time zone
SELECT bucket_start, used FROM usage_series('acme', 'api_calls', '2026-02-25', '2026-03-12', 'week');
SELECT bucket_start, used FROM usage_series('acme', 'api_calls', '2026-02-25', '2026-03-12', 'week', 'America/Los_Angeles');
SELECT usage_series('acme', 'api_calls', '2026-03-01', '2026-03-02', 'fortnight');
SELECT usage_series('acme', 'api_calls', '2026-03-01', '2026-03-02', 'day', 'Nowhere/Land');
SELECT usage_series('acme', 'nope', '2026-03-01', '2026-03-02');
SELECT usage_series('acme', 'api_calls', '-infinity', '2026-03-02');
SELECT usage_series('acme', 'api_calls', '2000-01-01', '2026-03-02');

-- Folded totals equal the raw events (voided ones excluded)
-- (max and latest keep describing what was recorded, voided events included)
SELECT used(r) AS rolled_up_used, events(r) AS rolled_up_events, used(e) AS raw_used, events(e) AS raw_events
FROM (SELECT merge_agg(counter) FROM rollup_day WHERE tenant = 'acme') AS x(r),
     (SELECT quota_counter_agg(amount, occurred_at) FROM events
      WHERE tenant = 'acme' AND idempotency_key IS DISTINCT FROM 'late-key') AS y(e);

-- Status, states and top tenants (current period: usage tracked now)
SELECT track('acme', 'api_calls', 40), track('globex', 'api_calls', 85), track('initech', 'api_calls', 120);
SELECT tenant, meter, used, quota, remaining, round(ratio::numeric, 2) AS ratio, state,
       period_start = date_trunc('month', now(), 'UTC') AS current_period
FROM status ORDER BY tenant;
SELECT tenant, used FROM top_tenants('api_calls', 2);
SELECT tenant, round(ratio::numeric, 2) AS ratio FROM top_tenants('api_calls', 3, 'ratio');
SELECT top_tenants('api_calls', 0);
SELECT top_tenants('api_calls', 3, 'loudest');
SELECT top_tenants('nope');

-- Partitions: maintain() creates the coming days' partitions
SELECT events_folded FROM maintain();
SELECT count(*) >= 3 AS has_upcoming_partitions
FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
WHERE i.inhparent = 'flagmeter.events'::regclass
  AND c.relname > 'events_p' || to_char(now() AT TIME ZONE 'UTC', 'YYYYMMDD');

-- Retention: an old partition goes once its events are folded; old keys go
CREATE TABLE flagmeter.events_p20200101 PARTITION OF flagmeter.events
	FOR VALUES FROM ('2020-01-01 00:00:00+00') TO ('2020-01-02 00:00:00+00');
INSERT INTO flagmeter.events (tenant, meter, amount, occurred_at, recorded_at)
VALUES ('acme', 'api_calls', 1000, '2020-01-01 12:00:00+00', '2020-01-01 12:00:00+00');
INSERT INTO flagmeter.event_keys (tenant, idempotency_key, seq, meter, amount, occurred_at,
	period_start, recorded_at, kind, granted)
VALUES ('acme', 'ancient', 0, 'api_calls', 1000, '2020-01-01 12:00:00+00',
	'2020-01-01 00:00:00+00', '2020-01-01 12:00:00+00', 'track', true);
SELECT events_folded, partitions_dropped, keys_expired FROM maintain();
SELECT to_regclass('flagmeter.events_p20200101') AS old_partition;
SELECT bucket_start, counter FROM rollup_day WHERE bucket_start = '2020-01-01';
SELECT count(*) AS ancient_keys FROM event_keys WHERE idempotency_key = 'ancient';
SELECT * FROM configure(retention => '0 days');
SELECT * FROM configure(partitions_ahead => 0);
SELECT * FROM configure(retention => '30 days');
SELECT * FROM configure(partitions_ahead => 5);
SELECT * FROM current_settings;
SELECT * FROM configure(retention => '90 days', partitions_ahead => 3);

-- Compaction: stripes of an ended period merge into one row
SET flagmeter.stripes = 4;
SELECT track('globex', 'api_calls', 1, '2026-02-10 00:00:00+00');
SELECT count(*) AS rows_before, merge_agg(counter) AS before
FROM counters WHERE tenant = 'globex' AND period_start = '2026-02-01';
INSERT INTO counters VALUES ('globex', 'api_calls', '2026-02-01', 0, 'used=5 events=1 max=5 latest=5@2026-02-11T00:00:00Z');
SELECT periods_compacted FROM maintain();
SELECT stripe, counter FROM counters WHERE tenant = 'globex' AND period_start = '2026-02-01';
RESET flagmeter.stripes;
-- a lone track stripe of an ended period moves to stripe 0, out of the
-- index of rows maintain() may still merge
SELECT track('globex', 'api_calls', 3, '2026-01-10 00:00:00+00');
SELECT stripe FROM counters WHERE tenant = 'globex' AND period_start = '2026-01-01';
SELECT periods_compacted FROM maintain();
-- Open periods never stand in the way of ended ones: 10 000 of them, two
-- stripes each, sort before an ended period, and a run's 10 000 periods
-- are chosen among the ended ones.
INSERT INTO counters (tenant, meter, period_start, stripe, counter)
SELECT 'open-' || lpad(i::text, 5, '0'), 'api_calls', date_trunc('month', now(), 'UTC'), s,
       'used=1 events=1 max=1 latest=1@2026-01-01T00:00:00Z'
FROM generate_series(1, 10000) i, generate_series(1, 2) s;
INSERT INTO counters (tenant, meter, period_start, stripe, counter)
VALUES ('zz-ended', 'api_calls', '2026-01-01', 1, 'used=2 events=1 max=2 latest=2@2026-01-05T00:00:00Z'),
       ('zz-ended', 'api_calls', '2026-01-01', 2, 'used=3 events=1 max=3 latest=3@2026-01-06T00:00:00Z');
SELECT compact_counters();
SELECT stripe, used(counter) FROM counters WHERE tenant = 'zz-ended';
SELECT count(*) AS open_rows_left FROM counters WHERE tenant LIKE 'open-%';
DELETE FROM counters WHERE tenant LIKE 'open-%' OR tenant = 'zz-ended';
SELECT stripe, used(counter), events(counter) FROM counters
WHERE tenant = 'globex' AND period_start = '2026-01-01';
SELECT periods_compacted FROM maintain();

-- Merging idle stripes: the track stripes of a period, open or ended,
-- last written before the previous maintain() run and held by no
-- transaction, merge into the period's merged stripe 32767; stripe 0
-- stays.  A lifetime limit keeps hooli's period open whatever day this
-- runs; shared stripe 2 and own stripe 40 stand for other sessions'.
SELECT define_plan('forever'), set_limit('forever', 'api_calls', 1000, 'lifetime'),
       assign_plan('hooli', 'forever');
SELECT track('hooli', 'api_calls', 2);
INSERT INTO counters (tenant, meter, period_start, stripe, counter)
SELECT c.tenant, c.meter, c.period_start, s.stripe, c.counter
FROM counters c, (VALUES (2), (40)) s(stripe)
WHERE c.tenant = 'hooli' AND c.stripe = 1;
INSERT INTO counters
SELECT tenant, meter, period_start, 0, 'used=5 events=1 max=5 latest=5@2026-03-06T00:00:00Z'
FROM counters WHERE tenant = 'hooli' AND stripe = 1;
SELECT used, remaining FROM flagmeter.check('hooli', 'api_calls');
-- written after the previous run: left alone
SELECT periods_compacted FROM maintain();
SELECT stripe, used(counter), events(counter) FROM counters WHERE tenant = 'hooli' ORDER BY stripe;
-- idle now: merged
SELECT periods_compacted FROM maintain();
SELECT stripe, used(counter), events(counter), recheck_at FROM counters WHERE tenant = 'hooli' ORDER BY stripe;
SELECT used, remaining FROM flagmeter.check('hooli', 'api_calls');
-- a new stripe joins the merged one once idle; an idle merged row alone stays
SELECT track('hooli', 'api_calls', 1);
SELECT periods_compacted FROM maintain();
SELECT periods_compacted FROM maintain();
SELECT stripe, used(counter), events(counter) FROM counters WHERE tenant = 'hooli' ORDER BY stripe;
SELECT periods_compacted FROM maintain();
SELECT used, remaining FROM flagmeter.check('hooli', 'api_calls');
-- a void takes the amount out of the merged stripe
SELECT track('hooli', 'api_calls', 4, idempotency_key => 'hooli-1');
SELECT periods_compacted FROM maintain();
SELECT periods_compacted FROM maintain();
SELECT void('hooli', 'hooli-1');
SELECT stripe, used(counter), events(counter) FROM counters WHERE tenant = 'hooli' ORDER BY stripe;

-- Scheduling needs pg_cron in this database
SELECT schedule();
SELECT unschedule();
