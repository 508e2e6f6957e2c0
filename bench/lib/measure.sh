# shellcheck shell=bash
# bench/lib/measure.sh -- pgbench runs, the warm-up and alternating timed
# rounds of a workload's scripts (measure), the wait-event sampler of
# --waits, and the rates and latencies read back from the results.
# Sourced by bench/run.

# Hooks run around each run of a script of a workload: PRE_HOOK[wl.script]
# and POST_HOOK[wl.script] name a function (e.g. start_listeners).
# shellcheck disable=SC2034  # read through a nameref in run_hook
declare -A PRE_HOOK=() POST_HOOK=()

# around_script WORKLOAD.SCRIPT BEFORE AFTER: run the function BEFORE
# before and AFTER after each run of that script, warm-up and timed.
around_script() {
	PRE_HOOK[$1]=$2
	POST_HOOK[$1]=$3
}
# Connection of a workload's runs: pgbench options before the database.
CONN_ARGS=()

# pgbench_run PREFIX CLIENTS MODE SECONDS SCRIPT LOG_PREFIX: one pgbench
# run; stdout/stderr/exit status in PREFIX.{stdout,stderr,rc}, and the
# per-transaction logs in LOG_PREFIX.* unless LOG_PREFIX is empty.
pgbench_run() {
	local prefix=$1 clients=$2 mode=$3 secs=$4 name=$5 log_prefix=$6
	local threads=$((clients < 2 ? clients : 2)) rc=0
	local args=(-n -M "$mode" -c "$clients" -j "$threads" -T "$secs" -f "$SCRIPTS/$name.sql")
	if [[ -n $log_prefix ]]; then
		args+=(--log "--log-prefix=$log_prefix")
	fi
	pg_nofile pgbench "${args[@]}" ${CONN_ARGS[@]+"${CONN_ARGS[@]}"} "$DB" \
		>"$prefix.stdout" 2>"$prefix.stderr" || rc=$?
	echo "$rc" >"$prefix.rc"
}

