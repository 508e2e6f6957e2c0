-- ---------------------------------------------------------------------------
-- Maintenance: folding raw events into rollups, partitions and retention,
-- compaction of closed periods, scheduling with pg_cron, operator stats.
--
-- maintain() does it all, in one transaction:
--   1. fold: events (and voids) whose transaction id lies in
--      [folded_through, snapshot xmin) go into the hourly and daily rollups.
--      Every transaction below the xmin has ended, so a band is complete
--      when it is folded, whatever order the transactions committed in;
--      nothing is folded twice because the watermark moves in the same
--      transaction, under the lock of the state row.
--   2. idempotency keys and voids older than the retention are deleted;
--   3. the stripes of periods that have ended are merged into one row,
--      and near the end of the run the idle track stripes of every period
--      into its merged stripe (merge_idle_stripes);
--      tenants blocked in ended periods are unblocked; the unused quota of
--      ended periods rolls over into credit grants (roll_over()); a resync hint goes
--      out for notifications skipped under backpressure; old outbox rows
--      are deleted;
--   4. partitions for the coming days are created; partitions older than
--      the retention whose events are all folded are dropped.
-- It never waits for a lock that track holds and never makes track wait,
-- except: a late event for a period that has ended waits for the end of
-- the run when its stripes are being compacted, so does a track that
-- writes a stripe idle for a minute at the moment the run merges it, and
-- dropping an expired partition (once a day) holds inserts for the last
-- moment of the run.
-- ---------------------------------------------------------------------------

-- The two single-row tables below get their row on first use, not from
-- this script: they are dumped with pg_dump (pg_extension_config_dump), and
-- a row inserted here would collide with the dumped one on restore.

CREATE TABLE flagmeter.settings (
	singleton			boolean PRIMARY KEY DEFAULT true CONSTRAINT settings_singleton CHECK (singleton),
	retention			interval NOT NULL DEFAULT '90 days'
		CONSTRAINT settings_retention_positive CHECK (retention OPERATOR(pg_catalog.>=) '1 day'::interval),
	partitions_ahead	integer NOT NULL DEFAULT 3
		CONSTRAINT settings_partitions_ahead_range
		CHECK (partitions_ahead OPERATOR(pg_catalog.>=) 1 AND partitions_ahead OPERATOR(pg_catalog.<=) 60),
	-- what the calls do for a tenant never assigned a plan: meter it without
	-- limit, or refuse the call (QT001); read by the calls from their cached
	-- configuration (src/limit_lookup.c), hence the trigger below
	unassigned_tenants	text NOT NULL DEFAULT 'refuse'
		CONSTRAINT settings_unassigned_tenants_valid
		CHECK (unassigned_tenants OPERATOR(pg_catalog.=) ANY (ARRAY['unlimited', 'refuse'])),
	-- the window of event times track, track_batch and track_events accept
	-- (QT002 outside it): occurred_at from now() - late_events to now() +
	-- future_events; cached by the calls like unassigned_tenants
	late_events			interval NOT NULL DEFAULT '35 days'
		CONSTRAINT settings_late_events_range
		CHECK (late_events OPERATOR(pg_catalog.>=) '0'::interval
		       AND late_events OPERATOR(pg_catalog.<=) '1000 years'::interval),
	future_events		interval NOT NULL DEFAULT '5 minutes'
		CONSTRAINT settings_future_events_range
		CHECK (future_events OPERATOR(pg_catalog.>=) '0'::interval
		       AND future_events OPERATOR(pg_catalog.<=) '1000 years'::interval)
);
COMMENT ON TABLE flagmeter.settings IS
'settings of maintain() and of the calls when changed from the defaults (see flagmeter.configure and flagmeter.current_settings)';
SELECT pg_catalog.pg_extension_config_dump('flagmeter.settings', '');
-- the calls cache unassigned_tenants and the event window with the limits:
-- a change empties the caches
CREATE TRIGGER settings_changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON flagmeter.settings
	FOR EACH STATEMENT EXECUTE FUNCTION flagmeter.config_changed();

CREATE VIEW flagmeter.current_settings AS
SELECT COALESCE(s.retention, '90 days'::interval) AS retention,
       COALESCE(s.partitions_ahead, 3) AS partitions_ahead,
       COALESCE(s.unassigned_tenants, 'refuse') AS unassigned_tenants,
       COALESCE(s.late_events, '35 days'::interval) AS late_events,
       COALESCE(s.future_events, '5 minutes'::interval) AS future_events
