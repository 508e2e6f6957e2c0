#!/usr/bin/env bash
# tools/sqlsmith.sh -- random SQL from sqlsmith against a database with
# flagmeter installed; passes when the server never crashed.
#
#   bash tools/sqlsmith.sh [N]        (`make sqlsmith`; N defaults to 20000)
#
# Standalone it does what `make test` does first (tools/common.sh): install
# missing Debian packages, build flagmeter with -Werror in a copy and
# install it, start a throwaway PostgreSQL 15 cluster.  Called from
# tools/test.sh it uses the cluster already running instead: set
#   FM_SQLSMITH_SERVER_LOG   that server's log file (this selects the mode)
#   PGHOST, PGPORT, PGUSER   how to reach it, as a superuser
#
# Then it creates the database FM_SQLSMITH_DB (default flagmeter_sqlsmith;
# dropped first if it exists), installs flagmeter in it with a little of
# everything (meters, plans, limits, tenants, overrides, tracked and
# consumed usage, a void, a maintain() run, and a table of edge-case
# quota_counter values; the database's search_path includes flagmeter, since
# sqlsmith writes operators unqualified), and runs
#   sqlsmith --max-queries=N --exclude-catalog --seed=S --target=...
# as the superuser.  --exclude-catalog keeps pg_catalog's relations out of
# the FROM lists, so the queries read and write flagmeter's tables; every
# routine stays callable.  sqlsmith rolls back each statement's
# transaction, so every statement sees the data set up here.  S is
# FM_SQLSMITH_SEED or a fresh one, printed so that a run can be repeated.
# Errors of the generated statements are expected and only counted.
#
# It fails (exit 1) when the server log, from where it stood before the
# run, has a backend or the postmaster dying: "terminated by signal",
# "was terminated by", "exited with exit code" of a server process, PANIC,
# a failed assertion (TRAP), or a crash restart; or when the server does not
# answer afterwards; or when sqlsmith itself fails or runs past 120 s plus
# 0.1 s a query.  The last line is
#   sqlsmith: N queries (E errors, T timeouts, C lost connections), F call
#   flagmeter functions, S s, seed S, server OK

set -euo pipefail

# shellcheck source=SCRIPTDIR/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

NQUERIES=${1:-20000}
DB=${FM_SQLSMITH_DB:-flagmeter_sqlsmith}
SEED=${FM_SQLSMITH_SEED:-$(((RANDOM << 15 | RANDOM) % 1000000000))}
SERVER_LOG=${FM_SQLSMITH_SERVER_LOG:-}

# Lines of a server log that mean a process died or the server restarted.
CRASH_RE='terminated by signal|was terminated by|server process .* exited with exit code|PANIC:|TRAP:|terminating any other active server processes|all server processes terminated; reinitializing'

if ! [[ $NQUERIES =~ ^[0-9]+$ ]] || ((NQUERIES == 0)); then
	fm_err "usage: $0 [N]   (N = number of queries, > 0)"
	exit 2
fi
if ! [[ $DB =~ ^[a-z_][a-z0-9_]*$ ]]; then
	fm_err "FM_SQLSMITH_DB must be a plain lower-case identifier, not '$DB'"
	exit 2
fi

on_exit() {
	local rc=$?
	fm_cleanup
	exit "$rc"
}
trap on_exit EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# psql_pg DB ARGS...: psql as the unprivileged user, stopping at errors.
psql_pg() {
	local db=$1
	shift
	run_as_pg psql -X -q -v ON_ERROR_STOP=1 -d "$db" "$@"
}

