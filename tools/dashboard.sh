#!/usr/bin/env bash
# tools/dashboard.sh -- what `make dashboard` runs: the reference app
# (examples/dashboard) live in a browser, on a throwaway cluster.
#
# Same setup as `make demo` (tools/common.sh): missing Debian packages, a
# -Werror build installed into PostgreSQL 15, a throwaway cluster run by an
# unprivileged user.  Then, as that user:
#   1. the database flagmeter_dashboard with the extension and the demo
#      plans and tenants (examples/dashboard/tools/demo.sql);
#   2. `npm ci` at the root (the npm workspace: the client and the app)
#      when node_modules is missing (from the npm registry);
#   3. a webhook receiver that prints each alert's text
#      (examples/dashboard/tools/receiver.js), registered as the app's
#      global webhook;
#   4. the app (examples/dashboard/server.js) on DASHBOARD_PORT (54370),
#      bound to DASHBOARD_HOST (127.0.0.1; 0.0.0.0 to reach it from another
#      machine), its URL printed;
#   5. the load generator (examples/dashboard/tools/load.js, DASHBOARD_RATE
#      requests a second, 40) until Ctrl-C, or for DASHBOARD_SECONDS.
# On Ctrl-C (or the end of DASHBOARD_SECONDS) everything it started is
# stopped, the cluster too, and the temp dir removed: nothing is left
# running.

set -euo pipefail

# shellcheck source=SCRIPTDIR/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

DB=flagmeter_dashboard
APP_PORT=${DASHBOARD_PORT:-54370}
RECEIVER_PORT=${DASHBOARD_RECEIVER_PORT:-54371}
APP_HOST=${DASHBOARD_HOST:-127.0.0.1}
RATE=${DASHBOARD_RATE:-40}
SECONDS_TO_RUN=${DASHBOARD_SECONDS:-0}
PIDS=()

# stop_all: SIGTERM to each process started here (load first, then the
# app, which finishes its pending requests, then the receiver), waiting
# for each to exit; fm_cleanup stops the cluster after.  The signal goes
# to the node process itself: as root it runs under runuser, which does not
# pass a SIGTERM on.
stop_all() {
	local pid i node
	for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do
		pid=${PIDS[i]}
		node=$(node_under "$pid")
		kill -TERM "${node:-$pid}" 2>/dev/null || true
		wait "$pid" 2>/dev/null || true
	done
	PIDS=()
}

# node_under PID: the node process among PID's descendants (the subshell of
# start, then runuser as root, then node), empty when it has exited.
node_under() {
	local queue=("$1") p kid comm
	while ((${#queue[@]})); do
		p=${queue[0]}
		queue=("${queue[@]:1}")
		while read -r kid comm; do
			[[ $comm == node ]] && { echo "$kid"; return 0; }
			queue+=("$kid")
		done < <(ps -o pid=,comm= --ppid "$p" 2>/dev/null || true)
	done
}

on_exit() {
	local rc=$?
	stop_all
	fm_cleanup
	exit "$rc"
}
trap on_exit EXIT
# Ctrl-C reaches the node processes too (they stop by themselves); the
# loop at the end of main sees the flag before it sees the app gone.
INTERRUPTED=0
trap 'INTERRUPTED=1' INT
trap 'exit 143' TERM

# npm_ci: `npm ci` at the root of the copy (the workspace of the client and
# the app), as the unprivileged user, when node_modules is missing.
npm_ci() {
	if [[ ! -d $FM_SRC/node_modules ]]; then
		fm_log "npm ci (the npm workspace at the root)"
		run_as_pg env HOME="$FM_TMP" npm_config_cache="$FM_TMP/npm-cache" \
			bash -c 'cd "$1" && npm ci --no-audit --no-fund --silent' _ "$FM_SRC"
	fi
}

# start NAME LOG CMD...: CMD as the unprivileged user in the background,
# its output shown live and kept in LOG.
start() {
	local log=$2
	shift 2
	: >"$log"
	# tee ignores Ctrl-C, so that what the processes print while they stop is shown
	run_as_pg "$@" > >(trap '' INT; exec tee -a "$log") 2>&1 &
	PIDS+=($!)
}

main() {
	for port in "$APP_PORT" "$RECEIVER_PORT"; do
		if fm_port_in_use "$port"; then
			fm_err "port $port is in use (set DASHBOARD_PORT / DASHBOARD_RECEIVER_PORT)"
			return 1
		fi
	done
	fm_setup_cluster
	fm_log "creating database $DB with flagmeter, plans and tenants"
	run_as_pg psql -X -q -v ON_ERROR_STOP=1 -d postgres -c "CREATE DATABASE $DB"
	run_as_pg psql -X -q -v ON_ERROR_STOP=1 -d "$DB" -c 'CREATE EXTENSION flagmeter' \
		-f "$FM_SRC/examples/dashboard/tools/demo.sql" >/dev/null
	npm_ci

	local app=$FM_SRC/examples/dashboard url
	start receiver "$FM_TMP/receiver.log" node "$app/tools/receiver.js" "$RECEIVER_PORT"
	fm_wait_for_line "$FM_TMP/receiver.log" 'receiver on' "${PIDS[-1]}" "the webhook receiver did not start"
	start app "$FM_TMP/app.log" env DATABASE_URL="postgresql://$FM_PG_ROLE@/$DB?host=$FM_TMP&port=$FM_PORT" \
		PORT="$APP_PORT" HOST="$APP_HOST" INSTANCE_NAME="make dashboard" node "$app/server.js"
	fm_wait_for_line "$FM_TMP/app.log" 'listening on' "${PIDS[-1]}" "the app did not start"
	url=http://127.0.0.1:$APP_PORT
	curl -fsS -o /dev/null -H 'content-type: application/json' \
		-d "{\"url\":\"http://127.0.0.1:$RECEIVER_PORT/slack\"}" "$url/api/webhooks"
	start load "$FM_TMP/load.log" env LOAD_SECONDS="$SECONDS_TO_RUN" node "$app/tools/load.js" "$url" "$RATE"

	echo
	echo "== The dashboard: http://$APP_HOST:$APP_PORT/  (metrics: /metrics; Ctrl-C stops everything) =="
	echo
	if ((SECONDS_TO_RUN > 0)); then
		sleep "$SECONDS_TO_RUN"
		sleep 1
	else
		while ((!INTERRUPTED)) && kill -0 "${PIDS[1]}" 2>/dev/null; do sleep 1; done
		if ((!INTERRUPTED)); then
			fm_err "the app stopped"
			return 1
		fi
		echo
		fm_log "Ctrl-C: stopping"
	fi
}

main "$@"
