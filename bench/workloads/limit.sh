# shellcheck shell=bash
# bench/workloads/limit.sh -- the ad-hoc rate limiter, flagmeter.limit()
# (issue 37), against SELECT 1: its state lives in shared memory and it
# writes nothing, so the peer is a round trip that does no work at all.
#   limit_hot   every client on one key; then the over-grant check: a key
#               of burst $LIMIT_TIGHT_BURST spent by more calls than that
#   limit_keys  keys random of $LIMIT_KEYS ('user:1' ...), at a rate of 100
#               a minute (none is refused at these rates)
# Each has a diagnostic row: the same limiter as plain SQL, GCRA in an
# unlogged table (one upsert per call; the row holds the key's theoretical
# arrival time), what one writes without flagmeter.  limit_hot has a second
# one: a constant row of limit()'s shape (rate_decision: a boolean, a
# bigint, two intervals), which costs SELECT 1 its output alone.  Both are
# skipped while flagmeter.limit() does not exist in the build.

register_workload limit_hot "limit() on one key vs SELECT 1; over-grant check"
register_workload limit_keys "limit() over $LIMIT_KEYS keys vs SELECT 1"

LIMIT_PROC='flagmeter.limit(text,bigint,interval,bigint,bigint)'

limit_exists() {
	[[ $(psql_q "SELECT to_regprocedure('$LIMIT_PROC') IS NOT NULL") == t ]]
}

# The plain-SQL limiter's table and the over-grant check's, once.
limit_setup() {
	run_as_pg psql -X -q -v ON_ERROR_STOP=1 -d "$DB" >/dev/null <<'EOF'
-- GCRA as plain SQL: one row per key, its theoretical arrival time; a call
-- is allowed when, pushed by one emission interval, it stays within the
-- burst's worth of time ahead of now.  Unlogged, as a developer would keep
-- a limiter's state (losing it on a crash only hands out fresh bursts).
CREATE UNLOGGED TABLE IF NOT EXISTS peer.rate_tat (key text PRIMARY KEY, tat timestamptz NOT NULL);
-- one row per call limit() allowed in the over-grant check
CREATE UNLOGGED TABLE IF NOT EXISTS peer.limit_grants (n int NOT NULL);
EOF
}

# sql_gcra KEY_EXPR INC CAP: the plain-SQL limiter's statement: one
# emission interval INC per call, at most CAP (the burst's worth) ahead.
# Returns a row when allowed, none when refused.
sql_gcra() {
	cat <<EOF
INSERT INTO peer.rate_tat AS r (key, tat) VALUES ($1, now() + interval '$2')
ON CONFLICT (key) DO UPDATE SET tat = greatest(r.tat, now()) + interval '$2'
WHERE greatest(r.tat, now()) + interval '$2' <= now() + interval '$3'
RETURNING tat;
EOF
}

# After each run of the plain-SQL limiter: vacuum its table, whose upserts
# leave up to 300 000 dead rows a run, so that autovacuum does not do it
# during the next run (flagmeter's or SELECT 1's).
vacuum_rate_tat() {
	psql_q "VACUUM peer.rate_tat"
}
around_script limit_hot.sql_gcra_hot "" vacuum_rate_tat
around_script limit_keys.sql_gcra_keys "" vacuum_rate_tat

write_select1() {
	script select1 <<'EOF'
SELECT 1;
EOF
}

