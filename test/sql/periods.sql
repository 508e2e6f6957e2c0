-- flagmeter.period_bounds: billing periods in the tenant's time zone.
SET search_path = flagmeter, public;
-- Results print in UTC; local_start and local_end show the tenant's clock.
SET TimeZone = 'UTC';
SET DateStyle = 'ISO, YMD';
SET IntervalStyle = 'postgres';

CREATE FUNCTION pg_temp.show(at timestamptz, period text, anchor timestamptz, tz text)
RETURNS TABLE (period_start timestamptz, period_end timestamptz, length interval,
               local_start timestamp, local_end timestamp)
LANGUAGE sql AS $$
	SELECT b.period_start, b.period_end,
	       CASE WHEN isfinite(b.period_start) AND isfinite(b.period_end)
	            THEN b.period_end - b.period_start END,
	       b.period_start AT TIME ZONE tz, b.period_end AT TIME ZONE tz
	FROM flagmeter.period_bounds(at, period, anchor, tz) b
$$;

-- Every kind, Europe/Berlin (CEST, +02), anchor Jan 31 10:00 local.
-- 2026-05-13 is a Wednesday: the week starts on Monday 2026-05-11.
SELECT p.period, s.*
FROM unnest(ARRAY['hour', 'day', 'week', 'month', 'year', 'lifetime']) WITH ORDINALITY p(period, i),
     pg_temp.show('2026-05-13 12:34:56.789+00', p.period,
                  '2026-01-31 10:00:00 Europe/Berlin', 'Europe/Berlin') s
ORDER BY p.i;

-- Monthly from an anchor on Jan 31 10:00 New York time: clamped to the
-- month end (Feb 28 in 2026), back to the 31st when the month has one,
-- always at 10:00 local (14:00 UTC in summer, 15:00 UTC in winter).
WITH RECURSIVE chain(n, period_start, period_end) AS (
	SELECT 1, b.period_start, b.period_end
	FROM period_bounds('2026-01-31 10:00:00 America/New_York', 'month',
	                   '2026-01-31 10:00:00 America/New_York', 'America/New_York') b
	UNION ALL
	SELECT c.n + 1, b.period_start, b.period_end
	FROM chain c,
	     period_bounds(c.period_end, 'month',
	                   '2026-01-31 10:00:00 America/New_York', 'America/New_York') b
	WHERE c.n < 14
)
SELECT n, period_start, period_end,
       period_start AT TIME ZONE 'America/New_York' AS local_start,
       period_end AT TIME ZONE 'America/New_York' AS local_end
FROM chain ORDER BY n;
-- Feb 29 in a leap year
SELECT * FROM pg_temp.show('2028-03-15 00:00:00+00', 'month',
                           '2026-01-31 10:00:00 America/New_York', 'America/New_York');
SELECT * FROM pg_temp.show('2028-02-15 00:00:00+00', 'month',
                           '2026-01-31 10:00:00 America/New_York', 'America/New_York');
-- An anchor on the 30th never moves to the 31st; one on the 1st never moves.
SELECT * FROM pg_temp.show('2026-08-31 12:00:00+00', 'month', '2026-04-30 00:00:00+00', 'UTC');
SELECT * FROM pg_temp.show('2026-08-31 12:00:00+00', 'month', '2026-04-01 00:00:00+00', 'UTC');

-- Yearly from Feb 29: Feb 28 in common years, Feb 29 in leap years.  The
-- anchor is midnight in Tokyo, so its local date (Feb 29) is not its UTC
-- date (Feb 28): the local date counts.
WITH RECURSIVE chain(n, period_start, period_end) AS (
	SELECT 1, b.period_start, b.period_end
	FROM period_bounds('2028-02-29 00:00:00 Asia/Tokyo', 'year',
	                   '2028-02-29 00:00:00 Asia/Tokyo', 'Asia/Tokyo') b
	UNION ALL
	SELECT c.n + 1, b.period_start, b.period_end
	FROM chain c,
	     period_bounds(c.period_end, 'year', '2028-02-29 00:00:00 Asia/Tokyo', 'Asia/Tokyo') b
	WHERE c.n < 5
)
SELECT n, period_start, period_end,
       period_start AT TIME ZONE 'Asia/Tokyo' AS local_start,
       period_end AT TIME ZONE 'Asia/Tokyo' AS local_end
