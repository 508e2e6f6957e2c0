-- Catalog: meters, plans, limits, tenants and overrides, with every error.
-- Every test file runs in the same database: start from a fresh extension.
SET client_min_messages = warning;
DROP EXTENSION flagmeter CASCADE;
CREATE EXTENSION flagmeter;
RESET client_min_messages;
SET search_path = flagmeter, public;
-- this file meters tenants never assigned a plan, which a new database
-- refuses (QT001): it turns that off
SELECT flagmeter.configure(unassigned_tenants => 'unlimited') \gset
SET TimeZone = 'UTC';
\set SHOW_CONTEXT never

-- Meters
SELECT define_meter('api_calls');
SELECT define_meter('tokens', 'sum', 'token');
SELECT define_meter('seats', 'max');
SELECT define_meter('storage_gb', 'latest', 'GB');
SELECT define_meter('requests', 'count');
SELECT define_meter('api_calls', 'sum', 'call');		-- redefining changes the unit
SELECT meter, aggregation, unit FROM meters ORDER BY meter;
SELECT define_meter(NULL);
SELECT define_meter('');
SELECT define_meter('has space');
SELECT define_meter('-leading-dash');
SELECT define_meter(repeat('m', 64));
SELECT define_meter(repeat('m', 63));		-- 63 characters are fine
SELECT define_meter('x', 'avg');
SELECT define_meter('x', NULL);
SELECT define_meter('x', 'sum', repeat('u', 64));
-- the table's own checks hold for direct writes too
\set VERBOSITY terse
INSERT INTO meters (meter, aggregation) VALUES ('bad name', 'sum');
INSERT INTO meters (meter, aggregation) VALUES ('y', 'median');
\set VERBOSITY default

-- Plans
SELECT define_plan('free');
SELECT define_plan('pro');
SELECT define_plan('free');		-- again: nothing happens
SELECT plan FROM plans ORDER BY plan;
SELECT define_plan(NULL);
SELECT define_plan('a/b');

-- Limits
SELECT set_limit('free', 'api_calls', 1000);
SELECT set_limit('free', 'tokens', 50000, 'day', 'soft', '{100,50,90}');
SELECT set_limit('pro', 'api_calls', 100000, 'month', 'hard', '{75}');
SELECT plan, meter, quota, period, mode, thresholds FROM limits ORDER BY plan, meter;
SELECT set_limit('nope', 'api_calls', 1);
SELECT set_limit('free', 'nope', 1);
SELECT set_limit('free', NULL, 1);
SELECT set_limit('free', 'api_calls', 0);
SELECT set_limit('free', 'api_calls', -5);
SELECT set_limit('free', 'api_calls', NULL);
SELECT set_limit('free', 'api_calls', 1, 'fortnight');
SELECT set_limit('free', 'api_calls', 1, NULL);
SELECT set_limit('free', 'api_calls', 1, 'month', 'strict');
SELECT set_limit('free', 'api_calls', 1, 'month', 'hard', '{80,80}');
SELECT set_limit('free', 'api_calls', 1, 'month', 'hard', '{0}');
SELECT set_limit('free', 'api_calls', 1, 'month', 'hard', '{80,NULL}');
SELECT set_limit('free', 'api_calls', 1, 'month', 'hard', '{{80},{100}}');
SELECT set_limit('free', 'api_calls', 1, 'month', 'hard', NULL);
-- nothing was written by the failed calls
SELECT plan, meter, quota, period, mode, thresholds FROM limits ORDER BY plan, meter;

-- Tenants
SELECT assign_plan('acme', 'free', '2026-01-31 10:00:00+00', 'Europe/Berlin');
SELECT assign_plan('globex', 'pro');
SELECT tenant, plan, anchor, timezone FROM tenants WHERE tenant = 'acme';
SELECT assign_plan('acme', 'nope');
SELECT assign_plan('acme', NULL);
SELECT assign_plan(NULL, 'free');
SELECT assign_plan('', 'free');
SELECT assign_plan(repeat('t', 257), 'free');
SELECT assign_plan('acme', 'free', 'infinity');
SELECT assign_plan('acme', 'free', now(), 'Mars/Olympus_Mons');
SELECT assign_plan('acme', 'free', now(), '');
SELECT tenant, plan, anchor, timezone FROM tenants WHERE tenant = 'acme';
-- A NULL (or omitted) anchor or time zone keeps the tenant's: changing its
-- plan does not move its periods.  A new tenant gets now() and UTC.
SELECT assign_plan('acme', 'pro'), assign_plan('acme', 'free', NULL, NULL);
SELECT assign_plan('acme', 'free', timezone => 'Asia/Tokyo');
SELECT tenant, plan, anchor, timezone FROM tenants WHERE tenant = 'acme';
SELECT assign_plan('acme', 'free', '2026-01-31 10:00:00+00', 'Europe/Berlin');
-- Time zones are zone names (issue 15): a POSIX specification such as
-- '+05:30' is refused, since PostgreSQL reads it as UTC-05:30 (offsets
-- west of UTC) with no daylight-saving rules.  Names are matched without
-- regard to case; IANA's own Etc/GMT-5 (UTC+5, by IANA's inverted sign) is
-- a zone name.  period_bounds() itself takes what PostgreSQL takes.
SELECT assign_plan('zoned', 'free', '2026-01-31 10:00:00+00', '+05:30');
SELECT assign_plan('zoned', 'free', '2026-01-31 10:00:00+00', 'UTC+3');
SELECT assign_plan('zoned', 'free', '2026-01-31 10:00:00+00', 'asia/kolkata'),
       assign_plan('zoned', 'free', timezone => 'Etc/GMT-5');
