# shellcheck shell=bash
# bench/workloads/consume.sh -- consume over many tenants against the plain
# INSERT of one event row; its diagnostic row times consume's writes in
# PL/pgSQL (peer.consume_writes, bench/lib/setup.sh).

register_workload consume "consume over $TENANTS tenants vs plain INSERT"

wl_consume() {
	script fm_consume <<EOF
\set t random(1, $TENANTS)
SELECT flagmeter.consume(:t, 'api_calls', 1);
EOF
	show_scripts fm_consume peer_insert writes_consume
	measure consume "$CLIENTS" prepared 0 peer_insert writes_consume fm_consume
	ratio_row consume "$CLIENTS" consume.fm_consume consume.peer_insert "INSERT event row" 0.8 "" ""
	diag_row consume "$CLIENTS" consume.fm_consume consume.writes_consume \
		"event INSERT + conditional UPDATE" \
		"consume's writes as plain SQL in a PL/pgSQL function; it runs at $(ratio_of consume.writes_consume consume.peer_insert) x the INSERT"
}
