-- Safe defaults (issue 36): in a new database a call for a tenant never
-- assigned a plan fails with QT001, and track, track_batch and track_events
-- accept an occurred_at only from now() - late_events to now() +
-- future_events (35 days and 5 minutes by default), failing with QT002 and
-- writing nothing otherwise.  Each is one configure() call away.
-- Every test file runs in the same database: start from a fresh extension.
SET client_min_messages = warning;
DROP EXTENSION flagmeter CASCADE;
CREATE EXTENSION flagmeter;
RESET client_min_messages;
SET search_path = flagmeter, public;
SET TimeZone = 'UTC';
\set SHOW_CONTEXT never

-- try(sql): 'ok', or the SQLSTATE and message of the error it raised, with
-- the times that depend on the day the test runs (all but 1900 and 2999)
-- shown as <time>
CREATE FUNCTION pg_temp.try(sql text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
	EXECUTE sql;
	RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
	RETURN SQLSTATE || ': ' || regexp_replace(SQLERRM,
		'(?!1900|2999)\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(\.\d+)?\+00', '<time>', 'g');
END $$;
-- written(): the rows of the tables a track writes
CREATE FUNCTION pg_temp.written() RETURNS bigint LANGUAGE sql AS $$
	SELECT (SELECT count(*) FROM flagmeter.events) + (SELECT count(*) FROM flagmeter.event_keys)
	       + (SELECT count(*) FROM flagmeter.counters)
$$;

SELECT define_meter('api_calls');
SELECT define_plan('free');
SELECT set_limit('free', 'api_calls', 1000, 'lifetime');
SELECT assign_plan('acme', 'free');

-- the defaults
SELECT * FROM current_settings;
SELECT count(*) AS settings_rows FROM settings;	-- none until configure()

-- unassigned tenants are refused by default: nothing written
SELECT pg_temp.written() AS written_before \gset
SELECT sql, pg_temp.try(sql) AS result FROM (VALUES
	($$SELECT track('Acme', 'api_calls', 1)$$),
	($$SELECT track_batch(ARRAY['acme', 'Acme'], ARRAY['api_calls', 'api_calls'], ARRAY[1, 1])$$),
	($$SELECT track_events(ARRAY['acme', 'Acme'], ARRAY['api_calls', 'api_calls'], ARRAY[1, 1])$$),
	($$SELECT consume('Acme', 'api_calls', 1)$$)
) v(sql);
SELECT pg_temp.written() - :written_before AS written;
-- one call away: metered without limit
SELECT unassigned_tenants FROM configure(unassigned_tenants => 'unlimited');
SELECT track('Acme', 'api_calls', 1);
SELECT granted, reason FROM consume('Acme', 'api_calls', 1);
SELECT unassigned_tenants FROM configure(unassigned_tenants => 'refuse');
SELECT pg_temp.try($$SELECT track('Acme', 'api_calls', 1)$$);

-- event times outside the window: QT002 from each call, nothing written
SELECT pg_temp.written() AS written_before \gset
SELECT sql, pg_temp.try(sql) AS result FROM (VALUES
	($$SELECT track('acme', 'api_calls', 1, '1900-01-01 00:00:00+00')$$),
	($$SELECT track('acme', 'api_calls', 1, '2999-01-01 00:00:00+00', 'k1')$$),
	($$SELECT track('acme', 'api_calls', 1, '1900-01-01 00:00:00+00'::text)$$),
	($$SELECT track('acme', 'api_calls', 1, now() - interval '35 days' - interval '1 microsecond')$$),
	($$SELECT track('acme', 'api_calls', 1, now() + interval '5 minutes 1 microsecond')$$),
	($$SELECT track_batch(ARRAY['acme', 'acme'], ARRAY['api_calls', 'api_calls'], ARRAY[1, 2],
	                      ARRAY[now(), '1900-01-01 00:00:00+00'])$$),
	($$SELECT track_batch(ARRAY['acme', 'acme'], ARRAY['api_calls', 'api_calls'], ARRAY[1, 2],
	                      ARRAY[NULL, now() + interval '1 hour'], ARRAY['k2', 'k3'])$$),
	($$SELECT track_events(ARRAY['acme', 'acme'], ARRAY['api_calls', 'api_calls'], ARRAY[1, 2],
	                       ARRAY[now(), '2999-01-01 00:00:00+00'])$$),
	($$SELECT track_events(ARRAY['acme'], ARRAY['api_calls'], ARRAY[1],
	                       ARRAY[now() - interval '36 days'], ARRAY['k4'])$$)
) v(sql);
SELECT pg_temp.written() - :written_before AS written;
SELECT count(*) AS keys FROM event_keys WHERE idempotency_key IN ('k1', 'k2', 'k3', 'k4');

-- the error's detail gives the window, its hint the setting
DO $$
DECLARE
	detail text;
	hint text;
BEGIN
	PERFORM flagmeter.track('acme', 'api_calls', 1, '1900-01-01 00:00:00+00');
EXCEPTION WHEN SQLSTATE 'QT002' THEN
	GET STACKED DIAGNOSTICS detail = PG_EXCEPTION_DETAIL, hint = PG_EXCEPTION_HINT;
	RAISE NOTICE 'detail: %', regexp_replace(detail,
		'(?!1900|2999)\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(\.\d+)?\+00', '<time>', 'g');
	RAISE NOTICE 'hint: %', hint;
END $$;

-- the boundaries, just inside the window, are accepted
SELECT used(usage('acme', 'api_calls')) AS used_before \gset
SELECT track('acme', 'api_calls', 1, now() - interval '35 days') AS earliest,
       track('acme', 'api_calls', 2, now() + interval '5 minutes') AS latest,
       track_batch(ARRAY['acme', 'acme'], ARRAY['api_calls', 'api_calls'], ARRAY[4, 8],
                   ARRAY[now() - interval '35 days', now() + interval '5 minutes']) AS batch,
       track_events(ARRAY['acme', 'acme'], ARRAY['api_calls', 'api_calls'], ARRAY[16, 32],
                    ARRAY[now() - interval '35 days', now() + interval '5 minutes']) AS events;
SELECT used(usage('acme', 'api_calls')) - :used_before AS added;

-- a wider window, one call away; the change reaches the cached settings
SELECT late_events, future_events FROM configure(late_events => '100 years', future_events => '100 years');
SELECT track('acme', 'api_calls', 1, '1950-01-01 00:00:00+00') AS old,
       track('acme', 'api_calls', 1, '2099-01-01 00:00:00+00') AS future;
-- and a narrower one: 0 accepts only the transaction's start time
SELECT late_events, future_events FROM configure(late_events => '0', future_events => '0');
SELECT track('acme', 'api_calls', 1, now()) AS at_start;
SELECT pg_temp.try($$SELECT track('acme', 'api_calls', 1, now() - interval '1 microsecond')$$);
SELECT pg_temp.try($$SELECT track('acme', 'api_calls', 1, now() + interval '1 microsecond')$$);
-- NULL keeps a setting
SELECT late_events, future_events FROM configure(late_events => '35 days');
SELECT late_events, future_events FROM configure(retention => '90 days');

-- configure validates the window: 0 to 1000 years
SELECT sql, pg_temp.try(sql) AS result FROM (VALUES
	($$SELECT configure(late_events => '-1 second')$$),
	($$SELECT configure(future_events => '-1 day')$$),
	($$SELECT configure(late_events => '1000 years 1 day')$$),
	($$SELECT configure(future_events => '1001 years')$$),
	($$SELECT configure(late_events => '1000 years', future_events => '1000 years')$$),
	($$INSERT INTO flagmeter.settings (singleton, late_events) VALUES (true, '-1 day')
	   ON CONFLICT (singleton) DO UPDATE SET late_events = EXCLUDED.late_events$$)
) v(sql);
SELECT configure(future_events => '-5 minutes');
SELECT * FROM current_settings;
