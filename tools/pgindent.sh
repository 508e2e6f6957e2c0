#!/usr/bin/env bash
# tools/pgindent.sh [--check] [FILE...] -- indent flagmeter's C sources as
# PostgreSQL's pgindent does (default: src/*.c src/*.h).
#
#   bash tools/pgindent.sh            rewrite the files that are not indented
#                                     (`make indent`)
#   bash tools/pgindent.sh --check    rewrite nothing; exit 1, naming what is
#                                     wrong, when a type declared in the files
#                                     is missing from typedefs.list (or the
#                                     list names a type that exists nowhere),
#                                     or when a file is not indented (its
#                                     diff is shown) (`make check-indent`)
#
# pgindent is a Perl script of PostgreSQL's source tree, not packaged by
# Debian; what it runs is pg_bsd_indent (Debian: pg-bsd-indent) with the
# options below and a typedefs file, between a few edits of the source
# before and after.  This script does the same:
#   - the typedefs are PostgreSQL's whole list plus the extension's, as
#     pgindent is run on an extension.  PostgreSQL's list is made by its
#     buildfarm and not installed, so its equivalent is read from the
#     installed server headers at run time (tools/typedefs.pl --server),
#     then typedefs.list is added, "bool" added and pgindent's excluded
#     names removed.  A new struct or typedef of ours goes into
#     typedefs.list, or pg_bsd_indent formats its declarations as
#     expressions;
#   - pgindent's pre_indent and post_indent, all of them (// comments,
#     dash-protected comments, extern "C" braces, CATALOG lines, comments
#     run together, "char *" alone on a line as a return type), as in
#     PostgreSQL 15 and 16, whose pgindent passes -tpg (a tab that would
#     advance one column is a space) to pg_bsd_indent itself.
# Files are read and written whole; a file pg_bsd_indent fails on is
# reported and counts as not indented.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

check=0
if [[ ${1:-} == --check ]]; then
	check=1
	shift
fi
if [[ ${1:-} == -* ]]; then
	echo "usage: $0 [--check] [FILE...]" >&2
	exit 2
fi

indent=$(command -v pg_bsd_indent || true)
if [[ -z $indent ]]; then
	echo "pg_bsd_indent not found: apt-get install pg-bsd-indent (Debian's package of PostgreSQL's indent)" >&2
	exit 1
fi
pg_config=${PG_CONFIG:-pg_config}
if ! server_includes=$("$pg_config" --includedir-server 2>/dev/null) || [[ ! -d $server_includes ]]; then
	echo "PostgreSQL's server headers not found ($pg_config --includedir-server): apt-get install postgresql-server-dev-15" >&2
	exit 1
