# shellcheck shell=bash
# bench/workloads/unique.sh -- meters that count distinct values
# (aggregation 'unique': track_value, and check reading the count it keeps)
# against the plain SQL a developer writes to collect distinct values.
#   track_value   track_value of a random tenant of $TENANTS and a random
#                 value of $UNIQUE_VALUES ('user-1' ...) against INSERT ... ON
#                 CONFLICT DO NOTHING of the same pair into a (tenant,
#                 period, value) table with that primary key (it keeps no
#                 count and enforces nothing); then the bytes each distinct
#                 value takes on each side
#   check_unique  check of the unique meter, tenant random of $TENANTS,
#                 against a primary-key SELECT of one row
# Each runs twice: with flagmeter preloaded, as the bench's server starts,
# and without (the server restarted with shared_preload_libraries =
# 'pg_cron', then back); each setup has its own rounds of the peers, so
# every ratio is of one setup in one stretch of time.  Unique meters never
# write pending usage (one write per track is for sum and count meters):
# preloading changes where the limit comes from (the shared limit cache
# or each backend's), and nothing they write.
# Each has diagnostic rows: track_value's writes as one plain statement on
# plain tables of flagmeter's shapes; check's read as plain SQL, and the
# count a developer without a maintained count reads (count(*) of the
# tenant's set).

register_workload track_value "track_value over $TENANTS tenants and $UNIQUE_VALUES values vs INSERT ... ON CONFLICT DO NOTHING, preloaded and not; bytes per value"
register_workload check_unique "check of a unique meter over $TENANTS tenants vs primary-key SELECT, preloaded and not"

UNIQUE_METER=active_users

# The meter on plan bench (tenants 1 .. $TENANTS have it) and the peers'
# tables, once.
unique_setup() {
	[[ $(psql_q "SELECT count(*) FROM flagmeter.meters WHERE meter = '$UNIQUE_METER'") == 1 ]] &&
		return 0
	fm_log "unique: meter $UNIQUE_METER (aggregation unique) on plan bench, peer tables"
	run_as_pg psql -X -q -v ON_ERROR_STOP=1 -d "$DB" >/dev/null <<EOF
SELECT flagmeter.define_meter('$UNIQUE_METER', aggregation => 'unique');
SELECT flagmeter.set_limit('bench', '$UNIQUE_METER', $BIG_QUOTA, 'month');

-- What a developer writes to collect a period's distinct values: one row
-- per value under the primary key, no count kept, nothing enforced.
CREATE TABLE peer.unique_values (
	tenant		text NOT NULL,
	period		timestamptz NOT NULL,
	value		text NOT NULL,
	PRIMARY KEY (tenant, period, value)
);

-- track_value's writes as plain SQL (diagnostic rows), on tables of
-- flagmeter's shapes: the set (a 128-bit hash per value), the day's
-- sighting, the event of a new value, the counter row it adds to.
CREATE TABLE peer.uv_values (
	tenant		text NOT NULL,
	meter		text NOT NULL,
	period_start	timestamptz NOT NULL,
	value_hash	uuid NOT NULL,
	counted_at	timestamptz NOT NULL,
	period_end	timestamptz NOT NULL,
	PRIMARY KEY (tenant, meter, period_start, value_hash)
);
CREATE TABLE peer.uv_sightings (
	tenant		text NOT NULL,
	meter		text NOT NULL,
	day		date NOT NULL,
	period_start	timestamptz NOT NULL,
	value_hash	uuid NOT NULL,
	PRIMARY KEY (tenant, meter, day, period_start, value_hash)
);
CREATE TABLE peer.uv_events (LIKE peer.events INCLUDING ALL);
CREATE TABLE peer.uv_usage (LIKE peer.usage INCLUDING ALL);
INSERT INTO peer.uv_usage SELECT i::text, '$UNIQUE_METER', 0 FROM generate_series(1, $TENANTS) i;
VACUUM ANALYZE peer.uv_usage;
EOF
}

# The two setups (set_preload, bench/lib/harness.sh).
UNIQUE_SETUPS=(preloaded not_preloaded)

# unique_measure WORKLOAD SCRIPT...: measure the scripts in each setup, as
# workload WORKLOAD.SETUP (labels WORKLOAD.SETUP.SCRIPT).
unique_measure() {
	local wl=$1 setup
	shift
	for setup in "${UNIQUE_SETUPS[@]}"; do
		echo "    -- $setup"
		[[ $setup == preloaded ]] || set_preload off
		measure "$wl.$setup" "$CLIENTS" prepared 0 "$@"
		if [[ $setup == preloaded ]]; then
			# where the limits came from (the cache is empty again after
			# the restarts)
			echo "    $(psql_q "SELECT COALESCE(format('shared limit cache: %s hits, %s loads since start',
			                                         hits, loads), 'no shared limit cache')
			                  FROM flagmeter.shared_limit_cache()")"
		else
			set_preload on
		fi
	done
}

