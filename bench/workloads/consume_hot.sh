# shellcheck shell=bash
# bench/workloads/consume_hot.sh -- consume with every client on one tenant
# against the conditional UPDATE of a quota row, then the over-grant check
# on a tenant whose quota runs out during it.

register_workload consume_hot "consume on one tenant vs conditional UPDATE; over-grant check"

wl_consume_hot() {
	script fm_consume_hot <<'EOF'
SELECT flagmeter.consume('hot', 'api_calls', 1);
EOF
	script peer_update_hot <<'EOF'
UPDATE peer.quota SET used = used + 1
WHERE tenant = 'hot' AND meter = 'api_calls' AND used + 1 <= quota
RETURNING used;
EOF
	script fm_consume_tight <<'EOF'
SELECT flagmeter.consume('tight', 'api_calls', 1);
EOF
	script writes_consume_hot <<'EOF'
SELECT peer.consume_writes('hot', 1);
EOF
	show_scripts fm_consume_hot peer_update_hot writes_consume_hot
	measure consume_hot "$CLIENTS" prepared 0 peer_update_hot writes_consume_hot fm_consume_hot

	# Over-grants: the same call on a tenant whose quota runs out half-way:
	# every client makes a fixed number of calls, 1.5 x the quota in all,
	# so the quota is reached however slow the machine is.  Afterwards used,
	# and the events recorded, must equal the quota.
	local per_client=$(((TIGHT_QUOTA * 3 / 2 + CLIENTS - 1) / CLIENTS)) used events gate='' note
	echo "    over-grant check: $CLIENTS clients x $per_client calls of consume('tight', 'api_calls', 1)," \
		"quota $TIGHT_QUOTA"
	pg_nofile pgbench -n -M prepared -c "$CLIENTS" -j 2 -t "$per_client" \
		-f "$SCRIPTS/fm_consume_tight.sql" "$DB" \
		>"$OUT/consume_hot.tight.stdout" 2>"$OUT/consume_hot.tight.stderr" ||
		echo $? >"$OUT/consume_hot.tight.rc"
	[[ -e $OUT/consume_hot.tight.rc ]] || echo 0 >"$OUT/consume_hot.tight.rc"
	run_result "$OUT/consume_hot.tight" 0 >/dev/null
	used=$(psql_q "SELECT used FROM flagmeter.check('tight', 'api_calls')")
	events=$(psql_q "SELECT COALESCE(sum(amount), 0) FROM flagmeter.events WHERE tenant = 'tight'")
	note="over-grant check: quota $TIGHT_QUOTA, used $used, events recorded $events"
	if ((used > TIGHT_QUOTA || events > TIGHT_QUOTA)); then
		gate="OVER-GRANTED by $((used > events ? used - TIGHT_QUOTA : events - TIGHT_QUOTA))"
	elif ((used != events)); then
		gate="used ($used) differs from the events recorded ($events)"
	elif ((used < TIGHT_QUOTA)); then
		note="$note (quota not reached: the check proved nothing)"
	else
		note="zero over-grants ($note)"
	fi
	ratio_row consume_hot "$CLIENTS" consume_hot.fm_consume_hot consume_hot.peer_update_hot \
		"conditional UPDATE" 3.0 "$gate" "$note"
	diag_row consume_hot "$CLIENTS" consume_hot.fm_consume_hot consume_hot.writes_consume_hot \
		"event INSERT + conditional UPDATE" \
		"consume's writes (the event row, then the conditional UPDATE) as plain SQL in a PL/pgSQL function; it runs at $(ratio_of consume_hot.writes_consume_hot consume_hot.peer_update_hot) x the conditional UPDATE"
}