FROM chain ORDER BY n;

-- The anchor's time of day counts: 09:59:59.999999 local on the reset day
-- is still the old period, 10:00 local starts the new one.
SELECT * FROM pg_temp.show('2026-02-28 09:59:59.999999 America/New_York', 'month',
                           '2026-01-31 10:00:00 America/New_York', 'America/New_York');
SELECT * FROM pg_temp.show('2026-02-28 10:00:00 America/New_York', 'month',
                           '2026-01-31 10:00:00 America/New_York', 'America/New_York');
SELECT * FROM pg_temp.show('2027-01-31 09:59:59.999999 America/New_York', 'year',
                           '2026-01-31 10:00:00 America/New_York', 'America/New_York');
SELECT * FROM pg_temp.show('2027-01-31 10:00:00 America/New_York', 'year',
                           '2026-01-31 10:00:00 America/New_York', 'America/New_York');

-- Start inclusive, end exclusive (day, Europe/Berlin)
SELECT * FROM pg_temp.show('2026-05-12 22:00:00+00', 'day', '2000-01-01 00:00:00+00', 'Europe/Berlin');
SELECT * FROM pg_temp.show('2026-05-13 21:59:59.999999+00', 'day', '2000-01-01 00:00:00+00', 'Europe/Berlin');
SELECT * FROM pg_temp.show('2026-05-13 22:00:00+00', 'day', '2000-01-01 00:00:00+00', 'Europe/Berlin');

-- Periods extend backwards from the anchor
SELECT * FROM pg_temp.show('2025-12-15 00:00:00+00', 'month',
                           '2026-01-31 10:00:00 America/New_York', 'America/New_York');
SELECT * FROM pg_temp.show('1999-03-01 00:00:00+00', 'month',
                           '2026-01-31 10:00:00 America/New_York', 'America/New_York');
SELECT * FROM pg_temp.show('2020-06-01 00:00:00+00', 'year',
                           '2026-01-31 10:00:00 America/New_York', 'America/New_York');
SELECT * FROM pg_temp.show('2026-01-31 09:00:00 America/New_York', 'year',
                           '2026-01-31 10:00:00 America/New_York', 'America/New_York');

-- DST, America/New_York: 2026-03-08 has 23 hours, 2026-11-01 has 25.
SELECT * FROM pg_temp.show('2026-03-08 12:00:00 America/New_York', 'day', '2000-01-01 00:00:00+00', 'America/New_York');
SELECT * FROM pg_temp.show('2026-11-01 12:00:00 America/New_York', 'day', '2000-01-01 00:00:00+00', 'America/New_York');
-- ... and the weeks containing them
SELECT * FROM pg_temp.show('2026-03-08 12:00:00 America/New_York', 'week', '2000-01-01 00:00:00+00', 'America/New_York');
SELECT * FROM pg_temp.show('2026-11-01 12:00:00 America/New_York', 'week', '2000-01-01 00:00:00+00', 'America/New_York');
-- Hours: 01:00-02:00 EST, then 03:00 EDT (02:00 does not exist) ...
SELECT * FROM pg_temp.show('2026-03-08 06:59:59.999999+00', 'hour', '2000-01-01 00:00:00+00', 'America/New_York');
SELECT * FROM pg_temp.show('2026-03-08 07:00:00+00', 'hour', '2000-01-01 00:00:00+00', 'America/New_York');
-- ... and 01:00-02:00 happens twice, as two hours (EDT, then EST)
SELECT * FROM pg_temp.show('2026-11-01 05:30:00+00', 'hour', '2000-01-01 00:00:00+00', 'America/New_York');
SELECT * FROM pg_temp.show('2026-11-01 06:30:00+00', 'hour', '2000-01-01 00:00:00+00', 'America/New_York');