FROM (VALUES (true)) AS one(singleton)
LEFT JOIN flagmeter.settings s ON s.singleton;
COMMENT ON VIEW flagmeter.current_settings IS
'the settings in force: retention of raw events, idempotency keys, voids and outbox rows (the idempotency window), how many daily partitions to create ahead, what the calls do for a tenant never assigned a plan (refuse or unlimited), and the window of event times track, track_batch and track_events accept (late_events before and future_events after now())';

CREATE FUNCTION flagmeter.configure(retention interval DEFAULT NULL, partitions_ahead integer DEFAULT NULL,
	unassigned_tenants text DEFAULT NULL, late_events interval DEFAULT NULL,
	future_events interval DEFAULT NULL)
RETURNS flagmeter.current_settings
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	result flagmeter.current_settings;
BEGIN
	IF retention IS NOT NULL AND retention < interval '1 day' THEN
		RAISE EXCEPTION 'retention must be at least one day: %', retention
			USING ERRCODE = 'invalid_parameter_value';
	END IF;
	IF partitions_ahead IS NOT NULL AND (partitions_ahead < 1 OR partitions_ahead > 60) THEN
		RAISE EXCEPTION 'partitions_ahead must be between 1 and 60: %', partitions_ahead
			USING ERRCODE = 'invalid_parameter_value';
	END IF;
	IF unassigned_tenants IS NOT NULL AND NOT unassigned_tenants = ANY (ARRAY['unlimited', 'refuse']) THEN
		RAISE EXCEPTION 'invalid unassigned_tenants "%"', left(unassigned_tenants, 64)
			USING ERRCODE = 'invalid_parameter_value',
			      HINT = 'Valid values are "unlimited" (metered without limit) and "refuse".';
	END IF;
	IF late_events IS NOT NULL AND (late_events < interval '0' OR late_events > interval '1000 years') THEN
		RAISE EXCEPTION 'late_events must be between 0 and 1000 years: %', late_events
			USING ERRCODE = 'invalid_parameter_value',
			      HINT = 'To accept any event time, set a large window: late_events => ''100 years''.';
	END IF;
	IF future_events IS NOT NULL AND (future_events < interval '0' OR future_events > interval '1000 years') THEN
		RAISE EXCEPTION 'future_events must be between 0 and 1000 years: %', future_events
			USING ERRCODE = 'invalid_parameter_value',
			      HINT = 'To accept any event time, set a large window: future_events => ''100 years''.';
	END IF;
	INSERT INTO flagmeter.settings AS s (retention, partitions_ahead, unassigned_tenants, late_events,
		future_events)
	SELECT COALESCE(configure.retention, c.retention), COALESCE(configure.partitions_ahead, c.partitions_ahead),
	       COALESCE(configure.unassigned_tenants, c.unassigned_tenants),
	       COALESCE(configure.late_events, c.late_events), COALESCE(configure.future_events, c.future_events)
	FROM flagmeter.current_settings c
	ON CONFLICT ON CONSTRAINT settings_pkey DO UPDATE
		SET retention = EXCLUDED.retention, partitions_ahead = EXCLUDED.partitions_ahead,
		    unassigned_tenants = EXCLUDED.unassigned_tenants, late_events = EXCLUDED.late_events,
		    future_events = EXCLUDED.future_events;
	SELECT * INTO result FROM flagmeter.current_settings;
	RETURN result;
END $$;
COMMENT ON FUNCTION flagmeter.configure(interval, integer, text, interval, interval) IS
'changes the settings (NULL keeps a setting): retention, partitions_ahead, unassigned_tenants (refuse, the default: calls for a tenant never assigned a plan fail with QT001; unlimited: it is metered without limit), late_events and future_events (track, track_batch and track_events refuse with QT002 an occurred_at earlier than now() - late_events or later than now() + future_events; 0 to 1000 years each); returns the settings in force';

CREATE TABLE flagmeter.maintenance_state (
	singleton			boolean PRIMARY KEY DEFAULT true CONSTRAINT maintenance_state_singleton CHECK (singleton),
	system_identifier	bigint,
	folded_through		xid8 NOT NULL DEFAULT '0',
	counted_through		xid8 NOT NULL DEFAULT '0',
	runs				bigint NOT NULL DEFAULT 0,
	last_run_at			timestamptz,
	last_run_duration	interval,
	last_run_folded		bigint NOT NULL DEFAULT 0,
	total_folded		bigint NOT NULL DEFAULT 0,
	total_voids_folded	bigint NOT NULL DEFAULT 0,
	resync_sent_through	bigint NOT NULL DEFAULT 0,
	resync_sent_at		timestamptz
);
COMMENT ON TABLE flagmeter.maintenance_state IS
'where folding stands (events with xid below folded_through are in the rollups; xids of the cluster system_identifier), counters of maintain() runs, and the outbox version up to which a resync hint went out';
SELECT pg_catalog.pg_extension_config_dump('flagmeter.maintenance_state', '');

