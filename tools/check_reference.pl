#!/usr/bin/env perl
# tools/check_reference.pl -- the reference (docs/reference/) against the
# extension: fails when a function of flagmeter is missing from it, when it
# names a function or a setting that does not exist, or when a link of the
# user documentation does not resolve.
#
#   perl tools/check_reference.pl        (from anywhere; exit status 1 on a failure)
#
# What counts as a function: every CREATE FUNCTION, CREATE OR REPLACE
# FUNCTION and CREATE AGGREGATE of schema flagmeter in sql/parts/*.sql, and
# in contrib/plproxy/proxy.sql (the flagmeter_proxy extension; a function of
# the proxy with the name of one of flagmeter's is documented by that entry).
# Overloads share one entry.
#
# Public or internal.  Every function is documented exactly once, in one of
# two forms:
#   - public: a heading of its own in docs/reference/*.md, written
#       ### `name()`
#   - internal: a row of a table in docs/reference/internals.md whose first
#     cell names it as `name(...)`.  Internal means the function exists for
#     the extension's own plumbing (validators, the halves and steps of other
#     calls, trigger functions, type support, the proxy's routing helpers):
#     callable, since PostgreSQL has no private functions, but not meant for
#     apps.  Which functions are internal is decided in internals.md, under
#     two rules this script enforces:
#       1. a function that a role layout other than admin grants (the
#          request, listener and dashboard branches of access_privileges()
#          in sql/parts/80_security.sql) is public: a layout is an app's
#          path, so everything on it has a reference entry;
#       2. a function named by a CREATE TYPE, CREATE AGGREGATE or CREATE
#          OPERATOR (input, output, send, receive, transition, combine and
#          operator functions) is internal: its public face is the type,
#          aggregate or operator, documented in docs/reference/types.md.
#
# Settings: every DefineCustom*Variable("flagmeter.x", ...) in src/*.c has a
# heading ### `flagmeter.x` in docs/reference/settings.md, and every such
# heading names a setting that exists.
#
# The documentation a user reads (README.md, CHANGELOG.md, the Node client's
# README (its guide, shipped in the npm package) and docs/**/*.md
# but docs/architecture.md, which describes the source and is checked by its
# own author): every `flagmeter.name(` outside the reference must name a
# function that exists, and every relative link must reach a file, and its
# #anchor a heading of that file (GitHub's anchors).  Code blocks are skipped
# for links, not for function names.
use strict;
use warnings;
use File::Basename qw(dirname);
use File::Find;
use Cwd qw(abs_path);

my $root = abs_path(dirname(__FILE__) . '/..');
chdir $root or die "cannot chdir to $root: $!\n";

my @failures;
sub fail { push @failures, join('', @_) }

sub slurp
{
	my ($file) = @_;
	open my $fh, '<', $file or die "cannot read $file: $!\n";
	local $/;
	my $text = <$fh>;
	close $fh;
	return $text;
}

# SQL text without its -- comments (dollar-quoted bodies are kept: no
# function body here creates a function).
sub sql_text
{
	my ($file) = @_;
	my $text = slurp($file);
	$text =~ s/--[^\n]*//g;
	return $text;
}

