#!/usr/bin/env bash
# tools/demo.sh -- what `make demo` runs.
#
# Same setup as `make test` (see tools/common.sh): install missing Debian
# packages, build with -Werror and install, start a throwaway PostgreSQL 15
# cluster with pg_cron preloaded as an unprivileged user.  Then create the
# database flagmeter_demo, CREATE EXTENSION flagmeter in it, and run
# tools/demo.sql with psql, whose output is the demo.  The cluster is stopped
# and the temp dir removed whatever happens (EXIT trap); the exit status is
# psql's.

set -euo pipefail

# shellcheck source=SCRIPTDIR/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

on_exit() {
	local rc=$?
	fm_cleanup
	exit "$rc"
}
trap on_exit EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

main() {
	fm_init
	install_deps
	fm_make_workdir
	build_and_install
	fm_chown_workdir
	start_cluster

	fm_log "creating database flagmeter_demo with the flagmeter extension"
	run_as_pg psql -X -q -v ON_ERROR_STOP=1 -d postgres -c 'CREATE DATABASE flagmeter_demo'
	run_as_pg psql -X -q -v ON_ERROR_STOP=1 -d flagmeter_demo -c 'CREATE EXTENSION flagmeter'

	fm_log "running tools/demo.sql"
	local rc=0
	# Run from the copy so that relative paths inside demo.sql (\i, \copy)
	# resolve against the tree, as the unprivileged user can read it.
	(cd "$FM_SRC" && run_as_pg psql -X -v ON_ERROR_STOP=1 -d flagmeter_demo \
		-f tools/demo.sql) || rc=$?

	fm_cleanup
	if ((rc != 0)); then
		fm_err "tools/demo.sql failed (psql exit status $rc)"
	fi
	return "$rc"
}

main "$@"
