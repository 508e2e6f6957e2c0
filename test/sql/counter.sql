-- flagmeter.quota_counter: text and binary I/O, accessors, merge, aggregates.
SET search_path = flagmeter, public;

-- Text form round trips exactly
SELECT c::quota_counter AS counter, c::quota_counter::text = c AS round_trip
FROM (VALUES
	('used=0 events=0 max=0'),
	('used=0 events=0 max=0 limit=1'),
	('used=10 events=3 max=5 latest=2@2026-11-30T10:00:00Z'),
	('used=10 events=3 max=5 latest=2@2026-11-30T10:00:00.5Z limit=100'),
	('used=9223372036854775807 events=9223372036854775807 max=9223372036854775807 latest=9223372036854775807@9999-12-31T23:59:59.999999Z limit=9223372036854775807'),
	('used=0 events=1 max=0 latest=0@0001-01-01T00:00:00Z'),
	('used=7 events=1 max=7 latest=7@2024-02-29T23:59:59.000001Z')
) v(c);

-- Output does not depend on the session's time zone or date style
SET TimeZone = 'Asia/Kolkata';
SET DateStyle = 'SQL, DMY';
SELECT event_counter(3, '2026-03-01 12:00:00+00');
RESET TimeZone;
RESET DateStyle;

-- Malformed text: 22P02
SELECT ''::quota_counter;
SELECT 'garbage'::quota_counter;
SELECT 'used=1'::quota_counter;
SELECT 'used=1 events=1'::quota_counter;
SELECT 'events=1 used=1 max=1 latest=1@2026-01-01T00:00:00Z'::quota_counter;
SELECT 'used=1  events=1 max=1 latest=1@2026-01-01T00:00:00Z'::quota_counter;
SELECT ' used=0 events=0 max=0'::quota_counter;
SELECT 'used=0 events=0 max=0 '::quota_counter;
SELECT 'used=0 events=0 max=0 limit='::quota_counter;
SELECT 'used=+1 events=1 max=1 latest=1@2026-01-01T00:00:00Z'::quota_counter;
SELECT 'used=1.5 events=1 max=1 latest=1@2026-01-01T00:00:00Z'::quota_counter;
SELECT 'used=1 events=1 max=1 latest=1@2026-01-01 00:00:00+00'::quota_counter;
SELECT 'used=1 events=1 max=1 latest=1@2026-01-01T00:00:00'::quota_counter;
SELECT 'used=1 events=1 max=1 latest=1@2026-01-01T00:00:00.1234567Z'::quota_counter;
SELECT 'used=1 events=1 max=1 latest=1@2026-01-01T00:00:00.Z'::quota_counter;
SELECT 'used=1 events=1 max=1 latest=1'::quota_counter;
SELECT 'used=0 events=0 max=0 limit=5 latest=1@2026-01-01T00:00:00Z'::quota_counter;
SELECT 'used=0 events=0 max=0 bogus=1'::quota_counter;
-- Inconsistent fields: 22P02 with a detail
SELECT 'used=1 events=0 max=0'::quota_counter;
SELECT 'used=1 events=1 max=1'::quota_counter;
SELECT 'used=0 events=0 max=3'::quota_counter;
SELECT 'used=5 events=1 max=2 latest=3@2026-01-01T00:00:00Z'::quota_counter;
-- Out of range: 22003
SELECT 'used=-1 events=0 max=0'::quota_counter;
SELECT 'used=9223372036854775808 events=1 max=1 latest=1@2026-01-01T00:00:00Z'::quota_counter;
SELECT 'used=99999999999999999999999 events=1 max=1 latest=1@2026-01-01T00:00:00Z'::quota_counter;
SELECT 'used=0 events=0 max=0 limit=0'::quota_counter;
SELECT 'used=0 events=0 max=0 limit=-5'::quota_counter;
SELECT 'used=1 events=1 max=1 latest=1@2026-02-29T00:00:00Z'::quota_counter;
SELECT 'used=1 events=1 max=1 latest=1@2026-13-01T00:00:00Z'::quota_counter;
SELECT 'used=1 events=1 max=1 latest=1@2026-01-01T24:00:00Z'::quota_counter;
SELECT 'used=1 events=1 max=1 latest=1@2026-01-01T00:00:60Z'::quota_counter;
SELECT 'used=1 events=1 max=1 latest=1@0000-12-31T00:00:00Z'::quota_counter;