# run_result PREFIX TOLERANT: check a pgbench run; prints "tps errors
# transactions".  Errors are failed transactions plus aborted clients.  A
# run with errors is a failure unless TOLERANT=1 (pgbouncer: errors are a
# result there).
run_result() {
	local prefix=$1 tolerant=$2 tps failed aborted rc processed
	rc=$(cat "$prefix.rc")
	tps=$(sed -n 's/^tps = \([0-9.]*\) (without initial connection time)$/\1/p' "$prefix.stdout")
	failed=$(sed -n 's/^number of failed transactions: \([0-9]*\).*/\1/p' "$prefix.stdout")
	processed=$(sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p' "$prefix.stdout")
	aborted=$(grep -Ec 'client [0-9]+ aborted' "$prefix.stderr" || true)
	local errors=$((${failed:-0} + aborted))
	# a short warm-up on a busy machine may end before any transaction
	if [[ -z $tps && $prefix == *.warmup && $rc == 0 && $errors == 0 ]]; then
		echo "0 0 0"
		return 0
	fi
	if [[ -z $tps ]] || { ((errors > 0 || rc != 0)) && ((tolerant == 0)); }; then
		fm_err "pgbench failed (exit status $rc, $errors errors): ${prefix##*/}"
		tail -n 15 "$prefix.stderr" >&2 || true
		tail -n 5 "$prefix.stdout" >&2 || true
		return 1
	fi
	echo "$tps $errors ${processed:-0}"
}

# Wait-event sampling (--waits): one session polls pg_stat_activity every
# 0.1 s during a timed run; counts go to RES/LABEL.waits.
SAMPLER_PID=
start_sampler() {
	((WAITS)) || return 0
	local label=$1
	cat >"$OUT/sampler.psql" <<'EOF'
SELECT COALESCE(wait_event_type || ':' || wait_event, 'CPU')
FROM pg_stat_activity
WHERE backend_type = 'client backend' AND state = 'active'
  AND pid <> pg_backend_pid() AND application_name NOT LIKE 'fm\_bench%'
\watch 0.1
EOF
	own "$OUT/sampler.psql"
	run_as_pg psql -X -q -At -d "dbname=$DB application_name=fm_bench_sampler" \
		-f "$OUT/sampler.psql" -o "$OUT/sampler.out" >/dev/null 2>&1 &
	SAMPLER_PID=$!
}

stop_sampler() {
	((WAITS)) || return 0
	local label=$1
	stop_app fm_bench_sampler "$SAMPLER_PID"
	SAMPLER_PID=
	if [[ -f $OUT/sampler.out ]]; then
		grep -v '^$' "$OUT/sampler.out" >>"$RES/$label.waits" || true
		rm -f "$OUT/sampler.out"
	fi
}

# a workload that fails during a timed run leaves its sampler running
sampler_cleanup() {
	if [[ -n $SAMPLER_PID ]]; then
		stop_app fm_bench_sampler "$SAMPLER_PID"
	fi
}
on_workload_exit sampler_cleanup

# measure WORKLOAD CLIENTS MODE TOLERANT SCRIPT...: warm-up run of each
# script, then ROUNDS rounds of timed runs in the order given (peers first).
# Results per WORKLOAD.SCRIPT: RES/<label>.tps and .errors (one line per
# round), pgbench logs in LOGS/<label>.r<round>.*
measure() {
	local wl=$1 clients=$2 mode=$3 tolerant=$4 s r label lsn wal tps errors xacts
	shift 4
	for s in "$@"; do
		label=$wl.$s
		run_hook PRE_HOOK "$label"
		if ((WARMUP > 0)); then
			pgbench_run "$OUT/$label.warmup" "$clients" "$mode" "$WARMUP" "$s" ""
			run_result "$OUT/$label.warmup" "$tolerant" >/dev/null
		fi
		run_hook POST_HOOK "$label"
	done
	for ((r = 1; r <= ROUNDS; r++)); do
		for s in "$@"; do
			label=$wl.$s
			run_hook PRE_HOOK "$label"
			psql_q "CHECKPOINT"
			lsn=$(psql_q "SELECT pg_current_wal_insert_lsn()")
			start_sampler "$label"
			pgbench_run "$OUT/$label.r$r" "$clients" "$mode" "$DURATION" "$s" "$LOGS/$label.r$r"
			stop_sampler "$label"
			wal=$(psql_q "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '$lsn')")
			run_hook POST_HOOK "$label"
			read -r tps errors xacts < <(run_result "$OUT/$label.r$r" "$tolerant" || echo)
			[[ -n $tps ]] || return 1
			echo "$tps" >>"$RES/$label.tps"
			echo "$errors" >>"$RES/$label.errors"
			# WAL per transaction: what the commit flush has to write
			wal=$(awk -v w="$wal" -v n="$xacts" 'BEGIN { printf "%.0f", (n > 0) ? w / n : 0 }')
			echo "$wal" >>"$RES/$label.wal"
			printf '    round %d  %-26s %10.1f tps  %7s B WAL/tx  (load %s)\n' \
				"$r" "$s" "$tps" "$wal" "$(loadavg)"
		done
	done
}

run_hook() {
	local -n hooks=$1
	if [[ -n ${hooks[$2]:-} ]]; then
		"${hooks[$2]}"
	fi
}

rate_of() { median_file "$RES/$1.tps"; }
errors_of() { awk '{ s += $1 } END { print s + 0 }' "$RES/$1.errors"; }

# p95_ms LABEL: 95th percentile (nearest rank) of the latencies in the
# pgbench logs of LABEL (column 3, microseconds), in milliseconds.
p95_ms() {
	local files=("$LOGS/$1".r*)
	if [[ ! -e ${files[0]} ]]; then
		echo "-"
		return 0
	fi
	awk '$3 ~ /^[0-9]+$/ { print $3 }' "${files[@]}" | sort -n |
		awk '{ v[NR] = $1 }
			END { if (NR == 0) { print "-"; exit }
			      i = int(NR * 0.95); if (i < NR * 0.95) i++
			      printf "%.1f\n", v[i] / 1000 }'
}
