-- ---------------------------------------------------------------------------
-- Notifications: the outbox of quota events, block state, the invalidate
-- trigger for app tables, and the operator stats.
--
-- Channel "flagmeter"; JSON payloads under 1 kB.  Quota events are written
-- to the outbox at commit (src/notify.c) with versions in commit order, so
-- "what changed since version V" misses nothing; notifications are hints,
-- the outbox is the record.
-- ---------------------------------------------------------------------------

CREATE SEQUENCE flagmeter.outbox_version;
COMMENT ON SEQUENCE flagmeter.outbox_version IS
'versions of outbox rows, drawn at commit in commit order';

CREATE TABLE flagmeter.outbox (
	version			bigint PRIMARY KEY,
	created_at		timestamptz NOT NULL DEFAULT pg_catalog.now(),
	kind			text NOT NULL
		CONSTRAINT outbox_kind_valid
		CHECK (kind OPERATOR(pg_catalog.=) ANY (ARRAY['threshold', 'blocked', 'unblocked',
		                                              'limit_changed', 'plan_changed',
		                                              'feature_changed', 'grant_low', 'grant_exhausted',
		                                              'grant_expired'])),
	tenant			text,
	meter			text,
	plan			text,
	period_start	timestamptz,
	threshold		integer,
	used			bigint,
	quota			bigint,
	resets_at		timestamptz,
	period			text,
	mode			text,
	thresholds		integer[],
	feature			text,
	enabled			boolean,
	config			jsonb,
	notified		boolean NOT NULL,
	grant_id		bigint			-- grant events (47_credits.sql)
);
-- a threshold is announced once per tenant, meter and period
CREATE UNIQUE INDEX outbox_threshold_once ON flagmeter.outbox (tenant, meter, period_start, threshold)
	WHERE kind OPERATOR(pg_catalog.=) 'threshold'::pg_catalog.text;
CREATE INDEX outbox_created_at ON flagmeter.outbox USING brin (created_at);
-- a grant event is announced once per grant and kind
CREATE UNIQUE INDEX outbox_grant_once ON flagmeter.outbox (grant_id, kind) WHERE grant_id IS NOT NULL;
COMMENT ON TABLE flagmeter.outbox IS
'every quota event (threshold reached, blocked, unblocked, limit, plan or feature changed, a credit grant low, exhausted or expired: grant_id, used = drawn, quota = amount, threshold = the low percent) with a version in commit order; resets_at: when a blocked period ends; quota, period, mode, thresholds of limit_changed: the limit now in force; feature, enabled, config of feature_changed: the plan''s row for the feature (tenant NULL) or the tenant''s override of it (enabled NULL: the row is gone); notified is false when the notification was skipped under backpressure; a negative version marks a threshold row copied from another shard by a tenant move (kept so that the threshold is not announced twice, never replayed)';

CREATE TABLE flagmeter.blocked (
	tenant			text NOT NULL,
	meter			text NOT NULL,
	period_start	timestamptz NOT NULL,
	blocked_at		timestamptz NOT NULL,
	resets_at		timestamptz,
	PRIMARY KEY (tenant, meter, period_start)
);
COMMENT ON TABLE flagmeter.blocked IS
'tenants whose usage reached a hard limit in a period, until a void, a limit change or the end of the period (resets_at, NULL for lifetime) brings them back under it';

CREATE TABLE flagmeter.notification_skips (
	skipped_at		timestamptz NOT NULL DEFAULT pg_catalog.now(),
	kind			text NOT NULL,
	detail			text
);
COMMENT ON TABLE flagmeter.notification_skips IS
'invalidations not sent because the NOTIFY queue was fuller than flagmeter.notify_queue_limit';

SELECT pg_catalog.pg_extension_config_dump('flagmeter.outbox', '');
SELECT pg_catalog.pg_extension_config_dump('flagmeter.outbox_version', '');
SELECT pg_catalog.pg_extension_config_dump('flagmeter.blocked', '');

CREATE FUNCTION flagmeter.announce(kind text, tenant text, meter text, plan text DEFAULT NULL,
	period_start timestamptz DEFAULT NULL, used bigint DEFAULT NULL, quota bigint DEFAULT NULL,
	period text DEFAULT NULL, mode text DEFAULT NULL, thresholds integer[] DEFAULT NULL)
RETURNS void
AS 'MODULE_PATHNAME', 'fm_announce'
LANGUAGE C VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE;
COMMENT ON FUNCTION flagmeter.announce(text, text, text, text, timestamptz, bigint, bigint, text, text, integer[]) IS
'queues a quota event (blocked, unblocked, limit_changed, plan_changed) to be recorded and announced when the transaction commits; quota, period, mode and thresholds of limit_changed give the limit now in force';

