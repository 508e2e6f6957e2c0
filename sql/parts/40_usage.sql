-- ---------------------------------------------------------------------------
-- Usage accounting: the tables behind track / consume / check / void / usage.
--
-- Writers never share a row (docs/design.md, "The write path"):
--   events      one row per recorded event, never updated (audit, rollups,
--               recounts); only a refused consume deletes the event it
--               had just inserted, in its own transaction;
--   counters    per tenant, meter and period, a few quota_counter rows:
--               stripe 0 is the row consume locks and updates, the others
--               take track's increments, each in a stripe no other
--               transaction holds (src/stripes.c), so
--               concurrent trackers of one tenant do not queue behind each
--               other.  The period's usage is the merge of its rows:
--               O(stripes), not O(events);
--   event_keys  idempotency keys and the decisions given for them.
-- ---------------------------------------------------------------------------

-- Raw events, partitioned by the day they were recorded (UTC) so that
-- retention drops whole partitions; maintain() creates the partitions ahead
-- of time, and the default partition catches rows when it has not run.
-- xid is the recording transaction's id: maintain() folds events into the
-- rollups in bands of xid below the snapshot xmin (all such transactions
-- have ended), which no commit order can break.  It is the xid8 as a
-- bigint (flagmeter.xid_int) because that type has a BRIN operator class
-- and xid8 has none: see index_event_partition.
-- A transaction id as stored in flagmeter.events.xid.  FullTransactionIds
-- stay far below 2^63 (the epoch would have to pass 2^31); the largest xid8
-- maps to the largest bigint so that "up to the end" bounds keep working.
-- In C: it is the default of every event row, and a SQL function there is
-- run through the SQL-function executor, not inlined.
CREATE FUNCTION flagmeter.xid_int(x xid8) RETURNS bigint
AS 'MODULE_PATHNAME', 'fm_xid_int'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION flagmeter.xid_int(xid8) IS
'a transaction id as the bigint flagmeter.events.xid stores';

CREATE TABLE flagmeter.events (
	tenant			text NOT NULL,
	meter			text NOT NULL,
	amount			bigint NOT NULL,
	occurred_at		timestamptz NOT NULL,
	recorded_at		timestamptz NOT NULL,
	idempotency_key	text,
	xid				bigint NOT NULL DEFAULT flagmeter.xid_int(pg_catalog.pg_current_xact_id()),
	-- the period the amount is pending in (src/pending*.c), NULL when a
	-- counter row took it as the event was written
	period_start	timestamptz
) PARTITION BY RANGE (recorded_at);
CREATE TABLE flagmeter.events_default PARTITION OF flagmeter.events DEFAULT;

-- Each partition is indexed on its own, not through the partitioned table:
-- partitions are created at run time and dumped as ordinary tables with
-- their indexes, which an index of the (extension-owned) parent would
-- duplicate on restore.
--
-- xid gets a BRIN index, not a btree: rows are appended in roughly
-- increasing xid order, so a summary per 128 pages finds the band maintain()
-- folds (the pages written since the last run) as well as a btree would,
-- at a fraction of the cost per insert: a btree on xid was one of the three
-- index insertions every track paid for.  autosummarize keeps the summary
-- current without waiting for a VACUUM; pages not yet summarized are always
-- read, which is where the unfolded rows are anyway.
CREATE FUNCTION flagmeter.index_event_partition(partition regclass)
RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	name text := (SELECT c.relname FROM pg_class c WHERE c.oid = partition);
BEGIN
	EXECUTE format('CREATE INDEX %I ON %s (tenant, meter, occurred_at)', name || '_tenant_meter_time', partition);
	EXECUTE format('CREATE INDEX %I ON %s USING brin (xid) WITH (autosummarize = on)',
				   name || '_xid', partition);
END $$;
COMMENT ON FUNCTION flagmeter.index_event_partition(regclass) IS
'creates the indexes of a partition of flagmeter.events: btree (tenant, meter, occurred_at) and brin (xid)';

SELECT flagmeter.index_event_partition('flagmeter.events_default');
COMMENT ON TABLE flagmeter.events IS
'every recorded event, never updated (voids are logged in voids; a refused consume deletes the event it inserted), partitioned by recorded_at day';
COMMENT ON COLUMN flagmeter.events.period_start IS
'not NULL: the event was written alone, its amount pending in shared memory in this period; in no counter row while xid is at or above maintenance_state.counted_through';
COMMENT ON TABLE flagmeter.events_default IS
'events recorded on a day that has no partition yet (maintain() creates them ahead)';

