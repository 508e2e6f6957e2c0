#!/usr/bin/env bash
# tools/chroot.sh -- PostgreSQL releases newer than Debian 12's, from later
# Debian suites, in a chroot.  Sourced by tools/common.sh, not executed.
#
# `make test PG=17` and `make test PG=18` test flagmeter against the
# PostgreSQL packages of Debian 13 "trixie" (17) and of Debian unstable
# "sid" (18).  They cannot be installed beside Debian 12's 15, so each
# suite gets a minimal Debian root made with debootstrap, kept between runs:
#
#   $FLAGMETER_CHROOT_DIR/chroot-<suite>      (default /var/cache/flagmeter)
#
# beside its build log (chroot-<suite>.log) and lock (chroot-<suite>.lock).
# A chroot is (re)built when it is missing, when its last build did not
# finish, when the package list below changed, or when a check of it fails
# (a package not installed, pg_config not running); FLAGMETER_CHROOT_REBUILD=1
# forces a rebuild.  Otherwise it is used as it is, without the network.
# FLAGMETER_DEBIAN_MIRROR names the archive (default http://deb.debian.org/debian).
#
# Every command inside runs through fm_chroot_exec, in a private mount
# namespace (unshare --mount): /proc, a fresh /dev/shm and the run's temp
# dir are mounted in that namespace only, so they disappear with the last
# process using them.  A run that is killed cannot leave a mount behind, and
# nothing is ever mounted where the host (or an `rm -rf` of the chroot)
# would see it.  The temp dir is bind-mounted at its own path, so the paths
# the host uses for logs, diffs and the server socket are the ones the
# chroot sees.  The server and the tests run as the chroot's own `postgres`
# account, by uid and gid (the host may give that number to someone else).
#
# Runs of any checkout may share a chroot at the same time: each installs
# flagmeter into a copy of the chroot's PostgreSQL tree in its own temp dir
# (fm_private_postgres), never into the chroot itself.  The lock only keeps
# a chroot from being rebuilt under a run: every run holds it shared, and a
# rebuild waits for the exclusive lock.

# PostgreSQL major version -> the Debian suite that packages it.
declare -A FM_PG_SUITES=([17]=trixie [18]=sid)

