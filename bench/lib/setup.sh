# shellcheck shell=bash
# bench/lib/setup.sh -- the bench's server settings, the database every
# workload runs in (flagmeter's configuration and the peers' tables) and the
# pgbench scripts several workloads share.  Sourced by bench/run.

# ---------------------------------------------------------------------------
# Cluster
# ---------------------------------------------------------------------------

# The huge pages the machine had before --huge-pages reserved more, or
# empty when it did not.
HUGE_PAGES_BEFORE=

# reserve_huge_pages: with --huge-pages and the server stopped, as many
# 2 MB pages as its shared memory needs as configured now
# (shared_memory_size_in_huge_pages), on top of what the machine had
# reserved before the run.  The reservation holds memory away from every
# other process of the machine until release_huge_pages gives it back.
reserve_huge_pages() {
	local file=/proc/sys/vm/nr_hugepages pages
	((HUGE_PAGES)) || return 0
	if ((EUID != 0)) || [[ ! -w $file ]]; then
		fm_err "--huge-pages needs root (it writes $file)"
		return 1
	fi
	pages=$(run_as_pg postgres -D "$FM_PGDATA" -C shared_memory_size_in_huge_pages) || return 1
	if [[ -z $HUGE_PAGES_BEFORE ]]; then
		HUGE_PAGES_BEFORE=$(cat "$file")
	fi
	echo $((HUGE_PAGES_BEFORE + pages)) >"$file"
	if (($(cat "$file") < HUGE_PAGES_BEFORE + pages)); then
		fm_err "huge pages: the kernel reserved $(cat "$file") of the $((HUGE_PAGES_BEFORE + pages)) asked for"
		return 1
	fi
	fm_log "huge pages: $pages of 2 MB reserved for the server"
}

release_huge_pages() {
	if [[ -n $HUGE_PAGES_BEFORE ]]; then
		echo "$HUGE_PAGES_BEFORE" >/proc/sys/vm/nr_hugepages || true
		HUGE_PAGES_BEFORE=
	fi
}

configure_cluster() {
	fm_log "bench settings: appending to postgresql.conf and restarting"
	cat >>"$FM_PGDATA/postgresql.conf" <<EOF

# --- added by bench/run ---
# Durability stays as shipped: fsync and synchronous_commit on, because
# durable metering in the caller's transaction is the product.
synchronous_commit = on
shared_buffers = 256MB
# clients + pgbouncer's pool + listeners + the bench's own sessions
max_connections = $((CLIENTS + BOUNCER_POOL + LISTENERS + 90))
# No checkpoint inside a run: each timed run starts right after one.
max_wal_size = 4GB
checkpoint_timeout = 30min
# The rate limiters' table (24 MB): limit_keys keeps about 0.6 s x its
# calls a second of its $LIMIT_KEYS keys live, some 26 000 at 44 000 calls
# a second; with the default of 100 000 slots, in parts of 16, a part full
# of live keys refused a new one (53400) within seconds.
flagmeter.rate_limit_keys = $RATE_LIMIT_KEYS
EOF
	if ((HUGE_PAGES)); then
		echo "huge_pages = on" >>"$FM_PGDATA/postgresql.conf"
	fi
	restart_server || return 1
}

print_settings() {
	local stripes keys
	echo
	echo "== machine and server"
	printf '  %-30s %s\n' "cpus" "$(nproc)"
	printf '  %-30s %s\n' "load average at start" "$(loadavg)"
	printf '  %-30s %s\n' "pgbench" "$(run_as_pg pgbench --version)"
	if [[ -n $PGBOUNCER_BIN ]]; then
		printf '  %-30s %s\n' "pgbouncer" "$("$PGBOUNCER_BIN" --version | head -n 1)"
	fi
	printf '  %-30s %s\n' "data directory" "$FM_PGDATA (port $FM_PORT, unix socket only)"
	psql_q "SELECT rpad(name, 30) || ' ' || current_setting(name)
	        FROM pg_settings
	        WHERE name IN ('server_version', 'shared_buffers', 'synchronous_commit', 'fsync',
	                       'full_page_writes', 'wal_level', 'wal_buffers', 'commit_delay',
	                       'max_wal_size', 'checkpoint_timeout', 'max_connections',
	                       'shared_preload_libraries', 'autovacuum', 'default_transaction_isolation',
	                       'huge_pages', 'shared_memory_size')
	        ORDER BY name" | sed 's/^/  /'
	stripes=$(run_as_pg psql -X -q -At -d "$DB" \
		-c "LOAD 'flagmeter'" -c "SELECT current_setting('flagmeter.stripes', true)" 2>/dev/null ||
		true)
	printf '  %-30s %s\n' "flagmeter.stripes" "${stripes:-(not defined)}"
	keys=$(run_as_pg psql -X -q -At -d "$DB" \
		-c "LOAD 'flagmeter'" -c "SELECT current_setting('flagmeter.rate_limit_keys', true)" 2>/dev/null ||
		true)
	printf '  %-30s %s\n' "flagmeter.rate_limit_keys" "${keys:-(not defined)}"
	echo
	echo "== run"
	printf '  %-30s %s\n' "workloads" "${SELECTED[*]}"
	printf '  %-30s %s\n' "timed run" "${DURATION} s x $ROUNDS round(s) per script, alternating peer / flagmeter"
	printf '  %-30s %s\n' "warm-up" "${WARMUP} s per script (discarded)"
	printf '  %-30s %s\n' "clients" "$CLIENTS (batch: $BATCH_CLIENTS, pgbouncer: $BOUNCER_CLIENTS), pgbench -j 2"
	printf '  %-30s %s\n' "pgbench" "-M prepared (pgbouncer: -M extended), CHECKPOINT before each timed run"
	echo
}