-- Voids, logged so that maintain() takes them out of the rollups too.
CREATE TABLE flagmeter.voids (
	tenant			text NOT NULL,
	meter			text NOT NULL,
	amount			bigint NOT NULL,
	occurred_at		timestamptz NOT NULL,
	idempotency_key	text NOT NULL,
	voided_at		timestamptz NOT NULL,
	xid				xid8 NOT NULL DEFAULT pg_catalog.pg_current_xact_id()
);
CREATE INDEX voids_xid ON flagmeter.voids (xid);
COMMENT ON TABLE flagmeter.voids IS
'voided events, folded out of the rollups by maintain() like events are folded in';

CREATE TABLE flagmeter.counters (
	tenant			text NOT NULL,
	meter			text NOT NULL,
	period_start	timestamptz NOT NULL,
	stripe			smallint NOT NULL,
	counter			flagmeter.quota_counter NOT NULL,
	-- track's stripes only: when this row's own usage reaches recheck_at,
	-- track reads the whole period again to see whether a threshold, the
	-- quota or the bigint range is reached; recheck_for fingerprints the
	-- limit that figure was worked out for (a changed limit: read again).
	-- NULL: read on the next track.  See src/track_alerts.c.
	recheck_at		bigint,
	recheck_for		integer,
	PRIMARY KEY (tenant, meter, period_start, stripe)
) WITH (fillfactor = 50);	-- room for HOT updates of the same row
COMMENT ON TABLE flagmeter.counters IS
'usage per tenant, meter and period, in stripes merged on read; stripe 0 is consume''s, the others track''s; recheck_at/recheck_for say when track must next read the whole period';

-- The rows maintain() may still merge: track stripes and merged stripes
-- (stripe > 0).  compact_counters() turns an ended period's rows into its
-- stripe 0 alone, so this index holds the open periods' rows and those of
-- periods ended since the last run, not the history: maintain() finds its
-- work here in time proportional to the open periods, where a scan of the
-- whole table grew with every period ever counted.  Track writes a stripe
-- in place (a HOT update: no indexed column changes), so only a new stripe
-- adds an entry.
CREATE INDEX counters_track_stripes ON flagmeter.counters (tenant, meter, period_start)
	WHERE stripe OPERATOR(pg_catalog.>) 0;

CREATE TABLE flagmeter.event_keys (
	tenant			text NOT NULL,
	idempotency_key	text NOT NULL,
	seq				smallint NOT NULL,
	meter			text NOT NULL,
	amount			bigint NOT NULL,
	occurred_at		timestamptz NOT NULL,
	period_start	timestamptz NOT NULL,
	recorded_at		timestamptz NOT NULL,
	kind			text NOT NULL
		CONSTRAINT event_keys_kind_valid
		CHECK (kind OPERATOR(pg_catalog.=) ANY (ARRAY['track', 'consume', 'track_pool', 'consume_pool'])),
	granted			boolean NOT NULL,
	used			bigint,
	quota			bigint,
	remaining		bigint,
	resets_at		timestamptz,
	overage			bigint,
	reason			text,
	voided_at		timestamptz,
	from_grants		bigint,
	balance			bigint,
	PRIMARY KEY (tenant, idempotency_key, seq)
);
COMMENT ON TABLE flagmeter.event_keys IS
'idempotency keys: what each key recorded (one row per meter, seq in call order; kind track_pool or consume_pool for the credit pool a named meter draws from) and the decision returned for it; voided_at marks voided events';

SELECT pg_catalog.pg_extension_config_dump('flagmeter.events_default', '');
SELECT pg_catalog.pg_extension_config_dump('flagmeter.voids', '');
SELECT pg_catalog.pg_extension_config_dump('flagmeter.counters', '');
SELECT pg_catalog.pg_extension_config_dump('flagmeter.event_keys', '');

-- The calls ------------------------------------------------------------------------

CREATE FUNCTION flagmeter.track(tenant text, meter text, amount bigint DEFAULT 1,
	occurred_at timestamptz DEFAULT now(), idempotency_key text DEFAULT NULL)