-- DST, Europe/Berlin: 2026-03-29 has 23 hours, 2026-10-25 has 25.
SELECT * FROM pg_temp.show('2026-03-29 12:00:00 Europe/Berlin', 'day', '2000-01-01 00:00:00+00', 'Europe/Berlin');
SELECT * FROM pg_temp.show('2026-10-25 12:00:00 Europe/Berlin', 'day', '2000-01-01 00:00:00+00', 'Europe/Berlin');
SELECT * FROM pg_temp.show('2026-03-29 01:30:00+00', 'hour', '2000-01-01 00:00:00+00', 'Europe/Berlin');
SELECT * FROM pg_temp.show('2026-10-25 00:30:00+00', 'hour', '2000-01-01 00:00:00+00', 'Europe/Berlin');
SELECT * FROM pg_temp.show('2026-10-25 01:30:00+00', 'hour', '2000-01-01 00:00:00+00', 'Europe/Berlin');

-- A monthly reset time that does not exist on the day (02:30 on
-- 2026-03-08 in New York) is read as timestamptz input reads it: with the
-- offset before the change, 07:30 UTC = 03:30 EDT.
SELECT * FROM pg_temp.show('2026-03-08 12:00:00 America/New_York', 'month',
                           '2026-02-08 02:30:00 America/New_York', 'America/New_York');
-- An ambiguous one (01:30 on 2026-11-01) is its later occurrence, 01:30 EST ...
SELECT * FROM pg_temp.show('2026-11-01 06:00:00+00', 'month',
                           '2026-10-01 01:30:00 America/New_York', 'America/New_York');
SELECT * FROM pg_temp.show('2026-11-01 06:30:00+00', 'month',
                           '2026-10-01 01:30:00 America/New_York', 'America/New_York');
-- ... except the anchor instant itself, which always starts a period
-- (here the earlier 01:30, EDT).
SELECT * FROM pg_temp.show('2026-11-01 05:30:00+00', 'month',
                           '2026-11-01 05:30:00+00', 'America/New_York');

-- America/Santiago changes its clocks at midnight.  2022-04-02 has 25
-- hours (23:00 happens twice); midnight of 2022-09-11 does not exist, so
-- that day starts at 01:00 local and has 23 hours.
SELECT * FROM pg_temp.show('2022-04-02 12:00:00 America/Santiago', 'day', '2000-01-01 00:00:00+00', 'America/Santiago');
SELECT * FROM pg_temp.show('2022-04-03 03:30:00+00', 'day', '2000-01-01 00:00:00+00', 'America/Santiago');
SELECT * FROM pg_temp.show('2022-09-10 12:00:00 America/Santiago', 'day', '2000-01-01 00:00:00+00', 'America/Santiago');
SELECT * FROM pg_temp.show('2022-09-11 12:00:00 America/Santiago', 'day', '2000-01-01 00:00:00+00', 'America/Santiago');

-- Pacific/Apia skipped 2011-12-30 (from -10 to +14): that day is an empty
-- period and is passed over; the 29th ends where the 31st starts.
SELECT * FROM pg_temp.show('2011-12-29 12:00:00-10', 'day', '2000-01-01 00:00:00+00', 'Pacific/Apia');
SELECT * FROM pg_temp.show('2011-12-30 10:00:00+00', 'day', '2000-01-01 00:00:00+00', 'Pacific/Apia');

