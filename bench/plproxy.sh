#!/usr/bin/env bash
# bench/plproxy.sh -- one node against a PL/Proxy proxy with two shards
# (README "Scale-out"), for track and consume, in the same run.
#
#   bash bench/plproxy.sh [--duration S] [--rounds N] [--clients N] [--partitions P]
#
# Four throwaway clusters on this machine, run by the unprivileged user of
# tools/common.sh, unix sockets in the temp dir: "node" (flagmeter preloaded
# with its shared limit cache, as the README recommends for one server),
# "proxy" (plproxy, dblink, flagmeter_proxy; the server "flagmeter" with P
# partitions over the two shards) and shards "a" and "b" (flagmeter
# preloaded with flagmeter.shared_limits = 0, max_prepared_transactions =
# 10: what two-phase catalog changes need).  All have synchronous_commit
# on, fsync on, shared_buffers = 128MB.  The same 10 000 tenants on a plan
# that never runs out, spread by the proxy's hash over the shards.
#
# Each script runs with pgbench (-M prepared, -j 2) against the node and
# against the proxy: one discarded warm-up run each, then ROUNDS rounds,
# node first in each, a CHECKPOINT of every cluster before each timed run.
# A row is the median tps of each side and their ratio (proxy / node).
# On one machine the proxy and both shards share its cores with pgbench:
# the ratio is what the extra hop costs, not what more machines would add
# (README "Scale-out" says how to read it).
set -euo pipefail

BENCH_HOME=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=SCRIPTDIR/../tools/common.sh
source "$BENCH_HOME/../tools/common.sh"

DURATION=10
WARMUP=3
ROUNDS=2
CLIENTS=32
PARTITIONS=16
TENANTS=10000

while (($#)); do
	case $1 in
		--duration) DURATION=$2; shift 2 ;;
		--rounds) ROUNDS=$2; shift 2 ;;
		--clients) CLIENTS=$2; shift 2 ;;
		--partitions) PARTITIONS=$2; shift 2 ;;
		-h | --help) sed -n '2,24p' "$0"; exit 0 ;;
		*) fm_err "unknown argument: $1"; exit 2 ;;
	esac
done
for v in "$DURATION" "$ROUNDS" "$CLIENTS" "$PARTITIONS"; do
	[[ $v =~ ^[1-9][0-9]*$ ]] || { fm_err "options take positive numbers"; exit 2; }
done
((PARTITIONS >= 2 && (PARTITIONS & (PARTITIONS - 1)) == 0)) ||
	{ fm_err "--partitions must be a power of two, at least 2"; exit 2; }

trap 'fm_cleanup' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

fm_init
install_deps
fm_make_workdir
build_and_install >"$FM_TMP/build.log" 2>&1 || { cat "$FM_TMP/build.log"; exit 1; }
fm_chown_workdir
export PGHOST=$FM_TMP PGUSER=$FM_PG_ROLE

# One port per cluster; the sockets all live in $FM_TMP, where
# fm_port_in_use does not look, hence the list of those taken here.
declare -A PORT
used_ports=" "
take_port() {
	local name=$1 port
	for ((port = FM_PORT_FIRST; port <= FM_PORT_LAST; port++)); do
		if [[ $used_ports != *" $port "* ]] && ! fm_port_in_use "$port"; then
			used_ports+="$port "
			PORT[$name]=$port
			return 0
		fi
	done
	fm_err "no free port in $FM_PORT_FIRST-$FM_PORT_LAST"
	return 1
}

# start NAME EXTRA-CONF: initdb and start cluster NAME.
start() {
	local name=$1 conf=$2 dir=$FM_TMP/$1
	take_port "$name"
	export PGPORT=${PORT[$name]}    # run_as_pg passes it on, and initdb needs it set
	run_as_pg initdb -D "$dir" -U "$FM_PG_ROLE" -A trust -E UTF8 --locale=C --no-instructions \
		>"$FM_TMP/initdb.$name.log" 2>&1 || { cat "$FM_TMP/initdb.$name.log" >&2; return 1; }
	cat >>"$dir/postgresql.conf" <<-EOF
		port = ${PORT[$name]}
		listen_addresses = ''
		unix_socket_directories = '$FM_TMP'
		shared_buffers = 128MB
		max_connections = $((CLIENTS * 3 + 20))
		synchronous_commit = on
		max_wal_size = 4GB
		checkpoint_timeout = 30min
		$conf
	EOF
	run_as_pg pg_ctl -D "$dir" -l "$FM_TMP/$name.log" -w start >/dev/null
}

sql() {
	local name=$1
	shift
	run_as_pg psql -X -q -At -v ON_ERROR_STOP=1 -p "${PORT[$name]}" -d postgres "$@"
}

fm_log "starting node, proxy, shards a and b"
start node "shared_preload_libraries = 'flagmeter'"
for s in a b; do
	start "$s" "shared_preload_libraries = 'flagmeter'
flagmeter.shared_limits = 0
max_prepared_transactions = 10"
done
start proxy ""

catalog="SELECT flagmeter.define_meter('api_calls');
SELECT flagmeter.define_plan('bench');
SELECT flagmeter.set_limit('bench', 'api_calls', 1000000000000, 'month');"
sql node -c 'CREATE EXTENSION flagmeter' -c "$catalog" >/dev/null
sql node -c "SELECT count(flagmeter.assign_plan(t::text, 'bench')) FROM generate_series(1, $TENANTS) t" >/dev/null
for s in a b; do
	sql "$s" -c 'CREATE EXTENSION flagmeter' >/dev/null
