# shellcheck shell=bash
# bench/workloads/onboarding.sh -- assigning new tenants with a short and
# with a long history of events (issue 39): each catalog call must cost the
# same whatever the history, so the peer is the same calls before it.

register_workload onboarding \
	"assign_plan_batch and assign_plan of new tenants with $ONBOARD_EVENTS events of history vs without"

# assign_ms SQL: SQL's run time in the server, in ms (a connection costs
# more than what is measured)
assign_ms() {
	psql_q "SELECT round(extract(epoch FROM clock_timestamp() - s.t0) * 1000, 1)
	        FROM (SELECT clock_timestamp() AS t0) s, LATERAL ($1) x"
}

# onboard PREFIX: "batch_ms single_ms" for ONBOARD_TENANTS new tenants
# PREFIX-b1 ... by assign_plan_batch (10 000 a call, each call its own
# statement as a loader's would be) and ONBOARD_SINGLE new tenants PREFIX-s1
# ... by one assign_plan each
onboard() {
	local prefix=$1 batch=0 single ms from
	for ((from = 1; from <= ONBOARD_TENANTS; from += 10000)); do
		ms=$(assign_ms "SELECT flagmeter.assign_plan_batch(array_agg('$prefix-b' || i), 'bench')
		                FROM generate_series($from, LEAST($from + 9999, $ONBOARD_TENANTS)) i")
		batch=$(awk -v a="$batch" -v b="$ms" 'BEGIN { print a + b }')
	done
	single=$(assign_ms "SELECT count(flagmeter.assign_plan('$prefix-s' || i, 'bench'))
	                    FROM generate_series(1, $ONBOARD_SINGLE) i")
	echo "$batch $single"
}

wl_onboarding() {
	local events before after b_rate s_rate b_peer s_peer r
	if [[ $(psql_q "SELECT to_regprocedure('flagmeter.assign_plan_batch(text[], text, timestamptz, text)') IS NOT NULL") != t ]]; then
		skip_row onboarding 1 - ">= 0.9 x peer" "not yet available: flagmeter.assign_plan_batch does not exist in this build"
		return 0
	fi
	psql_q "SELECT flagmeter.maintain()" >/dev/null
	events=$(psql_q "SELECT count(*) FROM flagmeter.events")
	read -r -a before <<<"$(onboard short)"
	echo "    with $events events: $ONBOARD_TENANTS by assign_plan_batch in ${before[0]} ms, $ONBOARD_SINGLE by assign_plan in ${before[1]} ms"
	# the history: ONBOARD_EVENTS events of the bench's tenants, folded into
	# the counter rows as pg_cron's maintain() would
	psql_q "SELECT count(flagmeter.track_batch(t, m, a)) FROM (
	            SELECT array_agg((1 + i % $TENANTS)::text) t, array_agg('api_calls'::text) m, array_agg(1::bigint) a
	            FROM generate_series(1, $ONBOARD_EVENTS) i GROUP BY i / $BATCH_SIZE) s" >/dev/null
	psql_q "SELECT flagmeter.maintain()" >/dev/null
	psql_q "VACUUM ANALYZE flagmeter.events"
	events=$(psql_q "SELECT count(*) FROM flagmeter.events")
	read -r -a after <<<"$(onboard long)"
	echo "    with $events events: $ONBOARD_TENANTS by assign_plan_batch in ${after[0]} ms, $ONBOARD_SINGLE by assign_plan in ${after[1]} ms"
	# as rates (tenants a second), so the ratio reads like the others': 1.0
	# means the history costs nothing
	b_rate=$(awk -v n="$ONBOARD_TENANTS" -v t="${after[0]}" 'BEGIN { printf "%.0f", n * 1000 / t }')
	b_peer=$(awk -v n="$ONBOARD_TENANTS" -v t="${before[0]}" 'BEGIN { printf "%.0f", n * 1000 / t }')
	r=$(ratio "$b_rate" "$b_peer")
	emit_row onboarding 1 tenants/s "$b_rate" - "same, $(printf '%s' "${before[0]}" | cut -d. -f1) ms before the history" "$b_peer" - \
		"$r" ">= 0.9 x peer" "$(met "$r" 0.9)" \
		"assign_plan_batch of $ONBOARD_TENANTS new tenants (10 000 a call) with $events events of history; a million at this rate: $(awk -v r="$b_rate" 'BEGIN { printf "%.1f", 1000000 / r / 60 }') min"
	s_rate=$(awk -v n="$ONBOARD_SINGLE" -v t="${after[1]}" 'BEGIN { printf "%.0f", n * 1000 / t }')
	s_peer=$(awk -v n="$ONBOARD_SINGLE" -v t="${before[1]}" 'BEGIN { printf "%.0f", n * 1000 / t }')
	r=$(ratio "$s_rate" "$s_peer")
	emit_row onboarding 1 calls/s "$s_rate" - "same before the history" "$s_peer" - \
		"$r" ">= 0.9 x peer" "$(met "$r" 0.9)" \
		"assign_plan of $ONBOARD_SINGLE new tenants, one call each in one statement, with $events events of history"
}
