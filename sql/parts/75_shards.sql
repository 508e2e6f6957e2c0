-- ---------------------------------------------------------------------------
-- Shards: what a database needs to give tenants away to another one.
--
-- Past one machine, a PL/Proxy proxy routes every per-tenant call by
-- hashtext(tenant) to one of P partitions (P a power of two), several of
-- which may live in one database (contrib/plproxy, README "Scale-out").
-- Moving partition K to another database is: fence it here (its tenants'
-- writes are refused from the moment the fence commits, after the writes in
-- flight), copy its rows from one snapshot, point the proxy at the copy,
-- wait for the proxy transactions that began before, then forget it here.
-- The fence is a set of triggers, so it costs nothing when no move is on.
-- ---------------------------------------------------------------------------

CREATE FUNCTION flagmeter.partition_of(tenant text, partitions integer)
RETURNS integer
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$
SELECT pg_catalog.hashtext($1) OPERATOR(pg_catalog.&) ($2 OPERATOR(pg_catalog.-) 1)
$$;
COMMENT ON FUNCTION flagmeter.partition_of(text, integer) IS
'the PL/Proxy partition (of partitions, a power of two) a tenant is routed to: hashtext(tenant) & (partitions - 1)';

CREATE FUNCTION flagmeter.check_partition(partitions integer, partition integer)
RETURNS void
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	IF partitions IS NULL OR partitions < 1 OR partitions > 1073741824
	   OR partitions & (partitions - 1) <> 0 THEN
		RAISE EXCEPTION 'partitions must be a power of two: %', partitions
			USING ERRCODE = 'invalid_parameter_value',
			      DETAIL = 'PL/Proxy maps hashtext(tenant) to a partition with a bit mask.';
	END IF;
	IF partition IS NULL OR partition < 0 OR partition >= partitions THEN
		RAISE EXCEPTION 'partition must be between 0 and %: %', partitions - 1, partition
			USING ERRCODE = 'invalid_parameter_value';
	END IF;
END $$;
COMMENT ON FUNCTION flagmeter.check_partition(integer, integer) IS
'raises a clear error unless partitions is a power of two and partition one of them';

-- A partition's fence is six triggers named after it; the one on tenants
-- stands for them all.
CREATE FUNCTION flagmeter.is_fenced(partitions integer, partition integer)
RETURNS boolean
LANGUAGE plpgsql STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	PERFORM flagmeter.check_partition(partitions, partition);
	RETURN EXISTS (SELECT FROM pg_trigger t
	               WHERE t.tgname = format('flagmeter_moving_%s_of_%s_new', partition, partitions)
	                 AND t.tgrelid = 'flagmeter.tenants'::regclass);
END $$;
COMMENT ON FUNCTION flagmeter.is_fenced(integer, integer) IS
'whether a partition is fenced here (being moved away)';

-- The fence's trigger: with arguments (partitions, partition) on the rows
-- of tenants, whose WHEN clause has already matched the partition; without,
-- on the catalog, which must not change while a partition is away (a new
-- period kind would recount tenants the copy has already taken).
CREATE FUNCTION flagmeter.refuse_moving()
RETURNS trigger
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	IF TG_NARGS = 0 THEN
		RAISE EXCEPTION 'flagmeter''s catalog cannot change while tenants are being moved'
			USING ERRCODE = 'object_not_in_prerequisite_state',
			      DETAIL = format('Table %s is fenced until the move is finished.', TG_TABLE_NAME),
			      HINT = 'Change the catalog once the move is done (flagmeter.forget_partition() or flagmeter.unfence_partition()).';
	END IF;
	RAISE EXCEPTION 'tenant "%" is being moved to another shard',
		left(CASE WHEN TG_OP = 'DELETE' THEN OLD.tenant ELSE NEW.tenant END, 64)
		USING ERRCODE = 'object_not_in_prerequisite_state',
		      DETAIL = format('Partition %s of %s is fenced here: its tenants'' writes are refused until the proxy routes them to their new shard.',
		                      TG_ARGV[1], TG_ARGV[0]),
		      HINT = 'Retry in a moment, with the same idempotency key.';
END $$;
COMMENT ON FUNCTION flagmeter.refuse_moving() IS
'trigger of the fence of a partition being moved: refuses the writes of its tenants (and, without arguments, changes of the catalog)';

-- Fenced tables, with the trigger events on which a tenant's row is
-- refused.  Every write of a call lands in one of them in its transaction:
-- track, track_batch and consume insert events, void inserts voids, the
-- per-tenant catalog calls write tenants, overrides or feature_overrides,
-- grant_credits and void_grant write credit_grants.
CREATE FUNCTION flagmeter.fence_partition(partitions integer, partition integer)
RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	name text := format('flagmeter_moving_%s_of_%s', partition, partitions);
	f record;
