-- ---------------------------------------------------------------------------
-- Dashboard and operator views: status, usage_series, top_tenants, stats.
-- They read the counters and the rollups (plus the events not folded yet),
-- never all raw events, so a dashboard over a year stays fast.
-- ---------------------------------------------------------------------------

CREATE VIEW flagmeter.status AS
SELECT l.tenant, l.meter, b.period_start, b.period_end,
       flagmeter.used_by(u.counter, l.aggregation) AS used,
       l.quota,
       GREATEST(l.quota - flagmeter.used_by(u.counter, l.aggregation), 0) AS remaining,
       flagmeter.used_by(u.counter, l.aggregation)::double precision / l.quota AS ratio,
       CASE
           WHEN flagmeter.used_by(u.counter, l.aggregation) >= l.quota THEN 'exceeded'
           WHEN flagmeter.used_by(u.counter, l.aggregation) * 100 >= l.quota * l.thresholds[1] THEN 'warning'
           ELSE 'ok'
       END AS state,
       l.mode, l.period, l.plan
FROM flagmeter.effective_limits l
CROSS JOIN LATERAL flagmeter.period_bounds(now(), l.period, l.anchor, l.timezone) b
CROSS JOIN LATERAL (SELECT flagmeter.usage(l.tenant, l.meter) AS counter) u;
COMMENT ON VIEW flagmeter.status IS
'one row per tenant and limited meter for the current period: used, quota, remaining, ratio, and state (ok below the lowest threshold, warning from it, exceeded once used >= quota); exact';

-- The status of one tenant, as a call that takes the tenant first: what a
-- PL/Proxy proxy routes to the tenant's shard (a view cannot be routed).
CREATE FUNCTION flagmeter.status(tenant text)
RETURNS SETOF flagmeter.status
LANGUAGE sql STABLE PARALLEL SAFE
AS $$
SELECT s.* FROM flagmeter.status s WHERE s.tenant OPERATOR(pg_catalog.=) $1 ORDER BY s.meter
$$;
COMMENT ON FUNCTION flagmeter.status(text) IS
'the rows of the status view for one tenant, by meter';

CREATE FUNCTION flagmeter.top_tenants(meter text, n integer DEFAULT 10, by text DEFAULT 'used')
RETURNS SETOF flagmeter.status
LANGUAGE plpgsql STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	PERFORM flagmeter.check_meter_exists(meter);
	IF n IS NULL OR n < 1 THEN
		RAISE EXCEPTION 'n must be a positive number of tenants' USING ERRCODE = 'invalid_parameter_value';
	END IF;
	IF by IS NULL OR NOT by = ANY (ARRAY['used', 'ratio']) THEN
		RAISE EXCEPTION 'invalid ranking "%"', left(by, 64) USING ERRCODE = 'invalid_parameter_value',
			HINT = 'Rank by "used" or by "ratio".';
	END IF;
	RETURN QUERY
	SELECT s.* FROM flagmeter.status s
	WHERE s.meter = top_tenants.meter
	ORDER BY CASE WHEN by = 'used' THEN s.used::double precision ELSE s.ratio END DESC, s.tenant
	LIMIT n;
END $$;
COMMENT ON FUNCTION flagmeter.top_tenants(text, integer, text) IS
'the n tenants with a limit on the meter that use the most in their current period, ranked by used or by ratio';

-- The usage of one tenant (NULL: of all tenants together) and meter per
-- bucket, zero buckets included: the body of usage_series and
-- usage_series_all.  Folded usage comes from the rollups (hourly for hour
-- buckets and for time zones other than UTC, daily otherwise); events not
-- folded yet are added from the raw events above the watermark.  Minute
-- buckets are finer than any rollup: they are counted from the raw events
-- alone, folded or not, less every void, so they reach back only as far as
-- the retention keeps raw events (and voids), and span at most a week
-- (10 080 buckets) to keep a mistaken call from reading months of events.
-- The tenant test is "IS NULL OR =": the plans of a call for one tenant are
-- custom plans with that test folded, so they keep the primary-key scans.
CREATE FUNCTION flagmeter.series(tenant text, meter text, "from" timestamptz, "to" timestamptz,
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
COMMENT ON FUNCTION flagmeter.series(text, text, timestamptz, timestamptz, text, text) IS
'usage of a tenant (NULL: all tenants) and meter per bucket: the body of usage_series and usage_series_all';

CREATE FUNCTION flagmeter.usage_series(tenant text, meter text, "from" timestamptz, "to" timestamptz,
	bucket text DEFAULT 'day', timezone text DEFAULT 'UTC')
RETURNS TABLE (bucket_start timestamptz, used bigint, counter flagmeter.quota_counter)
LANGUAGE plpgsql STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	PERFORM flagmeter.check_tenant(tenant);
	RETURN QUERY SELECT * FROM flagmeter.series(tenant, meter, "from", "to", bucket, timezone);
END $$;
COMMENT ON FUNCTION flagmeter.usage_series(text, text, timestamptz, timestamptz, text, text) IS
'usage of a tenant and meter per minute, hour, day, week (from Monday) or month bucket (in the given time zone) from "from" up to "to", zero buckets included; includes events not folded yet; minute buckets from the raw events, within the retention and at most 7 days';

CREATE FUNCTION flagmeter.usage_series_all(meter text, "from" timestamptz, "to" timestamptz,
	bucket text DEFAULT 'day', timezone text DEFAULT 'UTC')
RETURNS TABLE (bucket_start timestamptz, used bigint, counter flagmeter.quota_counter)
LANGUAGE sql STABLE PARALLEL SAFE
AS $$
SELECT * FROM flagmeter.series(NULL, $1, $2, $3, $4, $5)
$$;
COMMENT ON FUNCTION flagmeter.usage_series_all(text, timestamptz, timestamptz, text, text) IS
'usage of all tenants together of a meter per minute, hour, day, week or month bucket, like usage_series: counter merges every tenant''s events of the bucket';

