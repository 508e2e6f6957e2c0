#!/usr/bin/env bash
# tools/npm_package.sh WORKDIR -- the npm package of the Node client as a
# user gets it: `npm pack` of clients/node, installed into an empty project
# in WORKDIR, then the README's quick start run against the cluster that
# PGHOST, PGPORT and PGUSER name (make test's, over TCP).
#
# What it proves, in order:
#   1. the tarball holds the client's README (its guide), LICENSE,
#      package.json and src/ (code and type declarations), and nothing else;
#   2. `npm install` of the tarball into an empty project works: its
#      dependencies are declared (pg comes from the registry or npm's cache);
#   3. README.md's "Ten lines of SQL" run with psql in a fresh database with
#      the extension, and its "Ten lines of Node" (quota.mjs) then run in the
#      empty project, importing 'flagmeter' as a user's app does, and print
#      what the README's figures say: the event counted, the consume granted,
#      992 remaining, the tenant not blocked.
# tools/test.sh runs it as the suite npm_package, as the owner of its copy of
# the tree, with npm's cache in its temp dir.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
work=${1:?usage: tools/npm_package.sh WORKDIR}
db=fm_npm_package
mkdir -p "$work/app"

# README.md's code block of the given language that follows HEADING.
readme_block() {
	awk -v heading="$1" -v lang="$2" '
		$0 == heading { found = 1; next }
		found && !inside && $0 == "```" lang { inside = 1; next }
		inside && $0 == "```" { exit }
		inside { print }' "$root/README.md"
}

echo "==> npm pack clients/node"
tarball=$(cd "$root/clients/node" && npm pack --silent --pack-destination "$work")
tarball=$work/$tarball
unexpected=$(tar -tzf "$tarball" | grep -vE '^package/(package\.json|README\.md|LICENSE|src/.+\.(js|mjs|d\.ts|d\.mts))$' || true)
for f in package.json README.md LICENSE src/index.js src/index.mjs src/index.d.ts src/interfaces.d.ts; do
	tar -tzf "$tarball" "package/$f" >/dev/null 2>&1 || {
		echo "the package lacks $f" >&2
		exit 1
	}
done
if [[ -n $unexpected ]]; then
	printf 'the package holds files a user does not need:\n%s\n' "$unexpected" >&2
	exit 1
fi
echo "    $(tar -tzf "$tarball" | wc -l) files, $(du -k "$tarball" | cut -f1) kB: $(basename "$tarball")"

echo "==> npm install of the tarball into an empty project"
(cd "$work/app" && printf '{ "name": "quota-app", "private": true }\n' >package.json &&
	npm install --no-audit --no-fund --no-update-notifier --prefer-offline "$tarball")

echo "==> README.md's ten lines of SQL, in a fresh database"
psql -X -q -d postgres -v ON_ERROR_STOP=1 -c "DROP DATABASE IF EXISTS $db" -c "CREATE DATABASE $db"
trap 'psql -X -q -d postgres -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1 || true' EXIT
psql -X -q -d "$db" -v ON_ERROR_STOP=1 -c 'CREATE EXTENSION flagmeter'
readme_block '### Ten lines of SQL' sql >"$work/quickstart.sql"
[[ -s $work/quickstart.sql ]] || {
	echo "README.md has no sql block under '### Ten lines of SQL'" >&2
	exit 1
}
psql -X -d "$db" -v ON_ERROR_STOP=1 -f "$work/quickstart.sql"

echo "==> README.md's ten lines of Node, as quota.mjs of the project"
readme_block '### Ten lines of Node' js >"$work/app/quota.mjs"
[[ -s $work/app/quota.mjs ]] || {
	echo "README.md has no js block under '### Ten lines of Node'" >&2
	exit 1
}
url="postgresql://$PGUSER@$PGHOST:$PGPORT/$db"
out=$(cd "$work/app" && DATABASE_URL=$url timeout 60 node quota.mjs)
printf '%s\n' "$out"
# track counted its event, consume granted one more of 1000: 992 remaining
if [[ $(tail -n 1 <<<"$out") != "true true 992 false" ]]; then
	echo "quota.mjs printed '$(tail -n 1 <<<"$out")', not 'true true 992 false'" >&2
	exit 1
fi
echo "==> the packed client ran README.md's quick start"
