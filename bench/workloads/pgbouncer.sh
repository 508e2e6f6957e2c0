# shellcheck shell=bash
# bench/workloads/pgbouncer.sh -- track through pgbouncer in transaction
# mode against the plain INSERT through the same pgbouncer.  bench/run calls
# find_pgbouncer before the build (installing it needs root and apt, like
# the other packages) and stop_leftover_pgbouncer on exit.

register_workload pgbouncer "track through pgbouncer (transaction mode) vs plain INSERT through it"

# the binary find_pgbouncer found; empty: the workload is skipped
PGBOUNCER_BIN=
# where start_pgbouncer put its config, log and socket, and its port
BOUNCER_DIR=
BOUNCER_PORT=

# pgbouncer in transaction mode, started here on its own port and socket
# dir, connecting to the cluster through its unix socket.
BOUNCER_PID=
start_pgbouncer() {
	local port i
	for ((port = 6439; port <= 6459; port++)); do
		fm_port_in_use "$port" || break
	done
	BOUNCER_PORT=$port
	BOUNCER_DIR=$BENCH_DIR/pgbouncer
	mkdir -p "$BOUNCER_DIR"
	printf '"%s" ""\n' "$FM_PG_ROLE" >"$BOUNCER_DIR/userlist.txt"
	# shellcheck disable=SC2153  # BOUNCER_POOL is a parameter of bench/run
	cat >"$BOUNCER_DIR/pgbouncer.ini" <<EOF
[databases]
$DB = host=$FM_TMP port=$FM_PORT dbname=$DB user=$FM_PG_ROLE

[pgbouncer]
listen_port = $BOUNCER_PORT
unix_socket_dir = $BOUNCER_DIR
auth_type = trust
auth_file = $BOUNCER_DIR/userlist.txt
pool_mode = transaction
max_client_conn = $((BOUNCER_CLIENTS + 100))
default_pool_size = $BOUNCER_POOL
reserve_pool_size = 0
logfile = $BOUNCER_DIR/pgbouncer.log
pidfile = $BOUNCER_DIR/pgbouncer.pid
admin_users = $FM_PG_ROLE
log_connections = 0
log_disconnections = 0
EOF
	own "$BOUNCER_DIR"
	echo "    pgbouncer $BOUNCER_DIR/pgbouncer.ini: port $BOUNCER_PORT (unix socket only)," \
		"pool_mode transaction, max_client_conn $((BOUNCER_CLIENTS + 100))," \
		"default_pool_size $BOUNCER_POOL"
	pg_nofile "$PGBOUNCER_BIN" -d "$BOUNCER_DIR/pgbouncer.ini"
	for ((i = 0; i < 100; i++)); do
		if [[ -s $BOUNCER_DIR/pgbouncer.pid && -S $BOUNCER_DIR/.s.PGSQL.$BOUNCER_PORT ]]; then
			BOUNCER_PID=$(cat "$BOUNCER_DIR/pgbouncer.pid")
			break
		fi
		sleep 0.1
	done
	if [[ -z $BOUNCER_PID ]]; then
		tail -n 20 "$BOUNCER_DIR/pgbouncer.log" >&2 || true
		fm_err "pgbouncer did not start"
		return 1
	fi
	run_as_pg psql -X -q -At -h "$BOUNCER_DIR" -p "$BOUNCER_PORT" -d "$DB" -c "SELECT 1" >/dev/null
}

stop_pgbouncer() {
	local i
	[[ -n $BOUNCER_PID ]] || return 0
	kill -TERM "$BOUNCER_PID" 2>/dev/null || true
	for ((i = 0; i < 50; i++)); do
		kill -0 "$BOUNCER_PID" 2>/dev/null || break
		sleep 0.1
	done
	kill -KILL "$BOUNCER_PID" 2>/dev/null || true
	BOUNCER_PID=
}
on_workload_exit stop_pgbouncer

