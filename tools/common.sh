#!/usr/bin/env bash
# tools/common.sh -- helpers shared by tools/test.sh (`make test`) and
# tools/demo.sh (`make demo`).  This file is sourced, not executed.
#
# The flow both scripts follow:
#   fm_init            work out who runs the throwaway server, set up paths
#   install_deps       install missing Debian packages (root only)
#   fm_make_workdir    mktemp dir + a copy of the source tree (without .git)
#   build_and_install  make WERROR=1 + make install, in that copy
#   fm_chown_workdir   hand the temp dir to the unprivileged user
#   start_cluster      initdb + pg_ctl start on a free port, socket in temp dir
#   run_as_pg ...      run a command as that user, with PG* variables set
#   fm_cleanup         stop every server under the temp dir, delete the dir
# fm_setup_cluster runs the first six in order (make test, make demo).
#
# Why the build happens in a copy: the working tree stays free of root-owned
# build artifacts (someone may be editing it meanwhile), every run starts from
# a clean build (so -Werror really sees every file), and the unprivileged user
# needs a tree it can write results/, output_iso/ and tmp_check/ into.
#
# Environment knobs:
#   FLAGMETER_KEEP_TMP=1   keep the temp dir after the run (the servers are
#                          still stopped) so logs can be inspected.

set -euo pipefail

# PostgreSQL 15 from Debian: always use its binaries explicitly, because
# /usr/bin/pg_config and friends are wrappers that may pick another version.
FM_PG_BINDIR=/usr/lib/postgresql/15/bin
FM_PG_CONFIG=$FM_PG_BINDIR/pg_config

# Everything `make test` / `make demo` needs, by Debian package name.
FM_DEB_PACKAGES=(postgresql-15 postgresql-server-dev-15 postgresql-15-cron
	libipc-run-perl make gcc
	clang-14 libclang-rt-14-dev sqlsmith)  # fuzzing: libFuzzer (fuzz/), sqlsmith

# Port range reserved for this project's throwaway clusters.
FM_PORT_FIRST=54321
FM_PORT_LAST=54340

# Repository root: this file lives in <root>/tools/.
FM_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

# State filled in by the functions below (empty = not set up yet).
FM_TMP=
FM_SRC=
FM_PGDATA=
FM_PORT=

fm_log() { printf '==> %s\n' "$*"; }
fm_err() { printf 'ERROR: %s\n' "$*" >&2; }
fm_warn() { printf 'WARNING: %s\n' "$*" >&2; }

# fm_init: decide which OS user owns the throwaway cluster.  initdb refuses to
# run as root, so as root we use Debian's `postgres` account (created by the
# postgresql-common package; fm_chown_workdir checks it exists, after
# install_deps); otherwise the current user runs everything.
fm_init() {
	if ((EUID == 0)); then
		FM_OS_USER=postgres
	else
		FM_OS_USER=$(id -un)
	fi
	# The bootstrap superuser created by initdb -U below; exported as PGUSER.
	FM_PG_ROLE=$FM_OS_USER
}

