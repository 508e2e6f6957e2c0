# shellcheck shell=bash
# bench/workloads/listeners.sh -- track with LISTEN sessions attached
# against track without them, and against an upsert whose row trigger calls
# pg_notify, with the same listeners.

register_workload listeners "track with $LISTENERS listeners vs without, and vs upsert + per-row pg_notify trigger"

# LISTEN sessions: psql runs a trivial query every 0.2 s so that it reads
# the notifications its backend sends; nothing else.
LISTENER_PIDS=()
start_listeners() {
	local i n
	cat >"$OUT/listen.psql" <<'EOF'
LISTEN bench_usage;
LISTEN flagmeter;
SELECT 1 \watch 0.2
EOF
	own "$OUT/listen.psql"
	for ((i = 0; i < LISTENERS; i++)); do
		run_as_pg psql -X -q -d "dbname=$DB application_name=fm_bench_listener" \
			-f "$OUT/listen.psql" >/dev/null 2>&1 &
		LISTENER_PIDS+=($!)
	done
	for ((i = 0; i < 100; i++)); do
		n=$(psql_q "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'fm_bench_listener'")
		((n >= LISTENERS)) && return 0
		sleep 0.1
	done
	fm_err "only $n of $LISTENERS listener sessions connected"
	return 1
}

stop_listeners() {
	stop_app fm_bench_listener ${LISTENER_PIDS[@]+"${LISTENER_PIDS[@]}"}
	LISTENER_PIDS=()
}

# a workload that fails while its listeners are attached leaves them running
listeners_cleanup() {
	if ((${#LISTENER_PIDS[@]} > 0)); then
		stop_listeners
	fi
}
on_workload_exit listeners_cleanup

wl_listeners() {
	local notifies
	script peer_upsert_notify <<EOF
\set t random(1, $TENANTS)
INSERT INTO peer.usage_notify AS u (tenant, meter, used) VALUES (:t, 'api_calls', 1)
ON CONFLICT (tenant, meter) DO UPDATE SET used = u.used + EXCLUDED.used;
EOF
	around_script listeners.peer_upsert_notify start_listeners stop_listeners
	# flagmeter's quota events (and so anything worth listening to) come
	# with its outbox
	notifies=$(psql_q "SELECT to_regclass('flagmeter.outbox') IS NOT NULL")
	if [[ $notifies != t ]]; then
		show_scripts fm_track peer_upsert_notify
		echo "    peer runs with $LISTENERS LISTEN sessions attached; flagmeter's without any"
		measure listeners "$CLIENTS" prepared 0 peer_upsert_notify fm_track
		skip_row listeners "$CLIENTS" "track, no listeners" ">= 0.95 x peer" \
			"not yet available: flagmeter sends no notifications in this build"
		ratio_row listeners "$CLIENTS" listeners.fm_track listeners.peer_upsert_notify \
			"upsert + pg_notify trigger" 3.0 "" \
			"flagmeter side: track without listeners; peer with $LISTENERS listeners"
		return 0
	fi
	# fm_track_listened is fm_track with the listeners attached
	script fm_track_listened <"$SCRIPTS/fm_track.sql"
	around_script listeners.fm_track_listened start_listeners stop_listeners
	show_scripts fm_track_listened peer_upsert_notify
	echo "    fm_track_listened and the peer run with $LISTENERS LISTEN sessions attached (channels"
	echo "    flagmeter and bench_usage), fm_track without any"
	measure listeners "$CLIENTS" prepared 0 peer_upsert_notify fm_track fm_track_listened
	ratio_row listeners "$CLIENTS" listeners.fm_track_listened listeners.fm_track \
		"track, no listeners" 0.95 "" \
		"no threshold is crossed in the run (quota $BIG_QUOTA): listeners must cost track nothing"
	ratio_row listeners "$CLIENTS" listeners.fm_track_listened listeners.peer_upsert_notify \
		"upsert + pg_notify trigger" 3.0 "" "both with $LISTENERS listeners attached"
}
