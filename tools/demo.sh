#!/usr/bin/env bash
# tools/demo.sh -- what `make demo` runs.
#
# Same setup as `make test` (see tools/common.sh): install missing Debian
# packages, build with -Werror and install (the build's lines in
# /tmp/flagmeter-demo-build.log, FM_BUILD_LOG, one line per step on the
# screen), start a throwaway PostgreSQL 15
# cluster with pg_cron preloaded as an unprivileged user.  Then, in the
# database flagmeter_demo with the flagmeter extension:
#
#   1. tools/demo.sql part=setup: catalog, eight tenants on two plans, two
#      weeks of history, consume/void examples, the app table app_settings
#      with the flagmeter.invalidate() trigger, the role demo_app;
#   2. a listening app instance starts in the background: psql as demo_app
#      runs LISTEN flagmeter, reads latest_version() and the blocked tenants
#      (its "cache") in one REPEATABLE READ transaction, then polls every
#      0.2 s; psql prints each notification it receives into a file;
#   3. pgbench drives concurrent usage as demo_app (8 clients, 5 s, about
#      400 requests/s, one progress line per second): each request is a
#      consume of 1 api_call + some tokens across the tenants, every tenth
#      also a track of tokens; meanwhile (demo.sql part=upgrade) sales
#      raises hooli's limit and updates its app_settings row;
#   4. the listener is stopped, and tools/demo.sql part=dashboard runs
#      maintain() and prints the dashboard and the notifications received.
#
# The cluster is stopped and the temp dir removed whatever happens (EXIT
# trap); the listener stops by itself when its stop file appears or the
# server goes away.  The exit status is that of the first step that failed.

set -euo pipefail

# shellcheck source=SCRIPTDIR/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

DEMO_DB=flagmeter_demo
DEMO_ROLE=demo_app
LOAD_SECONDS=5
LOAD_CLIENTS=8
LOAD_RATE=400
UPGRADE_AFTER=2.5

LISTENER_PID=

# The build's and install's lines go to this file, not the screen
# (build_and_install in tools/common.sh); it stays after the demo.
FM_BUILD_LOG=${FM_BUILD_LOG:-/tmp/flagmeter-demo-build.log}

# stop_listener: ask the listener to finish (stop file), wait for it a few
# seconds.  Should it still run (it cannot outlive the server: psql exits
# when its connection is gone), fm_cleanup stopping the server ends it.
stop_listener() {
	[[ -n $LISTENER_PID ]] || return 0
	touch "$FM_TMP/listener.stop" 2>/dev/null || true
	local i
	for ((i = 0; i < 50; i++)); do
		kill -0 "$LISTENER_PID" 2>/dev/null || break
		sleep 0.1
	done
	wait "$LISTENER_PID" 2>/dev/null || true
	LISTENER_PID=
}

on_exit() {
	local rc=$?
	stop_listener
	fm_cleanup
	exit "$rc"
}
trap on_exit EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# demo_psql ARGS...: psql on the demo database, stopping at the first error.
demo_psql() {
	run_as_pg psql -X -v ON_ERROR_STOP=1 -d "$DEMO_DB" "$@"
}

# start_listener: the listening app instance (see the header).  The writer
# loop feeds psql one poll every 0.2 s until the stop file exists; a poll
# is a query, and psql prints the notifications that arrived with it.
start_listener() {
	local log=$FM_TMP/listener.log stop=$FM_TMP/listener.stop
	rm -f "$stop"
	: >"$log"
	{
		cat <<-'EOF'
			LISTEN flagmeter;
			BEGIN ISOLATION LEVEL REPEATABLE READ;
			SELECT 'resync', flagmeter.latest_version();
			SELECT 'blocked', tenant || '/' || meter FROM flagmeter.blocked ORDER BY 2;
			COMMIT;
		EOF
		while [[ ! -e $stop ]]; do
			printf '%s\n' 'SELECT 1 AS poll \gset'
			sleep 0.2
		done
		printf '%s\n' 'SELECT 1 AS poll \gset'
	} | run_as_pg psql -X -q -A -t -v ON_ERROR_STOP=1 -U "$DEMO_ROLE" -d "$DEMO_DB" \
		>"$log" 2>&1 &
	LISTENER_PID=$!
	# ready once it has read latest_version()
	fm_wait_for_line "$log" '^resync|' "$LISTENER_PID" "the listening app instance did not start"
}