wl_limit_hot() {
	if ! limit_exists; then
		skip_row limit_hot "$CLIENTS" "SELECT 1" ">= 0.8 x peer" "not yet available: no $LIMIT_PROC in this build"
		return 0
	fi
	limit_setup
	write_select1
	# a million a second: no call is refused at any rate pgbench reaches
	script fm_limit_hot <<'EOF'
SELECT flagmeter.limit('hot', 1000000, '1 second');
EOF
	script sql_gcra_hot < <(sql_gcra "'hot'" '1 microsecond' '1 second')
	script row_shape <<'SQL'
SELECT ROW(true, 999999::bigint, NULL::interval, '00:00:00.000001'::interval);
SQL
	show_scripts fm_limit_hot select1 sql_gcra_hot row_shape
	measure limit_hot "$CLIENTS" prepared 0 select1 row_shape sql_gcra_hot fm_limit_hot

	# Over-grants: a key allowing LIMIT_TIGHT_BURST calls an hour, spent by
	# 1.5 x as many calls from every client at once; exactly the burst
	# must be allowed (the next unit comes an hour later), and the key must
	# say nothing remains.
	local per_client=$(((LIMIT_TIGHT_BURST * 3 / 2 + CLIENTS - 1) / CLIENTS)) granted remaining
	local gate='' note
	script fm_limit_tight <<EOF
INSERT INTO peer.limit_grants
SELECT 1 FROM flagmeter.limit('tight', 1, '1 hour', $LIMIT_TIGHT_BURST) WHERE allowed;
EOF
	echo "    over-grant check: $CLIENTS clients x $per_client calls of limit('tight', 1, '1 hour', $LIMIT_TIGHT_BURST)"
	psql_q "TRUNCATE peer.limit_grants"
	pg_nofile pgbench -n -M prepared -c "$CLIENTS" -j 2 -t "$per_client" \
		-f "$SCRIPTS/fm_limit_tight.sql" "$DB" \
		>"$OUT/limit_hot.tight.stdout" 2>"$OUT/limit_hot.tight.stderr" ||
		echo $? >"$OUT/limit_hot.tight.rc"
	[[ -e $OUT/limit_hot.tight.rc ]] || echo 0 >"$OUT/limit_hot.tight.rc"
	run_result "$OUT/limit_hot.tight" 0 >/dev/null
	granted=$(psql_q "SELECT count(*) FROM peer.limit_grants")
	remaining=$(psql_q "SELECT remaining FROM flagmeter.limit('tight', 1, '1 hour', $LIMIT_TIGHT_BURST, 0)")
	note="over-grant check: burst $LIMIT_TIGHT_BURST, $((per_client * CLIENTS)) calls, $granted allowed, $remaining remaining"
	if ((granted > LIMIT_TIGHT_BURST)); then
		gate="OVER-GRANTED by $((granted - LIMIT_TIGHT_BURST))"
	elif ((granted < LIMIT_TIGHT_BURST || remaining != 0)); then
		gate="UNDER-GRANTED: $granted allowed of a burst of $LIMIT_TIGHT_BURST, $remaining remaining"
	else
		note="zero over-grants ($note)"
	fi
	ratio_row limit_hot "$CLIENTS" limit_hot.fm_limit_hot limit_hot.select1 "SELECT 1" 0.8 "$gate" "$note"
	diag_row limit_hot "$CLIENTS" limit_hot.fm_limit_hot limit_hot.sql_gcra_hot \
		"GCRA upsert, unlogged table" \
		"the same limiter as plain SQL (one hot row); it runs at $(ratio_of limit_hot.sql_gcra_hot limit_hot.select1) x SELECT 1"
	diag_row limit_hot "$CLIENTS" limit_hot.fm_limit_hot limit_hot.row_shape \
		"a constant row of limit()'s shape" \
		"SELECT ROW(true, 999999::bigint, NULL::interval, '00:00:00.000001'::interval), the output of limit()'s answer alone, runs at $(ratio_of limit_hot.row_shape limit_hot.select1) x SELECT 1"
}

wl_limit_keys() {
	if ! limit_exists; then
		skip_row limit_keys "$CLIENTS" "SELECT 1" ">= 0.8 x peer" "not yet available: no $LIMIT_PROC in this build"
		return 0
	fi
	limit_setup
	write_select1
	# 100 a minute: a key is called about once in 3 s here, never refused;
	# a key spent is live (in the shared table) for 0.6 s
	script fm_limit_keys <<EOF
\set k random(1, $LIMIT_KEYS)
SELECT flagmeter.limit('user:' || :k, 100, '1 minute');
EOF
	script sql_gcra_keys < <(echo "\\set k random(1, $LIMIT_KEYS)"; sql_gcra "'user:' || :k" '600 milliseconds' '60 seconds')
	show_scripts fm_limit_keys select1 sql_gcra_keys
	measure limit_keys "$CLIENTS" prepared 0 select1 sql_gcra_keys fm_limit_keys
	local stats
	stats=$(psql_q "SELECT format('the table holds %s keys, %s live now; %s calls failed for a full part',
	                              capacity, keys, full_refusals) FROM flagmeter.rate_limiter()")
	ratio_row limit_keys "$CLIENTS" limit_keys.fm_limit_keys limit_keys.select1 "SELECT 1" 0.8 "" \
		"keys random of $LIMIT_KEYS, 100 a minute each; $stats"
	diag_row limit_keys "$CLIENTS" limit_keys.fm_limit_keys limit_keys.sql_gcra_keys \
		"GCRA upsert, unlogged table" \
		"the same limiter as plain SQL ($LIMIT_KEYS rows); it runs at $(ratio_of limit_keys.sql_gcra_keys limit_keys.select1) x SELECT 1"
}
