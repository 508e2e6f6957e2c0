-- usage_series with minute buckets: counted from the raw events, folded or
-- not, less every void; within the retention and at most 7 days.  The
-- events are placed relative to the start of the current hour (minute
-- buckets only reach back as far as the retention), and bucket starts are
-- shown as offsets from it.
SET client_min_messages = warning;
DROP EXTENSION flagmeter CASCADE;
CREATE EXTENSION flagmeter;
RESET client_min_messages;
SET search_path = flagmeter, public;
SET TimeZone = 'UTC';
\set SHOW_CONTEXT never

SELECT define_meter('api_calls'), define_meter('peak', 'max'),
       define_plan('free'), set_limit('free', 'api_calls', 1000, 'month'),
       assign_plan('acme', 'free'), assign_plan('globex', 'free');
CREATE TEMP TABLE base AS SELECT date_trunc('hour', now()) - interval '2 hours' AS h;

SELECT track('acme', 'api_calls', 3, h + interval '10 minutes', 'k1'),
       track('acme', 'api_calls', 4, h + interval '10 minutes 59.999 seconds'),
       track('acme', 'api_calls', 5, h + interval '12 minutes'),
       track('acme', 'api_calls', 6, h + interval '61 minutes'),
       track('globex', 'api_calls', 100, h + interval '10 minutes'),
       track('acme', 'peak', 7, h + interval '10 minutes'),
       track('acme', 'peak', 2, h + interval '10 minutes 30 seconds')
FROM base;

-- unfolded: every minute from the one containing "from", zero minutes included
SELECT s.bucket_start - b.h AS minute, s.used
FROM base b, usage_series('acme', 'api_calls', b.h + interval '9 minutes 30 seconds', b.h + interval '13 minutes', 'minute') s;

-- a void takes its event out at once; folding changes nothing
SELECT void('acme', 'k1');
SELECT s.bucket_start - b.h AS minute, s.used
FROM base b, usage_series('acme', 'api_calls', b.h + interval '10 minutes', b.h + interval '13 minutes', 'minute') s;
SELECT events_folded, voids_folded FROM maintain();
SELECT s.bucket_start - b.h AS minute, s.used, events(s.counter) AS events
FROM base b, usage_series('acme', 'api_calls', b.h + interval '10 minutes', b.h + interval '13 minutes', 'minute') s;

-- minutes add up to the hour buckets (read from the rollups once folded)
SELECT (SELECT sum(used) FROM usage_series('acme', 'api_calls', b.h, b.h + interval '2 hours', 'minute')) AS minutes,
       (SELECT sum(used) FROM usage_series('acme', 'api_calls', b.h, b.h + interval '2 hours', 'hour')) AS hours,
       (SELECT count(*) FROM usage_series('acme', 'api_calls', b.h, b.h + interval '2 hours', 'minute')) AS buckets
FROM base b;

-- a max meter: the greatest event of each minute
SELECT s.bucket_start - b.h AS minute, s.used
FROM base b, usage_series('acme', 'peak', b.h + interval '10 minutes', b.h + interval '12 minutes', 'minute') s;

-- another time zone: minute edges are the same instants, in Kathmandu
-- (UTC+5:45) too
SELECT s.bucket_start - b.h AS minute, s.used
FROM base b, usage_series('acme', 'api_calls', b.h + interval '12 minutes', b.h + interval '13 minutes', 'minute', 'Asia/Kathmandu') s;

-- bounds: 7 days at most; not older than the retention
SELECT count(*) AS week_of_minutes
FROM base b, usage_series('acme', 'api_calls', b.h, b.h + interval '7 days', 'minute');
SELECT usage_series('acme', 'api_calls', h, h + interval '7 days 1 minute', 'minute') FROM base;
SELECT usage_series('acme', 'api_calls', now() - interval '91 days', now() - interval '90 days', 'minute');
SELECT configure(retention => '1 day') IS NOT NULL AS configured;
SELECT count(*) BETWEEN 1380 AND 1381 AS inside_retention
FROM usage_series('acme', 'api_calls', now() - interval '23 hours', now(), 'minute');
SELECT usage_series('acme', 'api_calls', now() - interval '25 hours', now(), 'minute');