-- Zones at :30 and :45 cut hours and days on their own clock.
SELECT * FROM pg_temp.show('2026-05-13 10:15:00+00', 'hour', '2000-01-01 00:00:00+00', 'Asia/Kolkata');
SELECT * FROM pg_temp.show('2026-05-13 09:30:00+00', 'hour', '2000-01-01 00:00:00+00', 'Asia/Kolkata');
SELECT * FROM pg_temp.show('2026-05-13 09:29:59.999999+00', 'hour', '2000-01-01 00:00:00+00', 'Asia/Kolkata');
SELECT * FROM pg_temp.show('2026-05-13 10:15:00+00', 'day', '2000-01-01 00:00:00+00', 'Asia/Kolkata');
SELECT * FROM pg_temp.show('2026-05-13 18:30:00+00', 'day', '2000-01-01 00:00:00+00', 'Asia/Kolkata');
SELECT * FROM pg_temp.show('2026-05-13 10:00:00+00', 'hour', '2000-01-01 00:00:00+00', 'Asia/Kathmandu');
-- Australia/Lord_Howe moves its clocks by half an hour (02:00 +10:30 ->
-- 02:30 +11 on 2026-10-04, 02:00 +11 -> 01:30 +10:30 on 2026-04-05): the
-- hour is cut where the offset changes, so hours never overlap.
SELECT * FROM pg_temp.show('2026-10-03 15:00:00+00', 'hour', '2000-01-01 00:00:00+00', 'Australia/Lord_Howe');
SELECT * FROM pg_temp.show('2026-10-03 15:45:00+00', 'hour', '2000-01-01 00:00:00+00', 'Australia/Lord_Howe');
SELECT * FROM pg_temp.show('2026-10-03 16:00:00+00', 'hour', '2000-01-01 00:00:00+00', 'Australia/Lord_Howe');
SELECT * FROM pg_temp.show('2026-04-04 14:30:00+00', 'hour', '2000-01-01 00:00:00+00', 'Australia/Lord_Howe');
SELECT * FROM pg_temp.show('2026-04-04 15:10:00+00', 'hour', '2000-01-01 00:00:00+00', 'Australia/Lord_Howe');

-- Weeks start on Monday at local midnight: Sunday 23:59:59 and Monday
-- 00:00 in Tokyo are both on Sunday in UTC, in different weeks.
SELECT * FROM pg_temp.show('2026-05-17 23:59:59 Asia/Tokyo', 'week', '2000-01-01 00:00:00+00', 'Asia/Tokyo');
SELECT * FROM pg_temp.show('2026-05-18 00:00:00 Asia/Tokyo', 'week', '2000-01-01 00:00:00+00', 'Asia/Tokyo');

-- lifetime: all of time, whatever the anchor and zone
SELECT * FROM period_bounds('2026-05-13 12:00:00+00', 'lifetime', '2026-01-31 10:00:00+00', 'Asia/Kolkata');
SELECT * FROM period_bounds('1900-01-01 00:00:00+00', 'lifetime', '2100-01-01 00:00:00+00', 'UTC');

-- A tenant without a plan: calendar months (and years) in UTC, from the
-- anchor 2000-01-01 00:00 UTC.
SELECT * FROM pg_temp.show('2026-02-14 12:00:00+00', 'month', '2000-01-01 00:00:00+00', 'UTC');
SELECT * FROM pg_temp.show('2026-12-31 23:59:59.999999+00', 'month', '2000-01-01 00:00:00+00', 'UTC');
SELECT * FROM pg_temp.show('2027-01-01 00:00:00+00', 'month', '2000-01-01 00:00:00+00', 'UTC');
SELECT * FROM pg_temp.show('2024-02-29 23:00:00+00', 'month', '2000-01-01 00:00:00+00', 'UTC');
SELECT * FROM pg_temp.show('2026-02-14 12:00:00+00', 'year', '2000-01-01 00:00:00+00', 'UTC');
-- the same instants agree with date_trunc in UTC
SELECT count(*) AS instants,
       count(*) FILTER (WHERE b.period_start = date_trunc('month', t, 'UTC')
                          AND b.period_end = date_trunc('month', t, 'UTC') + interval '1 month') AS calendar_months
FROM generate_series('1999-01-01 00:00:00+00'::timestamptz, '2031-01-01 00:00:00+00', interval '17 hours 13 minutes') t,
     period_bounds(t, 'month', '2000-01-01 00:00:00+00', 'UTC') b;

-- Time zone names: as SET TimeZone takes them, case-insensitive
SELECT * FROM period_bounds('2026-05-13 12:00:00+00', 'day', '2000-01-01 00:00:00+00', 'europe/berlin');
SELECT * FROM period_bounds('2026-05-13 12:00:00+00', 'day', '2000-01-01 00:00:00+00', 'Etc/GMT-14');

