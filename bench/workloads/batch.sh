# shellcheck shell=bash
# bench/workloads/batch.sh -- track_batch against the same events INSERTed
# with unnest (one multi-row INSERT): batch spreads a call's
# events over many tenants, batch_1k the same with calls of 1 000 events,
# batch_one_tenant gives them all to one.  batch_one_tenant is a diagnostic
# (per-event against per-tenant cost of track_batch) that would take the
# default run past ten minutes: it runs only when --workload names it.

register_workload batch "track_batch, $BATCH_SIZE events over $TENANTS tenants per call vs unnest INSERT"
register_workload batch_1k "track_batch, 1000 events over $TENANTS tenants per call vs unnest INSERT"
register_workload batch_one_tenant \
	"track_batch, $BATCH_SIZE events of one tenant per call vs unnest INSERT" explicit

# batch_workload NAME TENANT_EXPR NOTE SIZE: track_batch of SIZE events per
# call against the same events INSERTed with unnest into peer.batch_events.  The
# tenant array is built in the server the same way for both.
batch_workload() {
	local wl=$1 tenant_expr=$2 what=$3 BATCH_SIZE=$4 fm_rate peer_rate sizes r
	script "fm_$wl" <<EOF
\set b random(0, $((TENANTS - 1)))
SELECT flagmeter.track_batch(
	(SELECT array_agg($tenant_expr) FROM generate_series(0, $((BATCH_SIZE - 1))) g),
	array_fill('api_calls'::text, ARRAY[$BATCH_SIZE]),
	array_fill(1::bigint, ARRAY[$BATCH_SIZE]));
EOF
	script "peer_$wl" <<EOF
\set b random(0, $((TENANTS - 1)))
INSERT INTO peer.batch_events (tenant, meter, amount)
SELECT u.t, u.m, u.a
FROM unnest((SELECT array_agg($tenant_expr) FROM generate_series(0, $((BATCH_SIZE - 1))) g),
            array_fill('api_calls'::text, ARRAY[$BATCH_SIZE]),
            array_fill(1::bigint, ARRAY[$BATCH_SIZE])) AS u(t, m, a);
EOF
	# track_batch's writes as plain SQL (diagnostic): the events, and one
	# counter upsert per tenant of the call, in tenant order (two calls
	# that upsert the same tenants in different orders can deadlock)
	script "writes_$wl" <<EOF
\set b random(0, $((TENANTS - 1)))
WITH a AS (SELECT array_agg($tenant_expr) AS ts FROM generate_series(0, $((BATCH_SIZE - 1))) g),
event AS (INSERT INTO peer.batch_writes_events (tenant, meter, amount)
          SELECT u.t, 'api_calls', 1 FROM a, unnest(a.ts) AS u(t))
INSERT INTO peer.usage AS c (tenant, meter, used)
SELECT u.t, 'api_calls', count(*) FROM a, unnest(a.ts) AS u(t) GROUP BY u.t ORDER BY u.t
ON CONFLICT (tenant, meter) DO UPDATE SET used = c.used + EXCLUDED.used;
EOF
	show_scripts "fm_$wl" "peer_$wl" "writes_$wl"
	# Each side's events go into a B-tree on (tenant, meter, occurred_at)
	# at random tenants, which costs more the larger the index: say how
	# large each table was (flagmeter.events holds every earlier workload's
	# events, the peer's table only its own).
	sizes=$(psql_q "SELECT (SELECT count(*) FROM flagmeter.events) || ' rows in flagmeter.events, '
	                || (SELECT count(*) FROM peer.batch_events) || ' in peer.batch_events'")
	measure "$wl" "$BATCH_CLIENTS" prepared 0 "peer_$wl" "writes_$wl" "fm_$wl"
	fm_rate=$(events_per_s "$wl.fm_$wl")
	peer_rate=$(events_per_s "$wl.peer_$wl")
	r=$(ratio "$fm_rate" "$peer_rate")
	emit_row "$wl" "$BATCH_CLIENTS" ev/s "$fm_rate" "$(p95_ms "$wl.fm_$wl")" "unnest INSERT" \
		"$peer_rate" "$(p95_ms "$wl.peer_$wl")" "$r" ">= 0.8 x peer" "$(met "$r" 0.8)" \
		"$BATCH_SIZE events per call, $what; P95 is per call; at the start $sizes"
	emit_row "$wl" "$BATCH_CLIENTS" ev/s "$fm_rate" "$(p95_ms "$wl.fm_$wl")" \
		"event INSERT + counter upserts" "$(events_per_s "$wl.writes_$wl")" \
		"$(p95_ms "$wl.writes_$wl")" "$(ratio_of "$wl.fm_$wl" "$wl.writes_$wl")" \
		"none (diagnostic)" - \
		"track_batch's writes as plain SQL (the events, then one upsert per tenant of the call); they run at $(ratio_of "$wl.writes_$wl" "$wl.peer_$wl") x the unnest INSERT"
}

# events_per_s LABEL: a batch script's calls per second times BATCH_SIZE
# (batch_workload's)
events_per_s() {
	awk -v t="$(rate_of "$1")" -v n="$BATCH_SIZE" 'BEGIN { printf "%.0f", t * n }'
}

wl_batch() {
	batch_workload batch "(1 + floor(random() * $TENANTS)::int)::text" \
		"each of a random tenant of $TENANTS" "$BATCH_SIZE"
}

wl_batch_1k() {
	batch_workload batch_1k "(1 + floor(random() * $TENANTS)::int)::text" \
		"each of a random tenant of $TENANTS" 1000
}

wl_batch_one_tenant() {
	batch_workload batch_one_tenant "(1 + :b)::text" "all of one random tenant" "$BATCH_SIZE"
}
