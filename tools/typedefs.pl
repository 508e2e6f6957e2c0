#!/usr/bin/env perl
# tools/typedefs.pl -- the type names C headers and sources declare, one a
# line, sorted: what pg_bsd_indent must be told are types (its -U file).
#
#   perl tools/typedefs.pl --server [DIR]   PostgreSQL's: every typedef of
#       the installed server headers (DIR, default `pg_config
#       --includedir-server`), as pgindent's own typedefs.list would list
#       them
#   perl tools/typedefs.pl FILE...          the project's: every typedef
#       and every struct, union or enum tag with a body in FILE...
#
# Why: pgindent formats with PostgreSQL's whole typedefs.list plus the
# extension's; without PostgreSQL's names (Datum, TransactionId, Jsonb...)
# pg_bsd_indent takes their declarations for expressions.  That list is
# made by the buildfarm from debug symbols and is not installed anywhere,
# so tools/pgindent.sh builds its equivalent from the headers at run time
# (and tools/pgindent.sh --check uses the second form to find the
# project's names missing from typedefs.list).
#
# What counts as a declaration, comments and preprocessor lines removed:
#   typedef <type> Name;  typedef <type> Name[N];  typedef A *B, C;
#   typedef ... { ... } Name;
#   typedef R (*Name) (args);  typedef R (Name) (args);
#   CATALOG(pg_x, ...) ... { ... } FormData_pg_x;  (a typedef once expanded)
#   struct|union|enum Tag { ... }                   (FILE... form only)
use strict;
use warnings;

use File::Find;

my $server = 0;
if (@ARGV && $ARGV[0] eq '--server')
{
	shift @ARGV;
	$server = 1;
	if (!@ARGV)
	{
		my $dir = `pg_config --includedir-server`;
		die "pg_config --includedir-server failed\n" if $? || !$dir;
		chomp $dir;
		@ARGV = ($dir);
	}
}
die "usage: $0 --server [DIR] | $0 FILE...\n" if !@ARGV;

my @files;
for my $arg (@ARGV)
{
	if (-d $arg)
	{
		find({ wanted => sub { push @files, $File::Find::name if /\.h\z/ && -f $_ }, no_chdir => 1 },
			$arg);
	}
	elsif (-f $arg)
	{
		push @files, $arg;
	}
	else
	{
		die "$0: no such file or directory: $arg\n";
	}
}

my %names;
for my $file (sort @files)
{
	open(my $fh, '<', $file) or die "$0: $file: $!\n";
	local $/;
	my $src = <$fh>;
	close $fh;
	$names{$_} = 1 for declared_names($src, !$server);
}
print "$_\n" for sort keys %names;

# The names one file declares.
sub declared_names
{
	my ($src, $with_tags) = @_;
	my @found;

	# comments, string and character literals, preprocessor lines
	# (continuations included) out
	$src =~ s{/\*.*?\*/|//[^\n]*|"(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*'}
	         {my $m = $&; $m =~ /^["']/ ? '""' : ' '}gse;
	$src =~ s/^[ \t]*#(?:[^\n]*\\\n)*[^\n]*//mg;
	# attribute macros that would read as the declared name
	$src =~ s/\b(?:pg_attribute_\w+|__attribute__)\s*(\((?:[^()]++|(?1))*\))//g;

	# catalog structs: CATALOG(pg_x,...) expands to "typedef struct FormData_pg_x"
	push @found, "FormData_$1" while $src =~ /\bCATALOG\(\s*(\w+)\s*,/g;

	while ($src =~ /\btypedef\b/g)
	{
		my $start = pos($src);
		my ($depth, $i) = (0, $start);
		for (; $i < length $src; $i++)
		{
			my $c = substr($src, $i, 1);
			$depth++ if $c eq '{';
			$depth-- if $c eq '}';
			last if $c eq ';' && $depth == 0;
		}
		my $decl = substr($src, $start, $i - $start);
		pos($src) = $i;
		push @found, typedef_names($decl);
	}

	if ($with_tags)
	{
		push @found, $1 while $src =~ /\b(?:struct|union|enum)\s+(\w+)\s*\{/g;
	}
	return grep { /^[A-Za-z_]\w*$/ } @found;
}

# The names of "typedef <decl>;" (the text between the two).
sub typedef_names
{
	my ($decl) = @_;

	# a function or function pointer type: R (*Name) (args), R (Name) (args)
	return ($1) if $decl =~ /^[^{]*?\(\s*\*?\s*(\w+)\s*\)\s*\(/s;

	# the declarators follow the body, if any
	$decl =~ s/^.*\}//s;
	my @names;
	for my $part (split /,/, $decl)
	{
		$part =~ s/\[[^\]]*\]//g;
		push @names, $1 if $part =~ /(\w+)\s*$/;
	}
	return @names;
}
