# shellcheck shell=bash
# bench/workloads/scale.sh -- the per-call ratios again with SCALE_TENANTS
# assigned tenants and SCALE_EVENTS events of history (issue 39), and what
# the history costs maintain(), usage, usage_series, pg_dump/pg_restore and
# shared memory.  About 15 minutes at a million tenants and ten million
# events: it runs only when --workload names it.

register_workload scale \
	"track and check over $SCALE_TENANTS tenants with $SCALE_EVENTS events of history; maintain, usage, dump, shared memory" explicit

# in_server_ms SQL: SQL's run time in the server, in ms
in_server_ms() {
	psql_q "SELECT round(extract(epoch FROM clock_timestamp() - s.t0) * 1000, 1)
	        FROM (SELECT clock_timestamp() AS t0) s, LATERAL ($1) x"
}

# server_shmem_mb: the server's whole shared memory in MB.  Not the rows of
# pg_shmem_allocations named for flagmeter: a fixed-size shared hash table's
# entries are allocated with it but listed as <anonymous>, so those rows
# left out most of flagmeter's tables.
server_shmem_mb() {
	psql_q "SELECT pg_size_bytes(current_setting('shared_memory_size')) / 1048576"
}

# secs_since T0: seconds since the date +%s.%N T0, one decimal
secs_since() {
	awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'
}