-- feature_changed, queued as announce queues the other kinds (src/notify.c).
-- It announces the rows a client caches, not derived answers:
--   - set_feature: the plan's row (tenant NULL), when it changed; it
--     decides for every tenant of the plan that does not override the
--     feature, and a client applies it to those it caches;
--   - override_feature: the tenant's override, when it changed;
--   - drop_feature_override: the tenant's override gone (enabled NULL);
--   - drop_plan: each of the plan's rows gone (enabled NULL), so that a
--     plan defined again under the name starts without them.
-- A tenant's plan moves with plan_changed (assign_plan, unassign_tenant,
-- whose tenant loses its overrides with its row): the features are then
-- the new plan's rows, and its overrides.
CREATE FUNCTION flagmeter.announce_feature(tenant text, plan text, feature text,
	enabled boolean, config jsonb DEFAULT NULL)
RETURNS void
AS 'MODULE_PATHNAME', 'fm_announce_feature'
LANGUAGE C VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE;
COMMENT ON FUNCTION flagmeter.announce_feature(text, text, text, boolean, jsonb) IS
'queues a feature_changed event, recorded and announced when the transaction commits: a plan''s row for a feature (tenant NULL) or a tenant''s override (plan NULL); enabled NULL: the row is gone';

-- What the current usage reaches after a configuration change (src/review.c).
CREATE FUNCTION flagmeter.review_usage(tenant text, meter text)
RETURNS void
AS 'MODULE_PATHNAME', 'fm_review_usage'
LANGUAGE C VOLATILE CALLED ON NULL INPUT PARALLEL UNSAFE;
COMMENT ON FUNCTION flagmeter.review_usage(text, text) IS
'queues the thresholds and the blocked event that the current period''s usage of a tenant and meter reaches under the limit in force (after a configuration change), announced at commit';