# write_load_script FILE: the pgbench script, one request per transaction.
# Tenants are drawn with fixed shares, so that in about 2 000 requests acme
# and globex cross 80 %, acme and initech reach their hard limit (100 %,
# blocked), umbrella crosses 75 % of its tokens, and the others stay ok.
write_load_script() {
	cat >"$1" <<-'EOF'
		\set r random(1, 100)
		\set t case when :r <= 30 then 1 when :r <= 40 then 2 when :r <= 45 then 3 when :r <= 55 then 4 when :r <= 70 then 5 when :r <= 80 then 6 when :r <= 90 then 7 else 8 end
		\set tokens random(5, 45) * case when :t > 4 then 40 else 1 end
		SELECT granted FROM flagmeter.consume((ARRAY['acme', 'globex', 'initech', 'hooli', 'umbrella', 'stark', 'wayne', 'wonka'])[:t], ARRAY['api_calls', 'tokens'], ARRAY[1, :tokens]::bigint[]);
		\if :r % 10 = 0
		SELECT flagmeter.track((ARRAY['acme', 'globex', 'initech', 'hooli', 'umbrella', 'stark', 'wayne', 'wonka'])[:t], 'tokens', :tokens);
		\endif
	EOF
}

# run_load: pgbench in the foreground (its progress lines and summary,
# filtered), the upgrade of hooli in the background UPGRADE_AFTER seconds
# in.  Fails if either fails.
run_load() {
	local script=$FM_TMP/load.sql upgrade_pid rc=0 upgrade_rc=0
	write_load_script "$script"

	(
		sleep "$UPGRADE_AFTER"
		fm_log "t=${UPGRADE_AFTER}s: sales gives hooli 5 000 api_calls (override_limit) and turns on" \
			"bulk_export in its app_settings row, in one transaction"
		demo_psql -q -v part=upgrade -f "$FM_SRC/tools/demo.sql"
	) &
	upgrade_pid=$!

	# the file exists before tail opens it; pgbench appends to it
	: >"$FM_TMP/pgbench.out"
	run_as_pg pgbench -n -U "$DEMO_ROLE" -c "$LOAD_CLIENTS" -j 2 -T "$LOAD_SECONDS" \
		-R "$LOAD_RATE" -P 1 -f "$script" "$DEMO_DB" >>"$FM_TMP/pgbench.out" 2>&1 &
	local pgbench_pid=$!
	# show the progress lines as they come
	tail -n +1 -f --pid="$pgbench_pid" "$FM_TMP/pgbench.out" |
		grep --line-buffered -E '^progress:' || true
	wait "$pgbench_pid" || rc=$?
	wait "$upgrade_pid" || upgrade_rc=$?

	if ((rc != 0)); then
		cat "$FM_TMP/pgbench.out" >&2
		fm_err "pgbench failed (exit status $rc)"
		return "$rc"
	fi
	grep -E '^(number of clients|duration|number of transactions actually processed|number of failed transactions|latency average|tps)' \
		"$FM_TMP/pgbench.out" || true
	if ((upgrade_rc != 0)); then
		fm_err "the upgrade of hooli failed (exit status $upgrade_rc)"
		return "$upgrade_rc"
	fi
}

main() {
	fm_setup_cluster

	fm_log "creating database $DEMO_DB with the flagmeter extension"
	run_as_pg psql -X -q -v ON_ERROR_STOP=1 -d postgres -c "CREATE DATABASE $DEMO_DB"
	demo_psql -q -c 'CREATE EXTENSION flagmeter'

	fm_log "running tools/demo.sql (setup)"
	# From the copy, which the unprivileged user can read.
	(cd "$FM_SRC" && demo_psql -v part=setup -f tools/demo.sql)

	echo
	echo '== 6. Load: concurrent clients, and an app instance listening ================================'
	echo
	fm_log "starting the listening app instance: psql as $DEMO_ROLE, LISTEN flagmeter"
	start_listener
	fm_log "driving usage: pgbench, $LOAD_CLIENTS clients as $DEMO_ROLE for ${LOAD_SECONDS}s at" \
		"~$LOAD_RATE requests/s; a request is consume(tenant, {api_calls,tokens}, {1,n})"
	run_load
	sleep 0.5 # let the last notifications reach the listener
	stop_listener
	fm_log "listener stopped"

	(cd "$FM_SRC" && demo_psql -v part=dashboard -v listener_log="$FM_TMP/listener.log" \
		-f tools/demo.sql)

	fm_cleanup
}

main "$@"