-- The state, as readers see it before maintain() first ran.
CREATE VIEW flagmeter.current_state AS
SELECT COALESCE(m.folded_through, '0'::xid8) AS folded_through,
       COALESCE(m.runs, 0) AS runs, m.last_run_at, m.last_run_duration,
       COALESCE(m.last_run_folded, 0) AS last_run_folded,
       COALESCE(m.total_folded, 0) AS total_folded,
       COALESCE(m.total_voids_folded, 0) AS total_voids_folded,
       COALESCE(m.resync_sent_through, 0) AS resync_sent_through,
       m.resync_sent_at,
       m.system_identifier,
       COALESCE(m.counted_through, '0'::xid8) AS counted_through
FROM (VALUES (true)) AS one(singleton)
LEFT JOIN flagmeter.maintenance_state m ON m.singleton;
COMMENT ON VIEW flagmeter.current_state IS
'maintenance_state with its defaults before the first maintain()';

CREATE TABLE flagmeter.rollup_hour (
	tenant		text NOT NULL,
	meter		text NOT NULL,
	bucket_start timestamptz NOT NULL,
	counter		flagmeter.quota_counter NOT NULL,
	PRIMARY KEY (tenant, meter, bucket_start)
);
COMMENT ON TABLE flagmeter.rollup_hour IS
'folded usage per tenant, meter and UTC hour (the hour of occurred_at)';

CREATE TABLE flagmeter.rollup_day (
	tenant		text NOT NULL,
	meter		text NOT NULL,
	bucket_start timestamptz NOT NULL,
	counter		flagmeter.quota_counter NOT NULL,
	PRIMARY KEY (tenant, meter, bucket_start)
);
COMMENT ON TABLE flagmeter.rollup_day IS
'folded usage per tenant, meter and UTC day (the day of occurred_at)';

SELECT pg_catalog.pg_extension_config_dump('flagmeter.rollup_hour', '');
SELECT pg_catalog.pg_extension_config_dump('flagmeter.rollup_day', '');

-- Retention deletes by age: BRIN indexes cost next to nothing on append-only
-- tables.
CREATE INDEX event_keys_recorded_at ON flagmeter.event_keys USING brin (recorded_at);
CREATE INDEX voids_voided_at ON flagmeter.voids USING brin (voided_at);

-- Partitions ---------------------------------------------------------------------

-- Creates the daily partitions of events for the partitions_ahead days after
-- today (UTC); returns how many it created.  Never today's: an insert that
-- had already chosen the default partition for today's rows when the new
-- partition was attached would then fail its partition check, so a day is
-- attached only while no event can be recorded for it yet.  Attaching must
-- lock the default partition, which takes events only on days without a
-- partition (the day flagmeter is installed): the lock is asked with NOWAIT
-- so that ingest never queues behind it, and a busy default partition means
-- "try again next run".  Each partition is made as a table and then
-- attached, which does not block inserts into the other partitions.
CREATE FUNCTION flagmeter.create_partitions()
RETURNS integer
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	ahead integer := (SELECT s.partitions_ahead FROM flagmeter.current_settings s);
	today timestamptz := date_trunc('day', now(), 'UTC');
	day timestamptz;
	name text;
	lower_bound text;
	upper_bound text;
	created integer := 0;
BEGIN
	IF NOT EXISTS (
		SELECT FROM generate_series(1, ahead) i
		WHERE to_regclass('flagmeter.events_p'
		                  || to_char((today + make_interval(days => i)) AT TIME ZONE 'UTC', 'YYYYMMDD')) IS NULL)
	THEN
		RETURN 0;
	END IF;
	BEGIN
		LOCK TABLE flagmeter.events_default IN ACCESS EXCLUSIVE MODE NOWAIT;
	EXCEPTION WHEN lock_not_available THEN
		RETURN 0;
	END;

	FOR i IN 1..ahead LOOP
		day := today + make_interval(days => i);
		name := 'events_p' || to_char(day AT TIME ZONE 'UTC', 'YYYYMMDD');
		CONTINUE WHEN to_regclass('flagmeter.' || quote_ident(name)) IS NOT NULL;
		CONTINUE WHEN EXISTS (SELECT FROM flagmeter.events_default d
		                      WHERE d.recorded_at >= day
		                        AND d.recorded_at < day + interval '1 day');
		lower_bound := to_char(day AT TIME ZONE 'UTC', 'YYYY-MM-DD') || ' 00:00:00+00';
		upper_bound := to_char((day + interval '1 day') AT TIME ZONE 'UTC', 'YYYY-MM-DD') || ' 00:00:00+00';
		EXECUTE format('CREATE TABLE flagmeter.%I (LIKE flagmeter.events INCLUDING DEFAULTS)', name);
		PERFORM flagmeter.index_event_partition(('flagmeter.' || quote_ident(name))::regclass);
		EXECUTE format('ALTER TABLE flagmeter.events ATTACH PARTITION flagmeter.%I FOR VALUES FROM (%L) TO (%L)',
		               name, lower_bound, upper_bound);
		created := created + 1;
	END LOOP;
	RETURN created;
