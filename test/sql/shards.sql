-- Shards: what a shard behind a PL/Proxy proxy needs from flagmeter.
-- partition_of (the proxy's routing), set_limit in its two halves (the
-- half two-phase commit can prepare, and the half that announces), the
-- calls that take the tenant first (status(tenant)) or that a proxy merges
-- (usage_series_all), and the fence, unfence and forget of a partition
-- moved to another shard, with the outbox rows such a move copies.
-- Every test file runs in the same database: start from a fresh extension.
SET client_min_messages = warning;
DROP EXTENSION flagmeter CASCADE;
CREATE EXTENSION flagmeter;
RESET client_min_messages;
SET search_path = flagmeter, public;
-- this file meters tenants never assigned a plan and tracks events at
-- fixed dates, which a new database refuses (QT001, QT002): it turns
-- both off
SELECT flagmeter.configure(unassigned_tenants => 'unlimited', late_events => '100 years',
	future_events => '100 years') \gset
SET TimeZone = 'UTC';
\set SHOW_CONTEXT never

-- pg_temp.try(sql): 'ok', or the SQLSTATE and message of the error it raised
CREATE FUNCTION pg_temp.try(sql text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
	EXECUTE sql;
	RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
	RETURN SQLSTATE || ': ' || SQLERRM;
END $$;

-- partition_of ------------------------------------------------------------------
-- PL/Proxy routes by hashtext(tenant) & (partitions - 1); of 4 partitions,
-- acme, tyrell and soylent are in partition 2, hooli in 0, initech in 1.
SELECT t, partition_of(t, 1) AS of_1, partition_of(t, 2) AS of_2, partition_of(t, 4) AS of_4,
       partition_of(t, 4) = hashtext(t) & 3 AS as_plproxy
FROM unnest(ARRAY['acme', 'tyrell', 'soylent', 'hooli', 'initech', 'cyberdyne']) t;
SELECT partition_of(NULL, 4) IS NULL AS null_tenant_no_partition;
SELECT pg_temp.try('SELECT flagmeter.check_partition(3, 0)') AS three_partitions,
       pg_temp.try('SELECT flagmeter.check_partition(0, 0)') AS none,
       pg_temp.try('SELECT flagmeter.check_partition(4, 4)') AS past_the_last,
       pg_temp.try('SELECT flagmeter.check_partition(4, -1)') AS negative,
       pg_temp.try('SELECT flagmeter.check_partition(4, NULL)') AS null_partition,
       pg_temp.try('SELECT flagmeter.check_partition(4, 3)') AS fine;

-- set_limit = store_limit, which announces nothing, then announce_limit -----------
SELECT define_meter('calls'), define_meter('seats', 'max'), define_meter('disk', 'latest'),
       define_plan('small');
SELECT store_limit('small', 'calls', 10, 'lifetime');
SELECT store_limit('small', 'seats', 100, 'lifetime');
SELECT count(*) AS outbox_after_store FROM outbox;
SELECT quota, period, mode, thresholds FROM limits WHERE plan = 'small' AND meter = 'calls';
SELECT announce_limit('small', 'calls');
SELECT kind, tenant, meter, plan FROM outbox ORDER BY version;
-- the same checks as set_limit, which calls it
SELECT pg_temp.try($$SELECT flagmeter.store_limit('nope', 'calls', 10)$$) AS unknown_plan,
       pg_temp.try($$SELECT flagmeter.store_limit('small', 'calls', 0)$$) AS zero_quota;
-- announce_limit unblocks what the stored limit no longer blocks
SELECT assign_plan(t, 'small') FROM unnest(ARRAY['acme', 'tyrell', 'soylent', 'hooli', 'initech']) t;
SELECT track('hooli', 'calls', 10);
SELECT tenant, meter FROM blocked;
SELECT store_limit('small', 'calls', 20, 'lifetime');
SELECT tenant, meter FROM blocked;
SELECT announce_limit('small', 'calls');
SELECT count(*) AS blocked_after_announce FROM blocked;
SELECT kind, tenant, meter, used, quota FROM outbox WHERE kind = 'unblocked';

-- status(tenant) and usage_series_all -------------------------------------------------
SELECT track('acme', 'calls', 3), track('initech', 'calls', 4);
SELECT (SELECT array_agg(s ORDER BY s.meter) FROM status('acme') s)
       = (SELECT array_agg(s ORDER BY s.meter) FROM status s WHERE s.tenant = 'acme') AS status_of_one_tenant;
SELECT tenant, meter, used, quota, state FROM status('acme');
SELECT count(*) AS unknown_tenant_rows FROM status('nobody');

-- events on three days, of three aggregations, folded and not
SELECT track('acme', 'calls', 1, '2026-03-01 10:00+00'), track('hooli', 'calls', 2, '2026-03-01 11:00+00'),
       track('initech', 'calls', 5, '2026-03-03 09:00+00'),
       track('acme', 'seats', 7, '2026-03-01 10:00+00'), track('hooli', 'seats', 9, '2026-03-01 12:00+00'),
       track('acme', 'disk', 40, '2026-03-01 10:00+00'), track('hooli', 'disk', 30, '2026-03-01 13:00+00');
SELECT events_folded FROM maintain();
SELECT track('initech', 'calls', 6, '2026-03-01 09:00+00'), track('initech', 'seats', 3, '2026-03-01 09:00+00'),
       track('initech', 'disk', 20, '2026-03-01 09:00+00');
SELECT m, a.bucket_start, a.used, a.counter
FROM unnest(ARRAY['calls', 'seats', 'disk']) m,
     usage_series_all(m, '2026-03-01', '2026-03-04') a
ORDER BY 1, 2;
-- the merge of every tenant's series, bucket by bucket
SELECT count(*) AS buckets_differing
FROM unnest(ARRAY['calls', 'seats', 'disk']) m,
     usage_series_all(m, '2026-03-01', '2026-03-04', 'hour') a
WHERE a.counter <> (SELECT merge_agg(s.counter)
                    FROM unnest(ARRAY['acme', 'hooli', 'initech', 'tyrell', 'soylent']) t,
                         usage_series(t, m, '2026-03-01', '2026-03-04', 'hour') s
                    WHERE s.bucket_start = a.bucket_start);
SELECT pg_temp.try($$SELECT * FROM flagmeter.usage_series_all('nope', '2026-03-01', '2026-03-04')$$) AS unknown_meter,
       pg_temp.try($$SELECT * FROM flagmeter.usage_series_all('calls', '2026-03-01', '2026-03-04', 'fortnight')$$) AS bad_bucket;

-- The fence of partition 2 of 4 -----------------------------------------------------
SELECT track('acme', 'calls', 1, now(), 'acme-key'), track('tyrell', 'calls', 1),
       override_limit('soylent', 'calls', 50), consume('hooli', 'seats', 1, 'hooli-key');
SELECT grant_credits('acme', 'calls', 5, starts_at => now() + interval '1 day') > 0 AS acme_granted;
SELECT fence_partition(4, 2);
SELECT fence_partition(4, 2);	-- already fenced: nothing more
SELECT tgrelid::regclass, tgname FROM pg_trigger
WHERE tgname LIKE 'flagmeter_moving%' AND NOT tgisinternal AND tgparentid = 0
ORDER BY tgrelid::regclass::text COLLATE "C", tgname;
-- the tenants of partition 2 may not write
SELECT pg_temp.try($$SELECT flagmeter.track('acme', 'calls')$$) AS track,
       pg_temp.try($$SELECT flagmeter.track_batch(ARRAY['hooli', 'tyrell'], ARRAY['calls', 'calls'], ARRAY[1, 1]::bigint[])$$) AS batch,
       pg_temp.try($$SELECT flagmeter.consume('acme', 'calls')$$) AS consume;
SELECT pg_temp.try($$SELECT flagmeter.consume('acme', ARRAY['calls', 'seats'], ARRAY[1, 1]::bigint[])$$) AS consume_meters,
       pg_temp.try($$SELECT flagmeter.void('acme', 'acme-key')$$) AS void,
       pg_temp.try($$SELECT flagmeter.assign_plan('tyrell', 'small')$$) AS assign_plan;
SELECT pg_temp.try($$SELECT flagmeter.override_limit('acme', 'calls', 5)$$) AS override_limit,
       pg_temp.try($$SELECT flagmeter.drop_override('soylent', 'calls')$$) AS drop_override,
       pg_temp.try($$SELECT flagmeter.assign_plan('brand-new-in-2', 'small')$$) AS new_tenant;
SELECT pg_temp.try($$SELECT flagmeter.grant_credits('acme', 'calls', 5)$$) AS grant_credits,
       pg_temp.try($$SELECT flagmeter.void_grant(g.grant_id) FROM flagmeter.credit_grants g WHERE g.tenant = 'acme'$$) AS void_grant,
       pg_temp.try($$SELECT flagmeter.grant_credits('hooli', 'calls', 5)$$) AS others_grant;
SELECT pg_temp.try($$SELECT flagmeter.reserve('acme', 'calls', 1)$$) AS reserve,
       pg_temp.try($$SELECT flagmeter.reserve('hooli', 'calls', 1)$$) AS others_reserve;
SELECT partition_of('brand-new-in-2', 4) AS new_tenant_partition;
-- what the fence says
DO $$
BEGIN
	PERFORM flagmeter.track('acme', 'calls');
EXCEPTION WHEN OTHERS THEN
	DECLARE
		detail text;
		hint text;
	BEGIN
		GET STACKED DIAGNOSTICS detail = PG_EXCEPTION_DETAIL, hint = PG_EXCEPTION_HINT;
		RAISE NOTICE '% / % / % / %', SQLSTATE, SQLERRM, detail, hint;
	END;
END $$;
-- nor may anyone change the catalog meanwhile
SELECT pg_temp.try($$SELECT flagmeter.define_meter('new_meter')$$) AS define_meter,
       pg_temp.try($$SELECT flagmeter.define_plan('new_plan')$$) AS define_plan,
       pg_temp.try($$SELECT flagmeter.set_limit('small', 'calls', 30, 'lifetime')$$) AS set_limit;
-- the others write, everyone reads
SELECT track('hooli', 'calls'), track('initech', 'calls', 1, now(), 'initech-key'),
       (consume('initech', 'seats', 2)).granted, void('initech', 'initech-key'),
       assign_plan('cyberdyne', 'small'), override_limit('hooli', 'calls', 40);
SELECT used(usage('acme', 'calls')) AS acme_used, (flagmeter.check('acme', 'calls')).remaining AS acme_remaining,
       (SELECT count(*) FROM status('acme')) AS acme_status_rows;
-- a retried consume of a recorded key replays its decision without writing
SELECT (consume('hooli', 'seats', 1, 'hooli-key')).granted AS replayed;

-- unfence gives the partition back; forget needs a fence
SELECT unfence_partition(4, 2), unfence_partition(4, 2) AS again;
SELECT count(*) AS fence_triggers FROM pg_trigger WHERE tgname LIKE 'flagmeter_moving%';
SELECT track('acme', 'calls');
SELECT pg_temp.try('SELECT flagmeter.forget_partition(4, 2)') AS unfenced;

-- Every table with a tenant column: forget_partition and the move
-- (contrib/plproxy/flagmeter-move-partition) handle exactly these.
SELECT c.relname
FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
WHERE c.relnamespace = 'flagmeter'::regnamespace AND c.relkind IN ('r', 'p')
  AND NOT c.relispartition AND a.attname = 'tenant' AND NOT a.attisdropped
ORDER BY 1;

-- rows of the partition and of the others in each of them
CREATE FUNCTION pg_temp.rows_by_partition(OUT tbl text, OUT in_2 bigint, OUT elsewhere bigint)
RETURNS SETOF record LANGUAGE plpgsql AS $$
BEGIN
	FOR tbl IN
		SELECT c.relname FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
		WHERE c.relnamespace = 'flagmeter'::regnamespace AND c.relkind IN ('r', 'p')
		  AND NOT c.relispartition AND a.attname = 'tenant' ORDER BY 1
	LOOP
		EXECUTE format('SELECT count(*) FILTER (WHERE flagmeter.partition_of(tenant, 4) = 2),'
		               ' count(*) FILTER (WHERE flagmeter.partition_of(tenant, 4) <> 2)'
		               ' FROM flagmeter.%I', tbl) INTO in_2, elsewhere;
		RETURN NEXT;
	END LOOP;
END $$;
SELECT assign_plan('acme', 'small');	-- a row in every table for partition 2
SELECT reservation_id > 0 AS reserved FROM reserve('acme', 'calls', 1, '1 day');
SELECT track('acme', 'calls', 30);
SELECT void('acme', 'acme-key');
SELECT grant_credits('acme', 'calls', 5, starts_at => now() + interval '1 day') > 0 AS granted;
SELECT events_folded > 0 AS folded FROM maintain();
CREATE TEMP TABLE before_forget AS SELECT * FROM pg_temp.rows_by_partition();
SELECT tbl, in_2 > 0 AS has_partition_2, elsewhere > 0 AS has_others FROM before_forget ORDER BY 1;
SELECT fence_partition(4, 2);
SELECT forget_partition(4, 2) = (SELECT sum(in_2) FROM before_forget) AS forgot_every_row;
SELECT a.tbl, a.in_2, a.elsewhere = b.elsewhere AS others_kept
FROM pg_temp.rows_by_partition() a JOIN before_forget b USING (tbl) ORDER BY 1;
SELECT count(*) AS fence_triggers FROM pg_trigger WHERE tgname LIKE 'flagmeter_moving%';
-- acme is a stranger here now
SELECT used(usage('acme', 'calls')) AS acme_used, quota(usage('acme', 'calls')) AS acme_quota;

-- Outbox rows a move copies: negative versions ---------------------------------------
-- A threshold row copied from the old shard keeps the threshold from being
-- announced twice here, and is never replayed nor counted as the latest.
-- (wayne: a tenant this session has never announced anything for, since a
-- session remembers the thresholds it saw announced.)
SELECT assign_plan('wayne', 'small');
TRUNCATE outbox;
SELECT latest_version() AS empty_latest;
INSERT INTO outbox (version, kind, tenant, meter, period_start, threshold, used, quota, notified)
SELECT -1, 'threshold', 'wayne', 'calls', p.period_start, 80, 16, 20, true
FROM limit_config('wayne', 'calls') c, period_bounds(now(), c.period, c.anchor, c.timezone) p;
SELECT latest_version() AS only_copied_rows;
SELECT track('wayne', 'calls', 20);	-- 80 % and 100 % reached
SELECT kind, threshold, used, version > 0 AS announced_here FROM outbox ORDER BY version;
SELECT version > 0 AS positive, kind, threshold FROM changes_since(-10);
SELECT latest_version() = (SELECT max(version) FROM outbox) AS latest_is_the_announced_one;
