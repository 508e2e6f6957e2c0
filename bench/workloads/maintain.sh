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
