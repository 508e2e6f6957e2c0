-- ---------------------------------------------------------------------------
-- Distinct counts: meters of aggregation 'unique' (monthly active users,
-- seats, distinct API keys), whose usage in a period is the number of
-- distinct values recorded in it (src/unique_values.c).
--
--   unique_values    each period's set of values, one row per value, as
--                    the first 128 bits of its SHA-256: the primary key
--                    decides "new in this period?", so concurrent writers
--                    of one new value count it once.  A new value is one
--                    event of amount 1 (the counters hold the count: check
--                    never counts rows); a forgotten one takes it back.
--   value_sightings  which values were seen on which UTC day (and in which
--                    period), for usage_series: a day's, week's or
--                    month's distinct count is a count of distinct hashes
--                    over its days.
--
-- Both are kept as long as the events are (the retention): a set until
-- its period has ended that long ago, a sighting until its day has.  A
-- lifetime period's set stays.  docs/design.md, "Distinct counts".
-- ---------------------------------------------------------------------------

CREATE TABLE flagmeter.unique_values (
	tenant			text NOT NULL,
	meter			text NOT NULL,
	period_start	timestamptz NOT NULL,
	value_hash		uuid NOT NULL,
	-- the time of the event of amount 1 that counted the value (forget_value
	-- takes it back from the period and the rollup bucket of that time)
	counted_at		timestamptz NOT NULL,
	period_end		timestamptz NOT NULL,
	PRIMARY KEY (tenant, meter, period_start, value_hash)
);
-- retention deletes by period_end; rows arrive roughly in period order
CREATE INDEX unique_values_period_end ON flagmeter.unique_values USING brin (period_end)
	WITH (autosummarize = on);
COMMENT ON TABLE flagmeter.unique_values IS
'the distinct values of each period of a unique meter, by tenant: one row per value (the first 128 bits of its SHA-256), the count itself kept in the counters';

CREATE TABLE flagmeter.value_sightings (
	tenant			text NOT NULL,
	meter			text NOT NULL,
	day				date NOT NULL,
	period_start	timestamptz NOT NULL,
	value_hash		uuid NOT NULL,
	PRIMARY KEY (tenant, meter, day, period_start, value_hash)
);
CREATE INDEX value_sightings_day ON flagmeter.value_sightings USING brin (day)
	WITH (autosummarize = on);
COMMENT ON TABLE flagmeter.value_sightings IS
'which values of a unique meter were seen on which UTC day (and in which period): what usage_series counts distinct values per day, week or month from';

SELECT pg_catalog.pg_extension_config_dump('flagmeter.unique_values', '');
SELECT pg_catalog.pg_extension_config_dump('flagmeter.value_sightings', '');

CREATE FUNCTION flagmeter.track_value(tenant text, meter text, value text,
	occurred_at timestamptz DEFAULT now())
RETURNS boolean
AS 'MODULE_PATHNAME', 'fm_track_value'
LANGUAGE C VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE;
COMMENT ON FUNCTION flagmeter.track_value(text, text, text, timestamptz) IS
'records that value (1 to 1024 bytes) was seen at occurred_at on a unique meter: true when it was new in its period (usage up by one), false when counted already; never refused by the limit';

CREATE FUNCTION flagmeter.consume_value(tenant text, meter text, value text)
RETURNS flagmeter.decision
AS 'MODULE_PATHNAME', 'fm_consume_value'
LANGUAGE C VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE;
COMMENT ON FUNCTION flagmeter.consume_value(text, text, text) IS
'granted when value is counted in the current period already, or when one more value fits the limit and the rate limit (then it is counted); refused at a hard limit (quota_exceeded), recording nothing';

CREATE FUNCTION flagmeter.forget_value(tenant text, meter text, value text)
RETURNS boolean
AS 'MODULE_PATHNAME', 'fm_forget_value'
LANGUAGE C VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE;
COMMENT ON FUNCTION flagmeter.forget_value(text, text, text) IS
'frees value in the current period of a unique meter (a seat given up): true when it was counted there and the usage went down by one; earlier periods keep their counts';

-- A unique meter's current period after its boundaries moved (a plan,
-- period, anchor or time zone change; recount_current_period): the values
-- counted within the new bounds move from the sets of the periods they
-- were counted in (periods of the configuration before) into its set, once
-- each, and its counter is their number.  Moved, not copied: a value
-- forgotten since it was counted must not come back from an older set when
-- the configuration changes back.  A value seen in the new bounds but first
-- counted before them is counted again when it is next seen.
CREATE FUNCTION flagmeter.recount_unique_values(tenant text, meter text,
	period_start timestamptz, period_end timestamptz)