# install_deps: install whatever of FM_DEB_PACKAGES is missing.  Presence is
# checked with dpkg-query, so a second run neither installs nor runs
# `apt-get update`.  Without root we cannot use apt: assume the packages are
# there (the build fails clearly otherwise).
install_deps() {
	if ((EUID != 0)); then
		fm_log "not root: skipping apt-get, assuming ${FM_DEB_PACKAGES[*]} are installed"
		return 0
	fi
	local pkg status missing=()
	for pkg in "${FM_DEB_PACKAGES[@]}"; do
		# shellcheck disable=SC2016  # ${Status} is dpkg-query's format, not ours
		status=$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)
		if [[ $status != "install ok installed" ]]; then
			missing+=("$pkg")
		fi
	done
	if ((${#missing[@]} == 0)); then
		fm_log "Debian packages already installed: ${FM_DEB_PACKAGES[*]}"
		return 0
	fi
	fm_log "installing missing Debian packages: ${missing[*]}"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update
	apt-get install -y "${missing[@]}"
}

# fm_make_workdir: fresh temp dir holding a copy of the tree (minus .git).
# /tmp explicitly (not $TMPDIR): the server's unix socket lives in here, so
# the path must be short (sun_path is ~107 bytes) and reachable by the
# unprivileged user.
fm_make_workdir() {
	FM_TMP=$(mktemp -d /tmp/flagmeter.XXXXXX)
	FM_SRC=$FM_TMP/src
	mkdir "$FM_SRC"
	tar -C "$FM_ROOT" --exclude=./.git -cf - . | tar -C "$FM_SRC" -xf -
	fm_log "work dir: $FM_TMP"
}

# build_and_install: clean build with warnings as errors, then install into
# the PostgreSQL 15 tree.  That tree belongs to root on Debian: without root
# and without write access to it, the install is skipped with a warning and
# the tests run against whatever `sudo make install` put there before (no
# sudo here: it may prompt, and CI runs as root anyway).
build_and_install() {
	fm_log "building flagmeter (WERROR=1)"
	# The copy may carry objects from the working tree: start from scratch.
	make -C "$FM_SRC" --no-print-directory PG_CONFIG="$FM_PG_CONFIG" clean >/dev/null
	make -C "$FM_SRC" --no-print-directory WERROR=1 PG_CONFIG="$FM_PG_CONFIG"
	local libdir extdir
	libdir=$("$FM_PG_CONFIG" --pkglibdir)
	extdir=$("$FM_PG_CONFIG" --sharedir)/extension
	if ((EUID != 0)) && ! [[ -w $libdir && -w $extdir ]]; then
		fm_warn "not root and $libdir or $extdir is not writable: skipping make install;" \
			"testing the flagmeter already installed there (run" \
			"'sudo make install PG_CONFIG=$FM_PG_CONFIG' first to test this tree)"
		return 0
	fi
	fm_log "installing flagmeter"
	make -C "$FM_SRC" --no-print-directory WERROR=1 PG_CONFIG="$FM_PG_CONFIG" install
}

# fm_chown_workdir: as root, give the temp dir to the unprivileged user so it
# can run initdb there and write test output into the source copy.
fm_chown_workdir() {
	if ((EUID == 0)); then
		if ! id -u "$FM_OS_USER" >/dev/null 2>&1; then
			fm_err "OS user '$FM_OS_USER' does not exist (it comes with postgresql-common)"
			return 1
		fi
		chown -R "$FM_OS_USER:" "$FM_TMP"
	fi
}

# run_as_pg CMD ARGS...: run CMD as the unprivileged user with the PG15
# binaries first on PATH and PGHOST/PGPORT/PGUSER pointing at our cluster.
# As root this goes through runuser (no password, no tty needed, works with
# no stdin in CI); the environment is passed explicitly with env(1) so it does
# not depend on what runuser/PAM keep.  TMPDIR points into our temp dir so
# that the TAP framework's own temp dirs and sockets are cleaned up with it.
run_as_pg() {
	local envs=(
		"PATH=$FM_PG_BINDIR:$PATH"
		"PGHOST=${PGHOST:-}"
		"PGPORT=${PGPORT:-}"
		"PGUSER=${PGUSER:-}"
		"TMPDIR=$FM_TMP"
		# C.UTF-8 always exists on Debian 12: untranslated messages, and no
		# perl "setting locale failed" noise from a missing $LANG locale.
		"LC_ALL=C.UTF-8"
	)
	if ((EUID == 0)); then
		local runuser
		runuser=$(command -v runuser || echo /usr/sbin/runuser)
		"$runuser" -u "$FM_OS_USER" -- env "${envs[@]}" "$@"
	else
		env "${envs[@]}" "$@"
	fi
}

# fm_port_in_use PORT: true if something already uses PORT: a TCP listener
# on any address (read from /proc/net/tcp{,6}, which needs no extra tools), or
# a PostgreSQL socket in one of the usual socket directories (e.g. a system
# cluster).  Our own server listens on no TCP address at all and keeps its
# socket in the temp dir, so it cannot really clash; picking an unused number
# anyway keeps psql/pg_regress messages unambiguous and is what TAP/humans
# expect.
fm_port_in_use() {
	local port=$1 hex files=() f
	hex=$(printf '%04X' "$port")
	for f in /proc/net/tcp /proc/net/tcp6; do
		[[ -r $f ]] && files+=("$f")
	done
	# Column 2 is local "ADDR:PORT" in hex, column 4 the state (0A = LISTEN).
	if ((${#files[@]} > 0)) &&
		awk -v p="$hex" 'FNR > 1 && $4 == "0A" { n = split($2, a, ":"); if (a[n] == p) found = 1 }
			END { exit !found }' "${files[@]}"; then
		return 0
	fi
	[[ -e /var/run/postgresql/.s.PGSQL.$port || -e /tmp/.s.PGSQL.$port ]]
}

# fm_pick_port: first free port of FM_PORT_FIRST..FM_PORT_LAST.
fm_pick_port() {
	local port
	for ((port = FM_PORT_FIRST; port <= FM_PORT_LAST; port++)); do
		if ! fm_port_in_use "$port"; then
			echo "$port"
			return 0
		fi
	done
	fm_err "no free port in $FM_PORT_FIRST-$FM_PORT_LAST"
	return 1
}

# start_cluster: initdb + start a throwaway server in $FM_TMP/data, owned by
# the unprivileged user, reachable only through the unix socket in $FM_TMP.
# pg_cron is preloaded (flagmeter may schedule jobs with it); pg_cron only
# works in the database named by cron.database_name.  flagmeter is preloaded
# too, for its shared limit cache (the TAP tests' own clusters run without
# it, so both ways are tested).  fsync & co. are left
# at their defaults on purpose.  Exports PGHOST/PGPORT/PGUSER for the caller.
start_cluster() {
	FM_PORT=$(fm_pick_port)
	FM_PGDATA=$FM_TMP/data
	export PGHOST=$FM_TMP PGPORT=$FM_PORT PGUSER=$FM_PG_ROLE

	fm_log "initdb in $FM_PGDATA"
	# C locale: sort order and messages do not depend on the machine, so the
	# expected outputs of the regression tests are stable.
	if ! run_as_pg initdb -D "$FM_PGDATA" -U "$FM_PG_ROLE" -A trust \
		-E UTF8 --locale=C --no-instructions >"$FM_TMP/initdb.log" 2>&1; then
		cat "$FM_TMP/initdb.log" >&2
		fm_err "initdb failed"
		return 1
	fi

	cat >>"$FM_PGDATA/postgresql.conf" <<EOF

# --- added by tools/common.sh (throwaway test cluster) ---
port = $FM_PORT
listen_addresses = ''
unix_socket_directories = '$FM_TMP'
shared_preload_libraries = 'pg_cron,flagmeter'
cron.database_name = 'postgres'
EOF

	fm_log "starting PostgreSQL 15 on port $FM_PORT (socket dir $FM_TMP, user $FM_OS_USER)"
	if ! run_as_pg pg_ctl -D "$FM_PGDATA" -l "$FM_TMP/server.log" -w -t 120 start >/dev/null; then
		tail -n 50 "$FM_TMP/server.log" >&2 || true
		fm_err "the server did not start"
		return 1
	fi
}

# fm_stop_datadir DIR: stop the server of data dir DIR if it runs: fast
# shutdown, then immediate, then SIGKILL of that postmaster's own pid.
fm_stop_datadir() {
	local dir=$1 pid
	[[ -f $dir/postmaster.pid ]] || return 0
	run_as_pg pg_ctl -D "$dir" -m fast -w -t 60 stop >/dev/null 2>&1 && return 0
	run_as_pg pg_ctl -D "$dir" -m immediate -w -t 30 stop >/dev/null 2>&1 && return 0
	pid=$(head -n 1 "$dir/postmaster.pid" 2>/dev/null || true)
	if [[ $pid =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null; then
		fm_err "killing postmaster $pid of $dir"
		kill -KILL "$pid" 2>/dev/null || true
	fi
}

# stop_cluster: stop the server started by start_cluster.
stop_cluster() {
	if [[ -n $FM_PGDATA ]]; then
		fm_stop_datadir "$FM_PGDATA"
	fi
}

# fm_cleanup: stop our cluster plus any server a TAP test left behind under
# the temp dir, then delete the temp dir.  Safe to call more than once (the
# EXIT trap calls it again after the normal path did).  Never fails, so it
# can run from a trap under set -e.
fm_cleanup() {
	stop_cluster || true
	FM_PGDATA=
	if [[ -n $FM_TMP && -d $FM_TMP ]]; then
		local pidfile
		while IFS= read -r pidfile; do
			fm_stop_datadir "$(dirname "$pidfile")" || true
		done < <(find "$FM_TMP" -name postmaster.pid -type f 2>/dev/null || true)
		if [[ ${FLAGMETER_KEEP_TMP:-0} == 1 ]]; then
			fm_log "FLAGMETER_KEEP_TMP=1: keeping $FM_TMP"
		else
			rm -rf "$FM_TMP" || true
		fi
	fi
	FM_TMP=
}

# fm_wait_for_line FILE PATTERN PID WHAT: wait (up to 30 s) until FILE has
# a line matching the grep PATTERN; fails, showing FILE, when PID (the
# process writing it) exits first or time runs out.
fm_wait_for_line() {
	local i
	for ((i = 0; i < 300; i++)); do
		grep -q -e "$2" "$1" 2>/dev/null && return 0
		kill -0 "$3" 2>/dev/null || break
		sleep 0.1
	done
	cat "$1" >&2
	fm_err "$4"
	return 1
}

# fm_setup_cluster: the whole set-up of make test and make demo, from
# choosing the OS user to a running throwaway server with flagmeter
# installed.  (bench/run does the same steps with the build logged to a file.)
fm_setup_cluster() {
	fm_init
	install_deps
	fm_make_workdir
	build_and_install
	fm_chown_workdir
	start_cluster
}
