# shellcheck shell=bash
# bench/lib/harness.sh -- paths, small helpers and the workload registry of
# bench/run.  Sourced by bench/run after its parameters are set.
#
# A workload lives in bench/workloads/*.sh: the file calls register_workload
# and defines wl_NAME, which writes its pgbench scripts (script), runs them
# (measure, bench/lib/measure.sh) and adds its rows (bench/lib/report.sh).
# ALL_WORKLOADS in bench/run gives the order they run in.

BENCH_DIR=     # $FM_TMP/bench: scripts, pgbench output and logs, results
SCRIPTS=
OUT=
LOGS=
RES=
ROWS=
DB=bench
# soft limit of open files for pgbench and pgbouncer (1 200 clients need
# more than the usual 1 024; runuser resets the soft limit through PAM)
NOFILE=4096

# make_bench_dirs: the directories under $FM_TMP/bench, handed to the
# unprivileged user, who writes pgbench's logs there.
make_bench_dirs() {
	BENCH_DIR=$FM_TMP/bench
	SCRIPTS=$BENCH_DIR/scripts OUT=$BENCH_DIR/out LOGS=$BENCH_DIR/logs RES=$BENCH_DIR/results
	ROWS=$RES/rows.tsv
	mkdir -p "$SCRIPTS" "$OUT" "$LOGS" "$RES"
	: >"$ROWS"
	own "$BENCH_DIR"
}

# ---------------------------------------------------------------------------
# Small helpers
# ---------------------------------------------------------------------------

# own PATH...: hand files we created to the unprivileged user.
own() {
	if ((EUID == 0)); then
		chown -R "$FM_OS_USER:" "$@"
	fi
}

# pg_nofile CMD...: run_as_pg with a raised open-file limit.
pg_nofile() {
	# shellcheck disable=SC2016  # expanded by the inner shell
	run_as_pg bash -c 'ulimit -n "$0" 2>/dev/null || ulimit -n "$(ulimit -Hn)"; exec "$@"' \
		"$NOFILE" "$@"
}

# psql_q SQL: run SQL in the bench database, unaligned output, stop on error.
psql_q() {
	run_as_pg psql -X -q -At -v ON_ERROR_STOP=1 -d "$DB" -c "$1"
}

# script NAME: the file of pgbench script NAME, written from stdin.
script() {
	local f=$SCRIPTS/$1.sql
	cat >"$f"
	own "$f"
}

# show_scripts NAME...: print the scripts a workload runs, so that its rows
# can be read next to the SQL they measured.
show_scripts() {
	local s
	for s in "$@"; do
		echo "    -- $s.sql"
		sed 's/^/    /' "$SCRIPTS/$s.sql"
	done
}

median_file() {
	sort -g "$1" | awk '{ v[NR] = $1 }
		END { if (NR == 0) exit 1
		      m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
		      printf "%.1f\n", m }'
}

loadavg() { cut -d' ' -f1-3 /proc/loadavg; }

# kill_tree PID: stop PID and its descendants (all started by this script).
kill_tree() {
	local pid=$1 child
	for child in $(pgrep -P "$pid" 2>/dev/null || true); do
		kill_tree "$child"
	done
	kill -TERM "$pid" 2>/dev/null || true
}

# stop_app NAME PID...: end the sessions with application_name NAME (their
# psql exits when its connection is gone), then the given pids.
stop_app() {
	local name=$1 pid i
	shift
	psql_q "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
	        WHERE application_name = '$name'" >/dev/null || true
	for pid in "$@"; do
		[[ -n $pid ]] || continue
		for ((i = 0; i < 50; i++)); do
			kill -0 "$pid" 2>/dev/null || break
			sleep 0.1
		done
		kill_tree "$pid"
		wait "$pid" 2>/dev/null || true
	done
}

# ---------------------------------------------------------------------------
# Workload registry
# ---------------------------------------------------------------------------

# WL_HELP[NAME]: the line of --list and of the workload's heading; a name
# without one is not a workload (--workload refuses it).
declare -A WL_HELP=()
# WL_EXPLICIT[NAME]: set for a workload that runs only when --workload
# names it.
declare -A WL_EXPLICIT=()
# Functions run when a workload's subshell ends, however it ends, to stop
# what it started; each does nothing when there is nothing to stop.
WL_CLEANUP=()

# register_workload NAME HELP [explicit]: NAME's help line; "explicit" keeps
# NAME out of the default run.  Its code is the function wl_NAME.
register_workload() {
	WL_HELP[$1]=$2
	if [[ ${3:-} == explicit ]]; then
		WL_EXPLICIT[$1]=1
	fi
}

# on_workload_exit FUNC: run FUNC when any workload ends.
on_workload_exit() {
	WL_CLEANUP+=("$1")
}

