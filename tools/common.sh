#!/usr/bin/env bash
# tools/common.sh -- helpers shared by tools/test.sh (`make test`) and
# tools/demo.sh (`make demo`).  This file is sourced, not executed.
#
# The flow both scripts follow:
#   fm_init            take the PostgreSQL version (FM_PG_MAJOR: 15, Debian
#                      12's own, unless the caller set another), work out who
#                      runs the throwaway server, set up paths
#   install_deps       install missing Debian packages (root only); for a
#                      version from a later Debian suite, also get its chroot
#                      ready (tools/chroot.sh)
#   fm_make_workdir    mktemp dir + a copy of the source tree (without .git)
#   build_and_install  make WERROR=1 + make install, in that copy
#   fm_chown_workdir   hand the temp dir to the unprivileged user
#   start_cluster      initdb + pg_ctl start on a free port, socket in temp dir
#   run_as_pg ...      run a command as that user, with PG* variables set
#   fm_cleanup         stop every server under the temp dir, delete the dir
# fm_setup_cluster runs the first six in order (make test, make demo).
# With PostgreSQL 17 or 18 the build, the server and every run_as_pg
# command run inside that version's chroot; the paths stay the same (the
# temp dir is mounted there at its own path).
#
# Why the build happens in a copy: the working tree stays free of root-owned
# build artifacts (someone may be editing it meanwhile), every run starts from
# a clean build (so -Werror really sees every file), and the unprivileged user
# needs a tree it can write results/, output_iso/ and tmp_check/ into.
#
# Environment knobs:
#   FLAGMETER_KEEP_TMP=1   keep the temp dir after the run (the servers are
#                          still stopped) so logs can be inspected.
#   FLAGMETER_CHROOT_DIR, FLAGMETER_CHROOT_REBUILD, FLAGMETER_DEBIAN_MIRROR
#                          where the chroots of PostgreSQL 17 and 18 live and
#                          how they are built: see tools/chroot.sh.

set -euo pipefail

# PostgreSQL 15 from Debian unless the caller sets FM_PG_MAJOR before
# fm_init (tools/test.sh does, from PG): always use the binaries of the
# version explicitly, because /usr/bin/pg_config and friends are wrappers
# that may pick another one.
FM_PG_MAJOR=15
FM_PG_BINDIR=/usr/lib/postgresql/15/bin
FM_PG_CONFIG=$FM_PG_BINDIR/pg_config

# Everything `make test` / `make demo` needs, by Debian package name.
FM_DEB_PACKAGES=(postgresql-15 postgresql-server-dev-15 postgresql-15-cron
	postgresql-15-plproxy  # test/t/080_plproxy.pl, bench/plproxy.sh
	libipc-run-perl make gcc
	pgbouncer  # the Node client's fault suite (clients/node/test/faults)
	build-essential debhelper postgresql-server-dev-all  # the Debian packages (tools/package.sh)
	pg-bsd-indent python3  # tools/check_static.sh: pgindent's layout, the proxy and docs checks
	clang-14 libclang-rt-14-dev sqlsmith)  # fuzzing: libFuzzer (fuzz/), sqlsmith

# Port range reserved for this project's throwaway clusters.
FM_PORT_FIRST=54321
FM_PORT_LAST=54340

# Repository root: this file lives in <root>/tools/.
FM_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

# shellcheck source=SCRIPTDIR/chroot.sh
source "$FM_ROOT/tools/chroot.sh"

# FM_LISTEN_TCP=1 (set by the caller before start_cluster): the server
# listens on 127.0.0.1 too, for clients on the host that use TCP.
FM_LISTEN_TCP=${FM_LISTEN_TCP:-0}

# State filled in by the functions below (empty = not set up yet).
FM_TMP=
FM_SRC=
FM_PGDATA=
FM_PORT=

fm_log() { printf '==> %s\n' "$*"; }
fm_err() { printf 'ERROR: %s\n' "$*" >&2; }
fm_warn() { printf 'WARNING: %s\n' "$*" >&2; }

