#!/usr/bin/env bash
# tools/test.sh -- what `make test` (and so .ci/run) runs.
#
#   bash tools/test.sh            PostgreSQL 15, Debian 12's, on this machine
#   PG=17 bash tools/test.sh      (make test PG=17) PostgreSQL 17 of Debian 13,
#   PG=18 bash tools/test.sh      (make test PG=18) PostgreSQL 18 of Debian sid,
#                                 each in a chroot (tools/chroot.sh)
#
# Installs missing Debian packages (and, for 17/18, gets the chroot ready),
# builds flagmeter with -Werror and installs it, starts a throwaway cluster
# of that version (pg_cron preloaded) as an unprivileged user, listening on
# its unix socket and on 127.0.0.1, then runs the suites.  The first four
# run as that user in a copy of the tree, inside the chroot for 17/18, three
# of them through PGXS's `make installcheck`:
#   regress    pg_regress, test/sql/*.sql vs test/expected/*.out
#   isolation  pg_isolation_regress, test/specs/*.spec
#   regress_row_lock, isolation_row_lock
#              the same two with flagmeter.lock_free_consume = off and
#              flagmeter.one_write_track = off: every consume decides under
#              stripe 0's row lock and every track writes a stripe, as
#              without flagmeter preloaded
#   tap        prove, test/t/*.pl (these start their own clusters with
#              PostgreSQL::Test::Cluster; only PGXS's bindir on PATH matters)
#   fuzz       `make fuzz-smoke`: a short libFuzzer run on the quota_counter
#              parsers (fuzz/fuzz.mk), built with the clang of the version's
#              Debian suite; one test, failed on any crash, hang, sanitizer
#              report or broken property
#   package    tools/package.sh: the Debian packages of this version built
#              with pg_buildext (in its chroot for 17 and 18), then test/sql
#              run against their files alone on a cluster of its own; one
#              test, failed when a package does not build, its dependencies
#              cannot be met, or a regression test fails
# The last run on this machine, whatever the version, the first three over
# the tree's files, the others as clients of the cluster over TCP (see
# run_host_suites, where more such suites go):
#   static     tools/check_static.sh: pgindent's layout and typedefs.list,
#              the proxy stubs against the calls they route to,
#              docs/architecture.md and the code's comments naming what
#              exists, the reference documenting every function and setting;
#              one test, failed when any of them fails
#   lint       `npm run lint` at the root: ESLint (eslint.config.js,
#              neostandard) over every .js and .mjs; one test, failed on any
#              problem it reports
#   typecheck  `npm run typecheck` at the root: tsc --noEmit over the Node
#              client's src/*.js against its published declarations
#              (clients/node's typecheck script); one test
#   sqlsmith   tools/sqlsmith.sh 2000 against this cluster; one test, failed
#              when the server log shows a crash
#   node       the Node.js client's node:test suite (clients/node, `npm test`)
#              against this cluster; one test.  Its fault files
#              (test/faults*.test.js) start clusters of their own, of the
#              version under test, through $FM_TMP/pg-run (write_pg_run), and
#              pgbouncer on this machine, and restart, crash and fail them over
#   npm_package  tools/npm_package.sh: `npm pack` of clients/node holds its
#              README, LICENSE and src/ only; installed into an empty
#              project, it runs README.md's quick start (SQL, then Node)
#              against this cluster; one test
#   doc_examples  tools/run_doc_examples.py: the ```sql blocks of every
#              docs/guides/*.md and docs/reference/*.md run in order with
#              psql (ON_ERROR_STOP), each file in a fresh database with the
#              extension; a block marked <!-- not run: reason --> is skipped;
#              one test, failed naming the file and line of the block that
#              errors
#   dashboard  the reference app's node:test suite (examples/dashboard,
#              `npm test`: API, webhooks, browser, faults on a cluster of its
#              own as above) against this cluster; one test
#
# Each suite is its own `make installcheck` (the other two switched off on the
# command line: REGRESS= / ISOLATION= / TAP_TESTS=), because a single
# `make installcheck` stops at the first failing suite and would hide the
# results of the others.  Output is shown live and kept in a log per suite,
# which is then parsed for the summary.
#
# Summary: the last line printed is exactly `N passed, M failed` (followed by
# `, K skipped` only when K > 0).  What is counted:
#   - one per pg_regress test       (`test foo ... ok` / `... FAILED`)
#   - one per isolation test        (same format)
#   - one per TAP test *file*       (a file fails if prove reports it in its
#                                   "Test Summary Report" with a non-zero wait
#                                   status, failed assertions or parse errors;
#                                   files that skip_all count as skipped)
#   - a suite whose `make installcheck` fails without any failed test above
#     (e.g. pg_regress could not CREATE EXTENSION, prove crashed) counts as
#     one more failure, so a non-zero exit never shows "0 failed".
#   - pg_regress "failed (ignored)" tests are counted as skipped.
# If setup fails before the tests (packages, build, server start), the line
# is `0 passed, 1 failed`.
#
# While working on one thing: SUITES="tap node" runs only those suites (names
# as above; all when unset), and TAP_FILES="test/t/080_plproxy.pl" only those
# TAP files.  `make test` as CI runs it sets neither.
#
# On failure, regression.diffs, output_iso/regression.diffs, the tails of the
# TAP logs (tmp_check/log/*) and of the server log are printed, and the exit
# status is non-zero.  The cluster is always stopped and the temp dir removed
# (EXIT trap), so the script can run again straight away.