-- Accessors
SELECT used(c), events(c), max_amount(c), latest(c), latest_at(c),
       quota(c), remaining(c), exceeded(c), usage_ratio(c)
FROM (VALUES
	('used=0 events=0 max=0'::quota_counter),
	('used=0 events=0 max=0 limit=10'),
	('used=8 events=2 max=5 latest=3@2026-01-02T00:00:00Z'),
	('used=8 events=2 max=5 latest=3@2026-01-02T00:00:00Z limit=10'),
	('used=10 events=2 max=5 latest=5@2026-01-02T00:00:00Z limit=10'),
	('used=15 events=3 max=5 latest=5@2026-01-02T00:00:00Z limit=10')
) v(c);

-- with_limit sets, replaces and removes the limit; quota must be positive
SELECT with_limit('used=3 events=1 max=3 latest=3@2026-01-01T00:00:00Z', 10);
SELECT with_limit('used=3 events=1 max=3 latest=3@2026-01-01T00:00:00Z limit=5', 10);
SELECT with_limit('used=3 events=1 max=3 latest=3@2026-01-01T00:00:00Z limit=5', NULL);
SELECT with_limit(NULL, 10);
SELECT with_limit('used=0 events=0 max=0', 0);
SELECT with_limit('used=0 events=0 max=0', -1);

-- event_counter
SELECT event_counter(0, '2026-01-01 00:00:00+00');
SELECT event_counter(-1, '2026-01-01 00:00:00+00');
SELECT event_counter(1, 'infinity');
SELECT event_counter(1, '-infinity');
SELECT event_counter(1, '10000-01-01 00:00:00+00');
SELECT event_counter(1, NULL);

-- Merge: sums add, max and latest are kept, the smaller limit wins
SELECT 'used=3 events=1 max=3 latest=3@2026-01-01T00:00:00Z'::quota_counter
     + 'used=5 events=2 max=4 latest=1@2026-01-02T00:00:00Z limit=100';
SELECT 'used=0 events=0 max=0 limit=7'::quota_counter
     + 'used=0 events=0 max=0 limit=100';
-- latest: same timestamp, the greater amount wins whatever the order
SELECT a + b AS ab, b + a AS ba, a + b = b + a AS commutes
FROM (SELECT event_counter(4, '2026-01-01 00:00:00+00') a,
             event_counter(9, '2026-01-01 00:00:00+00') b) s;
-- overflow is an error, never a wrap
SELECT event_counter(9223372036854775807, '2026-01-01 00:00:00+00')
     + event_counter(1, '2026-01-01 00:00:00+00');
SELECT 'used=0 events=9223372036854775807 max=0 latest=0@2026-01-01T00:00:00Z'::quota_counter
     + event_counter(0, '2026-01-01 00:00:00+00');

-- Equality
SELECT 'used=0 events=0 max=0'::quota_counter = 'used=0 events=0 max=0' AS eq,
       'used=0 events=0 max=0'::quota_counter = 'used=0 events=0 max=0 limit=1' AS eq_limit,
       'used=0 events=0 max=0'::quota_counter <> 'used=0 events=0 max=0 limit=1' AS ne_limit;

-- Aggregates skip NULLs; an empty set is an empty counter
SELECT quota_counter_agg(a, t)
FROM (VALUES (5, '2026-01-01 00:00:00+00'::timestamptz), (3, '2026-01-02 00:00:00+00'),
             (NULL, '2026-01-03 00:00:00+00'), (7, NULL), (2, '2026-01-02 00:00:00+00')) v(a, t);
