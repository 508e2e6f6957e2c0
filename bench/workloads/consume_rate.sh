# shellcheck shell=bash
# bench/workloads/consume_rate.sh -- consume of tenants whose plan has a
# rate limit besides its quota (issue 37) against the same consume of
# tenants whose plan has the quota alone: what the rate limit adds to a
# consume.  Both plans have the same quota ($BIG_QUOTA a month); plan
# bench_rate adds $RATE_LIMIT_RATE units a second, more than any tenant is
# called here, so no call is refused and both sides do the same work but
# the limiter's.  Each side has its own fresh tenants, named alike ('r1' ..
# against 'q1' ..), so that the statements differ in one letter only.
#   consume_rate      tenants random of $TENANTS; checks afterwards that
#                     every call was granted (the events recorded equal the
#                     calls pgbench made)
#   consume_rate_hot  every client on one tenant; then the over-grant check:
#                     a tenant of $RATE_TIGHT_BURST calls an hour (its rate
#                     override), spent by more calls than that
# Skipped while flagmeter.set_rate_limit() does not exist in the build.

register_workload consume_rate "consume with a rate limit and a quota vs quota alone ($TENANTS tenants)"
register_workload consume_rate_hot "consume with a rate limit and a quota vs quota alone, one tenant; over-grant check"

RATE_PROC='flagmeter.set_rate_limit(text,text,bigint,interval,bigint)'

consume_rate_setup() {
	[[ $(psql_q "SELECT count(*) FROM flagmeter.plans WHERE plan = 'bench_rate'" 2>/dev/null) == 1 ]] &&
		return 0
	fm_log "consume_rate: plan bench_rate ($RATE_LIMIT_RATE a second), tenants r1 .. r$TENANTS on it, q1 .. q$TENANTS on plan bench"
	run_as_pg psql -X -q -v ON_ERROR_STOP=1 -d "$DB" >/dev/null <<EOF
SELECT flagmeter.define_plan('bench_rate');
SELECT flagmeter.set_limit('bench_rate', 'api_calls', $BIG_QUOTA, 'month');
SELECT flagmeter.set_rate_limit('bench_rate', 'api_calls', $RATE_LIMIT_RATE, '1 second');
SELECT count(flagmeter.assign_plan('r' || i, 'bench_rate')) FROM generate_series(1, $TENANTS) i;
SELECT count(flagmeter.assign_plan('q' || i, 'bench')) FROM generate_series(1, $TENANTS) i;
SELECT flagmeter.assign_plan('hotr', 'bench_rate');
SELECT flagmeter.assign_plan('hotq', 'bench');
SELECT flagmeter.assign_plan('rate_tight', 'bench_rate');
SELECT flagmeter.override_rate_limit('rate_tight', 'api_calls', 1, '1 hour', $RATE_TIGHT_BURST);
EOF
}

rate_skipped() {
	if [[ $(psql_q "SELECT to_regprocedure('$RATE_PROC') IS NOT NULL") == t ]]; then
		return 1
	fi
	skip_row "$1" "$CLIENTS" "consume, quota alone" ">= 0.9 x peer" \
		"not yet available: no $RATE_PROC in this build"
}

# calls_of LABEL: the transactions pgbench completed in every run of LABEL,
# the warm-up's too
calls_of() {
	cat "$OUT/$1".warmup.stdout "$OUT/$1".r*.stdout 2>/dev/null |
		sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p' |
		awk '{ s += $1 } END { print s + 0 }'
}

# cache_stats: "entries capacity not_stored" of the shared limit cache, and
# "periods no_room" of the usage pending in shared memory
cache_stats() {
	psql_q "SELECT concat_ws(' ', c.entries, c.capacity, c.not_stored, p.periods, p.no_room)
	        FROM flagmeter.shared_limit_cache() c, flagmeter.pending_usage_stats() p"
}

# Before each run of either side: maintain() twice, which folds the usage
# pending in shared memory into the counter rows and then frees the
# periods it folded, so that each side finds room there for its tenants'
# periods (flagmeter.pending_periods, 16 384 by default: the two sides'
# 20 000 do not fit at once, and a tenant that finds none writes a counter
# row on every call).  A period is freed by the fold after the one that
# emptied it.
maintain_between() {
	psql_q "SELECT flagmeter.maintain()" >/dev/null
	psql_q "SELECT flagmeter.maintain()" >/dev/null
}
for s in consume_rate.fm_consume_quota consume_rate.fm_consume_rate \
	consume_rate_hot.fm_consume_quota_hot consume_rate_hot.fm_consume_rate_hot; do
	around_script "$s" maintain_between ""
done
unset s

# cache_check BEFORE: sets cache_note to what the shared limit cache did
# since BEFORE (cache_stats), and cache_gate when it left limits out: those
# are read from the catalog again in every new backend, so the row would
# time the cache's size, not the rate limit
cache_check() {
	local before after
	read -r -a before <<<"$1"
	read -r -a after <<<"$(cache_stats)"
	cache_note="shared limit cache: ${after[0]} entries of ${after[1]}, $((after[2] - before[2])) limits not stored during the workload; pending usage: $((after[4] - before[4])) calls found no room"
	cache_gate=
	if ((after[2] > before[2])); then
		cache_gate="$((after[2] - before[2])) limits found no room in the shared limit cache (raise flagmeter.shared_limits)"
	fi
	if ((after[4] > before[4])); then
		cache_gate="${cache_gate:+$cache_gate; }$((after[4] - before[4])) calls found no room for their pending usage (flagmeter.pending_periods)"
	fi
}