# unique_sizes: "values events unique_values value_sightings events counters
# peer_values peer_table" -- rows of the meter and total bytes (indexes,
# TOAST and forks included; events over all partitions)
unique_sizes() {
	psql_q "SELECT concat_ws(' ',
	          (SELECT count(*) FROM flagmeter.unique_values WHERE meter = '$UNIQUE_METER'),
	          (SELECT count(*) FROM flagmeter.events WHERE meter = '$UNIQUE_METER'),
	          pg_total_relation_size('flagmeter.unique_values'),
	          pg_total_relation_size('flagmeter.value_sightings'),
	          (SELECT sum(pg_total_relation_size(relid)) FROM pg_partition_tree('flagmeter.events')
	           WHERE isleaf),
	          pg_total_relation_size('flagmeter.counters'),
	          (SELECT count(*) FROM peer.unique_values),
	          pg_total_relation_size('peer.unique_values'))"
}

# bytes_per BYTES N: BYTES / N, no decimals
bytes_per() {
	awk -v b="$1" -v n="$2" 'BEGIN { printf "%.0f", (n > 0) ? b / n : 0 }'
}

wl_track_value() {
	local before after values events peer_values fm_bytes peer_bytes note
	unique_setup
	script fm_track_value <<EOF
\set t random(1, $TENANTS)
\set v random(1, $UNIQUE_VALUES)
SELECT flagmeter.track_value(:t, '$UNIQUE_METER', 'user-' || :v);
EOF
	script peer_value_insert <<EOF
\set t random(1, $TENANTS)
\set v random(1, $UNIQUE_VALUES)
INSERT INTO peer.unique_values (tenant, period, value)
VALUES (:t, date_trunc('month', now()), 'user-' || :v) ON CONFLICT DO NOTHING;
EOF
	# track_value's writes as one plain statement: the value into the set
	# (as its hash); when new, its event and the counter row's increment;
	# the day's sighting either way
	script writes_track_value <<EOF
\set t random(1, $TENANTS)
\set v random(1, $UNIQUE_VALUES)
WITH h AS (
	SELECT (:t)::text AS tenant, date_trunc('month', now()) AS ps,
	       encode(substr(sha256(convert_to('user-' || :v, 'UTF8')), 1, 16), 'hex')::uuid AS hash
), val AS (
	INSERT INTO peer.uv_values (tenant, meter, period_start, value_hash, counted_at, period_end)
	SELECT tenant, '$UNIQUE_METER', ps, hash, now(), ps + interval '1 month' FROM h
	ON CONFLICT DO NOTHING RETURNING tenant
), ev AS (
	INSERT INTO peer.uv_events (tenant, meter, amount) SELECT tenant, '$UNIQUE_METER', 1 FROM val
), seen AS (
	INSERT INTO peer.uv_sightings (tenant, meter, day, period_start, value_hash)
	SELECT tenant, '$UNIQUE_METER', current_date, ps, hash FROM h ON CONFLICT DO NOTHING
)
INSERT INTO peer.uv_usage AS u (tenant, meter, used) SELECT tenant, '$UNIQUE_METER', 1 FROM val
ON CONFLICT (tenant, meter) DO UPDATE SET used = u.used + EXCLUDED.used;
EOF
	show_scripts fm_track_value peer_value_insert writes_track_value
	read -r -a before <<<"$(unique_sizes)"
	unique_measure track_value peer_value_insert writes_track_value fm_track_value
	read -r -a after <<<"$(unique_sizes)"

	local setup wl
	for setup in "${UNIQUE_SETUPS[@]}"; do
		wl=track_value.$setup
		ratio_row track_value "$CLIENTS" "$wl.fm_track_value" "$wl.peer_value_insert" \
			"INSERT ... ON CONFLICT DO NOTHING" 1.0 "" \
			"${setup/_/ }: tenants random of $TENANTS, values random of $UNIQUE_VALUES (nearly every pair new)"
		diag_row track_value "$CLIENTS" "$wl.fm_track_value" "$wl.writes_track_value" \
			"track_value's writes as plain SQL" \
			"${setup/_/ }: the set, the sighting, the event and the counter upsert as one plain statement; it runs at $(ratio_of "$wl.writes_track_value" "$wl.peer_value_insert") x the INSERT"
	done

	# Bytes per distinct value: what the runs above added, over the values
	# they added (warm-ups included)
	values=$((after[0] - before[0]))
	events=$((after[1] - before[1]))
	peer_values=$((after[6] - before[6]))
	fm_bytes=$(((after[2] - before[2]) + (after[3] - before[3]) + (after[4] - before[4])))
	peer_bytes=$((after[7] - before[7]))
	note="over $values new values ($events events; peer: $peer_values rows): unique_values $(bytes_per $((after[2] - before[2])) "$values") B, value_sightings $(bytes_per $((after[3] - before[3])) "$values") B, events $(bytes_per $((after[4] - before[4])) "$values") B (tables and indexes); besides, counters grew by $((after[5] - before[5])) B in all"
	echo "    bytes per value: $note"
	emit_row track_value - B/value "$(bytes_per "$fm_bytes" "$values")" - "(tenant, period, value) table" \
		"$(bytes_per "$peer_bytes" "$peer_values")" - "$(ratio "$(bytes_per "$fm_bytes" "$values")" "$(bytes_per "$peer_bytes" "$peer_values")")" \
		"none (information)" - "$note"
}