# ---------------------------------------------------------------------------
# Database
# ---------------------------------------------------------------------------

# The flagmeter configuration and the peers' tables.  Tenants are '1' ..
# '$TENANTS', plus 'hot' (one tenant for every client), 'checked' (check)
# and 'tight' (over-grant check), all on plan bench (quota $BIG_QUOTA a
# month) except 'tight'.
setup_database() {
	fm_log "creating database $DB: flagmeter, $TENANTS tenants, peer tables"
	run_as_pg psql -X -q -v ON_ERROR_STOP=1 -d postgres -c "CREATE DATABASE $DB"
	run_as_pg psql -X -q -v ON_ERROR_STOP=1 -d "$DB" >/dev/null <<EOF
CREATE EXTENSION flagmeter;
SELECT flagmeter.define_meter('api_calls');
SELECT flagmeter.define_plan('bench');
SELECT flagmeter.set_limit('bench', 'api_calls', $BIG_QUOTA, 'month');
SELECT count(flagmeter.assign_plan(i::text, 'bench')) FROM generate_series(1, $TENANTS) i;
SELECT flagmeter.assign_plan(t, 'bench') FROM unnest(ARRAY['hot', 'checked', 'tight']) t;
SELECT flagmeter.override_limit('tight', 'api_calls', $TIGHT_QUOTA);

-- What a competent developer writes without flagmeter.
CREATE SCHEMA peer;

-- one row per event, indexed for per-tenant usage queries
CREATE TABLE peer.events (
	tenant		text NOT NULL,
	meter		text NOT NULL,
	amount		bigint NOT NULL,
	occurred_at	timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX ON peer.events (tenant, meter, occurred_at);
-- the same for the batch peers (they run last; see ALL_WORKLOADS)
CREATE TABLE peer.batch_events (LIKE peer.events INCLUDING ALL);
-- and for the plain-SQL copies of flagmeter's own writes (diagnostic rows)
CREATE TABLE peer.writes_events (LIKE peer.events INCLUDING ALL);
CREATE TABLE peer.batch_writes_events (LIKE peer.events INCLUDING ALL);

-- a counter per tenant and meter (upserts, primary-key reads)
CREATE TABLE peer.usage (
	tenant		text NOT NULL,
	meter		text NOT NULL,
	used		bigint NOT NULL,
	PRIMARY KEY (tenant, meter)
);
INSERT INTO peer.usage
SELECT t, 'api_calls', 0
FROM (SELECT i::text FROM generate_series(1, $TENANTS) i UNION ALL VALUES ('hot')) s(t);
INSERT INTO peer.usage VALUES ('checked', 'api_calls', $CHECK_EVENTS);

-- a quota row per tenant and meter, consumed by a conditional UPDATE
CREATE TABLE peer.quota (
	tenant		text NOT NULL,
	meter		text NOT NULL,
	used		bigint NOT NULL,
	quota		bigint NOT NULL,
	PRIMARY KEY (tenant, meter)
);
INSERT INTO peer.quota
SELECT t, 'api_calls', 0, $BIG_QUOTA
FROM (SELECT i::text FROM generate_series(1, $TENANTS) i UNION ALL VALUES ('hot')) s(t);

-- consume's writes as plain SQL (diagnostic rows): the event row, then the
-- conditional UPDATE, in one call; the quota never runs out, so no event is
-- ever taken back
CREATE FUNCTION peer.consume_writes(t text, n bigint) RETURNS boolean LANGUAGE plpgsql AS \$\$
BEGIN
	INSERT INTO peer.writes_events (tenant, meter, amount) VALUES (t, 'api_calls', n);
	UPDATE peer.quota SET used = used + n
	WHERE tenant = t AND meter = 'api_calls' AND used + n <= quota;
	RETURN FOUND;
END \$\$;

-- the counter again, with a row trigger that tells app instances
CREATE TABLE peer.usage_notify (LIKE peer.usage INCLUDING ALL);
INSERT INTO peer.usage_notify SELECT * FROM peer.usage;
CREATE FUNCTION peer.usage_notify() RETURNS trigger LANGUAGE plpgsql AS \$\$
BEGIN
	PERFORM pg_notify('bench_usage',
		json_build_object('tenant', NEW.tenant, 'meter', NEW.meter, 'used', NEW.used)::text);
	RETURN NEW;
END \$\$;
CREATE TRIGGER usage_notify AFTER INSERT OR UPDATE ON peer.usage_notify
	FOR EACH ROW EXECUTE FUNCTION peer.usage_notify();

VACUUM ANALYZE;
EOF
}

# ---------------------------------------------------------------------------
# Scripts shared by several workloads
# ---------------------------------------------------------------------------

write_common_scripts() {
	script fm_track <<EOF
\set t random(1, $TENANTS)
SELECT flagmeter.track(:t, 'api_calls');
EOF
	script peer_insert <<EOF
\set t random(1, $TENANTS)
INSERT INTO peer.events (tenant, meter, amount) VALUES (:t, 'api_calls', 1);
EOF
	# flagmeter's own writes as plain SQL, for the diagnostic rows
	script writes_track <<EOF
\set t random(1, $TENANTS)
WITH event AS (INSERT INTO peer.writes_events (tenant, meter, amount) VALUES (:t, 'api_calls', 1))
INSERT INTO peer.usage AS u (tenant, meter, used) VALUES (:t, 'api_calls', 1)
ON CONFLICT (tenant, meter) DO UPDATE SET used = u.used + EXCLUDED.used;
EOF
	script writes_consume <<EOF
\set t random(1, $TENANTS)
SELECT peer.consume_writes(:t::text, 1);
EOF
}
