#!/usr/bin/env bash
# tools/check_versions.sh -- the version is EXTVERSION in the Makefile; every
# other file that states it must say the same (`make dist` runs this first,
# tools/check_static.sh as its check `versions`):
#   flagmeter.control                      default_version
#   META.json                              version, provides.*.version
#   clients/node/package.json              version
#   contrib/plproxy/flagmeter_proxy.control  default_version
#   debian/changelog                       the upstream part of the first entry
# Prints each mismatch as FILE: FIELD is X, not the Makefile's Y; exits 1 if any.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

want=$(sed -n 's/^EXTVERSION *= *\([^ ]*\) *$/\1/p' Makefile)
if [[ -z $want ]]; then
	echo "Makefile: no EXTVERSION = line"
	echo "versions: the Makefile states no version"
	exit 1
fi

bad=0
# expect FILE FIELD VALUE: VALUE must be the Makefile's version.
expect() {
	if [[ $3 != "$want" ]]; then
		echo "$1: $2 is '$3', not the Makefile's EXTVERSION '$want'"
		bad=$((bad + 1))
	fi
}
control_version() { sed -n "s/^default_version *= *'\\([^']*\\)'.*/\\1/p" "$1"; }
json_field() { python3 -c 'import json, sys
v = json.load(open(sys.argv[1]))
for k in sys.argv[2:]:
    v = v.get(k, {}) if isinstance(v, dict) else {}
print(v if isinstance(v, str) else "")' "$@"; }

expect flagmeter.control default_version "$(control_version flagmeter.control)"
expect contrib/plproxy/flagmeter_proxy.control default_version \
	"$(control_version contrib/plproxy/flagmeter_proxy.control)"
expect META.json version "$(json_field META.json version)"
expect META.json provides.flagmeter.version "$(json_field META.json provides flagmeter version)"
expect META.json provides.flagmeter_proxy.version "$(json_field META.json provides flagmeter_proxy version)"
expect clients/node/package.json version "$(json_field clients/node/package.json version)"
# "flagmeter (0.1.0-1) unstable; ...": the upstream version is before the last -
deb=$(sed -n '1s/^[^ ]* (\([^)]*\)).*/\1/p' debian/changelog)
expect debian/changelog "the first entry's upstream version" "${deb%-*}"

if ((bad)); then
	echo "versions: $bad file(s) disagree with EXTVERSION $want"
	exit 1
fi
echo "versions: 7 places state $want, as the Makefile's EXTVERSION"