wl_scale() {
	local have ms t0 secs cache pend shmem dump_secs restore_secs dump_mb events
	# 1. the tenants: TENANTS are assigned already; the rest by
	#    assign_plan_batch, 10 000 a call, one statement each
	have=$(psql_q "SELECT count(*) FROM flagmeter.tenants")
	t0=$(date +%s.%N)
	psql_q "SELECT sum(flagmeter.assign_plan_batch(ARRAY(SELECT g::text FROM generate_series(c, LEAST(c + 9999, $SCALE_TENANTS)) g), 'bench'))
	        FROM generate_series($((TENANTS + 1)), $SCALE_TENANTS, 10000) c" >/dev/null
	secs=$(secs_since "$t0")
	echo "    assigned $((SCALE_TENANTS - TENANTS)) tenants with assign_plan_batch in $secs s ($have assigned before)"
	emit_row scale 1 s "$secs" - - - - - "none (measured)" - \
		"assign_plan_batch of $((SCALE_TENANTS - TENANTS)) tenants, 10 000 a call, one statement"
	psql_q "INSERT INTO peer.usage (tenant, meter, used)
	        SELECT g::text, 'api_calls', 0 FROM generate_series($((TENANTS + 1)), $SCALE_TENANTS) g
	        ON CONFLICT DO NOTHING"
	# 2. the history: SCALE_EVENTS events over all the tenants, by
	#    track_batch (2 clients, 10 000 a call), then maintain() timed
	script fill_scale <<EOF2
SELECT flagmeter.track_batch(
	(SELECT array_agg((1 + floor(random() * $SCALE_TENANTS)::int)::text) FROM generate_series(1, $BATCH_SIZE)),
	array_fill('api_calls'::text, ARRAY[$BATCH_SIZE]), array_fill(1::bigint, ARRAY[$BATCH_SIZE]));
EOF2
	t0=$(date +%s.%N)
	run_as_pg pgbench -n -M prepared -c 2 -j 2 -t $((SCALE_EVENTS / BATCH_SIZE / 2)) -f "$SCRIPTS/fill_scale.sql" "$DB" \
		>"$OUT/scale.fill.stdout" 2>&1 || {
		cat "$OUT/scale.fill.stdout" >&2
		return 1
	}
	secs=$(secs_since "$t0")
	events=$(psql_q "SELECT count(*) FROM flagmeter.events")
	echo "    recorded $SCALE_EVENTS events in $secs s; flagmeter.events has $events"
	# the peer's event table with the same history: a plain-SQL metering
	# table holds its events too, and an INSERT into a 10 M-row index costs
	# more than one into the near-empty table of the 10 000-tenant rows
	t0=$(date +%s.%N)
	psql_q "INSERT INTO peer.events (tenant, meter, amount, occurred_at)
	        SELECT (1 + floor(random() * $SCALE_TENANTS)::int)::text, 'api_calls', 1, now()
	        FROM generate_series(1, $SCALE_EVENTS)" >/dev/null
	echo "    the peer's events: $SCALE_EVENTS rows in $(secs_since "$t0") s"
	psql_q "CHECKPOINT"
	ms=$(in_server_ms "SELECT flagmeter.maintain()")
	echo "    maintain() after them: $ms ms"
	emit_row scale 1 ms "$ms" - - - - - "none (measured)" - \
		"one maintain() after $SCALE_EVENTS events over $SCALE_TENANTS tenants were recorded (it folds what they left pending)"
	ms=$(in_server_ms "SELECT flagmeter.maintain()")
	emit_row scale 1 ms "$ms" - - - - - "none (measured)" - \
		"the next maintain(), with $events events and $SCALE_TENANTS tenants of history and nothing new"
	psql_q "VACUUM ANALYZE" >/dev/null
	# 3. one tenant's reads over that history
	ms=$(in_server_ms "SELECT flagmeter.usage('5', 'api_calls')")
	emit_row scale 1 ms "$ms" - - - - - "none (measured)" - "usage() of one tenant, first call of the session"
	ms=$(in_server_ms "SELECT count(*) FROM flagmeter.usage_series('5', 'api_calls', now() - interval '1 day', now(), 'hour')")
	emit_row scale 1 ms "$ms" - - - - - "none (measured)" - "usage_series() of one tenant, a day in hours"
	# 4. the per-call ratios over all the tenants
	script fm_track_scale <<EOF2
\set t random(1, $SCALE_TENANTS)
SELECT flagmeter.track(:t, 'api_calls');
EOF2
	script peer_insert_scale <<EOF2
\set t random(1, $SCALE_TENANTS)
INSERT INTO peer.events (tenant, meter, amount) VALUES (:t, 'api_calls', 1);
EOF2
	script fm_check_scale <<EOF2
\set t random(1, $SCALE_TENANTS)
SELECT * FROM flagmeter.check(:t, 'api_calls');
EOF2
	script peer_select_scale <<EOF2
\set t random(1, $SCALE_TENANTS)
SELECT used FROM peer.usage WHERE tenant = :t::text AND meter = 'api_calls';
EOF2
	show_scripts fm_track_scale peer_insert_scale fm_check_scale peer_select_scale
	measure scale "$CLIENTS" prepared 0 peer_insert_scale fm_track_scale peer_select_scale fm_check_scale
	cache=$(psql_q "SELECT COALESCE(format('shared limit cache: %s entries of %s, %s not stored',
	                                       entries, capacity, not_stored), 'no shared limit cache')
	                FROM flagmeter.shared_limit_cache()")
	pend=$(psql_q "SELECT format('pending table: %s periods, %s calls found no room', periods, no_room)
	               FROM flagmeter.pending_usage_stats()")
	echo "    $cache; $pend"
	ratio_row scale "$CLIENTS" scale.fm_track_scale scale.peer_insert_scale "INSERT event row" 0.9 "" \
		"default sizes: track over $SCALE_TENANTS tenants with $events events of history; $cache; $pend"
	ratio_row scale "$CLIENTS" scale.fm_check_scale scale.peer_select_scale "primary-key SELECT" 0.9 "" \
		"default sizes: check over $SCALE_TENANTS tenants with $events events of history"
	# the same with the shared limit cache and the pending table sized for
	# every tenant (operations guide, "Tuning"), the server restarted
	psql_q "ALTER SYSTEM SET flagmeter.shared_limits = $((SCALE_TENANTS + SCALE_TENANTS / 10))"
	psql_q "ALTER SYSTEM SET flagmeter.pending_periods = $((SCALE_TENANTS + SCALE_TENANTS / 10))"
	restart_server || return 1
	psql_q "SELECT flagmeter.maintain()" >/dev/null
	shmem=$(server_shmem_mb)
	echo "    sized for $SCALE_TENANTS tenants: the server's shared memory $shmem MB"
	measure scale.sized "$CLIENTS" prepared 0 peer_insert_scale fm_track_scale peer_select_scale fm_check_scale
	cache=$(psql_q "SELECT format('shared limit cache: %s entries of %s, %s not stored', entries, capacity, not_stored)
	                FROM flagmeter.shared_limit_cache()")
	pend=$(psql_q "SELECT format('pending table: %s periods, %s calls found no room', periods, no_room)
	               FROM flagmeter.pending_usage_stats()")
	echo "    $cache; $pend"
	ratio_row scale.sized "$CLIENTS" scale.sized.fm_track_scale scale.sized.peer_insert_scale "INSERT event row" 0.9 "" \
		"sized for the tenants (the server's shared memory $shmem MB): track over $SCALE_TENANTS tenants; $cache; $pend"
	ratio_row scale.sized "$CLIENTS" scale.sized.fm_check_scale scale.sized.peer_select_scale "primary-key SELECT" 0.9 "" \
		"sized for the tenants: check over $SCALE_TENANTS tenants"
	emit_row scale.sized 1 MB "$shmem" - - - - - "none (measured)" - \
		"the server's shared memory (shared_memory_size) with shared_limits and pending_periods at $((SCALE_TENANTS + SCALE_TENANTS / 10))"
	psql_q "ALTER SYSTEM RESET flagmeter.shared_limits"
	psql_q "ALTER SYSTEM RESET flagmeter.pending_periods"
	restart_server || return 1
	# 5. shared memory, and pg_dump/pg_restore of the database
	shmem=$(server_shmem_mb)
	emit_row scale 1 MB "$shmem" - - - - - "none (measured)" - \
		"the server's shared memory (shared_memory_size) with the bench's settings, fixed at start: the same for 10 000 or $SCALE_TENANTS tenants"
	t0=$(date +%s.%N)
	run_as_pg pg_dump -Fc -Z 1 -f "$FM_TMP/scale.dump" "$DB" || return 1
	dump_secs=$(secs_since "$t0")
	dump_mb=$(du -m "$FM_TMP/scale.dump" | cut -f1)
	emit_row scale 1 s "$dump_secs" - - - - - "none (measured)" - \
		"pg_dump -Fc of the database ($dump_mb MB: $events events, $SCALE_TENANTS tenants, the peers' tables)"
	# serial, then in the operations guide's three steps with --jobs 2 (a
	# plain -j lets the extension's configuration tables load before those
	# their foreign keys name)
	run_as_pg createdb -T template0 scale_restore
	t0=$(date +%s.%N)
	run_as_pg pg_restore -d scale_restore "$FM_TMP/scale.dump" >"$OUT/scale.restore.log" 2>&1 || {
		tail -n 20 "$OUT/scale.restore.log" >&2
		return 1
	}
	restore_secs=$(secs_since "$t0")
	run_as_pg dropdb scale_restore
	emit_row scale 1 s "$restore_secs" - - - - - "none (measured)" - "pg_restore (serial) of that dump into a new database"
	run_as_pg createdb -T template0 scale_restore
	t0=$(date +%s.%N)
	{
		run_as_pg pg_restore --section=pre-data -d scale_restore "$FM_TMP/scale.dump" &&
			run_as_pg pg_restore --section=data --jobs 2 --disable-triggers -d scale_restore "$FM_TMP/scale.dump" &&
			run_as_pg pg_restore --section=post-data --jobs 2 -d scale_restore "$FM_TMP/scale.dump"
	} >"$OUT/scale.restore_parallel.log" 2>&1 || {
		tail -n 20 "$OUT/scale.restore_parallel.log" >&2
		return 1
	}
	restore_secs=$(secs_since "$t0")
	run_as_pg dropdb scale_restore
	rm -f "$FM_TMP/scale.dump"
	emit_row scale 1 s "$restore_secs" - - - - - "none (measured)" - \
		"pg_restore of that dump in the operations guide's three steps, --jobs 2"
}