-- Bad input: 22023 for the period and the time zone ...
SELECT * FROM period_bounds(now(), 'fortnight', now(), 'UTC');
SELECT * FROM period_bounds(now(), 'Month', now(), 'UTC');
SELECT * FROM period_bounds(now(), '', now(), 'UTC');
SELECT * FROM period_bounds(now(), 'month', now(), 'Mars/Olympus_Mons');
SELECT * FROM period_bounds(now(), 'month', now(), '');
SELECT * FROM period_bounds(now(), 'month', now(), repeat('x', 256));
-- ... 22008 for timestamps that are not finite ...
SELECT * FROM period_bounds('infinity', 'day', now(), 'UTC');
SELECT * FROM period_bounds('-infinity', 'hour', now(), 'UTC');
SELECT * FROM period_bounds('infinity', 'lifetime', now(), 'UTC');
SELECT * FROM period_bounds(now(), 'month', 'infinity', 'UTC');
SELECT * FROM period_bounds(now(), 'day', '-infinity', 'UTC');
-- ... and for periods that end past the last timestamp or start before the first
SELECT * FROM period_bounds('294276-12-31 12:00:00+00', 'day', '2000-01-01 00:00:00+00', 'UTC');
SELECT * FROM period_bounds('294276-12-31 23:30:00+00', 'hour', '2000-01-01 00:00:00+00', 'UTC');
SELECT * FROM period_bounds('4714-11-24 00:00:00+00 BC', 'day', '2000-01-01 00:00:00+00', 'America/New_York');
SELECT * FROM period_bounds('4714-11-24 00:00:00+00 BC', 'day', '2000-01-01 00:00:00+00', 'UTC');
-- STRICT: a NULL argument gives NULL bounds
SELECT * FROM period_bounds(NULL, 'day', now(), 'UTC');
SELECT * FROM period_bounds(now(), NULL, now(), 'UTC');
SELECT * FROM period_bounds(now(), 'month', NULL, 'UTC');
SELECT * FROM period_bounds(now(), 'month', now(), NULL);

-- Properties, over zones with DST, :30 and :45 offsets, half-hour DST
-- (Lord_Howe), a two-hour DST (Antarctica/Troll), negative DST
-- (Europe/Dublin), midnight changes (Santiago) and a skipped day (Apia):
-- start <= at < end, the period of start is the same period, and the
-- period of end starts at end (periods tile time).
CREATE TEMP TABLE zones (tz text);
INSERT INTO zones VALUES ('UTC'), ('America/New_York'), ('Europe/Berlin'), ('Asia/Kolkata'),
	('Asia/Kathmandu'), ('Australia/Lord_Howe'), ('Antarctica/Troll'), ('Europe/Dublin'),
	('America/Santiago'), ('Pacific/Apia'), ('America/St_Johns'), ('Pacific/Chatham');
CREATE FUNCTION pg_temp.tiles(at timestamptz, period text, anchor timestamptz, tz text)
RETURNS boolean LANGUAGE sql AS $$
	SELECT CASE WHEN period = 'lifetime'
	            THEN b.period_start = '-infinity' AND b.period_end = 'infinity'
	            ELSE b.period_start <= at AND at < b.period_end
	                 AND (SELECT (s.period_start, s.period_end) = (b.period_start, b.period_end)
	                      FROM flagmeter.period_bounds(b.period_start, period, anchor, tz) s)
	                 AND (SELECT e.period_start = b.period_end
	                      FROM flagmeter.period_bounds(b.period_end, period, anchor, tz) e)
	       END
	FROM flagmeter.period_bounds(at, period, anchor, tz) b
$$;

-- 2000 pseudo-random instants, anchors (biased to month ends), zones and kinds
SELECT setseed(0.25);
CREATE TEMP TABLE cases AS
SELECT g,
       to_timestamp(-2208988800 + random() * 6311433600) AS at,
       ((make_date(1950 + (random() * 100)::int, 1 + (random() * 11)::int, 1)
         + (27 + (random() * 4)::int))::timestamp
        + random() * interval '24 hours') AS anchor_local,
       (SELECT array_agg(tz ORDER BY tz) FROM zones)[1 + (random() * 11)::int] AS tz,
       (ARRAY['hour', 'day', 'week', 'month', 'year', 'lifetime'])[1 + (random() * 5)::int] AS period