fi
if (($# == 0)); then
	set -- "$root"/src/*.c "$root"/src/*.h
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# The typedefs, as pgindent's load_typedefs() filters them.  The C
# library's types that PostgreSQL's list holds too (its buildfarm reads them
# from the same debug symbols) are named here.
perl "$root/tools/typedefs.pl" --server "$server_includes" >"$tmp/pg_typedefs"
printf '%s\n' FILE DIR va_list size_t ssize_t ptrdiff_t intptr_t uintptr_t uintmax_t \
	{u,}int{8,16,32,64}_t pid_t uid_t gid_t mode_t off_t time_t sig_atomic_t socklen_t \
	sigset_t sigjmp_buf wchar_t pthread_t pthread_mutex_t >"$tmp/libc_typedefs"
{ cat "$tmp/pg_typedefs" "$tmp/libc_typedefs" "$root/typedefs.list"; echo bool; } |
	grep -vxE 'ANY|FD_SET|U|abs|allocfunc|boolean|date|digit|ilist|interval|iterator|other|pointer|printfunc|reference|string|timestamp|type|wrap' |
	sort -u >"$tmp/typedefs"

failed=0

# --check, first: typedefs.list against the types the files declare.
if ((check)); then
	perl "$root/tools/typedefs.pl" "$@" >"$tmp/declared"
	sort -u "$root/typedefs.list" >"$tmp/listed"
	comm -23 "$tmp/declared" "$tmp/listed" >"$tmp/missing"
	if [[ -s $tmp/missing ]]; then
		echo "typedefs.list lacks types declared in the sources (add them, one a line):"
		sed 's/^/  /' "$tmp/missing"
		failed=1
	fi
	# a name of the list that neither our C (src/, fuzz/, tools/), nor
	# PostgreSQL's headers, nor the C library's common types declare: a type
	# renamed or removed
	shopt -s nullglob
	perl "$root/tools/typedefs.pl" "$root"/src/*.[ch] "$root"/fuzz/*.c "$root"/tools/*.c >"$tmp/ours"
	shopt -u nullglob
	sort -u "$tmp/ours" "$tmp/pg_typedefs" "$tmp/libc_typedefs" >"$tmp/known"
	comm -23 "$tmp/listed" "$tmp/known" >"$tmp/stale"
	if [[ -s $tmp/stale ]]; then
		echo "typedefs.list names types declared nowhere (renamed or removed? take them out):"
		sed 's/^/  /' "$tmp/stale"
		failed=1
	fi
fi

# pgindent's pre_indent, pg_bsd_indent, pgindent's post_indent.
changed=()
for f in "$@"; do
	perl -0777 -pe '
		s!^([ \t]*)//(.*)$!$1/* $2 */!gm;
		s!/\* +---!/*---X_X!g;
		s!(^#ifdef[ \t]+__cplusplus.*\nextern[ \t]+"C"[ \t]*\n)\{[ \t]*$!$1/* Open extern "C" */!gm;
		s!(^#ifdef[ \t]+__cplusplus.*\n)\}[ \t]*$!$1/* Close extern "C" */!gm;
		s!^(CATALOG\(.*)$!/*$1*/!gm;
	' "$f" >"$tmp/in.c"
	if ! errors=$("$indent" -bad -bap -bbb -bc -bl -cli1 -cp33 -cdb -nce -d0 -di12 -nfc1 -i4 -l79 \
		-lp -lpl -nip -npro -sac -tpg -ts4 -U"$tmp/typedefs" "$tmp/in.c" "$tmp/out.c" 2>&1) ||
		[[ -n $errors ]]; then
		echo "pg_bsd_indent failed on ${f#"$root"/}: $errors" >&2
		failed=1
		continue
	fi
	perl -0777 -pe '
		s!^/\*(CATALOG\(.*)\*/$!$1!gm;
		s!^/\* Open extern "C" \*/$!{!gm;
		s!^/\* Close extern "C" \*/$!}!gm;
		s!/\*---X_X!/* ---!g;
		s!\*/(/\*.*\*/)$!*/\t$1!gm;
		s!^([A-Za-z_]\S*)[ \t]+\*$!$1 *!gm;
	' "$tmp/out.c" >"$tmp/fixed.c"
	cmp -s "$f" "$tmp/fixed.c" && continue
	changed+=("${f#"$root"/}")
	if ((check)); then
		diff -u --label "a/${f#"$root"/}" --label "b/${f#"$root"/}" "$f" "$tmp/fixed.c" || true
	else
		cat "$tmp/fixed.c" >"$f"
		echo "indented ${f#"$root"/}"
	fi
done

if ((check)); then
	if ((${#changed[@]})); then
		echo "not indented (bash tools/pgindent.sh ${changed[*]}):"
		printf '  %s\n' "${changed[@]}"
		failed=1
	fi
	# the summary, last
	printf 'pgindent: %d of %d files not indented; typedefs.list: %d types missing, %d declared nowhere\n' \
		"${#changed[@]}" $# "$(wc -l <"$tmp/missing")" "$(wc -l <"$tmp/stale")"
fi
exit $failed