END $$;
COMMENT ON FUNCTION flagmeter.create_partitions() IS
'creates the daily partitions of flagmeter.events for the days after today (settings.partitions_ahead); returns how many it created (0 when the default partition is busy: the next run tries again)';

-- Drops the daily partitions that ended before the retention cut-off and hold
-- no event still to fold.  Dropping a partition locks events exclusively
-- until the end of the transaction (maintain() does it last): inserts wait
-- for that moment, and when the lock is not had within 50 ms the partition
-- is left for the next run rather than stalling ingest longer.
CREATE FUNCTION flagmeter.drop_expired_partitions(folded_through xid8)
RETURNS integer
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	cutoff timestamptz := now() - (SELECT s.retention FROM flagmeter.current_settings s);
	part record;
	unfolded boolean;
	saved_timeout text := current_setting('lock_timeout');
	dropped integer := 0;
BEGIN
	FOR part IN
		SELECT c.oid::regclass AS rel, c.relname,
		       to_date(substr(c.relname, 9), 'YYYYMMDD')::timestamp AT TIME ZONE 'UTC' AS day
		FROM pg_inherits i
		JOIN pg_class c ON c.oid = i.inhrelid
		WHERE i.inhparent = 'flagmeter.events'::regclass
		  AND c.relname ~ '^events_p[0-9]{8}$'
		ORDER BY c.relname
	LOOP
		CONTINUE WHEN part.day + interval '1 day' > cutoff;
		EXECUTE format('SELECT EXISTS (SELECT FROM %s WHERE xid >= $1)', part.rel)
			INTO unfolded USING flagmeter.xid_int(folded_through);
		CONTINUE WHEN unfolded;
		BEGIN
			PERFORM set_config('lock_timeout', '50ms', true);
			EXECUTE format('DROP TABLE %s', part.rel);
			PERFORM set_config('lock_timeout', saved_timeout, true);
			dropped := dropped + 1;
		EXCEPTION WHEN lock_not_available THEN
			RAISE NOTICE 'partition % is busy; it will be dropped by a later run', part.relname;
		END;
	END LOOP;
	-- events that went to the default partition age out row by row
	DELETE FROM flagmeter.events_default d WHERE d.recorded_at < cutoff AND d.xid < flagmeter.xid_int(folded_through);
	RETURN dropped;
END $$;
COMMENT ON FUNCTION flagmeter.drop_expired_partitions(xid8) IS
'drops daily partitions of flagmeter.events older than the retention whose events are all folded; returns how many';

-- Folding ---------------------------------------------------------------------------

-- Folds the events and voids of transactions in [low, high) into the rollups.
CREATE FUNCTION flagmeter.fold_band(low xid8, high xid8, OUT events_folded bigint, OUT voids_folded bigint)
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	WITH band AS (
		SELECT e.tenant, e.meter, date_trunc('hour', e.occurred_at, 'UTC') AS hour,
		       flagmeter.quota_counter_agg(e.amount, e.occurred_at) AS counter
		FROM flagmeter.events e
		WHERE e.xid >= flagmeter.xid_int(low) AND e.xid < flagmeter.xid_int(high)
		GROUP BY 1, 2, 3
	), hours AS (
		INSERT INTO flagmeter.rollup_hour AS r (tenant, meter, bucket_start, counter)
		SELECT b.tenant, b.meter, b.hour, b.counter FROM band b
		ON CONFLICT (tenant, meter, bucket_start) DO UPDATE
			SET counter = r.counter OPERATOR(flagmeter.+) EXCLUDED.counter
	), days AS (
		INSERT INTO flagmeter.rollup_day AS r (tenant, meter, bucket_start, counter)
		SELECT b.tenant, b.meter, date_trunc('day', b.hour, 'UTC'), flagmeter.merge_agg(b.counter)
		FROM band b GROUP BY 1, 2, 3
		ON CONFLICT (tenant, meter, bucket_start) DO UPDATE
			SET counter = r.counter OPERATOR(flagmeter.+) EXCLUDED.counter
	)
	SELECT COALESCE(sum(flagmeter.events(b.counter)), 0) INTO events_folded FROM band b;

	-- Voids come after events: a void's transaction started after its
	-- event committed, so its event is folded in this band or before.
	WITH band AS (
		SELECT v.tenant, v.meter, date_trunc('hour', v.occurred_at, 'UTC') AS hour,
		       sum(v.amount)::bigint AS amount, count(*) AS n
		FROM flagmeter.voids v
		WHERE v.xid >= low AND v.xid < high
		GROUP BY 1, 2, 3
	), hours AS (
		UPDATE flagmeter.rollup_hour r
		SET counter = flagmeter.subtract_events(r.counter, b.amount, b.n)
		FROM band b
		WHERE r.tenant = b.tenant AND r.meter = b.meter AND r.bucket_start = b.hour
	), days AS (
		UPDATE flagmeter.rollup_day r
		SET counter = flagmeter.subtract_events(r.counter, d.amount, d.n)
		FROM (SELECT b.tenant, b.meter, date_trunc('day', b.hour, 'UTC') AS day,
		             sum(b.amount)::bigint AS amount, sum(b.n)::bigint AS n
		      FROM band b GROUP BY 1, 2, 3) d
		WHERE r.tenant = d.tenant AND r.meter = d.meter AND r.bucket_start = d.day
	)
	SELECT COALESCE(sum(b.n), 0) INTO voids_folded FROM band b;