SELECT quota_counter_agg(a, t) FROM (VALUES (1::bigint, now())) v(a, t) WHERE false;
SELECT merge_agg(c) FROM (VALUES ('used=1 events=1 max=1 latest=1@2026-01-01T00:00:00Z'::quota_counter),
                                 (NULL), ('used=2 events=1 max=2 latest=2@2025-01-01T00:00:00Z limit=9')) v(c);
SELECT quota_counter_agg(a, now()) FROM (VALUES (1), (-1)) v(a);
SELECT quota_counter_agg(a, now()) FROM (VALUES (9223372036854775807), (1)) v(a);
-- the aggregate's input is never modified: the same counter twice
SELECT merge_agg(c) FROM (SELECT 'used=1 events=1 max=1 latest=1@2026-01-01T00:00:00Z'::quota_counter c
                          FROM generate_series(1, 3)) s;

-- Binary round trip through COPY
CREATE TABLE counter_copy (id int, c quota_counter);
INSERT INTO counter_copy VALUES
	(1, 'used=0 events=0 max=0'),
	(2, 'used=10 events=3 max=5 latest=2@2026-11-30T10:00:00.5Z limit=100'),
	(3, 'used=9223372036854775807 events=1 max=9223372036854775807 latest=9223372036854775807@0001-01-01T00:00:00Z');
SELECT current_setting('data_directory') || '/flagmeter_counter_copy.bin' AS copy_file \gset
COPY counter_copy TO :'copy_file' (FORMAT binary);
CREATE TABLE counter_copy_back (LIKE counter_copy);
COPY counter_copy_back FROM :'copy_file' (FORMAT binary);
SELECT a.id, a.c = b.c AS same, b.c FROM counter_copy a JOIN counter_copy_back b USING (id) ORDER BY id;

-- Binary input is as strict as text input: a bytea's binary form is its raw
-- bytes, so COPY of a bytea column feeds chosen bytes to quota_counter_recv.
CREATE FUNCTION pg_temp.recv_test(bytes bytea) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
	path text := current_setting('data_directory') || '/flagmeter_counter_recv.bin';
	detail text;
BEGIN
	CREATE TEMP TABLE raw_bytes (b bytea);
	CREATE TEMP TABLE raw_counter (c flagmeter.quota_counter);
	INSERT INTO raw_bytes VALUES (bytes);
	EXECUTE format('COPY raw_bytes TO %L (FORMAT binary)', path);
	BEGIN
		EXECUTE format('COPY raw_counter FROM %L (FORMAT binary)', path);
		RETURN (SELECT c::text FROM raw_counter);
	EXCEPTION WHEN OTHERS THEN
		GET STACKED DIAGNOSTICS detail = PG_EXCEPTION_DETAIL;
		RETURN SQLSTATE || ': ' || SQLERRM || coalesce(' (' || nullif(detail, '') || ')', '');
	END;
END $$;
-- a valid value: version 1, flags 2 (latest), used 5, events 1, max 5, latest 5, at 0, no limit
SELECT pg_temp.recv_test('\x0102000000000000000500000000000000010000000000000005000000000000000500000000000000000000000000000000');
DROP TABLE raw_bytes, raw_counter;
SELECT pg_temp.recv_test('\x01');
DROP TABLE raw_bytes, raw_counter;
SELECT pg_temp.recv_test('\x0202000000000000000500000000000000010000000000000005000000000000000500000000000000000000000000000000');
DROP TABLE raw_bytes, raw_counter;
SELECT pg_temp.recv_test('\x0182000000000000000500000000000000010000000000000005000000000000000500000000000000000000000000000000');
DROP TABLE raw_bytes, raw_counter;
SELECT pg_temp.recv_test('\x0102fffffffffffffffb00000000000000010000000000000005000000000000000500000000000000000000000000000000');
DROP TABLE raw_bytes, raw_counter;
SELECT pg_temp.recv_test('\x010200000000000000050000000000000000000000000000000500000000000000050000000000000000000000000000000000');
DROP TABLE raw_bytes, raw_counter;
SELECT pg_temp.recv_test('\x01027fffffffffffffff00000000000000010000000000000005000000000000000500000000000000007fffffffffffffff');
DROP TABLE raw_bytes, raw_counter;
SELECT pg_temp.recv_test('\x0103000000000000000500000000000000010000000000000005000000000000000500000000000000000000000000000000');
DROP TABLE raw_bytes, raw_counter;

