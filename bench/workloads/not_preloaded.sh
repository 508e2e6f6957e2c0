# shellcheck shell=bash
# bench/workloads/not_preloaded.sh -- track and check without flagmeter in
# shared_preload_libraries (managed databases where the provider chooses
# it; issue 39): the server restarted without it, after one maintain()
# (set_preload, bench/lib/harness.sh), then restarted as before.

register_workload not_preloaded \
	"track and check over $TENANTS tenants without flagmeter preloaded vs INSERT and primary-key SELECT"

wl_not_preloaded() {
	# every tenant has a counter row of the current period, so check reads one
	psql_q "SELECT flagmeter.track_batch(array_agg(i::text), array_agg('api_calls'::text), array_agg(1::bigint))
	        FROM generate_series(1, $TENANTS) i" >/dev/null
	script fm_check_np <<EOF2
\set t random(1, $TENANTS)
SELECT * FROM flagmeter.check(:t, 'api_calls');
EOF2
	script peer_select_np <<EOF2
\set t random(1, $TENANTS)
SELECT used FROM peer.usage WHERE tenant = :t::text AND meter = 'api_calls';
EOF2
	show_scripts fm_track peer_insert fm_check_np peer_select_np
	set_preload off
	measure not_preloaded "$CLIENTS" prepared 0 peer_insert fm_track peer_select_np fm_check_np
	set_preload on
	ratio_row not_preloaded "$CLIENTS" not_preloaded.fm_track not_preloaded.peer_insert \
		"INSERT event row" 0.75 "" "track over $TENANTS tenants, flagmeter not preloaded: every call writes its event and a stripe"
	ratio_row not_preloaded "$CLIENTS" not_preloaded.fm_check_np not_preloaded.peer_select_np \
		"primary-key SELECT" 0.75 "" "check over $TENANTS tenants, flagmeter not preloaded: each backend caches the limits it read"
}
