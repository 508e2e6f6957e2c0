# shellcheck shell=bash
# bench/workloads/maintain.sh -- one maintain() folding a known number of
# events; an absolute target, no peer.

register_workload maintain "maintain() folding $MAINTAIN_EVENTS events (when flagmeter.maintain exists)"

wl_maintain() {
	local calls t0 t1 folded secs rate exists
	exists=$(psql_q "SELECT to_regprocedure('flagmeter.maintain()') IS NOT NULL")
	if [[ $exists != t ]]; then
		skip_row maintain 1 - ">= 500000 ev/s" \
			"not yet available: flagmeter.maintain() does not exist in this build"
		return 0
	fi
	# Fold what earlier workloads left, untimed, then record exactly
	# MAINTAIN_EVENTS events (blocks of 100 tenants per call, over all
	# tenants) and time one maintain() folding them.
	echo "    folding the earlier workloads' events (untimed)"
	psql_q "SELECT flagmeter.maintain()" >/dev/null
	calls=$((MAINTAIN_EVENTS / BATCH_SIZE))
	script fill_maintain <<EOF
\set b random(0, $((TENANTS / 100 - 1)))
SELECT flagmeter.track_batch(
	(SELECT array_agg((1 + :b * 100 + g % 100)::text) FROM generate_series(0, $((BATCH_SIZE - 1))) g),
	array_fill('api_calls'::text, ARRAY[$BATCH_SIZE]),
	array_fill(1::bigint, ARRAY[$BATCH_SIZE]));
EOF
	echo "    recording $((calls * BATCH_SIZE)) events with track_batch"
	run_as_pg pgbench -n -M prepared -c 2 -j 2 -t $((calls / 2)) -f "$SCRIPTS/fill_maintain.sql" "$DB" \
		>"$OUT/maintain.fill.stdout" 2>&1 || {
		cat "$OUT/maintain.fill.stdout" >&2
		return 1
	}
	psql_q "CHECKPOINT"
	t0=$(date +%s.%N)
	# events_folded is what maintain() reports; fall back on what we recorded
	folded=$(psql_q "SELECT events_folded FROM flagmeter.maintain()" 2>/dev/null) ||
		{
			psql_q "SELECT flagmeter.maintain()" >/dev/null
			folded=$(((calls / 2) * 2 * BATCH_SIZE))
		}
	t1=$(date +%s.%N)
	secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", b - a }')
	rate=$(awk -v n="$folded" -v s="$secs" 'BEGIN { printf "%.0f", (s > 0) ? n / s : 0 }')
	rate_row maintain 1 ev/s "$rate" - - - - 500000 \
		"one maintain() folding $folded events took $secs s (wall clock, incl. psql connect)"
}

register_workload maintain_history \
	"maintain()'s counter steps with $HISTORY_PERIODS ended periods of history vs without"

# counter_steps_ms: maintain()'s two counter steps, compact_counters() and
# merge_idle_stripes() from the last run's watermark, each time the first
# call of a fresh session (pg_cron runs each maintain() in its own, and
# pays for its plans), timed inside the server: the connection's own cost
# would drown what the history costs.  ms, the median of five.
counter_steps_ms() {
	local times=() _
	for _ in 1 2 3 4 5; do
		times+=("$(psql_q "SELECT round(extract(epoch FROM clock_timestamp() - s.t0) * 1000, 1)
		                   FROM (SELECT clock_timestamp() AS t0) s,
		                        LATERAL (SELECT flagmeter.compact_counters(),
		                                        flagmeter.merge_idle_stripes((SELECT m.folded_through
		                                                                      FROM flagmeter.maintenance_state m))) x")")
	done
	printf '%s\n' "${times[@]}" | sort -n | sed -n 3p
}

wl_maintain_history() {
	local without with
	# What a live install has: an open period for every tenant (earlier
	# workloads may have made them already).  Two runs first merge and
	# compact what they can, so both timings below find nothing to do and
	# measure only how the two steps find their work.
	psql_q "SELECT flagmeter.track_batch(array_agg(i::text), array_agg('api_calls'::text), array_agg(1::bigint))
	        FROM generate_series(1, $TENANTS) i" >/dev/null
	psql_q "SELECT flagmeter.maintain()" >/dev/null
	psql_q "SELECT flagmeter.maintain()" >/dev/null
	without=$(counter_steps_ms)
	echo "    without history: ${without} ms"
	# The history a long-lived install keeps: one compacted row per
	# tenant, meter and ended month.
	psql_q "INSERT INTO flagmeter.counters (tenant, meter, period_start, stripe, counter)
	        SELECT 'history-' || i, 'api_calls',
	               date_trunc('month', now()) - make_interval(months => m), 0,
	               'used=1 events=1 max=1 latest=1@2020-01-01T00:00:00Z'
	        FROM generate_series(1, $((HISTORY_PERIODS / 20))) i, generate_series(1, 20) m"
	psql_q "VACUUM ANALYZE flagmeter.counters"
	with=$(counter_steps_ms)
	echo "    with $HISTORY_PERIODS ended periods: ${with} ms"
	psql_q "DELETE FROM flagmeter.counters WHERE tenant LIKE 'history-%'"
	psql_q "VACUUM ANALYZE flagmeter.counters"
	# as rates (runs per second), so the ratio reads like the others':
	# 1.0 means the history costs nothing
	local fm_rate peer_rate r
	fm_rate=$(awk -v t="$with" 'BEGIN { printf "%.1f", 1000 / t }')
	peer_rate=$(awk -v t="$without" 'BEGIN { printf "%.1f", 1000 / t }')
	r=$(ratio "$without" "$with")
	emit_row maintain_history 1 runs/s "$fm_rate" - "same steps without history" "$peer_rate" - \
		"$r" ">= 0.8 x peer" "$(met "$r" 0.8)" \
		"compact_counters() + merge_idle_stripes(), first call of a fresh session, timed in the server, median of 5: ${with} ms with $HISTORY_PERIODS rows of ended periods, ${without} ms without"
}
