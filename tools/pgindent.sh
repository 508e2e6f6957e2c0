#!/usr/bin/env bash
# tools/pgindent.sh [FILE...] -- indent flagmeter's C sources as PostgreSQL's
# pgindent does (`make indent`; default: src/*.c src/*.h).
#
# pgindent is a Perl script of PostgreSQL's source tree, not packaged by
# Debian; what it runs is pg_bsd_indent (Debian: pg-bsd-indent) with the
# options below and typedefs.list, then a few fix-ups of its output.  This
# script does the same with the two fix-ups our code meets:
#   - a lone tab between two words that advances one column is a space
#     ("TimestampTz ts"), as pgindent's entab leaves it;
#   - a function's return type stays "char *" on its own line.
# Add a new struct or typedef name to typedefs.list, or pg_bsd_indent
# formats its declarations as expressions.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
indent=$(command -v pg_bsd_indent || true)
if [[ -z $indent ]]; then
	echo "pg_bsd_indent not found: apt-get install pg-bsd-indent" >&2
	exit 1
fi
if (($# == 0)); then
	set -- "$root"/src/*.c "$root"/src/*.h
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

for f in "$@"; do
	"$indent" -bad -bap -bbb -bc -bl -cli1 -cp33 -cdb -nce -d0 -di12 -nfc1 -i4 -l79 \
		-lp -lpl -nip -npro -sac -ts4 -U"$root/typedefs.list" "$f" "$tmp/out"
	perl -pe '
		# a tab after a word that advances one column is a space
		my @ch = split //;
		my ($out, $col) = ("", 0);
		for my $i (0 .. $#ch) {
			if ($ch[$i] eq "\t") {
				my $next = (int($col / 4) + 1) * 4;
				my $lone = $i > 0 && $ch[$i - 1] =~ /\S/ && $i < $#ch && $ch[$i + 1] =~ /\S/;
				$out .= ($next - $col == 1 && $lone) ? " " : "\t";
				$col = $next;
			} else { $out .= $ch[$i]; $col++; }
		}
		$_ = $out;
		# return types alone on a line: "char *", not "char\t   *"
		s/^([A-Za-z_][A-Za-z0-9_ ]*?)\s+(\*+)$/$1 $2/;
	' "$tmp/out" >"$tmp/fixed"
	if ! cmp -s "$f" "$tmp/fixed"; then
		cat "$tmp/fixed" >"$f"
		echo "indented $f"
	fi
done