RETURNS boolean
AS 'MODULE_PATHNAME', 'fm_track'
LANGUAGE C VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE;
COMMENT ON FUNCTION flagmeter.track(text, text, bigint, timestamptz, text) IS
'records usage (amount >= 0) in the period containing occurred_at; false when the idempotency key was already recorded; never blocks on other writers of the tenant';

-- track with an untyped (or text) fourth argument: read as timestamptz input
-- reads it, and when it is not a time (a key passed there by mistake), the
-- error's hint says to pass the key by name.
CREATE FUNCTION flagmeter.track(tenant text, meter text, amount bigint, occurred_at text,
	idempotency_key text DEFAULT NULL)
RETURNS boolean
AS 'MODULE_PATHNAME', 'fm_track_text'
LANGUAGE C VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE;
COMMENT ON FUNCTION flagmeter.track(text, text, bigint, text, text) IS
'track with occurred_at given as text or an untyped literal: the same call; an occurred_at that is not a time gets a hint to pass the idempotency key by name';

CREATE FUNCTION flagmeter.track_batch(tenants text[], meters text[], amounts bigint[],
	occurred_at timestamptz[] DEFAULT NULL, idempotency_keys text[] DEFAULT NULL)
RETURNS bigint
AS 'MODULE_PATHNAME', 'fm_track_batch'
LANGUAGE C VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE;
COMMENT ON FUNCTION flagmeter.track_batch(text[], text[], bigint[], timestamptz[], text[]) IS
'records many events at once (arrays of equal length; occurred_at NULL means now(), a NULL key means none); returns how many were counted (duplicates of already recorded keys are skipped); all or nothing on error';

CREATE FUNCTION flagmeter.consume(tenant text, meter text, amount bigint DEFAULT 1,
	idempotency_key text DEFAULT NULL)
RETURNS flagmeter.decision
AS 'MODULE_PATHNAME', 'fm_consume'
LANGUAGE C VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE;
COMMENT ON FUNCTION flagmeter.consume(text, text, bigint, text) IS
'atomically checks the limit and records amount (> 0) if granted; never grants past a hard limit; a retried idempotency key returns the original decision';

-- consume with an untyped (or text) amount: an untyped NULL or parameter
-- there matches the one-meter and the multi-meter consume alike, which
-- PostgreSQL cannot choose between ("function is not unique"); this
-- overload takes it, so a NULL amount is 22004 as documented.
CREATE FUNCTION flagmeter.consume(tenant text, meter text, amount text,
	idempotency_key text DEFAULT NULL)
RETURNS flagmeter.decision
AS 'MODULE_PATHNAME', 'fm_consume_text'
LANGUAGE C VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE;
COMMENT ON FUNCTION flagmeter.consume(text, text, text, text) IS
'consume with the amount given as text or untyped (a NULL literal, a driver''s untyped parameter): the same call; read as bigint input reads it';

CREATE FUNCTION flagmeter.consume(tenant text, meters text[], amounts bigint[],
	idempotency_key text DEFAULT NULL)
RETURNS SETOF flagmeter.decision
AS 'MODULE_PATHNAME', 'fm_consume_multi'
LANGUAGE C VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE ROWS 2;
COMMENT ON FUNCTION flagmeter.consume(text, text[], bigint[], text) IS
'all-or-nothing consume across several meters: one decision per meter in argument order, all granted or none recorded';

CREATE FUNCTION flagmeter.check(tenant text, meter text, amount bigint DEFAULT 1)
RETURNS flagmeter.decision
AS 'MODULE_PATHNAME', 'fm_check'
LANGUAGE C STABLE CALLED ON NULL INPUT PARALLEL SAFE;
COMMENT ON FUNCTION flagmeter.check(text, text, bigint) IS
'the decision consume would give for amount (>= 0) now, without recording anything';

CREATE FUNCTION flagmeter.usage(tenant text, meter text, at timestamptz DEFAULT now())
RETURNS flagmeter.quota_counter
AS 'MODULE_PATHNAME', 'fm_usage'
LANGUAGE C STABLE CALLED ON NULL INPUT PARALLEL SAFE;
COMMENT ON FUNCTION flagmeter.usage(text, text, timestamptz) IS
'the quota_counter of the period containing at, carrying the limit in force; exact (sees all committed events and the caller''s own)';

CREATE FUNCTION flagmeter.void(tenant text, idempotency_key text)
RETURNS boolean
AS 'MODULE_PATHNAME', 'fm_void'
LANGUAGE C VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE;
COMMENT ON FUNCTION flagmeter.void(text, text) IS
'cancels the event(s) recorded under an idempotency key: usage goes down by their amount; false when already voided or when the key''s consume was denied; an unknown key is an error';