-- Unblocks the blocked tenants (optionally of one tenant, meter or plan)
-- whose usage is back under their hard limit, or whose period has ended,
-- or whose limit is gone or soft.
CREATE FUNCTION flagmeter.review_blocks(tenant text DEFAULT NULL, meter text DEFAULT NULL,
	plan text DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	b record;
	cfg record;
	used bigint;
	unblocked integer := 0;
BEGIN
	FOR b IN
		SELECT bl.tenant, bl.meter, bl.period_start
		FROM flagmeter.blocked bl
		LEFT JOIN flagmeter.tenants t ON t.tenant = bl.tenant
		WHERE (review_blocks.tenant IS NULL OR bl.tenant = review_blocks.tenant)
		  AND (review_blocks.meter IS NULL OR bl.meter = review_blocks.meter)
		  AND (review_blocks.plan IS NULL OR t.plan = review_blocks.plan)
		ORDER BY 1, 2, 3
	LOOP
		SELECT * INTO cfg FROM flagmeter.limit_config(b.tenant, b.meter);
		-- the usage of the blocked period (lifetime periods start at -infinity);
		-- none for a tenant with no plan any more, whose usage() may be refused
		used := CASE WHEN cfg.aggregation IS NULL OR cfg.plan IS NULL THEN NULL
		             ELSE flagmeter.used_by(flagmeter.usage(b.tenant, b.meter,
		                      CASE WHEN isfinite(b.period_start) THEN b.period_start ELSE now() END),
		                      cfg.aggregation) END;
		IF cfg.aggregation IS NULL OR cfg.quota IS NULL OR cfg.mode = 'soft'
		   OR (flagmeter.period_bounds(now(), cfg.period, cfg.anchor, cfg.timezone)).period_start <> b.period_start
		   OR used < cfg.quota
		THEN
			PERFORM flagmeter.announce('unblocked', b.tenant, b.meter, NULL, b.period_start, used, cfg.quota);
			unblocked := unblocked + 1;
		END IF;
	END LOOP;
	RETURN unblocked;
END $$;
COMMENT ON FUNCTION flagmeter.review_blocks(text, text, text) IS
'announces "unblocked" for blocked tenants that are back under their hard limit (limit raised or removed, usage voided, period ended); returns how many';

-- After notifications were skipped under backpressure (quota events kept in
-- the outbox, or invalidations), one hint tells app instances to resync,
-- once the queue has room again: {"kind":"resync","version":S} where S is
-- the greatest version skipped so far, with "invalidations":true when
-- invalidations were skipped since the last hint.  An instance whose last
-- version is below S replays changes_since(its version).  (One that
-- received a later notification already saw the gap in its prev_version.)
CREATE FUNCTION flagmeter.send_resync_hint()
RETURNS boolean
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	state flagmeter.current_state;
	skipped_through bigint;
	invalidations boolean;
	limit_setting double precision :=
		COALESCE(current_setting('flagmeter.notify_queue_limit', true)::double precision, 0.5);
BEGIN
	SELECT * INTO state FROM flagmeter.current_state;
	SELECT max(o.version) INTO skipped_through
	FROM flagmeter.outbox o
	WHERE NOT o.notified AND o.version > state.resync_sent_through;
	invalidations := EXISTS (SELECT FROM flagmeter.notification_skips k
	                         WHERE k.skipped_at > COALESCE(state.resync_sent_at, '-infinity'));
	IF skipped_through IS NULL AND NOT invalidations THEN
		RETURN false;
	END IF;
	IF pg_notification_queue_usage() > limit_setting THEN
		RETURN false;
	END IF;
	skipped_through := COALESCE(skipped_through, state.resync_sent_through);
	PERFORM pg_notify('flagmeter', format('{"kind":"resync","version":%s%s}', skipped_through,
	                                      CASE WHEN invalidations THEN ',"invalidations":true' ELSE '' END));
	UPDATE flagmeter.maintenance_state
	SET resync_sent_through = skipped_through, resync_sent_at = now();
	RETURN true;
END $$;
COMMENT ON FUNCTION flagmeter.send_resync_hint() IS
'sends one "resync" notification ({"kind":"resync","version":S}, S the greatest skipped version, "invalidations":true when invalidations were skipped) when notifications were skipped under backpressure and the queue has room again';

CREATE FUNCTION flagmeter.changes_since(version bigint)
RETURNS SETOF flagmeter.outbox
LANGUAGE plpgsql STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	-- a client that lost its version must resync, not believe it is in sync
	IF version IS NULL THEN
		RAISE EXCEPTION 'version must not be NULL' USING ERRCODE = 'null_value_not_allowed',
			HINT = 'Start from flagmeter.latest_version() after reading the state you cache.';
	END IF;
	-- rows a tenant move copied here have negative versions: history, not news
	RETURN QUERY SELECT o.* FROM flagmeter.outbox o
	WHERE o.version > changes_since.version AND o.version > 0
	ORDER BY o.version;
END $$;
COMMENT ON FUNCTION flagmeter.changes_since(bigint) IS
'the quota events recorded after version, in version (= commit) order: what an app instance that was disconnected must replay';

CREATE FUNCTION flagmeter.latest_version()
RETURNS bigint
LANGUAGE sql STABLE PARALLEL SAFE
AS $$
SELECT GREATEST(pg_catalog.max(o.version), 0) FROM flagmeter.outbox o
$$;
COMMENT ON FUNCTION flagmeter.latest_version() IS
'the version of the latest recorded quota event (0 when none): where a fresh app instance starts';

CREATE FUNCTION flagmeter.invalidate()
RETURNS trigger
AS 'MODULE_PATHNAME', 'fm_invalidate'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION flagmeter.invalidate() IS
'trigger for app tables: AFTER INSERT OR UPDATE OR DELETE (OR TRUNCATE), per row or per statement (with transition tables for keys); arguments name the key columns (default: the primary key); one notification per table per transaction at commit';

CREATE VIEW flagmeter.stats AS
SELECT (SELECT count(*) FROM flagmeter.events e WHERE e.xid >= flagmeter.xid_int(m.folded_through)) AS pending_events,
       (SELECT count(*) FROM flagmeter.voids v WHERE v.xid >= m.folded_through) AS pending_voids,
       m.folded_through,
       m.runs,
       m.last_run_at,
       m.last_run_duration,
       m.last_run_folded,
       m.total_folded,
       m.total_voids_folded,
       (SELECT count(*) FROM pg_catalog.pg_inherits i
        WHERE i.inhparent = 'flagmeter.events'::regclass) AS partitions,
       (SELECT count(*) FROM flagmeter.events_default) AS default_partition_events,
       (SELECT count(*) FROM flagmeter.outbox o WHERE o.notified) AS notifications_sent,
       (SELECT count(*) FROM flagmeter.outbox o WHERE NOT o.notified)
         + (SELECT count(*) FROM flagmeter.notification_skips) AS notifications_skipped,
       (SELECT count(*) FROM flagmeter.blocked) AS blocked
FROM flagmeter.current_state m;
COMMENT ON VIEW flagmeter.stats IS
'for operators: events and voids not folded yet, the last maintain() run, totals folded, partitions, quota notifications sent, notifications skipped under backpressure, tenants blocked';
