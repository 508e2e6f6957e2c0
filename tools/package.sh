#!/usr/bin/env bash
# tools/package.sh -- build flagmeter's Debian packages for one PostgreSQL
# release and prove them complete: the regression suite runs against the
# files of the packages alone, on a fresh cluster.
#
#   bash tools/package.sh                    PostgreSQL 15, Debian 12's
#   PG=18 bash tools/package.sh              (make package PG=18) 17 and 18
#                                            in their chroots (tools/chroot.sh)
#   bash tools/package.sh --out DIR          also copy the .deb files to DIR
#   bash tools/package.sh --no-test          build only
#
# The packages (debian/, built with pg_buildext as PGDG builds extensions):
#   postgresql-N-flagmeter        the library, the extension's control and
#                                 install script; recommends postgresql-N-cron
#   postgresql-N-flagmeter-proxy  flagmeter_proxy (contrib/plproxy), for a
#                                 PL/Proxy proxy database; needs
#                                 postgresql-N-plproxy
# Each release is built where Debian packages it: 15 on this machine, 17 in
# the trixie chroot, 18 in the sid one, so the packages depend on that
# suite's server.
#
# The proof, in order:
#   1. dpkg-buildpackage -b in a copy of the tree (debian/control made anew
#      for the release: pg_buildext's PG_UPDATECONTROL);
#   2. apt-get install --simulate of the .deb files: their dependencies are
#      met by the suite's own packages;
#   3. a private copy of the release's PostgreSQL tree with every flagmeter
#      file removed (a `make install` on this machine must not stand in for
#      a file the package forgot), the packages' files unpacked into it;
#   4. a throwaway cluster of that tree (pg_cron and flagmeter preloaded, as
#      `make test` runs them) and pg_regress's suite, test/sql, against it.
# Unpacking rather than `dpkg -i` keeps the system's PostgreSQL as it was:
# other checkouts, benchmarks and a user's own install may be using it.
#
# Last line: `N passed, M failed` of the regression suite (with --no-test:
# the packages built).  Exit status non-zero on any failure.
set -euo pipefail

# shellcheck source=SCRIPTDIR/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

OUT=
TEST=1
while (($# > 0)); do
	case $1 in
	--out)
		OUT=$(realpath -m "$2")
		shift 2
		;;
	--no-test)
		TEST=0
		shift
		;;
	*)
		fm_err "usage: [PG=N] bash tools/package.sh [--out DIR] [--no-test]"
		exit 2
		;;
	esac
done

trap 'fm_cleanup' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# The packages' version, from debian/changelog (its first line).
deb_version() {
	sed -n '1s/^[^(]*(\([^)]*\)).*/\1/p' "$FM_ROOT/debian/changelog"
}

# build_debs: dpkg-buildpackage in $FM_TMP/deb/flagmeter, where the
# release's server-dev package is (in its chroot for 17 and 18).
build_debs() {
	local dir=$FM_TMP/deb/flagmeter
	mkdir -p "$dir"
	tar -C "$FM_SRC" -cf - . | tar -C "$dir" -xf -
	fm_log "building the Debian packages for PostgreSQL $FM_PG_MAJOR ($(deb_version))"
	if ! run_build env PG_UPDATECONTROL=yes DEB_BUILD_OPTIONS=nocheck \
		bash -c 'cd "$1" && dpkg-buildpackage -us -uc -b' _ "$dir" >"$FM_TMP/deb/build.log" 2>&1; then
		tail -n 40 "$FM_TMP/deb/build.log" >&2
		fm_err "dpkg-buildpackage failed (log above)"
		return 1
	fi
	# dpkg-buildpackage writes to the parent directory; the debug symbols
	# package is not one a user installs
	rm -f "$FM_TMP"/deb/*-dbgsym_*.deb
	DEBS=("$FM_TMP"/deb/postgresql-"$FM_PG_MAJOR"-flagmeter*_"$(deb_version)"_*.deb)
	if ((${#DEBS[@]} != 2)) || [[ ! -f ${DEBS[0]} ]]; then
		fm_err "expected two packages, found: ${DEBS[*]}"
		return 1
	fi
	local deb
	for deb in "${DEBS[@]}"; do
		fm_log "built ${deb##*/}: $(dpkg-deb -f "$deb" Depends)"
	done
}