SELECT timezone FROM tenants WHERE tenant = 'zoned';
SELECT * FROM usage_series('zoned', 'api_calls', '2026-02-01', '2026-02-02', 'day', '+05:30');
SELECT * FROM period_bounds('2026-03-01 12:00+00', 'day', '2026-01-01', '+05:30');
-- An anchor is an instant (timestamptz): PostgreSQL reads a literal without
-- an offset in the session's TimeZone before flagmeter sees it, not in the
-- tenant's.  Write the zone in the literal, or convert a local time with
-- AT TIME ZONE: both give 10:00 in Tokyo.
SET TimeZone = 'America/New_York';
SELECT assign_plan('zoned', 'free', '2026-01-31 10:00', 'Asia/Tokyo');
SELECT anchor AT TIME ZONE 'Asia/Tokyo' AS local_anchor FROM tenants WHERE tenant = 'zoned';
SELECT assign_plan('zoned', 'free', '2026-01-31 10:00 Asia/Tokyo');
SELECT anchor AT TIME ZONE 'Asia/Tokyo' AS local_anchor FROM tenants WHERE tenant = 'zoned';
SELECT assign_plan('zoned', 'free', '2026-01-31 10:00'::timestamp AT TIME ZONE 'Asia/Tokyo');
SELECT anchor AT TIME ZONE 'Asia/Tokyo' AS local_anchor FROM tenants WHERE tenant = 'zoned';
SET TimeZone = 'UTC';
SELECT unassign_tenant('zoned');
BEGIN;
SELECT assign_plan('newbie', 'free');
SELECT plan, anchor = now() AS anchor_now, timezone FROM tenants WHERE tenant = 'newbie';
COMMIT;

-- Overrides
SELECT override_limit('acme', 'api_calls', 5000);
SELECT override_limit('acme', 'tokens', 10, 'hour');
SELECT override_limit('initech', 'api_calls', 1);
SELECT override_limit('acme', 'nope', 1);
SELECT override_limit('acme', 'api_calls', 0);
SELECT override_limit('acme', 'api_calls', 1, 'decade');
SELECT override_limit('acme', 'api_calls', 1, NULL, 'maybe');
SELECT override_limit('acme', 'api_calls', 1, NULL, NULL, '{101,101}');
SELECT tenant, meter, quota, period, mode, thresholds FROM effective_limits ORDER BY tenant, meter;
SELECT drop_override('acme', 'tokens');
SELECT drop_override('acme', 'tokens');
SELECT drop_override(NULL, 'tokens');
SELECT drop_override('acme', 'nope');
SELECT tenant, meter, quota, period, mode, thresholds FROM effective_limits ORDER BY tenant, meter;

-- The limit in force for tenants with and without a plan
SELECT * FROM limit_config('acme', 'api_calls');
SELECT * FROM limit_config('acme', 'seats');		-- on a plan, no limit for the meter
SELECT * FROM limit_config('stranger', 'api_calls');	-- no plan: calendar months in UTC
SELECT * FROM limit_config('acme', 'nope');			-- unknown meter: no row