# The data sqlsmith finds: a little of everything flagmeter stores.
setup_sql() {
	cat <<'EOF'
SET client_min_messages = warning;
SELECT flagmeter.define_meter('api_calls', 'sum', 'call'),
       flagmeter.define_meter('tokens', 'sum', 'token'),
       flagmeter.define_meter('seats', 'max'),
       flagmeter.define_meter('logins', 'count'),
       flagmeter.define_meter('storage', 'latest', 'byte');
SELECT flagmeter.define_plan('free'), flagmeter.define_plan('pro');
SELECT flagmeter.set_limit('free', 'api_calls', 1000),
       flagmeter.set_limit('free', 'tokens', 50000, 'month', 'soft'),
       flagmeter.set_limit('free', 'seats', 3),
       flagmeter.set_limit('pro', 'api_calls', 100000, 'month', 'hard', '{75,90,100}'),
       flagmeter.set_limit('pro', 'tokens', 5000000, 'month', 'soft'),
       flagmeter.set_limit('pro', 'storage', 1000000000);
SELECT flagmeter.assign_plan('acme', 'free', '2026-01-31 10:00 America/New_York', 'America/New_York'),
       flagmeter.assign_plan('globex', 'free', '2026-03-15 09:00 Europe/Berlin', 'Europe/Berlin'),
       flagmeter.assign_plan('hooli', 'pro', '2025-11-30 00:00 America/Los_Angeles', 'America/Los_Angeles'),
       flagmeter.assign_plan('umbrella', 'pro', '2024-02-29 00:00 Asia/Tokyo', 'Asia/Tokyo');
SELECT flagmeter.override_limit('hooli', 'api_calls', 250000);

-- initech has no plan, and the history goes back 40 days: both past the
-- defaults (unknown tenants refused, events at most 35 days late)
SELECT flagmeter.configure(unassigned_tenants => 'unlimited', late_events => '60 days');

-- usage spread over the last 40 days, every meter and tenant
SELECT flagmeter.track_batch(array_agg(t), array_agg(m), array_agg(a), array_agg(at))
FROM (SELECT (ARRAY['acme', 'globex', 'hooli', 'umbrella', 'initech'])[1 + g % 5] AS t,
             (ARRAY['api_calls', 'tokens', 'seats', 'logins', 'storage'])[1 + (g / 5) % 5] AS m,
             (g * 7919 % 500)::bigint AS a,
             now() - (g % 960) * interval '1 hour' AS at
      FROM generate_series(1, 2000) g) s;
SELECT flagmeter.consume('acme', 'api_calls', 5, 'req-1'),
       flagmeter.consume('acme', 'api_calls', 5000),
       flagmeter.check('globex', 'tokens', 10);
SELECT * FROM flagmeter.consume('hooli', ARRAY['api_calls', 'tokens'], ARRAY[10, 800]::bigint[]);
SELECT flagmeter.track('umbrella', 'api_calls', 500, now(), 'import-42'),
       flagmeter.void('umbrella', 'import-42');
SELECT * FROM flagmeter.maintain();
SELECT flagmeter.track('acme', 'tokens', 3, now() - interval '2 days');

-- quota_counter values at the edges, for sqlsmith to feed to every
-- function and operator that takes one
CREATE TABLE public.counter_samples (
	id		integer PRIMARY KEY,
	counter	flagmeter.quota_counter,
	amount	bigint,
	at		timestamptz,
	tenant	text,
	meter	text
);
INSERT INTO public.counter_samples VALUES
	(1, 'used=0 events=0 max=0', 0, '0001-01-01 00:00:00+00', 'acme', 'api_calls'),
	(2, 'used=0 events=0 max=0 limit=1', 1, '9999-12-31 23:59:59.999999+00', 'hooli', 'tokens'),
	(3, 'used=10 events=3 max=5 latest=2@2026-11-30T10:00:00.5Z limit=100', 5, now(), 'globex', 'seats'),
	(4, 'used=9223372036854775807 events=9223372036854775807 max=9223372036854775807 latest=9223372036854775807@9999-12-31T23:59:59.999999Z limit=9223372036854775807',
	    9223372036854775807, 'infinity', 'umbrella', 'storage'),
	(5, 'used=0 events=1 max=0 latest=0@0001-01-01T00:00:00Z', -1, '-infinity', 'nobody', 'nothing'),
	(6, 'used=0 events=0 max=7 latest=7@2024-02-29T23:59:59.000001Z', -9223372036854775808, NULL, NULL, NULL),
	(7, NULL, NULL, '4714-11-24 00:00:00+00 BC', '', '');
INSERT INTO public.counter_samples
SELECT 100 + row_number() OVER (), c.counter, 1, c.period_start, c.tenant, c.meter
FROM flagmeter.counters c;
ANALYZE;
EOF
}