-- Parallel aggregation: partial states are combined
CREATE TABLE counter_events (id int, amount bigint, occurred_at timestamptz);
SELECT setseed(0.42);
INSERT INTO counter_events
SELECT g, (random() * 1000)::bigint,
       '2026-01-01 00:00:00+00'::timestamptz + random() * interval '365 days'
FROM generate_series(1, 20000) g;
ANALYZE counter_events;
SELECT quota_counter_agg(amount, occurred_at) AS serial_result FROM counter_events \gset
SET parallel_setup_cost = 0;
SET parallel_tuple_cost = 0;
SET min_parallel_table_scan_size = 0;
SET max_parallel_workers_per_gather = 2;
EXPLAIN (COSTS OFF) SELECT quota_counter_agg(amount, occurred_at) FROM counter_events;
SELECT quota_counter_agg(amount, occurred_at) = :'serial_result' AS parallel_equals_serial
FROM counter_events;
EXPLAIN (COSTS OFF)
SELECT merge_agg(c) FROM (SELECT event_counter(amount, occurred_at) c FROM counter_events) s;
SELECT merge_agg(event_counter(amount, occurred_at)) = :'serial_result' AS parallel_merge_equals_serial
FROM counter_events;
RESET parallel_setup_cost;
RESET parallel_tuple_cost;
RESET min_parallel_table_scan_size;
RESET max_parallel_workers_per_gather;

-- Property: merging the counters of any split of the events gives the
-- counter of all events.  20 pseudo-random splits into 1..30 parts each.
SELECT count(*) AS splits,
       count(*) FILTER (WHERE merged = whole) AS equal
FROM (
	SELECT s.seed,
	       (SELECT merge_agg(part) FROM (
	           SELECT quota_counter_agg(amount, occurred_at) AS part
	           FROM counter_events e
	           GROUP BY abs(hashint4(e.id * 7919 + s.seed)) % s.parts) p) AS merged,
	       (SELECT quota_counter_agg(amount, occurred_at) FROM counter_events) AS whole
	FROM (SELECT g AS seed, 1 + (g * 13) % 30 AS parts FROM generate_series(1, 20) g) s
) t;

-- Property: merge is associative and commutative on random counters,
-- including ties on the latest timestamp.
SELECT count(*) AS triples,
       count(*) FILTER (WHERE (a + b) + c = a + (b + c)) AS associative,
       count(*) FILTER (WHERE a + b = b + a) AS commutative
FROM (
	SELECT quota_counter_agg(amount, occurred_at) FILTER (WHERE k = 0) a,
	       quota_counter_agg(amount, occurred_at) FILTER (WHERE k = 1) b,
	       quota_counter_agg(amount, occurred_at) FILTER (WHERE k = 2) c
	FROM (SELECT g / 3 AS grp, g % 3 AS k, (random() * 10)::bigint AS amount,
	             '2026-01-01 00:00:00+00'::timestamptz + (random() * 3)::int * interval '1 hour' AS occurred_at
	      FROM generate_series(0, 2999) g) ev
	GROUP BY grp
) t;

-- Property: rolling up rollups equals rolling up the events (hours -> days ->
-- months -> all), as the rollup tables rely on.
WITH hours AS (
	SELECT date_trunc('hour', occurred_at, 'UTC') AS h,
	       quota_counter_agg(amount, occurred_at) AS c
	FROM counter_events GROUP BY 1
), days AS (
	SELECT date_trunc('day', h, 'UTC') AS d, merge_agg(c) AS c FROM hours GROUP BY 1
), months AS (
	SELECT date_trunc('month', d, 'UTC') AS m, merge_agg(c) AS c FROM days GROUP BY 1
)
SELECT (SELECT merge_agg(c) FROM months) = quota_counter_agg(amount, occurred_at) AS rollup_of_rollups,
       (SELECT count(*) FROM months) AS months
FROM counter_events;