END $$;
COMMENT ON FUNCTION flagmeter.fold_band(xid8, xid8) IS
'folds the events and voids of the transactions with ids in [low, high) into rollup_hour and rollup_day';

-- Summarizes the page ranges of the events' xid (BRIN) indexes that have no
-- summary yet, so that the next fold reads only the pages written after this
-- run rather than every page since autovacuum last summarized (autosummarize
-- asks autovacuum to, but it gets there when it gets there).  An index whose
-- table is busy (VACUUM, ANALYZE, CREATE INDEX) is left for the next run.
CREATE FUNCTION flagmeter.summarize_event_partitions()
RETURNS integer
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	idx regclass;
	ranges integer := 0;
	saved_timeout text := current_setting('lock_timeout');
BEGIN
	FOR idx IN
		SELECT i.indexrelid::regclass
		FROM pg_inherits h
		JOIN pg_index i ON i.indrelid = h.inhrelid
		JOIN pg_class c ON c.oid = i.indexrelid
		WHERE h.inhparent = 'flagmeter.events'::regclass
		  AND c.relam = (SELECT a.oid FROM pg_am a WHERE a.amname = 'brin')
	LOOP
		BEGIN
			PERFORM set_config('lock_timeout', '50ms', true);
			ranges := ranges + brin_summarize_new_values(idx);
			PERFORM set_config('lock_timeout', saved_timeout, true);
		EXCEPTION WHEN lock_not_available THEN
			NULL;
		END;
	END LOOP;
	RETURN ranges;
END $$;
COMMENT ON FUNCTION flagmeter.summarize_event_partitions() IS
'summarizes the new page ranges of the events'' xid indexes (maintain() calls it after folding); returns how many';

-- Turns the rows of each period that has ended (more than a minute ago)
-- into its stripe 0 alone: the stripes merged into one row, and a lone
-- track stripe moved there, so that the period leaves the index
-- counters_track_stripes, where this and merge_idle_stripes() look for
-- work.  Open periods are left alone: their stripes are what keeps
-- concurrent writers apart, and there are at most stripes + 1 of them.
-- Lifetime periods (period_start -infinity) never end.  A period one of
-- whose rows a transaction holds (a void, a late event) is left for the
-- next run: its rows are locked without waiting first, since a DELETE that
-- waited for them could deadlock with a void, which locks the track stripes
-- in stripe order and stripe 0 last.
--
-- jit is off here and in merge_idle_stripes: the planner costs the search
-- for work by the open periods it may visit (a limit lookup each), so at
-- about 10 000 of them it JIT-compiled a query that finds nothing in half a
-- millisecond: 95 ms of a run spent compiling, in every fresh session.
CREATE FUNCTION flagmeter.compact_counters()
RETURNS bigint
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
DECLARE
	g record;
	merged flagmeter.quota_counter;
	compacted bigint := 0;
	nrows bigint;
	nlocked bigint;