# fm_init: set up for the PostgreSQL version FM_PG_MAJOR (15, this
# machine's; 17 and 18 come in a chroot, see tools/chroot.sh) and decide
# which OS user owns the throwaway cluster.  initdb refuses to run as root,
# so as root we use Debian's `postgres` account (created by the
# postgresql-common package; fm_chown_workdir checks it exists, after
# install_deps; in a chroot it is the chroot's own); otherwise the current
# user runs everything.
fm_init() {
	if ! [[ $FM_PG_MAJOR =~ ^[0-9]+$ ]]; then
		fm_err "PG must be a PostgreSQL major version such as 15 or 18, not '$FM_PG_MAJOR'"
		return 1
	fi
	FM_PG_BINDIR=/usr/lib/postgresql/$FM_PG_MAJOR/bin
	FM_PG_CONFIG=$FM_PG_BINDIR/pg_config
	if ((FM_PG_MAJOR != 15)); then
		fm_chroot_init "$FM_PG_MAJOR"
	fi
	if ((EUID == 0)); then
		FM_OS_USER=postgres
	else
		FM_OS_USER=$(id -un)
	fi
	# The bootstrap superuser created by initdb -U below; exported as PGUSER.
	FM_PG_ROLE=$FM_OS_USER
}

# install_deps: install whatever of FM_DEB_PACKAGES is missing (with a
# chroot, debootstrap too: the host's PostgreSQL 15 client and sqlsmith
# still serve the suites that run on the host), then get the chroot ready
# (tools/chroot.sh).  Presence is checked with dpkg-query, so a second run
# neither installs nor runs `apt-get update`.  Without root we cannot use
# apt: assume the packages are there (the build fails clearly otherwise).
install_deps() {
	if ((EUID != 0)); then
		fm_log "not root: skipping apt-get, assuming ${FM_DEB_PACKAGES[*]} are installed"
		return 0
	fi
	local pkg status needed=("${FM_DEB_PACKAGES[@]}") missing=()
	if [[ -n $FM_CHROOT ]]; then
		needed+=(debootstrap)
	fi
	for pkg in "${needed[@]}"; do
		# shellcheck disable=SC2016  # ${Status} is dpkg-query's format, not ours
		status=$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)
		if [[ $status != "install ok installed" ]]; then
			missing+=("$pkg")
		fi
	done
	if ((${#missing[@]} == 0)); then
		fm_log "Debian packages already installed: ${needed[*]}"
	else
		fm_log "installing missing Debian packages: ${missing[*]}"
		export DEBIAN_FRONTEND=noninteractive
		apt-get update
		apt-get install -y "${missing[@]}"
	fi
	if [[ -n $FM_CHROOT ]]; then
		fm_chroot_ensure
	fi
}

# fm_make_workdir: fresh temp dir holding a copy of the tree (minus .git).
# /tmp explicitly (not $TMPDIR): the server's unix socket lives in here, so
# the path must be short (sun_path is ~107 bytes) and reachable by the
# unprivileged user.
fm_make_workdir() {
	FM_TMP=$(mktemp -d /tmp/flagmeter.XXXXXX)
	FM_SRC=$FM_TMP/src
	mkdir "$FM_SRC"
	if [[ -n $FM_CHROOT ]]; then
		mkdir -p "$FM_CHROOT$FM_TMP"	# where fm_chroot_exec mounts it
	fi
	tar -C "$FM_ROOT" --exclude=./.git -cf - . | tar -C "$FM_SRC" -xf -
	fm_log "work dir: $FM_TMP"
	fm_private_postgres
}

# fm_private_postgres: a copy of the PostgreSQL tree of the version under
# test (binaries, libraries, share, headers: Debian's 15 here, or the
# chroot's) under $FM_TMP/pg, which the build installs flagmeter into and
# every server of the run uses.  `make install` into the system tree, or
# into the chroot's (which runs of other checkouts share), would replace the
# flagmeter that another run on the machine (another checkout, a benchmark,
# a user's own install) is using meanwhile.  PostgreSQL finds its share and
# lib directories relative to its binaries, so the copy works where it is;
# pg_config reports its paths.  In a chroot $FM_TMP has the same path.
fm_private_postgres() {
	local root=$FM_TMP/pg from=$FM_CHROOT
	mkdir -p "$root/usr/lib/postgresql" "$root/usr/share/postgresql" "$root/usr/include"
	cp -a "$from/usr/lib/postgresql/$FM_PG_MAJOR" "$root/usr/lib/postgresql/"
	cp -a "$from/usr/share/postgresql/$FM_PG_MAJOR" "$root/usr/share/postgresql/"
	cp -a "$from/usr/include/postgresql" "$root/usr/include/"
	FM_PG_BINDIR=$root/usr/lib/postgresql/$FM_PG_MAJOR/bin
	FM_PG_CONFIG=$FM_PG_BINDIR/pg_config
}

# run_build CMD...: run a build command where the server's files are: here
# as the current user, or in the chroot as root.
run_build() {
	if [[ -n $FM_CHROOT ]]; then
		fm_chroot_exec HOME=/root "$@"
	else
		"$@"
	fi
}

# build_and_install: clean build with warnings as errors, then install into
# the run's private PostgreSQL tree (fm_private_postgres).  The compiler's and
# installer's lines are printed, unless FM_BUILD_LOG names a file (make demo
# sets it): then they go there, one line per step is printed, and the log's
# tail is shown if a step fails.
build_and_install() {
	local step
	if [[ -n ${FM_BUILD_LOG:-} ]]; then
		: >"$FM_BUILD_LOG"
	fi
	fm_log "building flagmeter (WERROR=1) for PostgreSQL $FM_PG_MAJOR${FM_BUILD_LOG:+ (log: $FM_BUILD_LOG)}"
	# The copy may carry objects from the working tree: start from scratch.
	run_build make -C "$FM_SRC" --no-print-directory PG_CONFIG="$FM_PG_CONFIG" clean >/dev/null
	for step in build install; do
		[[ $step == install ]] && fm_log "installing flagmeter"
		local args=(make -C "$FM_SRC" --no-print-directory WERROR=1 PG_CONFIG="$FM_PG_CONFIG")
		[[ $step == install ]] && args+=(install)
		if [[ -z ${FM_BUILD_LOG:-} ]]; then
			run_build "${args[@]}"
		elif ! run_build "${args[@]}" >>"$FM_BUILD_LOG" 2>&1; then
			tail -n 30 "$FM_BUILD_LOG" >&2
			fm_err "the $step failed; the whole log is $FM_BUILD_LOG"
			return 1
		fi
	done
}

# fm_chown_workdir: as root, give the temp dir to the unprivileged user so it
# can run initdb there and write test output into the source copy.
fm_chown_workdir() {
	if [[ -n $FM_CHROOT ]]; then
		chown -R "$FM_CHROOT_OWNER" "$FM_TMP"
	elif ((EUID == 0)); then
		if ! id -u "$FM_OS_USER" >/dev/null 2>&1; then
			fm_err "OS user '$FM_OS_USER' does not exist (it comes with postgresql-common)"
			return 1
		fi
		chown -R "$FM_OS_USER:" "$FM_TMP"
	fi
}

# run_as_pg CMD ARGS...: run CMD as the unprivileged user with the chosen
# version's binaries first on PATH and PGHOST/PGPORT/PGUSER pointing at our
# cluster.  As root this goes through runuser (no password, no tty needed,
# works with no stdin in CI); the environment is passed explicitly with
# env(1) so it does not depend on what runuser/PAM keep.  TMPDIR points into
# our temp dir so that the TAP framework's own temp dirs and sockets are
# cleaned up with it.  In a chroot the environment is only this (the
# host's PATH and the rest mean nothing there).
run_as_pg() {
	local envs=(
		"PGHOST=${PGHOST:-}"
		"PGPORT=${PGPORT:-}"
		"PGUSER=${PGUSER:-}"
		"PGOPTIONS=${PGOPTIONS:-}"
		"TMPDIR=$FM_TMP"
		# C.UTF-8 always exists on Debian: untranslated messages, and no
		# perl "setting locale failed" noise from a missing $LANG locale.
		"LC_ALL=C.UTF-8"
	)
	if [[ -n $FM_CHROOT ]]; then
		fm_chroot_exec --as-pg "PATH=$FM_PG_BINDIR:/usr/local/bin:/usr/bin:/bin" \
			HOME=/var/lib/postgresql USER=postgres LOGNAME=postgres "${envs[@]}" "$@"
		return
	fi
	envs+=("PATH=$FM_PG_BINDIR:$PATH")
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
# cluster).  Our own server keeps its socket in the temp dir, and listens on
# no TCP address unless FM_LISTEN_TCP=1, so it can clash only then (see
# start_cluster); picking an unused number anyway keeps psql/pg_regress
# messages unambiguous and is what TAP/humans expect.
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
# the unprivileged user, reachable through the unix socket in $FM_TMP and,
# with FM_LISTEN_TCP=1, on 127.0.0.1 at the same port (trust, like the
# socket: initdb -A trust covers loopback).
# pg_cron is preloaded (flagmeter may schedule jobs with it); pg_cron only
# works in the database named by cron.database_name.  flagmeter is preloaded
# too, for its shared limit cache (the TAP tests' own clusters run without
# it, so both ways are tested).  fsync & co. are left
# at their defaults on purpose.  Exports PGHOST/PGPORT/PGUSER for the caller.
start_cluster() {
	FM_PORT=$(fm_pick_port)
	FM_PGDATA=$FM_TMP/data
	export PGHOST=$FM_TMP PGPORT=$FM_PORT PGUSER=$FM_PG_ROLE
	local listen='' attempt
	if [[ $FM_LISTEN_TCP == 1 ]]; then
		listen=127.0.0.1
	fi

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
listen_addresses = '$listen'
unix_socket_directories = '$FM_TMP'
shared_preload_libraries = 'pg_cron,flagmeter'
cron.database_name = 'postgres'
# the isolation spec inflight_consume prepares a transaction that consumed
max_prepared_transactions = 4
EOF

	# A port found free can be taken before the server binds it (another
	# run picks ports from the same range): then try the next free one.
	# Each try appends its own port line; the last one counts.
	for ((attempt = 1; ; attempt++)); do
		if ((attempt > 1)); then
			FM_PORT=$(fm_pick_port)
			export PGPORT=$FM_PORT
		fi
		printf 'port = %s\n' "$FM_PORT" >>"$FM_PGDATA/postgresql.conf"
		rm -f "$FM_TMP/server.log"
		fm_log "starting PostgreSQL $FM_PG_MAJOR on port $FM_PORT (socket dir $FM_TMP${listen:+, TCP $listen}," \
			"user $FM_OS_USER${FM_CHROOT:+ of the chroot})"
		if run_as_pg pg_ctl -D "$FM_PGDATA" -l "$FM_TMP/server.log" -w -t 120 start >/dev/null; then
			return 0
		fi
		if ((attempt < 5)) && [[ -n $listen ]] &&
			grep -q 'could not bind IPv4 address' "$FM_TMP/server.log" 2>/dev/null; then
			fm_log "port $FM_PORT was taken meanwhile: trying another"
			continue
		fi
		tail -n 50 "$FM_TMP/server.log" >&2 || true
		fm_err "the server did not start"
		return 1
	done
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
# the temp dir (in a chroot, then any process still running there), then
# delete the temp dir.  Safe to call more than once (the EXIT trap calls it
# again after the normal path did).  Never fails, so it can run from a trap
# under set -e.
fm_cleanup() {
	stop_cluster || true
	FM_PGDATA=
	if [[ -n $FM_TMP && -d $FM_TMP ]]; then
		local pidfile
		while IFS= read -r pidfile; do
			fm_stop_datadir "$(dirname "$pidfile")" || true
		done < <(find "$FM_TMP" -name postmaster.pid -type f 2>/dev/null || true)
		if [[ -n $FM_CHROOT ]]; then
			fm_chroot_stop_run || true
		fi
		if [[ ${FLAGMETER_KEEP_TMP:-0} == 1 ]]; then
			fm_log "FLAGMETER_KEEP_TMP=1: keeping $FM_TMP"
		else
			rm -rf "$FM_TMP" || true
		fi
		if [[ -n $FM_CHROOT ]]; then
			rmdir "$FM_CHROOT$FM_TMP" 2>/dev/null || true
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
