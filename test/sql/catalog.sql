-- Catalog: meters, plans, limits, tenants and overrides, with every error.
-- Every test file runs in the same database: start from a fresh extension.
SET client_min_messages = warning;
DROP EXTENSION flagmeter CASCADE;
CREATE EXTENSION flagmeter;
RESET client_min_messages;
SET search_path = flagmeter, public;
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