set -euo pipefail

# shellcheck source=SCRIPTDIR/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

SUMMARY_PRINTED=0

on_exit() {
	local rc=$?
	fm_cleanup
	if ((rc != 0 && SUMMARY_PRINTED == 0)); then
		# Setup failed (or we were interrupted) before any summary.
		printf '0 passed, 1 failed\n'
	fi
	exit "$rc"
}
trap on_exit EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# count_regress LOG: "passed failed ignored" from pg_regress-style output.
# PG15 prints `test %-28s ... ok  <n> ms` (serial) or `     %-28s ... ok`
# (inside a parallel group); failures say FAILED (possibly after a note such as
# "(test process exited with exit code 2)"), ignored ones "failed (ignored)".
# From 16 the output is TAP: `ok 1         - name   <n> ms` or `not ok 2 ...`
# ('+' instead of '-' inside a parallel group), and nothing is ignored.
count_regress() {
	awk '
		/^(test |     )[^ ]+ +\.\.\. / {
			if ($0 ~ /failed \(ignored\)/) i++
			else if ($0 ~ /FAILED/) f++
			else if ($0 ~ /\.\.\. +ok/) p++
		}
		/^(not )?ok +[0-9]+ +[-+] +[^ ]/ {
			if ($1 == "not") f++
			else p++
		}
		END { printf "%d %d %d\n", p, f, i }' "$1"
}