# check_workloads: every name of ALL_WORKLOADS was registered and has its
# wl_NAME, and every registered name is in ALL_WORKLOADS (otherwise
# --workload would accept it and then never run it); then fills
# DEFAULT_WORKLOADS with ALL_WORKLOADS but the explicit ones, in order.
check_workloads() {
	local w bad=0
	DEFAULT_WORKLOADS=()
	for w in "${ALL_WORKLOADS[@]}"; do
		if [[ -z ${WL_HELP[$w]+x} ]] || ! declare -F "wl_$w" >/dev/null; then
			fm_err "workload '$w' of ALL_WORKLOADS is not registered, or has no wl_$w, in $BENCH_HOME/workloads"
			bad=1
		fi
		[[ -n ${WL_EXPLICIT[$w]+x} ]] || DEFAULT_WORKLOADS+=("$w")
	done
	for w in "${!WL_HELP[@]}"; do
		if [[ " ${ALL_WORKLOADS[*]} " != *" $w "* ]]; then
			fm_err "workload '$w' is registered but not in ALL_WORKLOADS of bench/run"
			bad=1
		fi
	done
	if ((bad)); then
		exit 1
	fi
}

workload_cleanup() {
	local f
	for f in ${WL_CLEANUP[@]+"${WL_CLEANUP[@]}"}; do
		"$f"
	done
}

# run_workload NAME: in a subshell, so that a failing workload is reported
# as an ERROR row and the others still run.
run_workload() {
	local wl=$1 rc=0
	echo
	echo "== workload $wl: ${WL_HELP[$wl]}"
	set +e
	(
		set -e
		# whatever the workload started, also when it fails half-way
		trap 'workload_cleanup' EXIT
		"wl_$wl"
	)
	rc=$?
	set -e
	if ((rc != 0)); then
		fm_err "workload $wl failed (exit status $rc)"
		emit_row "$wl" - - - - - - - - - ERROR "failed to run (exit status $rc); see the messages above"
		# shellcheck disable=SC2034  # bench/run's exit status
		BENCH_RC=1
	fi
}

# Workloads measured with flagmeter preloaded and not (unique.sh,
# not_preloaded.sh): the server is restarted without flagmeter preloaded
# (ALTER SYSTEM, so postgresql.conf stays as bench/run wrote it) and back;
# PRELOAD_OFF says the workload's subshell left it so, for the clean-up of a
# workload that fails half-way.
PRELOAD_OFF=0

# restart_server: pg_ctl restart; with --huge-pages, stop, reserve the
# pages the new settings need (reserve_huge_pages, setup.sh), start.
restart_server() {
	local ok=0
	if ((HUGE_PAGES)); then
		run_as_pg pg_ctl -D "$FM_PGDATA" -w -t 120 stop -m fast >/dev/null &&
			reserve_huge_pages &&
			run_as_pg pg_ctl -D "$FM_PGDATA" -l "$FM_TMP/server.log" -w -t 120 start >/dev/null &&
			ok=1
	else
		run_as_pg pg_ctl -D "$FM_PGDATA" -l "$FM_TMP/server.log" -w -t 120 restart >/dev/null &&
			ok=1
	fi
	if ((!ok)); then
		tail -n 50 "$FM_TMP/server.log" >&2 || true
		fm_err "the server did not restart"
		return 1
	fi
}

# set_preload on|off
set_preload() {
	if [[ $1 == off ]]; then
		echo "    restarting the server without flagmeter preloaded (shared_preload_libraries = 'pg_cron')"
		psql_q "ALTER SYSTEM SET shared_preload_libraries = 'pg_cron'"
		PRELOAD_OFF=1
	else
		echo "    restarting the server with flagmeter preloaded again"
		psql_q "ALTER SYSTEM RESET shared_preload_libraries"
		PRELOAD_OFF=0
	fi
	restart_server
	echo "    shared_preload_libraries = $(psql_q "SHOW shared_preload_libraries")"
	if [[ $1 == off ]]; then
		# The earlier workloads' tracks left events pending (their amounts
		# were in shared memory, gone with the restart): until maintain()
		# folds them, every read of a period without preloading looks for
		# them in the events, once a transaction, which an install that
		# never preloads does not pay.
		psql_q "SELECT flagmeter.maintain()" >/dev/null
		echo "    after maintain(): $(psql_q "SELECT count(*) FROM flagmeter.events e
		                                      WHERE e.period_start IS NOT NULL AND e.xid >=
		                                            (SELECT flagmeter.xid_int(s.counted_through) FROM flagmeter.current_state s)") events pending"
	fi
}

preload_cleanup() {
	if ((PRELOAD_OFF)); then
		set_preload on || true
	fi
}
on_workload_exit preload_cleanup
