# shellcheck shell=bash
# bench/workloads/check_tenants.sh -- check over many tenants, each with
# one counter row, against a primary-key SELECT over as many tenants: the
# per-call cost of check (limit, period bounds, the read) where the check
# workload measures the cost of many stripes on one tenant.

register_workload check_tenants "check over $TENANTS tenants (one counter row each) vs primary-key SELECT"

wl_check_tenants() {
	local rows
	# every tenant gets a counter row of the current period (a run of this
	# workload alone starts from empty tables: check would read nothing)
	psql_q "SELECT flagmeter.track_batch(array_agg(i::text), array_agg('api_calls'::text), array_agg(1::bigint))
	        FROM generate_series(1, $TENANTS) i" >/dev/null
	rows=$(psql_q "SELECT count(*) FROM flagmeter.counters WHERE meter = 'api_calls'
	               AND tenant IN (SELECT i::text FROM generate_series(1, $TENANTS) i)")
	echo "    $rows counter rows of $TENANTS tenants"
	script fm_check_tenants <<EOF
\set t random(1, $TENANTS)
SELECT * FROM flagmeter.check(:t, 'api_calls');
EOF
	script peer_select_tenants <<EOF
\set t random(1, $TENANTS)
SELECT used FROM peer.usage WHERE tenant = :t::text AND meter = 'api_calls';
EOF
	# check's read as plain SQL (diagnostic): the tenant's rows, merged
	script reads_check_tenants <<EOF
\set t random(1, $TENANTS)
SELECT flagmeter.used(flagmeter.merge_agg(counter)) FROM flagmeter.counters
WHERE tenant = :t::text AND meter = 'api_calls';
EOF
	show_scripts fm_check_tenants peer_select_tenants reads_check_tenants
	measure check_tenants "$CLIENTS" prepared 0 peer_select_tenants reads_check_tenants fm_check_tenants
	ratio_row check_tenants "$CLIENTS" check_tenants.fm_check_tenants check_tenants.peer_select_tenants \
		"primary-key SELECT" 0.9 "" "$rows counter rows of $TENANTS tenants"
	diag_row check_tenants "$CLIENTS" check_tenants.fm_check_tenants check_tenants.reads_check_tenants \
		"check's read as plain SQL" \
		"the tenant's counter rows merged in SQL; it runs at $(ratio_of check_tenants.reads_check_tenants check_tenants.peer_select_tenants) x the SELECT"
}