# count_tap LOG: "passed failed skipped" TAP files from prove output.
# Total files from prove's closing `Files=N, Tests=...` line; failed files
# from its "Test Summary Report" entries, which look like
#   test/t/001_smoke.pl (Wstat: 256 (exited 1) Tests: 2 Failed: 1)
#     Parse errors: No plan found in TAP output
# (an entry with Wstat 0, Failed 0 and no parse errors is only "TODO passed",
# not a failure); skipped files from `test/t/x.pl .. skipped: reason`.
count_tap() {
	awk '
		/^Files=[0-9]+, Tests=/ { s = $0; sub(/^Files=/, "", s); sub(/,.*/, "", s); files = s + 0 }
		/^[^ ]+\.pl +\.+ skipped/ { skipped++ }
		/^[^ ]+ +\(Wstat: / {
			cur = $1; w = 0; f = 0
			for (k = 1; k < NF; k++) {
				if ($k == "(Wstat:") w = $(k + 1) + 0
				if ($k == "Failed:") f = $(k + 1) + 0
			}
			if (w != 0 || f != 0) bad[cur] = 1
			next
		}
		/^  +Parse errors:/ && cur != "" { bad[cur] = 1 }
		END {
			nb = 0; for (k in bad) nb++
			p = files - nb - skipped; if (p < 0) p = 0
			printf "%d %d %d\n", p, nb, skipped
		}' "$1"
}

TOTAL_PASSED=0
TOTAL_FAILED=0
TOTAL_SKIPPED=0
ANY_STAGE_FAILED=0
declare -A SUITE_FAILED=()  # suite name -> 1 when it had a failure

# wanted NAME: true when SUITES is unset or names the suite.
wanted() {
	[[ -z ${SUITES:-} || " $SUITES " == *" $1 "* ]]
}

# run_suite NAME COUNTER MAKE-OVERRIDES...: one `make installcheck` as the
# unprivileged user in the copy, tee'd to $FM_TMP/NAME.log, then counted.
run_suite() {
	local name=$1 counter=$2 log=$FM_TMP/$1.log rc=0 p f s
	shift 2
	wanted "$name" || return 0
	if [[ $name == tap && -n ${TAP_FILES:-} ]]; then
		set -- "$@" "PROVE_TESTS=$TAP_FILES"
	fi
	fm_log "suite $name: make installcheck $*"
	(cd "$FM_SRC" && run_as_pg make --no-print-directory installcheck \
		PG_CONFIG="$FM_PG_CONFIG" "$@") 2>&1 | tee "$log" || rc=$?
	read -r p f s < <("$counter" "$log")
	if ((rc != 0)); then
		ANY_STAGE_FAILED=1
		if ((f == 0)); then
			fm_err "suite $name: make installcheck exited $rc without a failed test; counting 1 failure"
			f=1
		fi
	fi
	if ((f > 0)); then
		SUITE_FAILED[$name]=1
	fi
	fm_log "suite $name: $p passed, $f failed, $s skipped"
	TOTAL_PASSED=$((TOTAL_PASSED + p))
	TOTAL_FAILED=$((TOTAL_FAILED + f))
	TOTAL_SKIPPED=$((TOTAL_SKIPPED + s))
}

# run_check NAME CMD...: a suite that is one test, passed when CMD exits 0;
# output shown live and kept in $FM_TMP/NAME.log.
run_check() {
	local name=$1 rc=0
	shift
	wanted "$name" || return 0
	fm_log "suite $name: $*"
	"$@" 2>&1 | tee "$FM_TMP/$name.log" || rc=$?
	if ((rc == 0)); then
		fm_log "suite $name: 1 passed, 0 failed"
		TOTAL_PASSED=$((TOTAL_PASSED + 1))
	else
		fm_err "suite $name: exited $rc; counting 1 failure"
		ANY_STAGE_FAILED=1
		SUITE_FAILED[$name]=1
		TOTAL_FAILED=$((TOTAL_FAILED + 1))
	fi
}

# host_as_tree_owner ARRAY: the command prefix that runs a host-side suite
# as the owner of the temp dir (uid and gid, not a name: with PG=17/18 the
# tree belongs to the chroot's postgres account, whose uid the host may give
# to nobody or to another account).  Empty when not root.
host_as_tree_owner() {
	local -n prefix=$1
	prefix=()
	if ((EUID == 0)); then
		prefix=(setpriv --reuid="$(stat -c %u "$FM_TMP")" --regid="$(stat -c %g "$FM_TMP")"
			--clear-groups --)
	fi
}

# write_pg_run: $FM_TMP/pg-run, a command that runs its arguments as the
# owner of this run's clusters with the version under test first on PATH
# (in its chroot for 17 and 18), as run_as_pg does; and $FM_TMP/faults, a
# directory that owner writes.  The fault suites of the Node client and of
# the app start their clusters with it (test/node-helpers/cluster.js:
# FLAGMETER_PG_RUN, FLAGMETER_FAULT_DIR), so they test the version under
# test wherever its binaries run.
write_pg_run() {
	local f=$FM_TMP/pg-run
	{
		printf '#!/usr/bin/env bash\n'
		printf '# Written by tools/test.sh for this run: run_as_pg "$@" (PostgreSQL %s).\n' "$FM_PG_MAJOR"
		printf 'set -euo pipefail\n'
		declare -p FM_TMP FM_PG_BINDIR FM_CHROOT FM_CHROOT_OWNER FM_OS_USER
		printf 'FM_CHROOT_LOCK_FD=\n'
		declare -f run_as_pg fm_chroot_exec
		printf 'run_as_pg "$@"\n'
	} >"$f"
	chmod 755 "$f"
	run_as_pg mkdir -p "$FM_TMP/faults"
}

# The environment of the host suites' fault files (write_pg_run).
fault_env() {
	printf '%s\n' "FLAGMETER_PG_RUN=$FM_TMP/pg-run" "FLAGMETER_FAULT_DIR=$FM_TMP/faults"
}

# npm_ci_once: `npm ci` at the root of the copy (one npm workspace, the
# members the root package.json lists: one lockfile, one node_modules) when
# node_modules is missing, as in a fresh clone; from the npm registry, as the
# tree's owner (host_as_tree_owner), npm's cache in the temp dir.  Every
# suite that needs the packages calls it; the first one installs.
npm_ci_once() {
	[[ -d $FM_SRC/node_modules ]] && return 0
	npm_as_tree_owner bash -c 'cd "$1" && npm ci --no-audit --no-fund' _ "$FM_SRC"
}

# npm_as_tree_owner [NAME=VALUE...] CMD...: CMD as the owner of the temp dir
# (host_as_tree_owner), with HOME and npm's cache in the temp dir and no
# update notice in the logs.
npm_as_tree_owner() {
	local as=()
	host_as_tree_owner as
	"${as[@]}" env HOME="$FM_TMP" npm_config_cache="$FM_TMP/npm-cache" npm_config_update_notifier=false "$@"
}

# run_npm_script NAME: `npm run NAME` at the root of the copy, after
# npm_ci_once, as the tree's owner (lint and typecheck read the tree and
# write nothing into it).
run_npm_script() {
	npm_ci_once || return 1
	npm_as_tree_owner bash -c 'cd "$1" && npm run "$2"' _ "$FM_SRC" "$1"
}

# run_node_client: the Node.js client's suite (clients/node, node:test) on
# this machine, whatever the server's version, a client of the cluster over
# TCP (PGHOST, PGPORT, PGUSER as run_host_check sets them), after
# npm_ci_once.  The tests run as the caller (root in CI): their fault files
# start servers through pg-run, which enters the chroot for 17 and 18, and
# pgbouncer, which they run as postgres.
run_node_client() {
	local faults
	npm_ci_once || return 1
	mapfile -t faults < <(fault_env)
	env HOME="$FM_TMP" PGHOST="$PGHOST" PGPORT="$PGPORT" PGUSER="$PGUSER" "${faults[@]}" \
		bash -c 'cd "$1" && npm test' _ "$FM_SRC/clients/node"
}

# run_npm_package: tools/npm_package.sh, the packed client installed into an
# empty project and README.md's quick start run with it, as the tree's
# owner, with npm's cache in the temp dir (npm_ci_once filled it: pg
# installs from there).
run_npm_package() {
	npm_ci_once || return 1
	npm_as_tree_owner PGHOST="$PGHOST" PGPORT="$PGPORT" PGUSER="$PGUSER" \
		bash "$FM_SRC/tools/npm_package.sh" "$FM_TMP/npm-package"
}

# run_doc_examples: tools/run_doc_examples.py, the docs' SQL examples, as
# the tree's owner, against this cluster over TCP (PGHOST, PGPORT, PGUSER).
run_doc_examples() {
	local as=()
	host_as_tree_owner as
	"${as[@]}" env HOME="$FM_TMP" TMPDIR="$FM_TMP" PGHOST="$PGHOST" PGPORT="$PGPORT" PGUSER="$PGUSER" \
		python3 -B "$FM_SRC/tools/run_doc_examples.py"
}

# run_dashboard: the reference app's suite (examples/dashboard: API tests
# with two app instances, webhooks, Debian's chromium driving the page) on
# this machine, as run_node_client runs the client's.  As root chromium is
# installed from Debian when missing.
run_dashboard() {
	local faults
	if ((EUID == 0)); then
		if [[ ! -x /usr/bin/chromium ]]; then
			DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends chromium || return 1
		fi
	fi
	npm_ci_once || return 1
	mapfile -t faults < <(fault_env)
	env HOME="$FM_TMP" PGHOST="$PGHOST" PGPORT="$PGPORT" PGUSER="$PGUSER" "${faults[@]}" \
		DASHBOARD_TEST_OUTPUT="$FM_TMP/dashboard-output" bash -c 'cd "$1" && npm test' _ "$FM_SRC/examples/dashboard"
}

# has_files GLOB: true if the glob matches at least one file.
has_files() { compgen -G "$1" >/dev/null; }

# run_host_check NAME [VAR=VALUE...] CMD...: run_check on this machine (never
# in the chroot), as a client of the harness's cluster over TCP, with
# PGHOST=127.0.0.1, PGPORT=its port and PGUSER=its superuser role (trust on
# loopback).  Whatever the suite needs besides, it creates itself, its
# databases included.
run_host_check() {
	local name=$1
	shift
	run_check "$name" env PGHOST=127.0.0.1 PGPORT="$FM_PORT" PGUSER="$FM_PG_ROLE" "$@"
}

# run_host_suites: the suites that run on this machine against the cluster,
# the same way for every PostgreSQL version.
run_host_suites() {
	write_pg_run
	if has_files "$FM_SRC/tools/check_static.sh"; then
		run_check static bash "$FM_SRC/tools/check_static.sh"
	else
		fm_log "suite static: no tools/check_static.sh, skipped"
	fi
	if has_files "$FM_SRC/package.json"; then
		run_check lint run_npm_script lint
		run_check typecheck run_npm_script typecheck
	else
		fm_log "suites lint, typecheck: no package.json at the root, skipped"
	fi
	if has_files "$FM_SRC/tools/sqlsmith.sh"; then
		run_host_check sqlsmith FM_SQLSMITH_SERVER_LOG="$FM_TMP/server.log" \
			bash "$FM_SRC/tools/sqlsmith.sh" 2000
	else
		fm_log "suite sqlsmith: no tools/sqlsmith.sh, skipped"
	fi
	if has_files "$FM_SRC/clients/node/package.json"; then
		# run_host_check's connection, for a function rather than a command
		PGHOST=127.0.0.1 PGPORT=$FM_PORT PGUSER=$FM_PG_ROLE run_check node run_node_client
	else
		fm_log "suite node: no clients/node, skipped"
	fi
	if has_files "$FM_SRC/tools/npm_package.sh"; then
		PGHOST=127.0.0.1 PGPORT=$FM_PORT PGUSER=$FM_PG_ROLE run_check npm_package run_npm_package
	fi
	if has_files "$FM_SRC/tools/run_doc_examples.py"; then
		PGHOST=127.0.0.1 PGPORT=$FM_PORT PGUSER=$FM_PG_ROLE run_check doc_examples run_doc_examples
	fi
	if has_files "$FM_SRC/examples/dashboard/package.json"; then
		PGHOST=127.0.0.1 PGPORT=$FM_PORT PGUSER=$FM_PG_ROLE run_check dashboard run_dashboard
	else
		fm_log "suite dashboard: no examples/dashboard, skipped"
	fi
}

# show_failure_details: what is needed to understand the failed suites,
# printed before the temp dir is deleted (FLAGMETER_KEEP_TMP=1 keeps it all,
# e.g. results/*.out of a test that has no expected output yet).
show_failure_details() {
	local f
	for f in "$FM_SRC/regression.diffs" "$FM_SRC/output_iso/regression.diffs" \
		"$FM_SRC/output_row_lock/regression.diffs" "$FM_SRC/output_iso_row_lock/regression.diffs"; do
		if [[ -s $f ]]; then
			printf '\n======== %s ========\n' "${f#"$FM_SRC"/}"
			cat "$f"
		fi
	done
	if [[ -n ${SUITE_FAILED[tap]:-} && -d $FM_SRC/tmp_check/log ]]; then
		for f in "$FM_SRC"/tmp_check/log/*; do
			[[ -f $f ]] || continue
			printf '\n======== tail of %s ========\n' "${f#"$FM_SRC"/}"
			tail -n 60 "$f"
		done
	fi
	# The harness's own server serves pg_regress and isolation only.
	if [[ -n ${SUITE_FAILED[regress]:-}${SUITE_FAILED[isolation]:-}${SUITE_FAILED[regress_row_lock]:-}${SUITE_FAILED[isolation_row_lock]:-} &&
		-s $FM_TMP/server.log ]]; then
		printf '\n======== tail of server.log (throwaway cluster) ========\n'
		tail -n 40 "$FM_TMP/server.log"
	fi
	printf '\n'
}

main() {
	FM_PG_MAJOR=${PG:-15}
	FM_LISTEN_TCP=1	# for run_host_suites
	fm_setup_cluster

	if has_files "$FM_SRC/test/sql/*.sql"; then
		run_suite regress count_regress ISOLATION= TAP_TESTS=
	else
		fm_log "suite regress: no test/sql/*.sql, skipped"
	fi
	if has_files "$FM_SRC/test/specs/*.spec"; then
		run_suite isolation count_regress REGRESS= TAP_TESTS=
	else
		fm_log "suite isolation: no test/specs/*.spec, skipped"
	fi
	# The same two again with consumes deciding under stripe 0's row lock
	# and tracks writing stripes, as they do without flagmeter preloaded
	# (src/inflight.c, src/pending_*.c), in output
	# directories of their own (the later --outputdir wins); a test whose
	# output differs between the two ways has a second expected file, _1.
	if has_files "$FM_SRC/test/sql/*.sql"; then
		PGOPTIONS="-c flagmeter.lock_free_consume=off -c flagmeter.one_write_track=off" run_suite regress_row_lock \
			count_regress ISOLATION= TAP_TESTS= \
			EXTRA_REGRESS_OPTS=--outputdir=output_row_lock
	fi
	if has_files "$FM_SRC/test/specs/*.spec"; then
		PGOPTIONS="-c flagmeter.lock_free_consume=off -c flagmeter.one_write_track=off" run_suite isolation_row_lock \
			count_regress REGRESS= TAP_TESTS= \
			EXTRA_REGRESS_OPTS=--outputdir=output_iso_row_lock
	fi
	if has_files "$FM_SRC/test/t/*.pl"; then
		run_suite tap count_tap REGRESS= ISOLATION=
	else
		fm_log "suite tap: no test/t/*.pl, skipped"
	fi
	if has_files "$FM_SRC/fuzz/fuzz.mk"; then
		run_check fuzz run_as_pg make -C "$FM_SRC" --no-print-directory \
			PG_CONFIG="$FM_PG_CONFIG" ${FM_FUZZ_CC:+"FUZZ_CC=$FM_FUZZ_CC"} fuzz-smoke
	else
		fm_log "suite fuzz: no fuzz/fuzz.mk, skipped"
	fi
	if has_files "$FM_SRC/debian/control.in"; then
		run_check package env PG="$FM_PG_MAJOR" bash "$FM_SRC/tools/package.sh"
	else
		fm_log "suite package: no debian/, skipped"
	fi
	run_host_suites

	if ((TOTAL_PASSED + TOTAL_FAILED == 0)); then
		# A green run that tested nothing must not look like success.
		fm_err "no test ran"
		TOTAL_FAILED=1
	fi

	local rc=0
	if ((TOTAL_FAILED > 0 || ANY_STAGE_FAILED)); then
		rc=1
		show_failure_details
	fi

	# Stop and clean up now, so that the summary really is the last line.
	fm_cleanup

	local summary="$TOTAL_PASSED passed, $TOTAL_FAILED failed"
	if ((TOTAL_SKIPPED > 0)); then
		summary+=", $TOTAL_SKIPPED skipped"
	fi
	printf '%s\n' "$summary"
	SUMMARY_PRINTED=1
	return "$rc"
}

main "$@"