# check_dependencies: apt resolves the packages' dependencies from the
# suite's archive as it stands (a simulation: nothing is installed).
check_dependencies() {
	fm_log "apt-get install --simulate ${DEBS[*]##*/}"
	if ! run_build env DEBIAN_FRONTEND=noninteractive \
		apt-get install --simulate -q "${DEBS[@]}" >"$FM_TMP/deb/apt.log" 2>&1; then
		cat "$FM_TMP/deb/apt.log" >&2
		fm_err "the packages' dependencies cannot be met"
		return 1
	fi
}

# install_debs_privately: the run's private PostgreSQL tree without any
# flagmeter file, then the packages' files unpacked into it.
install_debs_privately() {
	local root=$FM_TMP/pg unpacked=$FM_TMP/deb/unpacked deb
	find "$root" \( -name 'flagmeter*' -o -path '*/bitcode/flagmeter*' \) -prune \
		-exec rm -rf {} + 2>/dev/null || true
	if [[ -n $(find "$root" -name 'flagmeter*' -print -quit) ]]; then
		fm_err "a flagmeter file is left in the private PostgreSQL tree"
		return 1
	fi
	for deb in "${DEBS[@]}"; do
		dpkg-deb -x "$deb" "$unpacked"
	done
	cp -a "$unpacked/usr/lib/postgresql/$FM_PG_MAJOR/." "$root/usr/lib/postgresql/$FM_PG_MAJOR/"
	cp -a "$unpacked/usr/share/postgresql/$FM_PG_MAJOR/." "$root/usr/share/postgresql/$FM_PG_MAJOR/"
	fm_log "installed from the packages: $(cd "$unpacked" && find usr/lib usr/share/postgresql -type f | wc -l) files"
}

# regress: pg_regress's suite (test/sql) against the cluster.
regress() {
	local log=$FM_TMP/regress.log rc=0 passed failed
	fm_log "pg_regress: make installcheck against the packaged flagmeter"
	(cd "$FM_SRC" && run_as_pg make --no-print-directory installcheck \
		PG_CONFIG="$FM_PG_CONFIG" ISOLATION= TAP_TESTS=) 2>&1 | tee "$log" || rc=$?
	# pg_regress's per-test lines: `test x ... ok` (15) or TAP `ok N - x` (16+)
	passed=$(grep -cE '^(test |     )[^ ]+ +\.\.\. +ok|^ok +[0-9]+ +[-+] ' "$log" || true)
	failed=$(grep -cE '\.\.\. FAILED|^not ok +[0-9]+ ' "$log" || true)
	if ((rc != 0 && failed == 0)); then
		failed=1
		[[ -s $FM_SRC/regression.diffs ]] && cat "$FM_SRC/regression.diffs"
	elif ((failed > 0)) && [[ -s $FM_SRC/regression.diffs ]]; then
		cat "$FM_SRC/regression.diffs"
	fi
	printf '%s passed, %s failed\n' "$passed" "$failed"
	((rc == 0 && failed == 0))
}

main() {
	FM_PG_MAJOR=${PG:-15}
	fm_init
	install_deps
	fm_make_workdir
	build_debs
	check_dependencies
	if [[ -n $OUT ]]; then
		mkdir -p "$OUT"
		cp "${DEBS[@]}" "$OUT/"
		fm_log "packages copied to $OUT"
	fi
	if ((TEST == 0)); then
		printf '%s packages built\n' "${#DEBS[@]}"
		return 0
	fi
	install_debs_privately
	fm_chown_workdir
	start_cluster
	regress
}

main