main() {
	fm_init
	local tmp_owned=0
	if [[ -n $SERVER_LOG ]]; then
		if [[ -z ${PGHOST:-} || -z ${PGPORT:-} ]]; then
			fm_err "FM_SQLSMITH_SERVER_LOG is set: PGHOST and PGPORT must say where that server is"
			exit 2
		fi
		if [[ ! -r $SERVER_LOG ]]; then
			fm_err "cannot read the server log $SERVER_LOG"
			exit 2
		fi
		export PGUSER=${PGUSER:-$FM_PG_ROLE}
		# Only for our own files; the server is the caller's.
		FM_TMP=$(mktemp -d /tmp/flagmeter-sqlsmith.XXXXXX)
		fm_chown_workdir
		fm_log "sqlsmith: using the running server at $PGHOST:$PGPORT (log $SERVER_LOG)"
	else
		install_deps
		fm_make_workdir
		build_and_install
		fm_chown_workdir
		start_cluster
		SERVER_LOG=$FM_TMP/server.log
		tmp_owned=1
	fi
	if ! command -v sqlsmith >/dev/null; then
		fm_err "sqlsmith is not installed (Debian package sqlsmith)"
		exit 1
	fi

	fm_log "sqlsmith: creating database $DB with flagmeter and sample data"
	psql_pg postgres -c 'SET client_min_messages = warning' \
		-c "DROP DATABASE IF EXISTS $DB" -c "CREATE DATABASE $DB"
	psql_pg "$DB" -c 'CREATE EXTENSION flagmeter'
	# sqlsmith writes operators unqualified: let it find quota_counter's.
	psql_pg "$DB" -c "ALTER DATABASE $DB SET search_path = public, flagmeter"
	setup_sql | psql_pg "$DB" >/dev/null

	# Look only at what the server logs from now on.
	local log_start
	log_start=$(stat -c %s "$SERVER_LOG")

	# Every statement has a 1 s timeout and most take milliseconds (about 150
	# a second here): a run this much slower is stuck somewhere.
	local out=$FM_TMP/sqlsmith.queries err=$FM_TMP/sqlsmith.err rc=0 start=$SECONDS
	local limit=$((120 + NQUERIES / 10))
	fm_log "sqlsmith: $NQUERIES queries, seed $SEED, at most $limit s"
	run_as_pg timeout -k 10 "$limit" \
		sqlsmith --target="host=$PGHOST port=$PGPORT dbname=$DB user=$PGUSER" \
		--max-queries="$NQUERIES" --seed="$SEED" --exclude-catalog --verbose \
		--dump-all-queries >"$out" 2>"$err" || rc=$?
	local elapsed=$((SECONDS - start))

	# sqlsmith --verbose: lines of one character per query ('.' ok, 'e' error,
	# 't' timeout, 'S' syntax error, 'C' connection lost), then a report
	# that starts with "queries: N" and counts the errors by message.
	local progress nqueries nerr ntimeout nbroken nfm
	progress=$(grep -E '^[.etSC]+$' "$err" | tr -d '\n' || true)
	nqueries=$(sed -n 's/^queries: \([0-9]*\).*/\1/p' "$err" | tail -n 1)
	nqueries=${nqueries:-${#progress}}
	nerr=$(tr -cd 'eS' <<<"$progress" | wc -c)
	ntimeout=$(tr -cd 't' <<<"$progress" | wc -c)
	nbroken=$(tr -cd 'C' <<<"$progress" | wc -c)
	# statements (each ends with ";" at the end of a line) that call one of
	# flagmeter's functions, operators aside
	nfm=$(awk 'BEGIN { RS = ";\n" } /flagmeter\.[a-z_]+\(/ { n++ } END { print n + 0 }' "$out")

	fm_log "sqlsmith: most frequent errors (expected: random SQL):"
	# (sqlsmith repeats its report every 1000 queries: the last one counts)
	awk '/^queries: / { n = 0 } /^[0-9]+\t/ { line[n++] = $0 }
		END { for (i = 0; i < n && i < 8; i++) print line[i] }' "$err"

	local failed=0
	local crashes
	crashes=$(tail -c +"$((log_start + 1))" "$SERVER_LOG" | grep -E -A 2 "$CRASH_RE" || true)
	if [[ -n $crashes ]]; then
		fm_err "the server log shows a crash during the sqlsmith run:"
		printf '%s\n' "$crashes" | head -n 40 >&2
		failed=1
	fi
	if ! psql_pg "$DB" -c 'SELECT 1' >/dev/null 2>&1; then
		fm_err "the server does not answer after the sqlsmith run"
		failed=1
	fi
	if ((rc == 124 || rc == 137)); then
		fm_err "sqlsmith did not finish within $limit s"
		failed=1
	elif ((rc != 0)); then
		fm_err "sqlsmith exited with status $rc:"
		tail -n 20 "$err" >&2
		failed=1
	fi
	if ((nbroken > 0)); then
		fm_warn "sqlsmith lost its connection $nbroken time(s) (a backend ended; see above)"
	fi
	if ((failed)) && ((tmp_owned)); then
		tail -n 40 "$SERVER_LOG" >&2 || true
	fi

	fm_cleanup
	local status="server OK"
	((failed)) && status="FAILED"
	printf 'sqlsmith: %d queries (%d errors, %d timeouts, %d lost connections), %d call flagmeter functions, %d s, seed %s, %s\n' \
		"$nqueries" "$nerr" "$ntimeout" "$nbroken" "$nfm" "$elapsed" "$SEED" "$status"
	return "$failed"
}

main "$@"