done
options=
for ((p = 0; p < PARTITIONS; p++)); do
	s=$([[ $((p % 2)) == 0 ]] && echo a || echo b)
	options+="${options:+, }partition_$p 'host=$FM_TMP port=${PORT[$s]} dbname=postgres'"
done
sql proxy -c 'CREATE EXTENSION plproxy' -c 'CREATE EXTENSION dblink' -c 'CREATE EXTENSION flagmeter_proxy' \
	-c "CREATE SERVER flagmeter FOREIGN DATA WRAPPER plproxy OPTIONS ($options)" \
	-c 'CREATE USER MAPPING FOR PUBLIC SERVER flagmeter' >/dev/null
sql proxy -c "$catalog" >/dev/null    # through the proxy: two-phase commit on both shards
# each shard assigns its own tenants (10 000 calls through the proxy would do the same, slower)
for s in a b; do
	r=$([[ $s == a ]] && echo 0 || echo 1)
	sql "$s" -c "SELECT count(flagmeter.assign_plan(t::text, 'bench')) FROM generate_series(1, $TENANTS) t
		WHERE flagmeter.partition_of(t::text, $PARTITIONS) % 2 = $r" >/dev/null
done
on_a=$(sql a -c 'SELECT count(*) FROM flagmeter.tenants')
on_b=$(sql b -c 'SELECT count(*) FROM flagmeter.tenants')
((on_a + on_b == TENANTS)) || { fm_err "tenants: $on_a on a + $on_b on b, not $TENANTS"; exit 1; }

mkdir -p "$FM_TMP/bench"
cat >"$FM_TMP/bench/track.sql" <<EOF
\\set t random(1, $TENANTS)
SELECT flagmeter.track(:t::text, 'api_calls');
EOF
cat >"$FM_TMP/bench/consume.sql" <<EOF
\\set t random(1, $TENANTS)
SELECT granted FROM flagmeter.consume(:t::text, 'api_calls', 1);
EOF
chown -R "$FM_OS_USER:" "$FM_TMP/bench"

# run TARGET SCRIPT SECONDS: tps of one pgbench run (pgbench exits non-zero
# when a client failed, which stops the bench)
run() {
	local target=$1 script=$2 seconds=$3 out
	out=$(run_as_pg pgbench -n -M prepared -c "$CLIENTS" -j 2 -T "$seconds" -p "${PORT[$target]}" \
		-f "$FM_TMP/bench/$script.sql" postgres 2>&1) || { printf '%s\n' "$out" >&2; return 1; }
	sed -n 's/^tps = \([0-9.]*\) .*/\1/p' <<<"$out"
}

median() { sort -n | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

checkpoint() {
	local c
	for c in node proxy a b; do sql "$c" -c CHECKPOINT; done
}

fm_log "PostgreSQL $(sql node -c 'SHOW server_version'), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
fm_log "$CLIENTS clients, -M prepared, ${DURATION} s runs after a ${WARMUP} s warm-up, $ROUNDS rounds; $TENANTS tenants, $on_a on shard a and $on_b on b ($PARTITIONS partitions)"
results=()
for script in track consume; do
	declare -a node_tps=() proxy_tps=()
	run node "$script" "$WARMUP" >/dev/null
	run proxy "$script" "$WARMUP" >/dev/null
	for ((r = 1; r <= ROUNDS; r++)); do
		checkpoint
		node_tps+=("$(run node "$script" "$DURATION")")
		checkpoint
		proxy_tps+=("$(run proxy "$script" "$DURATION")")
		fm_log "$script round $r: node ${node_tps[-1]} tps, proxy + 2 shards ${proxy_tps[-1]} tps"
	done
	n=$(printf '%s\n' "${node_tps[@]}" | median)
	p=$(printf '%s\n' "${proxy_tps[@]}" | median)
	results+=("$(printf '%-8s %10.0f %16.0f %8.2f' "$script" "$n" "$p" "$(awk -v a="$p" -v b="$n" 'BEGIN { print a / b }')")")
done
events_a=$(sql a -c 'SELECT count(*) FROM flagmeter.events')
events_b=$(sql b -c 'SELECT count(*) FROM flagmeter.events')
fm_log "load at the end $(cut -d' ' -f1-3 /proc/loadavg); events recorded: shard a $events_a, shard b $events_b"
# What a tenant and an event take on a shard (shard a, after the runs):
# an event's row and index entries in events (the retention keeps them),
# and the tenant's catalog row and counter rows (current periods).
sizes=$(sql a -c "SELECT
	(SELECT sum(pg_total_relation_size(i.inhrelid))::bigint FROM pg_inherits i
	 WHERE i.inhparent = 'flagmeter.events'::regclass) / (SELECT count(*) FROM flagmeter.events),
	pg_total_relation_size('flagmeter.tenants') / (SELECT count(*) FROM flagmeter.tenants),
	pg_total_relation_size('flagmeter.counters') / (SELECT count(DISTINCT tenant) FROM flagmeter.counters),
	round((SELECT count(*) FROM flagmeter.counters)::numeric / (SELECT count(DISTINCT tenant) FROM flagmeter.counters), 1)")
IFS='|' read -r per_event per_tenant per_counters counter_rows <<<"$sizes"
fm_log "shard a: $per_event bytes per event (row and indexes), $per_tenant bytes per tenant row," \
	"$per_counters bytes of counters per tenant ($counter_rows rows: stripes of one meter's period)"
printf '\n%-8s %10s %16s %8s\n' workload 'node tps' 'proxy+2 tps' ratio
printf '%s\n' "${results[@]}"