FM_CHROOT_DIR=${FLAGMETER_CHROOT_DIR:-/var/cache/flagmeter}
FM_DEBIAN_MIRROR=${FLAGMETER_DEBIAN_MIRROR:-http://deb.debian.org/debian}

# State filled in by fm_chroot_init and fm_chroot_ensure (empty FM_CHROOT =
# no chroot: PostgreSQL 15 on the host).
FM_CHROOT=
FM_CHROOT_SUITE=
FM_CHROOT_OWNER=    # uid:gid of the chroot's postgres account
FM_CHROOT_LOCK_FD=
FM_FUZZ_CC=         # the chroot's clang, for fuzz/fuzz.mk

# fm_chroot_init MAJOR: select the chroot of PostgreSQL MAJOR.
fm_chroot_init() {
	local major=$1
	FM_CHROOT_SUITE=${FM_PG_SUITES[$major]:-}
	if [[ -z $FM_CHROOT_SUITE ]]; then
		fm_err "PostgreSQL $major is not supported: PG=15 (this machine's) or one of" \
			"$(printf '%s\n' "${!FM_PG_SUITES[@]}" | sort -n | paste -sd' ')"
		return 1
	fi
	if ((EUID != 0)); then
		fm_err "PG=$major builds and enters a chroot: run as root"
		return 1
	fi
	FM_CHROOT=$FM_CHROOT_DIR/chroot-$FM_CHROOT_SUITE
}

# The packages the chroot holds: the server, its headers and PGXS, pg_cron,
# PL/Proxy (test/t/080_plproxy.pl),
# the TAP modules, a compiler and what builds the Debian packages
# (tools/package.sh).  (fm_chroot_build adds the libFuzzer
# runtime of the clang these pull in.)
fm_chroot_packages() {
	local major=$1
	echo "postgresql-$major postgresql-server-dev-$major postgresql-$major-cron postgresql-$major-plproxy libipc-run-perl make gcc" \
		"build-essential debhelper postgresql-server-dev-all"
}

# fm_chroot_exec [--as-pg] [NAME=VALUE...] CMD...: run CMD in the chroot (as
# root, or with --as-pg as its postgres account), in a mount namespace of
# its own with /proc, /dev/shm (PostgreSQL's dynamic shared memory) and
# $FM_TMP (when set) mounted, in the current directory if it is under
# $FM_TMP (else in /).  The environment is only a plain PATH, LC_ALL and
# FM_RUN=$FM_TMP (which fm_chroot_stop_run looks for), plus the NAME=VALUE
# given: the host's means nothing in there.  The lock's descriptor is not
# passed on, so a server that outlives the run cannot hold the chroot.
fm_chroot_exec() {
	local user=() dir=/
	if [[ -n $FM_TMP && ($PWD == "$FM_TMP" || $PWD == "$FM_TMP"/*) ]]; then
		dir=$PWD
	fi
	if [[ $1 == --as-pg ]]; then
		user=(--userspec="$FM_CHROOT_OWNER" --groups="${FM_CHROOT_OWNER#*:}")
		shift
	fi
	(
		if [[ -n $FM_CHROOT_LOCK_FD ]]; then
			exec {FM_CHROOT_LOCK_FD}>&-
		fi
		# shellcheck disable=SC2016  # expanded by the inner bash
		exec unshare --mount --propagation private -- bash -c '
			set -e
			root=$1 tmp=$2
			shift 2
			mount -t proc proc "$root/proc"
			mount -t tmpfs -o mode=1777,nosuid,nodev shm "$root/dev/shm"
			if [[ -n $tmp ]]; then
				mount --bind "$tmp" "$root$tmp"
			fi
			exec chroot "$@"' fm-chroot "$FM_CHROOT" "$FM_TMP" \
			"${user[@]}" "$FM_CHROOT" /usr/bin/env -i --chdir="$dir" \
			PATH=/usr/local/bin:/usr/bin:/bin LC_ALL=C.UTF-8 FM_RUN="$FM_TMP" "$@"
	)
}

# fm_chroot_run_pids: the processes of this run still in the chroot: those
# started through fm_chroot_exec (FM_RUN in their environment), and those
# working in $FM_TMP (a server rewrites the memory /proc shows as its
# environment, but works in its data directory).
fm_chroot_run_pids() {
	local p cwd
	for p in /proc/[0-9]*; do
		[[ $(readlink "$p/root" 2>/dev/null) == "$FM_CHROOT" ]] || continue
		cwd=$(readlink "$p/cwd" 2>/dev/null) || continue
		if [[ $cwd == "$FM_TMP" || $cwd == "$FM_TMP"/* ]] ||
			grep -qzxF "FM_RUN=$FM_TMP" "$p/environ" 2>/dev/null; then
			echo "${p#/proc/}"
		fi
	done
}

# fm_chroot_stop_run: end what this run left running in the chroot (its
# servers are stopped already, by their pid files; this is for what has
# none, a stuck client say): TERM, then KILL what is left after 10 s.
# Other runs' processes there are left alone.
fm_chroot_stop_run() {
	local sig pids i
	[[ -n $FM_TMP ]] || return 0
	for sig in TERM KILL; do
		mapfile -t pids < <(fm_chroot_run_pids)
		((${#pids[@]} > 0)) || return 0
		fm_warn "sending SIG$sig to what this run left running in $FM_CHROOT: ${pids[*]}"
		kill "-$sig" "${pids[@]}" 2>/dev/null || true
		for ((i = 0; i < 10; i++)); do
			sleep 1
			mapfile -t pids < <(fm_chroot_run_pids)
			((${#pids[@]} > 0)) || return 0
		done
	done
	fm_err "still running in $FM_CHROOT after SIGKILL: ${pids[*]}"
}

# fm_chroot_remove DIR: delete a chroot tree, unless something is mounted
# under it (rm would then delete what the mount shows).
fm_chroot_remove() {
	local dir=$1
	[[ -e $dir ]] || return 0
	if awk -v d="$dir/" 'index($5 "/", d) == 1 { found = 1 } END { exit !found }' \
		/proc/self/mountinfo; then
		fm_err "something is mounted under $dir: not deleting it (see /proc/self/mountinfo)"
		return 1
	fi
	rm -rf --one-file-system "$dir"
}

# fm_chroot_stamp: what a finished build records in the chroot; a chroot
# whose stamp differs was built for another package list or mirror.
fm_chroot_stamp() {
	printf 'suite=%s mirror=%s packages=%s\n' "$FM_CHROOT_SUITE" "$FM_DEBIAN_MIRROR" \
		"$(fm_chroot_packages "$FM_PG_MAJOR")"
}

# fm_chroot_clang: the clang PGXS compiles bitcode with (Makefile.global's
# CLANG, e.g. clang-19), which fuzz/fuzz.mk uses too.
fm_chroot_clang() {
	local root=$1
	sed -n 's|^CLANG = .*/||p' "$root/usr/lib/postgresql/$FM_PG_MAJOR/lib/pgxs/src/Makefile.global"
}

# fm_chroot_healthy: true if $FM_CHROOT is a finished build with the current
# package list, every package installed and configured, and pg_config runs.
fm_chroot_healthy() {
	local clang pkg status
	[[ -f $FM_CHROOT/.flagmeter-chroot && $(<"$FM_CHROOT/.flagmeter-chroot") == "$(fm_chroot_stamp)" ]] ||
		return 1
	clang=$(fm_chroot_clang "$FM_CHROOT" 2>/dev/null) && [[ -n $clang ]] || return 1
	# shellcheck disable=SC2046  # one word per package
	for pkg in $(fm_chroot_packages "$FM_PG_MAJOR") "libclang-rt-${clang#clang-}-dev"; do
		# shellcheck disable=SC2016  # ${Status} is dpkg-query's format
		status=$(chroot "$FM_CHROOT" dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null) || return 1
		[[ $status == "install ok installed" ]] || return 1
	done
	[[ -z $(chroot "$FM_CHROOT" dpkg --audit 2>&1) ]] &&
		chroot "$FM_CHROOT" "/usr/lib/postgresql/$FM_PG_MAJOR/bin/pg_config" --version >/dev/null 2>&1
}

# fm_chroot_build: debootstrap a fresh chroot next to the old one, install
# the packages, then put it in place; the old one is deleted first.  Output
# goes to chroot-<suite>.log, whose tail is shown on failure.
fm_chroot_build() {
	local build=$FM_CHROOT.build log=$FM_CHROOT.log start=$SECONDS clang
	fm_chroot_remove "$build"
	fm_chroot_remove "$FM_CHROOT"
	fm_log "building the $FM_CHROOT_SUITE chroot for PostgreSQL $FM_PG_MAJOR in $FM_CHROOT" \
		"(debootstrap and apt-get from $FM_DEBIAN_MIRROR; log $log)"
	: >"$log"
	# In a mount namespace too: debootstrap mounts /proc and /sys in the
	# target, and an interrupted run would leave them there.
	if ! unshare --mount --propagation private -- \
		debootstrap --variant=minbase "$FM_CHROOT_SUITE" "$build" "$FM_DEBIAN_MIRROR" \
		>>"$log" 2>&1; then
		tail -n 30 "$log" >&2
		fm_err "debootstrap $FM_CHROOT_SUITE failed"
		return 1
	fi
	# Installing must start no service and create no cluster (the tests make
	# their own).  sid's Release file can outlive its Valid-Until on a
	# mirror snapshot, which apt would refuse.
	printf '#!/bin/sh\nexit 101\n' >"$build/usr/sbin/policy-rc.d"
	chmod 755 "$build/usr/sbin/policy-rc.d"
	mkdir -p "$build/etc/postgresql-common/createcluster.d"
	echo 'create_main_cluster = false' >"$build/etc/postgresql-common/createcluster.d/flagmeter.conf"
	cat >"$build/etc/apt/apt.conf.d/90flagmeter" <<-'EOF'
		Acquire::Check-Valid-Until "false";
		APT::Install-Recommends "false";
		Dpkg::Use-Pty "false";
	EOF
	if [[ -f /etc/resolv.conf ]]; then
		cp -L /etc/resolv.conf "$build/etc/resolv.conf"
	fi
	# shellcheck disable=SC2046  # one word per package
	if ! FM_CHROOT=$build fm_chroot_exec PATH=/usr/sbin:/usr/bin:/sbin:/bin \
		DEBIAN_FRONTEND=noninteractive \
		bash -c 'apt-get -q update && apt-get -q install -y "$@"' apt \
		$(fm_chroot_packages "$FM_PG_MAJOR") >>"$log" 2>&1; then
		tail -n 30 "$log" >&2
		fm_err "installing PostgreSQL $FM_PG_MAJOR in the $FM_CHROOT_SUITE chroot failed"
		return 1
	fi
	clang=$(fm_chroot_clang "$build")
	if [[ -z $clang ]] || ! FM_CHROOT=$build fm_chroot_exec PATH=/usr/sbin:/usr/bin:/sbin:/bin \
		DEBIAN_FRONTEND=noninteractive \
		apt-get -q install -y "libclang-rt-${clang#clang-}-dev" >>"$log" 2>&1; then
		tail -n 30 "$log" >&2
		fm_err "installing the libFuzzer runtime of '$clang' in the $FM_CHROOT_SUITE chroot failed"
		return 1
	fi
	chroot "$build" apt-get clean
	fm_chroot_stamp >"$build/.flagmeter-chroot"
	mv "$build" "$FM_CHROOT"
	fm_log "chroot $FM_CHROOT built in $((SECONDS - start)) s"
}

# fm_chroot_flock -s|-x: take the chroot's lock shared or exclusive (from
# the other mode too), saying what it waits for; an hour at most.
fm_chroot_flock() {
	local mode=$1
	flock -n "$mode" "$FM_CHROOT_LOCK_FD" && return 0
	if [[ $mode == -x ]]; then
		fm_log "waiting for the runs that use $FM_CHROOT to finish, to rebuild it"
	else
		fm_log "waiting for another run to finish building $FM_CHROOT"
	fi
	if ! flock -w 3600 "$mode" "$FM_CHROOT_LOCK_FD"; then
		fm_err "gave up on $FM_CHROOT.lock after an hour"
		return 1
	fi
}

# fm_chroot_ensure: make sure the chroot is there and sound, building it if
# not, and hold it (shared lock) for the rest of the run; then read what the
# run needs from it: the postgres account and the clang for fuzzing.
# Changing the lock's mode is not atomic, so the check is made again under
# the shared lock after a build.
fm_chroot_ensure() {
	local start=$SECONDS rebuild=${FLAGMETER_CHROOT_REBUILD:-0} attempt
	mkdir -p "$FM_CHROOT_DIR"
	exec {FM_CHROOT_LOCK_FD}>>"$FM_CHROOT.lock"
	for ((attempt = 1; ; attempt++)); do
		fm_chroot_flock -s
		if [[ $rebuild != 1 ]] && fm_chroot_healthy; then
			break
		fi
		if ((attempt > 2)); then
			fm_err "$FM_CHROOT is not usable even after a rebuild (log $FM_CHROOT.log)"
			return 1
		fi
		fm_chroot_flock -x
		if [[ $rebuild == 1 ]]; then
			fm_log "FLAGMETER_CHROOT_REBUILD=1: rebuilding $FM_CHROOT"
		elif fm_chroot_healthy; then
			continue	# another run rebuilt it meanwhile
		elif [[ -e $FM_CHROOT ]]; then
			fm_log "$FM_CHROOT is incomplete or out of date: rebuilding it"
		fi
		fm_chroot_build
		rebuild=0
		start=$SECONDS
	done
	fm_log "using the chroot $FM_CHROOT (checked in $((SECONDS - start)) s)"
	FM_CHROOT_OWNER=$(awk -F: '$1 == "postgres" { print $3 ":" $4 }' "$FM_CHROOT/etc/passwd")
	if [[ -z $FM_CHROOT_OWNER ]]; then
		fm_err "$FM_CHROOT has no postgres account (it comes with postgresql-common)"
		return 1
	fi
	# shellcheck disable=SC2034  # tools/test.sh passes it to make fuzz-smoke
	FM_FUZZ_CC=$(fm_chroot_clang "$FM_CHROOT")
	fm_log "PostgreSQL: $(chroot "$FM_CHROOT" "/usr/lib/postgresql/$FM_PG_MAJOR/bin/pg_config" --version)" \
		"(Debian $FM_CHROOT_SUITE chroot)"
}