wl_check_unique() {
	local counted sets
	unique_setup
	# every tenant has a value counted in the current period (a run of this
	# workload alone starts from empty sets), and as many rows in the peer's
	# set as in flagmeter's
	counted=$(psql_q "SELECT count(*) FILTER (WHERE flagmeter.track_value(i::text, '$UNIQUE_METER', 'user-' || i))
	                  FROM generate_series(1, $TENANTS) i")
	psql_q "INSERT INTO peer.unique_values SELECT i::text, date_trunc('month', now()), 'user-' || i
	        FROM generate_series(1, $TENANTS) i ON CONFLICT DO NOTHING"
	psql_q "VACUUM ANALYZE peer.unique_values, flagmeter.unique_values, flagmeter.counters"
	sets=$(psql_q "SELECT format('%s values in the current period of %s tenants (%s counted now); the peer''s set: %s rows',
	                             (SELECT count(*) FROM flagmeter.unique_values WHERE meter = '$UNIQUE_METER'),
	                             (SELECT count(DISTINCT tenant) FROM flagmeter.unique_values WHERE meter = '$UNIQUE_METER'),
	                             $counted, (SELECT count(*) FROM peer.unique_values))")
	echo "    $sets"
	script fm_check_unique <<EOF
\set t random(1, $TENANTS)
SELECT * FROM flagmeter.check(:t, '$UNIQUE_METER', 1);
EOF
	script peer_select_unique <<EOF
\set t random(1, $TENANTS)
SELECT used FROM peer.usage WHERE tenant = (:t)::text AND meter = 'api_calls';
EOF
	# check's read as plain SQL (diagnostic): the tenant's counter rows, merged
	script reads_check_unique <<EOF
\set t random(1, $TENANTS)
SELECT flagmeter.used(flagmeter.merge_agg(counter)) FROM flagmeter.counters
WHERE tenant = (:t)::text AND meter = '$UNIQUE_METER';
EOF
	# the count without a maintained one (diagnostic): the peer's set, counted
	script count_unique <<EOF
\set t random(1, $TENANTS)
SELECT count(*) FROM peer.unique_values WHERE tenant = (:t)::text AND period = date_trunc('month', now());
EOF
	show_scripts fm_check_unique peer_select_unique reads_check_unique count_unique
	unique_measure check_unique peer_select_unique reads_check_unique count_unique fm_check_unique

	local setup wl
	for setup in "${UNIQUE_SETUPS[@]}"; do
		wl=check_unique.$setup
		ratio_row check_unique "$CLIENTS" "$wl.fm_check_unique" "$wl.peer_select_unique" \
			"primary-key SELECT" 0.8 "" "${setup/_/ }: $sets"
		diag_row check_unique "$CLIENTS" "$wl.fm_check_unique" "$wl.reads_check_unique" \
			"check's read as plain SQL" \
			"${setup/_/ }: the tenant's counter rows merged in SQL; it runs at $(ratio_of "$wl.reads_check_unique" "$wl.peer_select_unique") x the SELECT"
		diag_row check_unique "$CLIENTS" "$wl.fm_check_unique" "$wl.count_unique" \
			"count(*) of the peer's set" \
			"${setup/_/ }: the count without a maintained one; it runs at $(ratio_of "$wl.count_unique" "$wl.peer_select_unique") x the SELECT"
	done
}