BEGIN
	FOR g IN
		SELECT s.tenant, s.meter, s.period_start
		FROM (SELECT c.tenant, c.meter, c.period_start
		      FROM flagmeter.counters c
		      WHERE c.stripe > 0
		        AND c.period_start > '-infinity' AND c.period_start < now() - interval '1 hour'
		      GROUP BY 1, 2, 3) s,
		     LATERAL flagmeter.limit_config(s.tenant, s.meter) cfg
		WHERE (flagmeter.period_bounds(s.period_start, cfg.period, cfg.anchor, cfg.timezone)).period_end
		      <= now() - interval '1 minute'
		LIMIT 10000
	LOOP
		SELECT count(*) INTO nrows FROM flagmeter.counters c
		WHERE c.tenant = g.tenant AND c.meter = g.meter AND c.period_start = g.period_start;
		SELECT count(*) INTO nlocked FROM (
			SELECT FROM flagmeter.counters c
			WHERE c.tenant = g.tenant AND c.meter = g.meter AND c.period_start = g.period_start
			FOR UPDATE SKIP LOCKED) l;
		CONTINUE WHEN nlocked < nrows;

		WITH moved AS (
			DELETE FROM flagmeter.counters c
			WHERE c.tenant = g.tenant AND c.meter = g.meter AND c.period_start = g.period_start
			RETURNING c.counter)
		SELECT flagmeter.merge_agg(moved.counter) INTO merged FROM moved;
		INSERT INTO flagmeter.counters (tenant, meter, period_start, stripe, counter)
		VALUES (g.tenant, g.meter, g.period_start, 0, merged);
		compacted := compacted + 1;
	END LOOP;
	RETURN compacted;
END $$;
COMMENT ON FUNCTION flagmeter.compact_counters() IS
'turns the counter rows of each period that has ended into its stripe 0 alone; returns how many periods it compacted';