# events_of WHERE: events recorded for the tenants WHERE selects
events_of() {
	psql_q "SELECT COALESCE(sum(amount), 0) FROM flagmeter.events WHERE $1"
}

wl_consume_rate() {
	rate_skipped consume_rate && return 0
	consume_rate_setup
	script fm_consume_rate <<EOF
\set t random(1, $TENANTS)
SELECT flagmeter.consume('r' || :t, 'api_calls', 1);
EOF
	script fm_consume_quota <<EOF
\set t random(1, $TENANTS)
SELECT flagmeter.consume('q' || :t, 'api_calls', 1);
EOF
	show_scripts fm_consume_rate fm_consume_quota
	local cache calls events qcalls qevents gate='' note cache_note cache_gate
	cache=$(cache_stats)
	measure consume_rate "$CLIENTS" prepared 0 fm_consume_quota fm_consume_rate
	calls=$(calls_of consume_rate.fm_consume_rate)
	events=$(events_of "tenant ~ '^r[0-9]+$'")
	qcalls=$(calls_of consume_rate.fm_consume_quota)
	qevents=$(events_of "tenant ~ '^q[0-9]+$'")
	cache_check "$cache"
	note="all granted: $calls calls, $events events recorded (quota alone: $qcalls, $qevents); $cache_note"
	if ((calls != events || qcalls != qevents)); then
		gate="REFUSED $((calls - events)) of $calls calls ($((qcalls - qevents)) of $qcalls with the quota alone): the sides did not do the same work"
	fi
	[[ -z $cache_gate ]] || gate="${gate:+$gate; }$cache_gate"
	ratio_row consume_rate "$CLIENTS" consume_rate.fm_consume_rate consume_rate.fm_consume_quota \
		"consume, quota alone" 0.9 "$gate" "$note"
}

wl_consume_rate_hot() {
	rate_skipped consume_rate_hot && return 0
	consume_rate_setup
	script fm_consume_rate_hot <<'EOF'
SELECT flagmeter.consume('hotr', 'api_calls', 1);
EOF
	script fm_consume_quota_hot <<'EOF'
SELECT flagmeter.consume('hotq', 'api_calls', 1);
EOF
	script fm_consume_rate_tight <<'EOF'
SELECT flagmeter.consume('rate_tight', 'api_calls', 1);
EOF
	show_scripts fm_consume_rate_hot fm_consume_quota_hot
	local cache calls events gate='' note cache_note cache_gate
	cache=$(cache_stats)
	measure consume_rate_hot "$CLIENTS" prepared 0 fm_consume_quota_hot fm_consume_rate_hot
	calls=$(calls_of consume_rate_hot.fm_consume_rate_hot)
	events=$(events_of "tenant = 'hotr'")

	# Over-grants: every client at once, 1.5 x the tenant's burst in all;
	# its rate (one an hour) gives nothing back during the check, so
	# exactly the burst is granted, and recorded; the refused calls record
	# nothing.
	local per_client=$(((RATE_TIGHT_BURST * 3 / 2 + CLIENTS - 1) / CLIENTS)) used tight_events
	echo "    over-grant check: $CLIENTS clients x $per_client calls of consume('rate_tight', 'api_calls', 1)," \
		"rate 1 an hour, burst $RATE_TIGHT_BURST"
	pg_nofile pgbench -n -M prepared -c "$CLIENTS" -j 2 -t "$per_client" \
		-f "$SCRIPTS/fm_consume_rate_tight.sql" "$DB" \
		>"$OUT/consume_rate_hot.tight.stdout" 2>"$OUT/consume_rate_hot.tight.stderr" ||
		echo $? >"$OUT/consume_rate_hot.tight.rc"
	[[ -e $OUT/consume_rate_hot.tight.rc ]] || echo 0 >"$OUT/consume_rate_hot.tight.rc"
	run_result "$OUT/consume_rate_hot.tight" 0 >/dev/null
	used=$(psql_q "SELECT used FROM flagmeter.check('rate_tight', 'api_calls')")
	tight_events=$(events_of "tenant = 'rate_tight'")
	cache_check "$cache"
	note="all granted: $calls calls, $events events; over-grant check: burst $RATE_TIGHT_BURST, $((per_client * CLIENTS)) calls, used $used, events $tight_events; $cache_note"
	if ((calls != events)); then
		gate="REFUSED $((calls - events)) of $calls calls: the sides did not do the same work"
	fi
	if ((used > RATE_TIGHT_BURST || tight_events > RATE_TIGHT_BURST)); then
		gate="${gate:+$gate; }OVER-GRANTED by $((used > tight_events ? used - RATE_TIGHT_BURST : tight_events - RATE_TIGHT_BURST))"
	elif ((used != tight_events || used < RATE_TIGHT_BURST)); then
		gate="${gate:+$gate; }rate check: used $used, events $tight_events, burst $RATE_TIGHT_BURST"
	elif [[ -z $gate ]]; then
		note="zero over-grants ($note)"
	fi
	ratio_row consume_rate_hot "$CLIENTS" consume_rate_hot.fm_consume_rate_hot \
		consume_rate_hot.fm_consume_quota_hot "consume, quota alone" 0.9 "$gate" "$note"
}
