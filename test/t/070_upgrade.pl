# test/t/070_upgrade.pl -- the upgrade path.
#
# Installs the oldest version of flagmeter that the installed scripts
# offer, walks ALTER EXTENSION flagmeter UPDATE to the default version, and
# compares the result with a fresh install: the same member objects, the
# same definitions, and the same answers to the same calls.  Every version
# must reach the default one through update scripts; a new version without
# its sql/flagmeter--A--B.sql fails here.  Also checks that the versions in
# Makefile, the control file and META.json agree, and on 18 and later the
# one the loaded library reports.
use strict;
use warnings;

use File::Basename qw(dirname);
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $root = dirname(__FILE__) . '/../..';

# The version in the three places that name it.
my ($make_version) = slurp_file("$root/Makefile") =~ /^EXTVERSION\s*=\s*(\S+)/m;
my ($control_version) = slurp_file("$root/flagmeter.control") =~ /^default_version\s*=\s*'([^']+)'/m;
my ($meta_version) = slurp_file("$root/META.json") =~ /"version"\s*:\s*"([^"]+)"/;
is($control_version, $make_version, 'flagmeter.control and Makefile name the same version');
is($meta_version, $make_version, 'META.json and Makefile name the same version');

# Every version CHANGELOG names besides the one being built was released:
# its install script stays in sql/ as it shipped, so that it can still be
# installed and updated from (below).  Bumping EXTVERSION therefore needs
# the old script kept and an update script added.
# Its headings are Keep a Changelog's: "## [0.1.0] - 2026-12-04".
my @changelog = slurp_file("$root/CHANGELOG.md") =~ /^## \[(\d+\.\d+\.\d+)\]/mg;
ok((grep { $_ eq $make_version } @changelog),
	'CHANGELOG has an entry for the version being built');
my @released = grep { $_ ne $make_version } @changelog;
for my $version (@released)
{
	ok(-f "$root/sql/flagmeter--$version.sql",
		"the install script of released version $version is kept");
}

my $node = PostgreSQL::Test::Cluster->new('upgrade');
$node->init;
$node->start;

my $default = $node->safe_psql('postgres',
	q{SELECT default_version FROM pg_available_extensions WHERE name = 'flagmeter'});
is($default, $make_version, 'the installed default version is the one built');

# From 18 the library names itself (PG_MODULE_MAGIC_EXT), with the version
# it was built as.
SKIP:
{
	skip 'libraries name their version from PostgreSQL 18 on', 1
	  if $node->pg_version < 18;
	is( $node->safe_psql('postgres', q{
LOAD 'flagmeter';
SELECT version FROM pg_get_loaded_modules() WHERE module_name = 'flagmeter'}),
		$make_version, 'the loaded library names the version built');
}

# Every version must reach the default one, the released ones included.
for my $version (@released)
{
	is( $node->safe_psql('postgres', qq{
SELECT count(*) FROM pg_extension_update_paths('flagmeter')
WHERE source = '$version' AND target = '$make_version' AND path IS NOT NULL}),
		'1', "released version $version updates to $make_version");
}
my $unreachable = $node->safe_psql('postgres', qq{
SELECT string_agg(v.version, ', ' ORDER BY v.version)
FROM pg_available_extension_versions v
WHERE v.name = 'flagmeter' AND v.version <> '$default'
  AND NOT EXISTS (SELECT FROM pg_extension_update_paths('flagmeter') p
                  WHERE p.source = v.version AND p.target = '$default' AND p.path IS NOT NULL)});
is($unreachable, '', 'every available version has an update path to the default');

my $oldest = $node->safe_psql('postgres', q{
SELECT version FROM pg_available_extension_versions WHERE name = 'flagmeter'
ORDER BY string_to_array(version, '.')::int[] LIMIT 1});
note("oldest version: $oldest, default: $default");