BEGIN
	IF flagmeter.is_fenced(partitions, partition) THEN
		RETURN;
	END IF;
	-- Creating a trigger waits for the transactions writing the table and
	-- holds new ones until this commits; from then on they see the fence.
	FOR f IN
		SELECT * FROM (VALUES ('events', 'INSERT', 'NEW', '_new'),
		                      ('voids', 'INSERT', 'NEW', '_new'),
		                      ('tenants', 'INSERT OR UPDATE', 'NEW', '_new'),
		                      ('tenants', 'DELETE', 'OLD', '_old'),
		                      ('overrides', 'INSERT OR UPDATE', 'NEW', '_new'),
		                      ('overrides', 'DELETE', 'OLD', '_old'),
		                      ('feature_overrides', 'INSERT OR UPDATE', 'NEW', '_new'),
		                      ('feature_overrides', 'DELETE', 'OLD', '_old'),
		                      ('credit_grants', 'INSERT OR UPDATE', 'NEW', '_new'),
		                      ('reservations', 'INSERT OR UPDATE', 'NEW', '_new'),
		                      ('rollovers', 'INSERT OR UPDATE', 'NEW', '_new')) v(tbl, ops, rec, suffix)
	LOOP
		EXECUTE format('CREATE TRIGGER %I BEFORE %s ON flagmeter.%I FOR EACH ROW'
		               ' WHEN (flagmeter.partition_of(%s.tenant, %s) OPERATOR(pg_catalog.=) %s)'
		               ' EXECUTE FUNCTION flagmeter.refuse_moving(%L, %L)',
		               name || f.suffix, f.ops, f.tbl, f.rec, partitions, partition,
		               partitions, partition);
	END LOOP;
	FOR f IN SELECT * FROM unnest(ARRAY['meters', 'plans', 'limits', 'features', 'plan_features']) v(tbl) LOOP
		CONTINUE WHEN EXISTS (SELECT FROM pg_trigger t WHERE t.tgname = 'flagmeter_moving_catalog'
		                      AND t.tgrelid = ('flagmeter.' || f.tbl)::regclass);
		EXECUTE format('CREATE TRIGGER flagmeter_moving_catalog BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE'
		               ' ON flagmeter.%I FOR EACH STATEMENT EXECUTE FUNCTION flagmeter.refuse_moving()', f.tbl);
	END LOOP;
END $$;
COMMENT ON FUNCTION flagmeter.fence_partition(integer, integer) IS
'fences a partition that is being moved away: once this commits (after the writes in flight), writes of its tenants and changes of the catalog are refused; does nothing when it is already fenced';

-- Drops the fence of a partition, and the catalog's once no partition is
-- fenced any more; false when the partition was not fenced.
CREATE FUNCTION flagmeter.unfence_partition(partitions integer, partition integer)
RETURNS boolean
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	name text := format('flagmeter_moving_%s_of_%s', partition, partitions);
	t record;
BEGIN
	IF NOT flagmeter.is_fenced(partitions, partition) THEN
		RETURN false;
	END IF;
	FOR t IN
		SELECT tg.tgname, tg.tgrelid::regclass AS rel FROM pg_trigger tg
		WHERE tg.tgname IN (name || '_new', name || '_old')
		  AND tg.tgrelid IN ('flagmeter.events'::regclass, 'flagmeter.voids'::regclass,
		                     'flagmeter.tenants'::regclass, 'flagmeter.overrides'::regclass,
		                     'flagmeter.feature_overrides'::regclass,
		                     'flagmeter.credit_grants'::regclass, 'flagmeter.reservations'::regclass,
		                     'flagmeter.rollovers'::regclass)
	LOOP
		EXECUTE format('DROP TRIGGER %I ON %s', t.tgname, t.rel);
	END LOOP;
	IF NOT EXISTS (SELECT FROM pg_trigger tg WHERE tg.tgname ~ '^flagmeter_moving_[0-9]+_of_[0-9]+_new$'
	               AND tg.tgrelid = 'flagmeter.tenants'::regclass) THEN
		FOR t IN
			SELECT tg.tgrelid::regclass AS rel FROM pg_trigger tg
			WHERE tg.tgname = 'flagmeter_moving_catalog'
			  AND tg.tgrelid IN ('flagmeter.meters'::regclass, 'flagmeter.plans'::regclass,
			                     'flagmeter.limits'::regclass, 'flagmeter.features'::regclass,
			                     'flagmeter.plan_features'::regclass)
		LOOP
			EXECUTE format('DROP TRIGGER flagmeter_moving_catalog ON %s', t.rel);
		END LOOP;
	END IF;
	RETURN true;
END $$;
COMMENT ON FUNCTION flagmeter.unfence_partition(integer, integer) IS
'drops the fence of a partition (a move given up: its tenants are served here again); false when it was not fenced';

-- After the proxy routes the partition elsewhere: its rows go, and so does
-- the fence.  Only a fenced partition can be forgotten, so that a slip of
-- the partition number cannot delete tenants still served here.  The bulk
-- goes first, under the fence (it refuses inserts, not deletes); dropping
-- the triggers locks their tables until the commit, so only the tenants'
-- catalog rows are deleted after it.
CREATE FUNCTION flagmeter.forget_partition(partitions integer, partition integer)
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
COMMENT ON FUNCTION flagmeter.forget_partition(integer, integer) IS
'deletes every row of the tenants of a fenced partition (moved to another shard) and drops its fence; returns how many rows';
