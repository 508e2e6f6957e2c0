# shellcheck shell=bash
# bench/workloads/check.sh -- check on a tenant whose events are unfolded
# and spread over many stripes, against a primary-key SELECT of a counter.

register_workload check "check on a tenant with $CHECK_EVENTS unfolded events vs primary-key SELECT"

wl_check() {
	local per=$((CHECK_EVENTS / 16)) used rows
	# 16 concurrent sessions, so that the events land in up to 16 stripes
	# (the read merges them all): the worst case for check.
	script fill_checked <<EOF
SELECT flagmeter.track_batch(array_fill('checked'::text, ARRAY[$per]),
                             array_fill('api_calls'::text, ARRAY[$per]),
                             array_fill(1::bigint, ARRAY[$per]));
EOF
	run_as_pg pgbench -n -M prepared -c 16 -j 2 -t 1 -f "$SCRIPTS/fill_checked.sql" "$DB" \
		>"$OUT/check.fill.stdout" 2>&1 || {
		cat "$OUT/check.fill.stdout" >&2
		return 1
	}
	used=$(psql_q "SELECT used FROM flagmeter.check('checked', 'api_calls')")
	echo "    tenant 'checked' has $used events recorded by 16 sessions, none folded"
	script fm_check <<'EOF'
SELECT * FROM flagmeter.check('checked', 'api_calls');
EOF
	script peer_select <<'EOF'
SELECT used FROM peer.usage WHERE tenant = 'checked' AND meter = 'api_calls';
EOF
	# check's read as plain SQL (diagnostic): the period's rows, merged
	script reads_check <<'EOF'
SELECT flagmeter.used(flagmeter.merge_agg(counter)) FROM flagmeter.counters
WHERE tenant = 'checked' AND meter = 'api_calls';
EOF
	rows=$(psql_q "SELECT count(*) || ' counter rows on ' || count(DISTINCT (ctid::text::point)[0])
	               || ' heap pages' FROM flagmeter.counters WHERE tenant = 'checked'")
	show_scripts fm_check peer_select reads_check
	measure check "$CLIENTS" prepared 0 peer_select reads_check fm_check
	ratio_row check "$CLIENTS" check.fm_check check.peer_select "primary-key SELECT" 0.8 "" \
		"tenant with $used unfolded events in $rows"
	diag_row check "$CLIENTS" check.fm_check check.reads_check "merge of the period's rows" \
		"check's read (the period's rows, merged) as plain SQL; it runs at $(ratio_of check.reads_check check.peer_select) x the primary-key SELECT"
}