# ---------------------------------------------------------------------------
# The extension's functions.
my (%ext, %proxy, %support);
for my $file (glob('sql/parts/*.sql'))
{
	my $sql = sql_text($file);
	while ($sql =~ /\bCREATE\s+(?:OR\s+REPLACE\s+)?(?:FUNCTION|AGGREGATE)\s+flagmeter\.(\w+)\s*\(/gi)
	{
		$ext{$1} //= $file;
	}
	while ($sql =~ /\bCREATE\s+(?:TYPE|AGGREGATE|OPERATOR)\b([^;]*);/gi)
	{
		my $body = $1;
		while ($body =~ /\b(?:INPUT|OUTPUT|RECEIVE|SEND|SFUNC|COMBINEFUNC|FINALFUNC|SERIALFUNC|DESERIALFUNC|MSFUNC|MINVFUNC|MFINALFUNC|FUNCTION|PROCEDURE)\s*=\s*(?:flagmeter\.)?(\w+)/gi)
		{
			$support{$1} = 1;
		}
	}
}
die "no functions found in sql/parts/*.sql\n" unless %ext;
if (-f 'contrib/plproxy/proxy.sql')
{
	my $sql = sql_text('contrib/plproxy/proxy.sql');
	while ($sql =~ /\bCREATE\s+(?:OR\s+REPLACE\s+)?(?:FUNCTION|AGGREGATE)\s+flagmeter\.(\w+)\s*\(/gi)
	{
		$proxy{$1} = 1 unless $ext{$1};
	}
}
my %exists = (%ext, map { $_ => 'contrib/plproxy/proxy.sql' } keys %proxy);

# The functions the app-facing layouts grant (rule 1).
my %layout;
{
	my $sql = sql_text('sql/parts/80_security.sql');
	if ($sql =~ /CREATE\s+FUNCTION\s+flagmeter\.access_privileges\b(.*?)\n\s*ELSE\s*\n/s)
	{
		my $branches = $1;
		$layout{$1} = 1 while $branches =~ /flagmeter\.(\w+)\(/g;
	}
	fail('sql/parts/80_security.sql: cannot find the request, listener and dashboard ',
		'branches of access_privileges()') unless %layout;
}

# The settings.
my %gucs;
for my $file (glob('src/*.c'))
{
	my $c = slurp($file);
	$gucs{$1} = $file while $c =~ /DefineCustom\w+Variable\s*\(\s*"(flagmeter\.\w+)"/g;
}

# ---------------------------------------------------------------------------
# The reference.
my (%public, %internal, %settings);
my @reference = grep { !/internals\.md$/ } glob('docs/reference/*.md');
fail('docs/reference/: no reference files') unless @reference;
for my $file (@reference)
{
	my $in_code = 0;
	my $n = 0;
	for my $line (split /\n/, slurp($file))
	{
		$n++;
		if ($line =~ /^\s*```/) { $in_code = !$in_code; next; }
		next if $in_code;
		next unless $line =~ /^###\s+(.*?)\s*$/;
		my $heading = $1;
		if ($heading =~ /^`(\w+)\(\)`$/)
		{
			push @{ $public{$1} }, "$file:$n";
		}
		elsif ($heading =~ /^`(flagmeter\.\w+)`$/)
		{
			push @{ $settings{$1} }, "$file:$n";
		}
	}
}
if (-f 'docs/reference/internals.md')
{
	my $n = 0;
	for my $line (split /\n/, slurp('docs/reference/internals.md'))
	{
		$n++;
		next unless $line =~ /^\|([^|]*)\|/;
		my $cell = $1;
		push @{ $internal{$1} }, "docs/reference/internals.md:$n" while $cell =~ /`(\w+)\(/g;
	}
}
else
{
	fail('docs/reference/internals.md is missing');
}

for my $name (sort keys %exists)
{
	my @pub = @{ $public{$name} // [] };
	my @int = @{ $internal{$name} // [] };
	if (!@pub && !@int)
	{
		fail("function $name ($exists{$name}) is missing from the reference: ",
			"give it a heading ### `$name()` in docs/reference/, or a row in docs/reference/internals.md");
	}
	elsif (@pub + @int > 1)
	{
		fail("function $name is documented more than once: ", join(', ', @pub, @int));
	}
	if (@int && $layout{$name})
	{
		fail("function $name is granted by an app's role layout (access_privileges), ",
			"so it is public, but docs/reference/internals.md lists it");
	}
	if (@pub && $support{$name})
	{
		fail("function $name supports a type, aggregate or operator: list it in ",
			"docs/reference/internals.md, not under its own heading (@pub)");
	}
}
for my $name (sort keys %public)
{
	fail("the reference documents $name(), which the extension does not have: @{ $public{$name} }")
	  unless $exists{$name};
}
for my $name (sort keys %internal)
{
	fail("docs/reference/internals.md lists $name(), which the extension does not have: @{ $internal{$name} }")
	  unless $exists{$name};
}

for my $name (sort keys %gucs)
{
	my @at = @{ $settings{$name} // [] };
	fail("setting $name ($gucs{$name}) is missing from docs/reference/settings.md") unless @at;
	fail("setting $name is documented more than once: @at") if @at > 1;
}
for my $name (sort keys %settings)
{
	fail("the reference documents the setting $name, which src/*.c does not define: @{ $settings{$name} }")
	  unless $gucs{$name};
}

# ---------------------------------------------------------------------------
# The documentation a user reads: function names and links.
my @docs = grep { -f $_ } ('README.md', 'CHANGELOG.md', 'clients/node/README.md');
find({ wanted => sub { push @docs, $File::Find::name if /\.md$/ }, no_chdir => 1 }, 'docs')
  if -d 'docs';
@docs = sort grep { $_ ne 'docs/architecture.md' } @docs;

# GitHub's anchors of a markdown file's headings.
my %anchor_cache;
sub anchors
{
	my ($file) = @_;
	return $anchor_cache{$file} if $anchor_cache{$file};
	my (%seen, %anchors);
	my $in_code = 0;
	for my $line (split /\n/, slurp($file))
	{
		if ($line =~ /^\s*```/) { $in_code = !$in_code; next; }
		next if $in_code;
		next unless $line =~ /^#{1,6}\s+(.*?)\s*#*\s*$/;
		my $slug = lc $1;
		$slug =~ s/<[^>]*>//g;
		$slug =~ s/[^\w\- ]//g;
		$slug =~ tr/ /-/;
		my $n = $seen{$slug}++;
		$anchors{ $n ? "$slug-$n" : $slug } = 1;
	}
	return $anchor_cache{$file} = \%anchors;
}

my $links = 0;
for my $file (@docs)
{
	my $in_code = 0;
	my $n = 0;
	my $dir = dirname($file);
	for my $line (split /\n/, slurp($file))
	{
		$n++;
		while ($line =~ /\bflagmeter\.(\w+)\(/g)
		{
			fail("$file:$n: names flagmeter.$1(), which the extension does not have")
			  unless $exists{$1};
		}
		if ($line =~ /^\s*```/) { $in_code = !$in_code; next; }
		next if $in_code;
		(my $text = $line) =~ s/`[^`]*`//g;    # inline code is not a link
		while ($text =~ /\]\(([^)\s]+)(?:\s+"[^"]*")?\)/g)
		{
			my $target = $1;
			next if $target =~ m{^(?:https?|mailto):};
			$links++;
			my ($path, $anchor) = $target =~ /^([^#]*)(?:#(.*))?$/;
			my $dest = $path eq '' ? $file : "$dir/$path";
			$dest =~ s{/\./}{/}g;
			1 while $dest =~ s{[^/]+/\.\./}{};
			if (!-e $dest)
			{
				fail("$file:$n: link to $target: $dest does not exist");
				next;
			}
			next unless defined $anchor && $anchor ne '';
			if (-d $dest || $dest !~ /\.md$/)
			{
				fail("$file:$n: link to $target: an anchor into something that is not a markdown file");
				next;
			}
			fail("$file:$n: link to $target: $dest has no heading with the anchor #$anchor")
			  unless anchors($dest)->{$anchor};
		}
	}
}

# ---------------------------------------------------------------------------
if (@failures)
{
	print "$_\n" for @failures;
	printf "reference check: %d failure%s\n", scalar @failures, @failures == 1 ? '' : 's';
	exit 1;
}
printf "reference check: %d functions (%d public, %d internal), %d settings, %d links in %d files: ok\n",
  scalar(keys %exists), scalar(keys %public), scalar(keys %internal), scalar(keys %gucs), $links,
  scalar @docs;
exit 0;