-- Recount after the boundaries of the current period moved --------------------

-- Pending usage (src/pending*.c) outside shared memory: events written alone
-- that no counter row holds yet.
CREATE FUNCTION flagmeter.has_pending_events(tenant text, meter text)
RETURNS boolean
AS 'MODULE_PATHNAME', 'fm_has_pending_events'
LANGUAGE C STABLE PARALLEL SAFE;
COMMENT ON FUNCTION flagmeter.has_pending_events(text, text) IS
'whether a tenant''s (NULL: any) usage of a meter (NULL: any) has events written alone that no counter row holds yet';

CREATE FUNCTION flagmeter.counted_through()
RETURNS xid8
AS 'MODULE_PATHNAME', 'fm_counted_through'
LANGUAGE C STABLE PARALLEL SAFE;
COMMENT ON FUNCTION flagmeter.counted_through() IS
'maintenance_state.counted_through (read as the owner): pending events of transactions below it are in the counter rows';

CREATE FUNCTION flagmeter.pending_drop(tenant text, meter text, period_start timestamptz)
RETURNS void
AS 'MODULE_PATHNAME', 'fm_pending_drop'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION flagmeter.pending_drop(text, text, timestamptz) IS
'the pending usage in shared memory of a tenant, meter and period (NULL: all) is gone for whoever sees this transaction committed (delete_usage, which holds SHARE ROW EXCLUSIVE on flagmeter.counters)';

-- Whether the current period of (tenant, meter) under the limit in force
-- has usage: a counter row of it, or an event within its boundaries
-- (pending or counted).  Two index probes, whatever the length of the
-- history: the counters' primary key and the events' (tenant, meter,
-- occurred_at) index of the partitions the period spans.  The catalog
-- functions ask it for every tenant a change touches (assign_plan of a new
-- tenant included), so it must not read a tenant's events.
CREATE FUNCTION flagmeter.current_period_has_usage(tenant text, meter text)
RETURNS boolean
LANGUAGE plpgsql STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	-- PL/pgSQL for its cached plan: as LANGUAGE sql it was planned at every
	-- call, 80 of the 350 us an assign_plan_batch spent per tenant
	RETURN EXISTS (
		SELECT FROM flagmeter.limit_config(tenant, meter) c
		CROSS JOIN LATERAL flagmeter.period_bounds(now(), c.period, c.anchor, c.timezone) b
		WHERE EXISTS (SELECT FROM flagmeter.counters k
		              WHERE k.tenant = current_period_has_usage.tenant
		                AND k.meter = current_period_has_usage.meter
		                AND k.period_start = b.period_start)
		   OR EXISTS (SELECT FROM flagmeter.events e
		              WHERE e.tenant = current_period_has_usage.tenant
		                AND e.meter = current_period_has_usage.meter
		                AND e.occurred_at >= b.period_start AND e.occurred_at < b.period_end));
END $$;
COMMENT ON FUNCTION flagmeter.current_period_has_usage(text, text) IS
'whether the current period of a tenant and meter (under the limit in force) has a counter row or an event; index probes only, whatever the history';

-- Called by the catalog functions when a change of period kind, anchor or
-- time zone moves the boundaries of the current period of (tenant, meter):
-- its counter is rebuilt from the raw events.  The SHARE ROW EXCLUSIVE lock
-- waits for in-flight track/consume calls (they hold ROW EXCLUSIVE on
-- counters from before they read the configuration) and holds new ones
-- until the change commits, so no event is counted under the old
-- boundaries after the recount.
CREATE FUNCTION flagmeter.recount_current_period(tenant text, meter text)
RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	cfg record;
	b record;
BEGIN
	-- Nothing counted in the new period and no event within it (the common
	-- case: a tenant assigned at signup): nothing to recount, and no reason
	-- to pause anyone's ingest.  A track of this tenant in flight right now
	-- counts in the period its occurred_at had under the old boundaries.
	IF NOT flagmeter.current_period_has_usage(tenant, meter) THEN
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
COMMENT ON FUNCTION flagmeter.recount_current_period(text, text) IS
'rebuilds the counter of the current period of a tenant and meter from the raw events (after its boundaries moved); pauses ingest briefly';