-- Merges the idle track stripes of every period, open ones included, into
-- the period's merged stripe (32767), so that a read of a tenant whose
-- concurrent writers have gone merges about as many rows as it has writers
-- now, not as many as it ever had at once.  Idle: last written by a
-- transaction below written_before (maintain() passes where the previous
-- run's fold stopped, a minute or more ago) and held by no transaction
-- (locked without waiting).
--
-- No track writes the merged stripe (theirs are 1 .. 2 * flagmeter.stripes,
-- at most 2048), so no REPEATABLE READ track finds it changed after its
-- snapshot; one whose own stripe was merged after its snapshot inserts the
-- row again (and sets recheck_at on the version it wrote, src/track_alerts.h).
-- A track that writes a stripe at the moment a run merges it (it took the
-- stripe's tag, or it is its own stripe, then found the row locked) waits
-- for the end of that run, which is why maintain() calls this near its end.
-- Stripe 0 stays: usage moved into the row consume decides on would be
-- counted twice by a consume that read the track stripes in its snapshot
-- (spec void_consume_race).
CREATE FUNCTION flagmeter.merge_idle_stripes(written_before xid8)
RETURNS bigint
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
SET jit = off	-- see compact_counters
AS $$
DECLARE
	merged_stripe CONSTANT smallint := 32767;
	-- age(xmin) > span: written by a transaction below written_before
	span bigint := flagmeter.xid_int(pg_current_xact_id()) - flagmeter.xid_int(written_before);
	g record;
	locked tid[];
	merged flagmeter.quota_counter;
	has_merged_row boolean;
	periods bigint := 0;
BEGIN
	IF written_before IS NULL OR written_before = '0'::xid8 OR span <= 0 THEN
		RETURN 0;
	END IF;
	FOR g IN
		SELECT c.tenant, c.meter, c.period_start
		FROM flagmeter.counters c
		WHERE c.stripe > 0 AND (c.stripe = merged_stripe OR age(c.xmin) > span)
		GROUP BY 1, 2, 3
		HAVING count(*) > 1
		LIMIT 10000
	LOOP
		SELECT array_agg(l.ctid), bool_or(l.stripe = merged_stripe), flagmeter.merge_agg(l.counter)
		INTO locked, has_merged_row, merged
		FROM (SELECT c.ctid, c.stripe, c.counter FROM flagmeter.counters c
		      WHERE c.tenant = g.tenant AND c.meter = g.meter AND c.period_start = g.period_start
		        AND c.stripe > 0 AND (c.stripe = merged_stripe OR age(c.xmin) > span)
		      FOR UPDATE SKIP LOCKED) l;
		CONTINUE WHEN coalesce(cardinality(locked), 0) < 2;
		-- a merged row held by a void: left for the next run
		CONTINUE WHEN NOT has_merged_row AND EXISTS (
			SELECT FROM flagmeter.counters c
			WHERE c.tenant = g.tenant AND c.meter = g.meter AND c.period_start = g.period_start
			  AND c.stripe = merged_stripe);

		DELETE FROM flagmeter.counters c
		WHERE c.ctid = ANY (locked) AND c.stripe <> merged_stripe;
		IF has_merged_row THEN
			UPDATE flagmeter.counters c SET counter = merged, recheck_at = NULL, recheck_for = NULL
			WHERE c.ctid = ANY (locked) AND c.stripe = merged_stripe;
		ELSE
			INSERT INTO flagmeter.counters (tenant, meter, period_start, stripe, counter)
			VALUES (g.tenant, g.meter, g.period_start, merged_stripe, merged);
		END IF;
		periods := periods + 1;
	END LOOP;
	RETURN periods;
END $$;
COMMENT ON FUNCTION flagmeter.merge_idle_stripes(xid8) IS
'merges the track stripes of each period that no transaction holds and that were last written below written_before into its merged stripe (32767); returns how many periods it merged';

-- Pending usage (src/pending*.c): track's amounts that no counter row holds
-- yet, in shared memory when flagmeter is preloaded, always in the events
-- (period_start not NULL, xid at or above counted_through).
CREATE FUNCTION flagmeter.fold_pending()
RETURNS xid8
AS 'MODULE_PATHNAME', 'fm_fold_pending'
LANGUAGE C VOLATILE STRICT PARALLEL UNSAFE;
COMMENT ON FUNCTION flagmeter.fold_pending() IS
'maintain()''s fold of the pending usage shared memory holds into the merged stripes; returns the new counted_through, NULL when there is nothing it may fold now';

CREATE FUNCTION flagmeter.pending_in_memory()
RETURNS boolean
AS 'MODULE_PATHNAME', 'fm_pending_in_memory'
LANGUAGE C VOLATILE STRICT PARALLEL UNSAFE;
COMMENT ON FUNCTION flagmeter.pending_in_memory() IS
'whether shared memory holds this database''s pending usage (flagmeter preloaded, rebuilt since the start)';

CREATE FUNCTION flagmeter.pending_forget()
RETURNS void
AS 'MODULE_PATHNAME', 'fm_pending_forget'
LANGUAGE C VOLATILE STRICT PARALLEL UNSAFE;
COMMENT ON FUNCTION flagmeter.pending_forget() IS
'empties shared memory of this database''s pending usage, to be rebuilt from the events at the next call (after_restore)';

CREATE FUNCTION flagmeter.pending_events_folded()
RETURNS void
AS 'MODULE_PATHNAME', 'fm_pending_events_folded'
LANGUAGE C VOLATILE STRICT PARALLEL UNSAFE;
COMMENT ON FUNCTION flagmeter.pending_events_folded() IS
'after fold_pending_events: shared memory holds this database''s (now empty) pending usage once the transaction commits';

CREATE FUNCTION flagmeter.pending_usage_stats(
	OUT status text, OUT periods bigint, OUT transactions bigint,
	OUT added bigint, OUT no_room bigint, OUT folded bigint, OUT rebuilt bigint,
	OUT slots bigint)
RETURNS record
AS 'MODULE_PATHNAME', 'fm_pending_usage_stats'
LANGUAGE C VOLATILE STRICT PARALLEL UNSAFE;
COMMENT ON FUNCTION flagmeter.pending_usage_stats() IS
'where this database''s pending usage is read from, its periods and unsettled transactions in shared memory, and since the server started: amounts added, tracks sent to a stripe for want of room, periods folded, rebuilds';

-- The pending events of transactions in [low, high) into the merged stripes:
-- maintain() when shared memory does not hold them.
CREATE FUNCTION flagmeter.fold_pending_events(low xid8, high xid8)
RETURNS bigint
LANGUAGE sql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
	WITH folded AS (
		INSERT INTO flagmeter.counters AS c (tenant, meter, period_start, stripe, counter)
		SELECT e.tenant, e.meter, e.period_start, 32767,
		       flagmeter.quota_counter_agg(e.amount, e.occurred_at)
		FROM flagmeter.events e
		WHERE e.period_start IS NOT NULL
		  AND e.xid >= flagmeter.xid_int(low) AND e.xid < flagmeter.xid_int(high)
		GROUP BY e.tenant, e.meter, e.period_start
		ON CONFLICT (tenant, meter, period_start, stripe) DO UPDATE
		SET counter = c.counter OPERATOR(flagmeter.+) excluded.counter
		RETURNING 1)
	SELECT count(*) FROM folded;
$$;
COMMENT ON FUNCTION flagmeter.fold_pending_events(xid8, xid8) IS
'adds the pending events of transactions in [low, high) to their periods'' merged stripes; returns how many periods it wrote';

CREATE FUNCTION flagmeter.maintain(
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
COMMENT ON FUNCTION flagmeter.maintain() IS
'folds pending usage into the hourly and daily rollups, creates upcoming partitions, drops expired ones, expires idempotency keys, compacts ended periods, merges idle stripes, rolls unused quota over into credit grants (roll_over); idempotent, cheap when idle, one run at a time';

-- Scheduling with pg_cron ---------------------------------------------------------

CREATE FUNCTION flagmeter.schedule(schedule text DEFAULT '* * * * *')
RETURNS bigint
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	job bigint;
BEGIN
	IF NOT EXISTS (SELECT FROM pg_extension e WHERE e.extname = 'pg_cron') THEN
		RAISE EXCEPTION 'extension "pg_cron" is not installed in this database'
			USING ERRCODE = 'undefined_object',
			      HINT = 'Add pg_cron to shared_preload_libraries, set cron.database_name to this database, '
			             'restart and run CREATE EXTENSION pg_cron; or call flagmeter.maintain() every minute '
			             'from any scheduler.';
	END IF;
	-- dynamic SQL: flagmeter must not depend on the cron schema existing
	EXECUTE 'SELECT cron.schedule($1, $2, $3)'
		INTO job USING 'flagmeter-maintain', schedule, 'SELECT flagmeter.maintain()';
	RETURN job;
END $$;
COMMENT ON FUNCTION flagmeter.schedule(text) IS
'registers flagmeter.maintain() as the pg_cron job "flagmeter-maintain" (every minute by default); returns the job id; an error with a hint when pg_cron is not installed here';

CREATE FUNCTION flagmeter.unschedule()
RETURNS boolean
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	found_job boolean;
BEGIN
	IF NOT EXISTS (SELECT FROM pg_extension e WHERE e.extname = 'pg_cron') THEN
		RAISE EXCEPTION 'extension "pg_cron" is not installed in this database'
			USING ERRCODE = 'undefined_object';
	END IF;
	EXECUTE 'SELECT EXISTS (SELECT FROM cron.job WHERE jobname = $1 AND username = current_user)'
		INTO found_job USING 'flagmeter-maintain';
	IF NOT found_job THEN
		RETURN false;
	END IF;
	EXECUTE 'SELECT cron.unschedule($1)' USING 'flagmeter-maintain';
	RETURN true;
END $$;
COMMENT ON FUNCTION flagmeter.unschedule() IS
'removes the pg_cron job "flagmeter-maintain"; false when there was none';

-- After pg_dump/pg_restore (or any copy into another cluster) the events'
-- transaction ids and the watermark come from the old cluster, where they
-- were assigned; this cluster's ids are unrelated.  after_restore() folds
-- what the old cluster had not folded yet, then renumbers the copied rows
-- so that they all lie below this cluster's current xmin, and moves the
-- watermark there.  Run it once after restoring, before tracking resumes:
-- it takes the events' tables exclusively while it runs.
CREATE FUNCTION flagmeter.after_restore(OUT events_folded bigint, OUT voids_folded bigint,
	OUT rows_renumbered bigint)
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	low xid8;
	here bigint := (SELECT c.system_identifier FROM pg_control_system() c);
	cluster bigint;
	n bigint;
BEGIN
	SELECT m.folded_through, m.system_identifier INTO low, cluster
	FROM flagmeter.maintenance_state m FOR UPDATE;
	IF NOT FOUND OR cluster = here THEN
		RAISE EXCEPTION 'flagmeter''s data was not restored from another cluster'
			USING ERRCODE = 'object_not_in_prerequisite_state',
			      HINT = 'after_restore() is for the first run after a restore; use maintain().';
	END IF;
	LOCK TABLE flagmeter.events, flagmeter.voids IN EXCLUSIVE MODE;

	-- everything the old cluster had not folded: all of it has committed
	SELECT f.events_folded, f.voids_folded INTO events_folded, voids_folded
	FROM flagmeter.fold_band(low, '18446744073709551615'::xid8) f;
	-- and its pending usage into the counter rows; what shared memory read
	-- of it here (old ids) is rebuilt from the renumbered events
	PERFORM flagmeter.fold_pending_events(
		(SELECT m.counted_through FROM flagmeter.maintenance_state m),
		'18446744073709551615'::xid8);
	PERFORM flagmeter.pending_forget();

	-- below this cluster's xmin, so that no copied row looks unfolded
	UPDATE flagmeter.events e SET xid = 0 WHERE e.xid <> 0;
	GET DIAGNOSTICS rows_renumbered = ROW_COUNT;
	UPDATE flagmeter.voids v SET xid = '0' WHERE v.xid <> '0';
	GET DIAGNOSTICS n = ROW_COUNT;
	rows_renumbered := rows_renumbered + n;

	UPDATE flagmeter.maintenance_state
	SET system_identifier = here,
	    folded_through = pg_snapshot_xmin(pg_current_snapshot()),
	    counted_through = pg_snapshot_xmin(pg_current_snapshot());
END $$;
COMMENT ON FUNCTION flagmeter.after_restore() IS
'run once after restoring a dump into another cluster, before tracking resumes: folds what was not folded and renumbers the copied events so maintain() can go on';
