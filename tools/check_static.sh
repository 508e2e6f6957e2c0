#!/usr/bin/env bash
# tools/check_static.sh -- the checks that read the tree and need no server
# (`make check-static`), one line of summary each; exits 1 if any fails.
#
#   indent  tools/pgindent.sh --check: every src/*.c and *.h as pgindent
#           leaves it, typedefs.list naming exactly the types declared
#           (needs pg_bsd_indent: apt-get install pg-bsd-indent, and the
#           server headers: apt-get install postgresql-server-dev-15)
#   proxy   tools/check_proxy_stubs.py: contrib/plproxy/proxy.sql against
#           the flagmeter functions its stubs route to
#   docs    tools/check_docs_map.py: docs/architecture.md, and the paths the
#           code's comments cite, name what exists
#   reference  tools/check_reference.pl: docs/reference/ documents every
#           function and setting of the extension, names none that does not
#           exist, and the user docs' links resolve
#   versions   tools/check_versions.sh: flagmeter.control, META.json,
#           clients/node/package.json, flagmeter_proxy.control and
#           debian/changelog state the Makefile's EXTVERSION
#
# Each check's own output (a diff, the list of what is wrong) is printed
# above the summary when it fails.  CHECKS="indent docs" runs only those.
# Why here and not in a server suite: they are fast, need no cluster, and
# their failures name a file and line, not a test.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

declare -A command=(
	[indent]="bash tools/pgindent.sh --check"
	[proxy]="python3 -B tools/check_proxy_stubs.py"
	[docs]="python3 -B tools/check_docs_map.py"
	[reference]="perl tools/check_reference.pl"
	[versions]="bash tools/check_versions.sh"
)
read -r -a checks <<<"${CHECKS:-indent proxy docs reference versions}"

out=$(mktemp)
trap 'rm -f "$out"' EXIT
summary=()
failed=0
for check in "${checks[@]}"; do
	if [[ -z ${command[$check]:-} ]]; then
		echo "unknown check: $check (indent, proxy, docs, reference, versions)" >&2
		exit 2
	fi
	if ${command[$check]} >"$out" 2>&1; then
		summary+=("ok      $check: $(tail -n 1 "$out")")
	else
		cat "$out"
		# the last line of each check's output says what failed
		summary+=("FAILED  $check: $(tail -n 1 "$out")")
		failed=1
	fi
done
printf '%s\n' "${summary[@]}"
exit $failed