$node->safe_psql('postgres', 'CREATE DATABASE upgraded');
$node->safe_psql('postgres', 'CREATE DATABASE fresh');
$node->safe_psql('upgraded', qq{CREATE EXTENSION flagmeter VERSION '$oldest'});
$node->safe_psql('upgraded', 'ALTER EXTENSION flagmeter UPDATE');
$node->safe_psql('fresh', 'CREATE EXTENSION flagmeter');

is($node->safe_psql('upgraded', q{SELECT extversion FROM pg_extension WHERE extname = 'flagmeter'}),
	$default, "ALTER EXTENSION UPDATE walks from $oldest to $default");

# The objects: every member with its definition.
my $objects = q{
SELECT pg_describe_object(d.classid, d.objid, d.objsubid) || ' | ' ||
       COALESCE(CASE d.classid
           WHEN 'pg_proc'::regclass THEN
               (SELECT pg_get_function_identity_arguments(p.oid) || ' -> ' ||
                       pg_get_function_result(p.oid) || ' ' || p.provolatile::text || p.proparallel::text ||
                       p.proisstrict::text || ' ' || md5(p.prosrc) || ' ' || COALESCE(array_to_string(p.proconfig, ','), '')
                FROM pg_proc p WHERE p.oid = d.objid)
           WHEN 'pg_class'::regclass THEN
               (SELECT string_agg(a.attname || ' ' || format_type(a.atttypid, a.atttypmod) ||
                                  CASE WHEN a.attnotnull THEN ' not null' ELSE '' END, ', ' ORDER BY a.attnum)
                FROM pg_attribute a WHERE a.attrelid = d.objid AND a.attnum > 0 AND NOT a.attisdropped)
           ELSE '' END, '') || ' | ' ||
       COALESCE(obj_description(d.objid, d.classid::regclass::text), '')
FROM pg_depend d
WHERE d.refclassid = 'pg_extension'::regclass
  AND d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'flagmeter')
  AND d.deptype = 'e'
ORDER BY 1};
my $fresh_objects = $node->safe_psql('fresh', $objects);
my $upgraded_objects = $node->safe_psql('upgraded', $objects);
cmp_ok(scalar(split /\n/, $fresh_objects), '>', 50, 'a fresh install has its objects');
is($upgraded_objects, $fresh_objects, 'the upgraded install has the same objects and definitions');

# The behaviour: the same calls give the same answers.
my $calls = q{
SELECT 1 FROM flagmeter.configure(late_events => '100 years');  -- events of January 2026
SELECT flagmeter.define_meter('calls'), flagmeter.define_plan('p'),
       flagmeter.set_limit('p', 'calls', 10, 'lifetime'), flagmeter.assign_plan('t', 'p');
SELECT flagmeter.track('t', 'calls', 4, '2026-01-01 00:00:00+00', 'k1');
SELECT flagmeter.track('t', 'calls', 4, '2026-01-01 00:00:00+00', 'k1');
SELECT granted, used, remaining FROM flagmeter.consume('t', 'calls', 5);
SELECT granted, used, remaining FROM flagmeter.consume('t', 'calls', 6);
SELECT flagmeter.void('t', 'k1');
SELECT flagmeter.used(u), flagmeter.events(u), flagmeter.quota(u) FROM flagmeter.usage('t', 'calls') u;
SELECT events_folded FROM flagmeter.maintain();
SELECT bucket_start, used FROM flagmeter.usage_series('t', 'calls', '2026-01-01', '2026-01-03', 'day');
SELECT kind, tenant, meter, threshold FROM flagmeter.outbox ORDER BY version;
};
my $fresh_answers = $node->safe_psql('fresh', $calls);
my $upgraded_answers = $node->safe_psql('upgraded', $calls);
like($fresh_answers, qr/^5\|1\|10$/m, 'the calls ran on the fresh install');
is($upgraded_answers, $fresh_answers, 'the upgraded install answers the same calls the same way');

$node->stop;
done_testing();
