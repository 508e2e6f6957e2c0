-- flagmeter 0.2.0 -> 0.3.0: distinct counts (CHANGELOG.md).
-- What sql/parts changed between the two, in install order: meters may
-- have the aggregation 'unique'; the distinct counts' part
-- (43_unique_values.sql) whole; the functions that delete, recount, keep
-- and chart usage learn about its tables; the privileges of the new calls.
-- Roles given a layout with grant_access before the update get the new
-- calls by running grant_access again.

\echo Use "ALTER EXTENSION flagmeter UPDATE TO '0.3.0'" to load this file. \quit

-- 30_catalog.sql
ALTER TABLE flagmeter.meters DROP CONSTRAINT meters_aggregation_valid;
ALTER TABLE flagmeter.meters ADD CONSTRAINT meters_aggregation_valid
	CHECK (aggregation OPERATOR(pg_catalog.=) ANY (ARRAY['sum', 'count', 'max', 'latest', 'unique']));
COMMENT ON TABLE flagmeter.meters IS
'what is counted; aggregation says which figure of the counter is "used": sum of amounts, count of events, max amount, latest amount, or the number of distinct values (unique); draws and rate make a meter draw from a credit pool';

CREATE OR REPLACE FUNCTION flagmeter.define_meter(meter text, aggregation text DEFAULT 'sum', unit text DEFAULT NULL,
	draws text DEFAULT NULL, rate numeric DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	e_state text; e_message text; e_detail text; e_hint text;	-- the error, raised again
	current_aggregation text;
BEGIN
	PERFORM flagmeter.check_name('meter', meter);
	IF aggregation IS NULL THEN
		RAISE EXCEPTION 'aggregation must not be NULL' USING ERRCODE = 'null_value_not_allowed';
	END IF;
	IF NOT aggregation = ANY (ARRAY['sum', 'count', 'max', 'latest', 'unique']) THEN
		RAISE EXCEPTION 'invalid aggregation "%"', left(aggregation, 64)
			USING ERRCODE = 'invalid_parameter_value',
			      HINT = 'Valid aggregations are "sum", "count", "max", "latest" and "unique".';
	END IF;
	IF length(unit) > 63 THEN
		RAISE EXCEPTION 'unit is too long' USING ERRCODE = 'string_data_right_truncation',
			DETAIL = 'A unit is at most 63 characters.';
	END IF;
	PERFORM flagmeter.check_pool(meter, aggregation, draws, rate);
	IF draws IS NOT NULL THEN
		rate := trim_scale(COALESCE(rate, 1));
	END IF;
	-- The counters keep every figure, but "used" of the current periods,
	-- their blocks and thresholds would change meaning at once: refused.
	SELECT m.aggregation INTO current_aggregation FROM flagmeter.meters m
	WHERE m.meter = define_meter.meter;
	IF current_aggregation IS NOT NULL AND current_aggregation <> aggregation
	   AND flagmeter.meter_has_usage(meter) THEN
		RAISE EXCEPTION 'cannot change the aggregation of meter "%" from "%" to "%"',
			meter, current_aggregation, aggregation
			USING ERRCODE = 'object_in_use',
			      DETAIL = 'The meter has recorded usage, which would be read differently at once.',
			      HINT = 'Define a new meter, or drop this one with its usage first: '
			             'flagmeter.drop_meter(meter, force => true).';
	END IF;
	INSERT INTO flagmeter.meters AS m (meter, aggregation, unit, draws, rate)
	VALUES (define_meter.meter, define_meter.aggregation, define_meter.unit,
	        define_meter.draws, define_meter.rate)
	ON CONFLICT ON CONSTRAINT meters_pkey DO UPDATE
		SET aggregation = EXCLUDED.aggregation, unit = EXCLUDED.unit,
		    draws = EXCLUDED.draws, rate = EXCLUDED.rate;
EXCEPTION WHEN OTHERS THEN	-- without the CONTEXT of the helpers (raise_plain)
	GET STACKED DIAGNOSTICS e_state = RETURNED_SQLSTATE, e_message = MESSAGE_TEXT,
	                        e_detail = PG_EXCEPTION_DETAIL, e_hint = PG_EXCEPTION_HINT;
	PERFORM flagmeter.raise_plain(e_state, e_message, e_detail, e_hint);
END $$;
COMMENT ON FUNCTION flagmeter.define_meter(text, text, text, text, numeric) IS
'defines a meter (aggregation sum, count, max, latest or unique: distinct values) or changes its unit, its pool, or its aggregation while it has no recorded usage; draws names a sum meter (the pool) that every unit of this one also uses rate units of (default 1), decided all or nothing with it';

CREATE OR REPLACE FUNCTION flagmeter.delete_usage(tenant text, meter text)
RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	e_state text; e_message text; e_detail text; e_hint text;	-- the error, raised again
BEGIN
	IF (tenant IS NULL) = (meter IS NULL) THEN
		RAISE EXCEPTION 'delete_usage takes a tenant or a meter' USING ERRCODE = 'invalid_parameter_value';
	END IF;
	LOCK TABLE flagmeter.counters IN SHARE ROW EXCLUSIVE MODE;
	DELETE FROM flagmeter.counters c WHERE c.tenant = delete_usage.tenant OR c.meter = delete_usage.meter;
	PERFORM flagmeter.pending_drop(tenant, meter, NULL);
	DELETE FROM flagmeter.events e WHERE e.tenant = delete_usage.tenant OR e.meter = delete_usage.meter;
	DELETE FROM flagmeter.rollup_hour h WHERE h.tenant = delete_usage.tenant OR h.meter = delete_usage.meter;
	DELETE FROM flagmeter.rollup_day d WHERE d.tenant = delete_usage.tenant OR d.meter = delete_usage.meter;
	DELETE FROM flagmeter.event_keys k WHERE k.tenant = delete_usage.tenant OR k.meter = delete_usage.meter;
	DELETE FROM flagmeter.voids v WHERE v.tenant = delete_usage.tenant OR v.meter = delete_usage.meter;
	DELETE FROM flagmeter.unique_values u WHERE u.tenant = delete_usage.tenant OR u.meter = delete_usage.meter;
	DELETE FROM flagmeter.value_sightings s WHERE s.tenant = delete_usage.tenant OR s.meter = delete_usage.meter;
EXCEPTION WHEN OTHERS THEN	-- without the CONTEXT of the helpers (raise_plain)
	GET STACKED DIAGNOSTICS e_state = RETURNED_SQLSTATE, e_message = MESSAGE_TEXT,
	                        e_detail = PG_EXCEPTION_DETAIL, e_hint = PG_EXCEPTION_HINT;
	PERFORM flagmeter.raise_plain(e_state, e_message, e_detail, e_hint);
END $$;
COMMENT ON FUNCTION flagmeter.delete_usage(text, text) IS
'deletes everything recorded for a tenant or for a meter (counters, events, rollups, idempotency keys, voids, distinct values), after the transactions recording usage; for unassign_tenant(forget_usage) and drop_meter';

-- 40_usage.sql
CREATE OR REPLACE FUNCTION flagmeter.recount_current_period(tenant text, meter text)
RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	cfg record;
	b record;
BEGIN
	-- No usage yet (the common case: a tenant assigned at signup): nothing
	-- to recount, and no reason to pause anyone's ingest.  A track of this
	-- tenant in flight right now counts in the period its occurred_at had
	-- under the old boundaries.
	IF NOT EXISTS (SELECT FROM flagmeter.counters c
	               WHERE c.tenant = recount_current_period.tenant
	                 AND c.meter = recount_current_period.meter)
	   AND NOT flagmeter.has_pending_events(tenant, meter) THEN
		RETURN;
	END IF;
	LOCK TABLE flagmeter.counters IN SHARE ROW EXCLUSIVE MODE;
	SELECT * INTO cfg FROM flagmeter.limit_config(tenant, meter);
	IF NOT FOUND THEN
		RETURN;
	END IF;
	SELECT * INTO b FROM flagmeter.period_bounds(now(), cfg.period, cfg.anchor, cfg.timezone);

	DELETE FROM flagmeter.counters c
	WHERE c.tenant = recount_current_period.tenant AND c.meter = recount_current_period.meter
	  AND c.period_start = b.period_start;
	IF cfg.aggregation = 'unique' THEN
		-- its events include values forgotten since (voided without a key)
		PERFORM flagmeter.recount_unique_values(tenant, meter, b.period_start, b.period_end);
		RETURN;
	END IF;

	INSERT INTO flagmeter.counters (tenant, meter, period_start, stripe, counter)
	SELECT recount_current_period.tenant, recount_current_period.meter, b.period_start, 0,
	       flagmeter.quota_counter_agg(e.amount, e.occurred_at)
	FROM flagmeter.events e
	WHERE e.tenant = recount_current_period.tenant AND e.meter = recount_current_period.meter
	  AND e.occurred_at >= b.period_start AND e.occurred_at < b.period_end
	  -- the period's usage still pending (src/pending*.c) stays pending
	  AND NOT (e.period_start IS NOT NULL AND e.period_start = b.period_start
	           AND e.xid >= flagmeter.xid_int(flagmeter.counted_through()))
	  AND NOT EXISTS (SELECT FROM flagmeter.event_keys k
	                  WHERE k.tenant = e.tenant AND k.idempotency_key = e.idempotency_key
	                    AND k.meter = e.meter AND k.voided_at IS NOT NULL)
	HAVING count(*) > 0;
END $$;

-- 43_unique_values.sql
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

-- 50_maintenance.sql
CREATE OR REPLACE FUNCTION flagmeter.maintain(
	OUT events_folded bigint, OUT voids_folded bigint,
	OUT partitions_created integer, OUT partitions_dropped integer,
	OUT keys_expired bigint, OUT periods_compacted bigint,
	OUT duration interval)
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	started timestamptz := clock_timestamp();
	low xid8;
	high xid8;
	counted_low xid8;
	counted xid8;
	cluster bigint;
	cutoff timestamptz;
BEGIN
	-- One run at a time: a concurrent run waits here, then starts from the
	-- watermark this one leaves.
	INSERT INTO flagmeter.maintenance_state (system_identifier)
	SELECT c.system_identifier FROM pg_control_system() c
	ON CONFLICT ON CONSTRAINT maintenance_state_pkey DO NOTHING;
	SELECT m.folded_through, m.system_identifier INTO low, cluster
	FROM flagmeter.maintenance_state m FOR UPDATE;

	-- Transaction ids only mean something in the cluster that assigned them.
	IF cluster IS DISTINCT FROM (SELECT c.system_identifier FROM pg_control_system() c) THEN
		RAISE EXCEPTION 'flagmeter''s usage was folded in another cluster'
			USING ERRCODE = 'object_not_in_prerequisite_state',
			      DETAIL = 'The data was restored from a dump or copied from another cluster; '
			               'the fold watermark refers to that cluster''s transaction ids.',
			      HINT = 'Run SELECT flagmeter.after_restore() once, before tracking resumes.';
	END IF;
	-- Every transaction with an id below the xmin has ended.
	high := pg_snapshot_xmin(pg_current_snapshot());

	IF high > low THEN
		SELECT f.events_folded, f.voids_folded INTO events_folded, voids_folded
		FROM flagmeter.fold_band(low, high) f;
	ELSE
		high := low;
		events_folded := 0;
		voids_folded := 0;
	END IF;

	-- Pending usage into the counter rows, before compaction reads them.
	SELECT m.counted_through INTO counted_low FROM flagmeter.maintenance_state m;
	IF flagmeter.pending_in_memory() THEN
		counted := flagmeter.fold_pending();
	ELSIF pg_snapshot_xmin(pg_current_snapshot()) > counted_low THEN
		counted := pg_snapshot_xmin(pg_current_snapshot());
		PERFORM flagmeter.fold_pending_events(counted_low, counted);
		PERFORM flagmeter.pending_events_folded();
	END IF;
	IF counted > counted_low THEN
		UPDATE flagmeter.maintenance_state SET counted_through = counted;
	END IF;

	cutoff := now() - (SELECT s.retention FROM flagmeter.current_settings s);
	DELETE FROM flagmeter.event_keys k WHERE k.recorded_at < cutoff;
	GET DIAGNOSTICS keys_expired = ROW_COUNT;
	DELETE FROM flagmeter.voids v WHERE v.voided_at < cutoff AND v.xid < high;
	DELETE FROM flagmeter.reservations r WHERE r.expires_at < cutoff;
	DELETE FROM flagmeter.rollovers r WHERE r.expires_at < cutoff;
	-- the sets of unique meters' periods and their sightings, like events
	DELETE FROM flagmeter.unique_values u WHERE u.period_end < cutoff;
	DELETE FROM flagmeter.value_sightings s WHERE s.day < (cutoff AT TIME ZONE 'UTC')::date;

	periods_compacted := flagmeter.compact_counters();
	PERFORM flagmeter.summarize_event_partitions();

	-- Tenants blocked in periods that have ended are unblocked, and app
	-- instances that missed notifications (queue too full) are told to
	-- resync; both announce at commit.
	PERFORM flagmeter.review_blocks();
	-- the unused quota of periods that have ended, as credit grants
	PERFORM flagmeter.roll_over();
	PERFORM flagmeter.announce_expired_grants();
	PERFORM flagmeter.send_resync_hint();
	-- A threshold row is what makes a threshold announced once per period:
	-- it goes only when its period has surely ended (the longest periods
	-- but lifetime last a year); lifetime thresholds stay.
	-- Events skipped under backpressure stay until a hint announced them.
	DELETE FROM flagmeter.outbox o
	WHERE o.created_at < cutoff
	  AND (o.kind <> 'threshold' OR o.period_start < cutoff - interval '1 year 1 day')
	  AND (o.notified OR o.version <= (SELECT m.resync_sent_through FROM flagmeter.maintenance_state m));
	DELETE FROM flagmeter.notification_skips k WHERE k.skipped_at < cutoff;

	-- Near the end: a track that writes a stripe being merged waits for
	-- the commit.  Before the partitions, which hold inserts until then
	-- (and give up on a lock after 50 ms rather than wait for such a track).
	periods_compacted := periods_compacted + flagmeter.merge_idle_stripes(low);

	-- Last, since they hold table locks until the commit that follows.
	partitions_created := flagmeter.create_partitions();
	partitions_dropped := flagmeter.drop_expired_partitions(high);

	duration := clock_timestamp() - started;
	UPDATE flagmeter.maintenance_state m
	SET folded_through = high,
	    runs = m.runs + 1,
	    last_run_at = started,
	    last_run_duration = maintain.duration,
	    last_run_folded = maintain.events_folded,
	    total_folded = m.total_folded + maintain.events_folded,
	    total_voids_folded = m.total_voids_folded + maintain.voids_folded;
END $$;

-- 60_dashboard.sql
CREATE OR REPLACE FUNCTION flagmeter.series(tenant text, meter text, "from" timestamptz, "to" timestamptz,
	bucket text, timezone text)
RETURNS TABLE (bucket_start timestamptz, used bigint, counter flagmeter.quota_counter)
LANGUAGE plpgsql STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	aggregation text;
	step interval;
	first_bucket timestamptz;
	watermark xid8 := (SELECT m.folded_through FROM flagmeter.current_state m);
BEGIN
	PERFORM flagmeter.check_meter_exists(meter);
	SELECT m.aggregation INTO aggregation FROM flagmeter.meters m WHERE m.meter = series.meter;
	IF "from" IS NULL OR "to" IS NULL OR NOT isfinite("from") OR NOT isfinite("to") THEN
		RAISE EXCEPTION 'from and to must be finite timestamps' USING ERRCODE = 'invalid_parameter_value';
	END IF;
	IF bucket IS NULL OR NOT bucket = ANY (ARRAY['minute', 'hour', 'day', 'week', 'month']) THEN
		RAISE EXCEPTION 'invalid bucket "%"', left(bucket, 64) USING ERRCODE = 'invalid_parameter_value',
			HINT = 'Valid buckets are "minute", "hour", "day", "week" and "month".';
	END IF;
	PERFORM flagmeter.check_timezone(timezone);	-- a zone name, NULL refused
	IF "to" <= "from" THEN
		RETURN;
	END IF;
	IF "to" - "from" > interval '3660 days' THEN
		RAISE EXCEPTION 'a series spans at most ten years' USING ERRCODE = 'program_limit_exceeded';
	END IF;
	step := ('1 ' || bucket)::interval;
	first_bucket := date_trunc(bucket, "from", timezone);
	IF aggregation = 'unique' THEN
		RETURN QUERY SELECT * FROM flagmeter.unique_series(tenant, meter, first_bucket, "to", bucket, timezone);
		RETURN;
	END IF;
	IF bucket = 'minute' THEN
		IF "to" - "from" > interval '7 days' THEN
			RAISE EXCEPTION 'a series of minute buckets spans at most 7 days' USING ERRCODE = 'program_limit_exceeded',
				HINT = 'Use hour buckets for longer series.';
		END IF;
		-- raw events recorded before the cut-off may be gone (drop_expired_partitions)
		IF first_bucket < now() - (SELECT s.retention FROM flagmeter.current_settings s) THEN
			RAISE EXCEPTION 'minute buckets reach back only as far as the retention'
				USING ERRCODE = 'invalid_parameter_value',
				DETAIL = 'Minute buckets are counted from the raw events, which are kept only for the retention (flagmeter.current_settings).',
				HINT = 'Use hour buckets for older usage.';
		END IF;
	END IF;

	RETURN QUERY
	WITH buckets AS (
		-- local-time steps, so day and month buckets follow DST and month lengths
		SELECT (s.local_start AT TIME ZONE timezone) AS b
		FROM generate_series(first_bucket AT TIME ZONE timezone,
		                     ("to" - interval '1 microsecond') AT TIME ZONE timezone,
		                     step) AS s(local_start)
	), folded AS (
		SELECT date_trunc(bucket, r.bucket_start, timezone) AS b, r.counter
		FROM flagmeter.rollup_hour r
		WHERE bucket <> 'minute' AND (bucket = 'hour' OR timezone <> 'UTC')
		  AND (series.tenant IS NULL OR r.tenant = series.tenant) AND r.meter = series.meter
		  AND r.bucket_start >= first_bucket AND r.bucket_start < "to"
		UNION ALL
		SELECT date_trunc(bucket, r.bucket_start, timezone), r.counter
		FROM flagmeter.rollup_day r
		WHERE bucket <> ALL (ARRAY['minute', 'hour']) AND timezone = 'UTC'
		  AND (series.tenant IS NULL OR r.tenant = series.tenant) AND r.meter = series.meter
		  AND r.bucket_start >= first_bucket AND r.bucket_start < "to"
		UNION ALL
		SELECT date_trunc(bucket, e.occurred_at, timezone),
		       flagmeter.event_counter(e.amount, e.occurred_at)
		FROM flagmeter.events e
		WHERE bucket <> 'minute'
		  AND (series.tenant IS NULL OR e.tenant = series.tenant) AND e.meter = series.meter
		  AND e.occurred_at >= first_bucket AND e.occurred_at < "to"
		  AND e.xid >= flagmeter.xid_int(watermark)
		UNION ALL
		-- minute buckets: every raw event, one aggregate per minute
		SELECT date_trunc('minute', e.occurred_at, timezone),
		       flagmeter.quota_counter_agg(e.amount, e.occurred_at)
		FROM flagmeter.events e
		WHERE bucket = 'minute'
		  AND (series.tenant IS NULL OR e.tenant = series.tenant) AND e.meter = series.meter
		  AND e.occurred_at >= first_bucket AND e.occurred_at < "to"
		GROUP BY 1
	), pending_voids AS (
		-- the voids the rollups read do not hold yet (minute buckets: every void)
		SELECT date_trunc(bucket, v.occurred_at, timezone) AS b, sum(v.amount)::bigint AS amount, count(*) AS n
		FROM (SELECT v.occurred_at, v.amount FROM flagmeter.voids v
		      WHERE bucket <> 'minute' AND v.xid >= watermark
		        AND (series.tenant IS NULL OR v.tenant = series.tenant) AND v.meter = series.meter
		      UNION ALL
		      SELECT v.occurred_at, v.amount FROM flagmeter.voids v
		      WHERE bucket = 'minute'
		        AND (series.tenant IS NULL OR v.tenant = series.tenant) AND v.meter = series.meter) v
		WHERE v.occurred_at >= first_bucket AND v.occurred_at < "to"
		GROUP BY 1
	), merged AS (
		SELECT f.b, flagmeter.merge_agg(f.counter) AS counter FROM folded f GROUP BY f.b
	), net AS (
		SELECT m.b, CASE WHEN p.n IS NULL THEN m.counter
		                 ELSE flagmeter.subtract_events(m.counter, p.amount, p.n) END AS counter
		FROM merged m LEFT JOIN pending_voids p ON p.b = m.b
	)
	SELECT k.b,
	       COALESCE(flagmeter.used_by(n.counter, aggregation), 0),
	       COALESCE(n.counter, 'used=0 events=0 max=0'::flagmeter.quota_counter)
	FROM buckets k
	LEFT JOIN net n ON n.b = k.b
	ORDER BY k.b;
END $$;

-- 75_shards.sql
CREATE OR REPLACE FUNCTION flagmeter.forget_partition(partitions integer, partition integer)
RETURNS bigint
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	tbl text;
	n bigint;
	deleted bigint := 0;
BEGIN
	IF NOT flagmeter.is_fenced(partitions, partition) THEN
		RAISE EXCEPTION 'partition % of % is not fenced', partition, partitions
			USING ERRCODE = 'object_not_in_prerequisite_state',
			      HINT = 'Fence it with flagmeter.fence_partition() and copy its tenants to their new shard first.';
	END IF;
	-- every table with a tenant column (the regression test shards lists them)
	FOREACH tbl IN ARRAY ARRAY['events', 'voids', 'counters', 'event_keys', 'rollup_hour', 'rollup_day',
	                           'unique_values', 'value_sightings',
	                           'blocked', 'outbox', 'reservations', 'rollovers', 'credit_grants', 'credit_accounts',
	                           'overrides',
	                           'feature_overrides', 'tenants']
	LOOP
		IF tbl = 'overrides' THEN
			PERFORM flagmeter.unfence_partition(partitions, partition);
		END IF;
		EXECUTE format('DELETE FROM flagmeter.%I r WHERE flagmeter.partition_of(r.tenant, $1) = $2', tbl)
			USING partitions, partition;
		GET DIAGNOSTICS n = ROW_COUNT;
		deleted := deleted + n;
	END LOOP;
	RETURN deleted;
END $$;

-- 80_security.sql
REVOKE ALL ON FUNCTION flagmeter.track_value(text, text, text, timestamptz) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.consume_value(text, text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.forget_value(text, text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.recount_unique_values(text, text, timestamptz, timestamptz) FROM PUBLIC;
-- the layouts name the new calls and tables
CREATE OR REPLACE FUNCTION flagmeter.access_privileges(access text)
RETURNS TABLE (privilege text, object text)
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	config_tables text[] := ARRAY['flagmeter.meters', 'flagmeter.tenants', 'flagmeter.limits',
	                              'flagmeter.overrides', 'flagmeter.rate_limits',
	                              'flagmeter.rate_overrides'];
	-- entitlements and tenant_features read these with the caller's privileges
	feature_tables text[] := ARRAY['flagmeter.features', 'flagmeter.plan_features',
	                               'flagmeter.feature_overrides'];
BEGIN
	IF access IS NULL THEN
		RAISE EXCEPTION 'access must not be NULL' USING ERRCODE = 'null_value_not_allowed';
	END IF;
	IF NOT access = ANY (ARRAY['request', 'listener', 'dashboard', 'admin']) THEN
		RAISE EXCEPTION 'invalid access "%"', left(access, 64) USING ERRCODE = 'invalid_parameter_value',
			HINT = 'Valid accesses are "request", "listener", "dashboard" and "admin".';
	END IF;
	privilege := 'USAGE'; object := 'SCHEMA flagmeter';
	RETURN NEXT;
	IF access = 'request' THEN
		-- the calls run their statements as the owner: no table privilege
		RETURN QUERY SELECT 'EXECUTE', 'FUNCTION ' || f FROM unnest(ARRAY[
			'flagmeter.track(text, text, bigint, timestamptz, text)',
			'flagmeter.track(text, text, bigint, text, text)',
			'flagmeter.track_batch(text[], text[], bigint[], timestamptz[], text[])',
			'flagmeter.consume(text, text, bigint, text)',
			'flagmeter.consume(text, text, text, text)',
			'flagmeter.consume(text, text[], bigint[], text)',
			'flagmeter.check(text, text, bigint)',
			'flagmeter.usage(text, text, timestamptz)',
			'flagmeter.void(text, text)',
			'flagmeter.track_value(text, text, text, timestamptz)',
			'flagmeter.consume_value(text, text, text)',
			'flagmeter.forget_value(text, text, text)',
			'flagmeter.track_events(text[], text[], bigint[], timestamptz[], text[])',
			'flagmeter.consume_batch(text[], text[], bigint[], text[], integer[])',
			'flagmeter.has_feature(text, text)',
			'flagmeter.feature_config(text, text)',
			'flagmeter.balance(text, text)',
			'flagmeter.reserve(text, text, bigint, interval, text)',
			'flagmeter.settle(bigint, bigint)',
			'flagmeter.release(bigint)',
			'flagmeter.limit(text, bigint, interval, bigint, bigint)',
			'flagmeter.limit_batch(text[], bigint[], interval[], bigint[], bigint[])']) f;
	ELSIF access = 'listener' THEN
		-- step 2 of the client protocol reads blocked and effective_limits,
		-- latest_version() and changes_since() read the outbox; a client
		-- caching features reads a tenant's overrides and its plan's rows
		RETURN QUERY SELECT 'SELECT', 'TABLE ' || t FROM unnest(ARRAY[
			'flagmeter.outbox', 'flagmeter.blocked', 'flagmeter.effective_limits'] || config_tables
			|| feature_tables) t;
	ELSIF access = 'dashboard' THEN
		RETURN QUERY SELECT 'EXECUTE', 'FUNCTION flagmeter.usage(text, text, timestamptz)';
		RETURN QUERY SELECT 'SELECT', 'TABLE ' || t FROM unnest(ARRAY[
			'flagmeter.status', 'flagmeter.effective_limits', 'flagmeter.stats',
			'flagmeter.current_state', 'flagmeter.current_settings', 'flagmeter.rollup_hour', 'flagmeter.rollup_day',
			'flagmeter.events', 'flagmeter.voids', 'flagmeter.value_sightings', 'flagmeter.tenant_features',
			'flagmeter.entitlements', 'flagmeter.grants'] || config_tables || feature_tables) t;
	ELSE
		-- the catalog functions are PL/pgSQL run as the caller; recounts,
		-- unassign_tenant(forget_usage) and drop_meter(force) rewrite usage
		RETURN QUERY SELECT 'EXECUTE', 'FUNCTION ' || f FROM unnest(ARRAY[
			'flagmeter.define_meter(text, text, text, text, numeric)',
			'flagmeter.define_plan(text)',
			'flagmeter.set_limit(text, text, bigint, text, text, integer[], integer, bigint, integer)',
			'flagmeter.store_limit(text, text, bigint, text, text, integer[], integer, bigint, integer)',
			'flagmeter.announce_limit(text, text)',
			'flagmeter.assign_plan(text, text, timestamptz, text)',
			'flagmeter.override_limit(text, text, bigint, text, text, integer[])',
			'flagmeter.drop_override(text, text)',
			'flagmeter.set_rate_limit(text, text, bigint, interval, bigint)',
			'flagmeter.override_rate_limit(text, text, bigint, interval, bigint)',
			'flagmeter.store_rate_limit(text, text, text, bigint, interval, bigint)',
			'flagmeter.drop_rate_limit(text, text)',
			'flagmeter.drop_rate_override(text, text)',
			'flagmeter.delete_rate_limit(text, text, text)',
			'flagmeter.announce_rate_limit(text, text, text)',
			'flagmeter.define_feature(text, text)',
			'flagmeter.set_feature(text, text, boolean, jsonb)',
			'flagmeter.store_feature(text, text, boolean, jsonb)',
			'flagmeter.announce_plan_feature(text, text)',
			'flagmeter.override_feature(text, text, boolean, jsonb)',
			'flagmeter.drop_feature_override(text, text)',
			'flagmeter.unassign_tenant(text, boolean)',
			'flagmeter.drop_plan(text, boolean)',
			'flagmeter.drop_meter(text, boolean)',
			'flagmeter.delete_usage(text, text)',
			'flagmeter.recount_current_period(text, text)',
			'flagmeter.recount_unique_values(text, text, timestamptz, timestamptz)',
			'flagmeter.review_blocks(text, text, text)',
			'flagmeter.review_usage(text, text)',
			'flagmeter.apply_limit_changes(jsonb)',
			'flagmeter.announce(text, text, text, text, timestamptz, bigint, bigint, text, text, integer[])',
			'flagmeter.announce_feature(text, text, text, boolean, jsonb)',
			'flagmeter.usage(text, text, timestamptz)',
			'flagmeter.grant_credits(text, text, bigint, timestamptz, integer, timestamptz, text, integer)',
			'flagmeter.void_grant(bigint)']) f;
		-- grant_credits and void_grant write the grants with the caller's privileges
		RETURN QUERY SELECT 'SELECT, INSERT, UPDATE', 'TABLE ' || t FROM unnest(ARRAY[
			'flagmeter.credit_accounts', 'flagmeter.credit_grants']) t;
		RETURN QUERY SELECT 'USAGE', 'SEQUENCE flagmeter.credit_grant_id';
		RETURN QUERY SELECT 'SELECT, INSERT, UPDATE, DELETE', 'TABLE ' || t FROM unnest(ARRAY[
			'flagmeter.plans', 'flagmeter.counters', 'flagmeter.pending_limit_changes',
			'flagmeter.unique_values'] || config_tables || feature_tables) t;
		RETURN QUERY SELECT 'SELECT, DELETE', 'TABLE ' || t FROM unnest(ARRAY[
			'flagmeter.events', 'flagmeter.event_keys', 'flagmeter.voids', 'flagmeter.rollup_hour',
			'flagmeter.rollup_day', 'flagmeter.outbox', 'flagmeter.value_sightings']) t;
		RETURN QUERY SELECT 'SELECT', 'TABLE ' || t FROM unnest(ARRAY[
			'flagmeter.blocked', 'flagmeter.effective_limits', 'flagmeter.grants',
			'flagmeter.rollovers']) t;
	END IF;
END $$;
