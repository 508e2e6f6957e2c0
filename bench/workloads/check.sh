# shellcheck shell=bash
# bench/workloads/check.sh -- check on a tenant whose usage is spread over
# many stripes, then on the same tenant once maintain() merged them,
# against a primary-key SELECT of a counter.

register_workload check "check on a tenant with $CHECK_EVENTS events in 16 stripes, and once maintain() merged them, vs primary-key SELECT"

wl_check() {
	local per=$((CHECK_EVENTS / 16)) used rows merged_rows
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
	rows=$(stripes_of checked)
	echo "    tenant 'checked' has $used events recorded by 16 sessions in $rows"
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
	show_scripts fm_check peer_select reads_check
	measure check "$CLIENTS" prepared 0 peer_select reads_check fm_check

	# The same reads once maintain() merged the idle stripes (the first run
	# sets the watermark that makes them idle to the second).
	psql_q "SELECT flagmeter.maintain()" >/dev/null
	psql_q "SELECT flagmeter.maintain()" >/dev/null
	merged_rows=$(stripes_of checked)
	echo "    after maintain(): $merged_rows"
	cp "$SCRIPTS/fm_check.sql" "$SCRIPTS/fm_check_merged.sql"
	cp "$SCRIPTS/peer_select.sql" "$SCRIPTS/peer_select_merged.sql"
	own "$SCRIPTS/fm_check_merged.sql" "$SCRIPTS/peer_select_merged.sql"
	measure check "$CLIENTS" prepared 0 peer_select_merged fm_check_merged

	ratio_row check "$CLIENTS" check.fm_check check.peer_select "primary-key SELECT" 0.9 "" \
		"tenant with $used events in $rows (16 writers' stripes, before maintain())"
	diag_row check "$CLIENTS" check.fm_check check.reads_check "merge of the period's rows" \
		"check's read (the period's rows, merged) as plain SQL; it runs at $(ratio_of check.reads_check check.peer_select) x the primary-key SELECT"
	ratio_row check "$CLIENTS" check.fm_check_merged check.peer_select_merged "primary-key SELECT" 0.9 "" \
		"the same tenant after maintain() merged its idle stripes: $merged_rows"
}

# stripes_of TENANT: "N counter rows on M heap pages"
stripes_of() {
	psql_q "SELECT count(*) || ' counter rows on ' || count(DISTINCT (ctid::text::point)[0])
	        || ' heap pages' FROM flagmeter.counters WHERE tenant = '$1'"
}