wl_pgbouncer() {
	local errors_fm errors_peer gate='' warnings
	if [[ -z $PGBOUNCER_BIN ]]; then
		skip_row pgbouncer "$BOUNCER_CLIENTS" "INSERT via pgbouncer" ">= 0.8 x peer" \
			"pgbouncer is not installed"
		return 0
	fi
	start_pgbouncer
	show_scripts fm_track peer_insert
	echo "    pgbench -M extended: transaction pooling cannot keep named prepared statements"
	# shellcheck disable=SC2034  # read by pgbench_run (bench/lib/measure.sh)
	CONN_ARGS=(-h "$BOUNCER_DIR" -p "$BOUNCER_PORT")
	measure pgbouncer "$BOUNCER_CLIENTS" extended 1 peer_insert fm_track
	# shellcheck disable=SC2034
	CONN_ARGS=()
	stop_pgbouncer
	errors_fm=$(errors_of pgbouncer.fm_track)
	errors_peer=$(errors_of pgbouncer.peer_insert)
	warnings=$(grep -Ec 'WARNING|ERROR' "$BOUNCER_DIR/pgbouncer.log" || true)
	if ((errors_fm > 0)); then
		gate="$errors_fm errors"
	fi
	ratio_row pgbouncer "$BOUNCER_CLIENTS" pgbouncer.fm_track pgbouncer.peer_insert \
		"INSERT via pgbouncer" 0.8 "$gate" \
		"errors: flagmeter $errors_fm, peer $errors_peer; pgbouncer log warnings/errors: $warnings; pool $BOUNCER_POOL server connections"
}

# find_pgbouncer: the pgbouncer binary, installed from Debian when missing
# (as root).  Debian would start its own pgbouncer service on install: a
# policy-rc.d that denies starts is in place during the install (only if
# there is none already).
find_pgbouncer() {
	local wanted=0 w policy=/usr/sbin/policy-rc.d made_policy=0
	for w in "${SELECTED[@]}"; do
		[[ $w == pgbouncer ]] && wanted=1
	done
	((wanted)) || return 0
	PGBOUNCER_BIN=$(command -v pgbouncer || true)
	[[ -z $PGBOUNCER_BIN && -x /usr/sbin/pgbouncer ]] && PGBOUNCER_BIN=/usr/sbin/pgbouncer
	if [[ -n $PGBOUNCER_BIN ]]; then
		return 0
	fi
	if ((EUID != 0)); then
		fm_warn "pgbouncer is not installed and we are not root: the pgbouncer workload is skipped"
		return 0
	fi
	fm_log "installing pgbouncer from Debian"
	if [[ ! -e $policy ]]; then
		printf '#!/bin/sh\nexit 101\n' >"$policy"
		chmod 755 "$policy"
		made_policy=1
	fi
	export DEBIAN_FRONTEND=noninteractive
	apt-get install -y pgbouncer || { apt-get update && apt-get install -y pgbouncer; } ||
		fm_warn "could not install pgbouncer: the pgbouncer workload is skipped"
	((made_policy)) && rm -f "$policy"
	PGBOUNCER_BIN=$(command -v pgbouncer || true)
	[[ -z $PGBOUNCER_BIN && -x /usr/sbin/pgbouncer ]] && PGBOUNCER_BIN=/usr/sbin/pgbouncer
	return 0
}

# stop_leftover_pgbouncer: on exit, stop a pgbouncer that a workload's
# subshell started and did not stop (it died half-way); BOUNCER_PID was
# the subshell's, so the pid file is all that is left of it.
stop_leftover_pgbouncer() {
	stop_pgbouncer
	if [[ -n $BENCH_DIR && -s $BENCH_DIR/pgbouncer/pgbouncer.pid ]]; then
		BOUNCER_PID=$(cat "$BENCH_DIR/pgbouncer/pgbouncer.pid")
		kill -0 "$BOUNCER_PID" 2>/dev/null && stop_pgbouncer
	fi
	return 0
}