-- limit_in_force() (what the calls use: the tenant's row and override read
-- by primary key, the plan's part cached, composed in C) equals
-- limit_config() (the definition) for every kind of configuration: plan
-- limits hard and soft, an override of each field alone, a meter the plan
-- does not limit, a tenant with no plan, anchors and time zones.
SELECT set_limit('pro', 'tokens', 500, 'week', 'soft', '{50}');
SELECT assign_plan('hooli', 'pro', '2026-02-28 23:30:00+00', 'America/New_York'),
       override_limit('hooli', 'tokens', 900, NULL, 'hard', NULL),
       assign_plan('umbrella', 'pro', '2026-01-15 00:00:00+00', 'Asia/Kolkata'),
       override_limit('umbrella', 'api_calls', 7, 'day', NULL, NULL),
       override_limit('umbrella', 'tokens', 8, NULL, NULL, '{10,20}');
SELECT count(*) AS compared,
       count(*) FILTER (WHERE (c.aggregation, c.quota, c.period, c.mode, c.thresholds, c.anchor,
                               lower(c.timezone))
                              IS DISTINCT FROM
                              (f.aggregation, f.quota, f.period, f.mode, f.thresholds, f.anchor,
                               lower(f.timezone))) AS different,
       count(DISTINCT (c.quota, c.period, c.mode, c.thresholds)) AS kinds_of_limit
FROM (SELECT tenant FROM tenants UNION ALL VALUES ('stranger')) t(tenant)
CROSS JOIN meters m
CROSS JOIN LATERAL limit_config(t.tenant, m.meter) c
CROSS JOIN LATERAL limit_in_force(t.tenant, m.meter) f;
SELECT * FROM limit_in_force('umbrella', 'tokens');
-- The backend's cache starts afresh past 20 000 limits: 25 000 tenants met
-- in one statement (so the cache empties in the middle of it) are each
-- composed like the tenant with no plan above, and what the cache holds
-- afterwards (about 5 000 limits) stays below 4 MB; all 25 000 kept, it
-- would take more than 9.
SELECT count(*) AS met,
       count(*) FILTER (WHERE (f.aggregation, f.quota, f.period, f.mode, f.thresholds, f.anchor,
                               f.timezone)
                              IS DISTINCT FROM
                              (s.aggregation, s.quota, s.period, s.mode, s.thresholds, s.anchor,
                               s.timezone)) AS different
FROM limit_in_force('stranger', 'api_calls') s,
     generate_series(1, 25000) i,
     LATERAL limit_in_force('nobody-' || i, 'api_calls') f;
SELECT sum(total_bytes) < 4 * 1024 * 1024 AS below_4_mb
FROM pg_backend_memory_contexts WHERE name = 'flagmeter limits';
SELECT * FROM limit_in_force('acme', 'nope');			-- unknown meter: an error
SELECT * FROM limit_in_force(NULL, 'api_calls');		-- the argument checks of the calls
SELECT * FROM limit_in_force('', 'api_calls');
SELECT * FROM limit_in_force('acme', NULL);
-- With flagmeter preloaded (as make test runs it), a transaction that changed
-- the configuration tables cannot be prepared: its COMMIT PREPARED would not
-- invalidate the shared limit cache (src/shared_limits.c).
BEGIN;
UPDATE overrides SET quota = quota WHERE false;
PREPARE TRANSACTION 'flagmeter_config';

-- Configuration tables are dumped by pg_dump
SELECT c.relname
FROM pg_extension e, unnest(e.extconfig) AS cfg(oid)
JOIN pg_class c ON c.oid = cfg.oid
WHERE e.extname = 'flagmeter'
ORDER BY 1;

-- Lifecycle (issue 15): a tenant leaves its plan, a plan or a meter goes,
-- and a meter with usage keeps its aggregation.
SELECT define_meter('calls'), define_meter('spare'), define_plan('basic'),
       set_limit('basic', 'calls', 10, 'lifetime'), define_plan('empty');
SELECT assign_plan('leaver', 'basic'), override_limit('leaver', 'calls', 5);
SELECT track('leaver', 'calls', 6, idempotency_key => 'l-1'),
       (consume('leaver', 'calls', 1, 'l-2')).granted AS refused_at_5;
SELECT latest_version() AS before_leave \gset

-- define_meter cannot change how recorded usage is read ...
SELECT define_meter('calls', 'max');
-- ... but changes the unit, and the aggregation of a meter without usage
SELECT define_meter('calls', 'sum', 'call'), define_meter('spare', 'count');
SELECT meter, aggregation, unit FROM meters WHERE meter IN ('calls', 'spare') ORDER BY 1;

-- unassign_tenant: the plan and overrides go, the usage, events, keys and
-- outbox rows stay; it is announced as a plan change without a plan, a
-- limit change without a quota, and unblocked
SELECT unassign_tenant('leaver');
SELECT unassign_tenant('leaver');			-- not assigned any more
SELECT (SELECT count(*) FROM tenants WHERE tenant = 'leaver') AS tenant_rows,
       (SELECT count(*) FROM overrides WHERE tenant = 'leaver') AS overrides,
       (SELECT count(*) FROM events WHERE tenant = 'leaver') AS events,
       (SELECT count(*) FROM event_keys WHERE tenant = 'leaver') AS keys,
       (SELECT count(*) FROM blocked WHERE tenant = 'leaver') AS blocked;
SELECT kind, tenant, meter, plan, used, quota FROM outbox
WHERE version > :before_leave ORDER BY version;
SELECT granted, used, quota FROM flagmeter.check('leaver', 'calls', 1);	-- unlimited now
SELECT granted, used FROM consume('leaver', 'calls', 1, 'l-2');	-- a retry: the answer given
-- forget_usage deletes everything recorded for the tenant
SELECT assign_plan('forgotten', 'basic'), track('forgotten', 'calls', 3, idempotency_key => 'f-1');
SELECT maintain() IS NOT NULL AS folded;
SELECT unassign_tenant('forgotten', forget_usage => true);
SELECT (SELECT count(*) FROM counters WHERE tenant = 'forgotten') AS counters,
       (SELECT count(*) FROM events WHERE tenant = 'forgotten') AS events,
       (SELECT count(*) FROM rollup_day WHERE tenant = 'forgotten') AS rollups,
       (SELECT count(*) FROM event_keys WHERE tenant = 'forgotten') AS keys,
       (SELECT string_agg(kind, ',' ORDER BY version) FROM outbox WHERE tenant = 'forgotten') AS outbox;
SELECT unassign_tenant(NULL);
SELECT unassign_tenant('', true);
SELECT unassign_tenant('leaver', NULL);

-- drop_plan: refused while tenants are on it, unless force (which unassigns
-- them, usage kept); false for no such plan
SELECT assign_plan('stayer', 'basic');
SELECT drop_plan('basic');
SELECT drop_plan('empty'), drop_plan('empty'), drop_plan('never');
SELECT latest_version() AS before_drop \gset
SELECT drop_plan('basic', force => true);
SELECT kind, tenant, meter, plan, quota FROM outbox WHERE version > :before_drop ORDER BY version;
SELECT (SELECT count(*) FROM plans WHERE plan = 'basic') AS plans,
       (SELECT count(*) FROM limits WHERE plan = 'basic') AS limits,
       (SELECT count(*) FROM tenants WHERE tenant = 'stayer') AS stayer_assigned;
SELECT drop_plan(NULL);
SELECT drop_plan('a/b');

-- drop_meter: refused while limited, overridden or with usage, unless
-- force, which drops all of it; a meter never used drops without force
SELECT define_plan('metered'), set_limit('metered', 'calls', 2, 'lifetime'),
       assign_plan('blockee', 'metered');
SELECT track('blockee', 'calls', 2, idempotency_key => 'm-1');
SELECT meter, granted FROM consume('blockee', ARRAY['calls', 'spare'], ARRAY[1, 1], 'm-2');
SELECT drop_meter('calls');
SELECT latest_version() AS before_meter \gset
SELECT drop_meter('calls', force => true);
SELECT kind, tenant, meter, plan, quota FROM outbox WHERE version > :before_meter ORDER BY version;
SELECT (SELECT count(*) FROM counters WHERE meter = 'calls') AS counters,
       (SELECT count(*) FROM events WHERE meter = 'calls') AS events,
       (SELECT count(*) FROM event_keys WHERE meter = 'calls') AS keys,
       (SELECT count(*) FROM event_keys WHERE idempotency_key = 'm-2') AS other_meters_keys,
       (SELECT count(*) FROM limits WHERE meter = 'calls') AS limits,
       (SELECT count(*) FROM blocked WHERE meter = 'calls') AS blocked,
       (SELECT count(*) FROM outbox WHERE meter = 'calls' AND kind = 'threshold') AS thresholds;
SELECT track('blockee', 'calls');			-- gone
SELECT define_meter('unused'), drop_meter('unused'), drop_meter('unused');
SELECT drop_meter(NULL);
SELECT drop_meter('spare', NULL);
-- spare was only named by the refused consume: no usage, it drops without
-- force, and its empty counter and its part of the key go with it
SELECT drop_meter('spare');
SELECT (SELECT count(*) FROM counters WHERE meter = 'spare') AS counters,
       (SELECT count(*) FROM event_keys WHERE idempotency_key = 'm-2') AS keys;

-- A bad catalog call answers with its message, detail and hint, without the
-- CONTEXT lines of the internal functions it passed through (psql's default
-- SHOW_CONTEXT errors prints any CONTEXT there is); bad_input shows their SQLSTATEs.
\set SHOW_CONTEXT errors
SELECT set_limit('free', 'api_calls', -10);
SELECT set_limit('free', 'api_calls', 10, 'fortnight');
SELECT assign_plan('acme', 'nope');
SELECT override_limit('nobody', 'api_calls', 5);
SELECT define_meter('x', 'avg');
SELECT set_feature('free', 'nope', true);
SELECT grant_credits('acme', 'nope', 5);
\set VERBOSITY default
\set SHOW_CONTEXT never