RETURNS void
LANGUAGE sql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
WITH moved AS (
	DELETE FROM flagmeter.unique_values v
	WHERE v.tenant OPERATOR(pg_catalog.=) $1 AND v.meter OPERATOR(pg_catalog.=) $2
	  AND v.period_start OPERATOR(pg_catalog.<>) $3
	  AND v.counted_at OPERATOR(pg_catalog.>=) $3 AND v.counted_at OPERATOR(pg_catalog.<) $4
	RETURNING v.value_hash, v.counted_at
)
INSERT INTO flagmeter.unique_values AS u (tenant, meter, period_start, value_hash, counted_at, period_end)
SELECT DISTINCT ON (m.value_hash) $1, $2, $3, m.value_hash, m.counted_at, $4
FROM moved m
ORDER BY m.value_hash, m.counted_at
ON CONFLICT DO NOTHING;

-- the set's own rows, from when the period had other bounds
UPDATE flagmeter.unique_values v SET period_end = $4
WHERE v.tenant OPERATOR(pg_catalog.=) $1 AND v.meter OPERATOR(pg_catalog.=) $2
  AND v.period_start OPERATOR(pg_catalog.=) $3 AND v.period_end OPERATOR(pg_catalog.<>) $4;

INSERT INTO flagmeter.counters (tenant, meter, period_start, stripe, counter)
SELECT $1, $2, $3, 0, flagmeter.quota_counter_agg(1, v.counted_at)
FROM flagmeter.unique_values v
WHERE v.tenant OPERATOR(pg_catalog.=) $1 AND v.meter OPERATOR(pg_catalog.=) $2
  AND v.period_start OPERATOR(pg_catalog.=) $3
HAVING count(*) OPERATOR(pg_catalog.>) 0;
$$;
COMMENT ON FUNCTION flagmeter.recount_unique_values(text, text, timestamptz, timestamptz) IS
'rebuilds the set and the counter of a unique meter''s period [period_start, period_end) from the values counted within it, moved from the sets they were in (recount_current_period, after the counters of that period were deleted)';

-- usage_series of a unique meter (series()): distinct values per day, week
-- or month bucket in UTC, counted from the sightings.  Finer buckets and
-- other time zones would need sightings per hour; a day is what the table
-- keeps, so they are refused rather than answered wrong.
CREATE FUNCTION flagmeter.unique_series(tenant text, meter text, first_bucket timestamptz,
	"to" timestamptz, bucket text, timezone text)
RETURNS TABLE (bucket_start timestamptz, used bigint, counter flagmeter.quota_counter)
LANGUAGE plpgsql STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	IF bucket NOT IN ('day', 'week', 'month') OR timezone <> 'UTC' THEN
		RAISE EXCEPTION 'usage of unique meter "%" is counted in day, week and month buckets in UTC', meter
			USING ERRCODE = 'feature_not_supported',
			      DETAIL = 'A unique meter keeps which values were seen on which UTC day.',
			      HINT = 'Ask for bucket => ''day'' (or week, month) and timezone => ''UTC''.';
	END IF;
	IF first_bucket < now() - (SELECT s.retention FROM flagmeter.current_settings s) THEN
		RAISE EXCEPTION 'the distinct values of a unique meter reach back only as far as the retention'
			USING ERRCODE = 'invalid_parameter_value',
			      DETAIL = 'Which values were seen on a day is kept for the retention (flagmeter.current_settings).',
			      HINT = 'Start the series later, or read a past period''s count with flagmeter.usage(tenant, meter, at).';
	END IF;
	RETURN QUERY
	WITH buckets AS (
		SELECT s.b FROM generate_series(first_bucket, "to" - interval '1 microsecond',
		                                ('1 ' || bucket)::interval) AS s(b)
	), counted AS (
		-- each value once per bucket (once per tenant and bucket over all
		-- tenants), as an event of amount 1 on the last day it was seen
		SELECT d.b, count(*) AS n, flagmeter.quota_counter_agg(1, d.seen) AS counter
		FROM (SELECT date_trunc(bucket, v.day::timestamp) AT TIME ZONE 'UTC' AS b,
		             max(v.day)::timestamp AT TIME ZONE 'UTC' AS seen
		      FROM flagmeter.value_sightings v
		      WHERE (unique_series.tenant IS NULL OR v.tenant = unique_series.tenant)
		        AND v.meter = unique_series.meter
		        AND v.day >= (first_bucket AT TIME ZONE 'UTC')::date
		        AND v.day <= (("to" - interval '1 microsecond') AT TIME ZONE 'UTC')::date
		      GROUP BY 1, v.tenant, v.value_hash) d
		GROUP BY d.b
	)
	SELECT k.b, COALESCE(c.n, 0), COALESCE(c.counter, 'used=0 events=0 max=0'::flagmeter.quota_counter)
	FROM buckets k LEFT JOIN counted c ON c.b = k.b
	ORDER BY k.b;
END $$;
COMMENT ON FUNCTION flagmeter.unique_series(text, text, timestamptz, timestamptz, text, text) IS
'distinct values of a unique meter per day, week or month bucket in UTC, of a tenant (NULL: all tenants, a value counted once per tenant): the body of usage_series for unique meters';