FROM generate_series(1, 2000) g;
SELECT count(*) AS cases,
       count(*) FILTER (WHERE pg_temp.tiles(at, period, anchor_local AT TIME ZONE tz, tz)) AS tiling,
       count(DISTINCT tz) AS zones,
       count(DISTINCT period) AS periods
FROM cases;
-- period lengths stay within what the clocks allow
SELECT period, count(*) AS cases,
       count(*) FILTER (WHERE len > interval '0' AND len <= interval '1 hour') AS hour,
       count(*) FILTER (WHERE len BETWEEN interval '21 hours' AND interval '27 hours') AS day,
       count(*) FILTER (WHERE len BETWEEN interval '6 days 21 hours' AND interval '7 days 3 hours') AS week,
       count(*) FILTER (WHERE len BETWEEN interval '27 days 21 hours' AND interval '31 days 3 hours') AS month,
       count(*) FILTER (WHERE len BETWEEN interval '364 days 21 hours' AND interval '366 days 3 hours') AS year
FROM (SELECT c.period, pg_catalog.justify_hours(b.period_end - b.period_start) AS len
      FROM cases c, period_bounds(c.at, c.period, c.anchor_local AT TIME ZONE c.tz, c.tz) b
      WHERE c.period <> 'lifetime') s
GROUP BY period ORDER BY period;

-- Every 5 minutes for a day either side of every UTC offset change of
-- 2024 in these zones (a past year: no tzdata release will change it), for
-- hours, days and weeks; and for months and years anchored a month (a
-- year) before the change at every quarter hour of the local day of the
-- change, so that resets fall into every DST gap and overlap.
CREATE TEMP TABLE changes AS
SELECT tz, h AS changed_by
FROM (SELECT z.tz, h,
             (h AT TIME ZONE z.tz) - (h AT TIME ZONE 'UTC') AS off,
             lag((h AT TIME ZONE z.tz) - (h AT TIME ZONE 'UTC')) OVER (PARTITION BY z.tz ORDER BY h) AS prev
      FROM zones z,
           generate_series('2024-01-01 00:00:00+00'::timestamptz, '2025-01-01 00:00:00+00', interval '1 hour') h) s
WHERE off <> prev;
SELECT tz, count(*) AS changes_in_2024 FROM changes GROUP BY tz ORDER BY tz;
CREATE TEMP TABLE sweep AS
SELECT c.tz, c.changed_by + i * interval '5 minutes' AS at, p.period,
       '2000-01-01 00:00:00+00'::timestamptz AS anchor
FROM changes c, generate_series(-288, 288) i, unnest(ARRAY['hour', 'day', 'week']) p(period)
UNION ALL
SELECT c.tz, c.changed_by + i * interval '20 minutes', p.period,
       (date_trunc('day', c.changed_by AT TIME ZONE c.tz)
        - CASE p.period WHEN 'month' THEN interval '1 month' ELSE interval '1 year' END
        + j * interval '15 minutes') AT TIME ZONE c.tz
FROM changes c, generate_series(-6, 6) i, generate_series(0, 95) j,
     unnest(ARRAY['month', 'year']) p(period);
SELECT count(*) AS cases,
       count(*) FILTER (WHERE pg_temp.tiles(at, period, anchor, tz)) AS tiling
FROM sweep;
-- the hours and days in the sweep that are not 1 and 24 hours long
SELECT DISTINCT s.tz, s.period, b.period_start, b.period_end - b.period_start AS length,
       b.period_start AT TIME ZONE s.tz AS local_start,
       b.period_end AT TIME ZONE s.tz AS local_end
FROM sweep s, period_bounds(s.at, s.period, s.anchor, s.tz) b
WHERE s.period IN ('hour', 'day')
  AND b.period_end - b.period_start <> CASE s.period WHEN 'hour' THEN interval '1 hour' ELSE interval '1 day' END
ORDER BY s.tz, s.period, b.period_start;
