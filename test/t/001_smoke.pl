# test/t/001_smoke.pl -- smoke test: the installed extension loads into a
# fresh cluster and reports the expected version; its shared limit cache is
# off unless flagmeter is preloaded, and when preloaded and full, limits
# are still right.
#
# Run by `make installcheck` (prove) from tools/test.sh; the cluster here is
# a separate one made by PostgreSQL::Test::Cluster, not the harness's.
use strict;
use warnings;

use File::Basename qw(dirname);
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('main');
$node->init;
$node->start;

my ($ret, $stdout, $stderr) =
  $node->psql('postgres', 'CREATE EXTENSION flagmeter');
is($ret, 0, 'CREATE EXTENSION flagmeter succeeds')
  or diag("stderr: $stderr");

# the version being built, as the Makefile states it (070_upgrade.pl
# checks that the other files agree)
my ($version) =
  slurp_file(dirname(__FILE__) . '/../../Makefile') =~ /^EXTVERSION\s*=\s*(\S+)/m;
is( $node->safe_psql(
		'postgres',
		"SELECT extversion FROM pg_extension WHERE extname = 'flagmeter'"),
	$version,
	"installed flagmeter version is the Makefile's ($version)");

# t0 below has no plan: metered without limit, as configured here (the
# default refuses it).
$node->safe_psql('postgres',
	q{SELECT flagmeter.configure(unassigned_tenants => 'unlimited')});

# Not preloaded (as here so far): no shared limit cache, calls work.
is( $node->safe_psql(
		'postgres', q{
SELECT flagmeter.define_meter('calls');
SELECT flagmeter.track('t0', 'calls');
SELECT (c IS NULL)::text FROM flagmeter.shared_limit_cache() c;}),
	"\nt\ntrue",
	'without preloading, shared_limit_cache() is all NULL');

# Preloaded with room for 20 limits, 30 tenants with 30 different quotas:
# the table fills, the other 10 are not stored (each load of them counted
# twice: by the backend that tracked them all, then by the one that checks
# them, which tries to share what it loads as well), and every call sees
# its own limit.
$node->append_conf('postgresql.conf',
	"shared_preload_libraries = 'flagmeter'\nflagmeter.shared_limits = 20");
$node->restart;
$node->safe_psql(
	'postgres', q{
SELECT flagmeter.define_plan('p'), flagmeter.set_limit('p', 'calls', 1000, 'lifetime');
SELECT flagmeter.assign_plan('t' || i, 'p'), flagmeter.override_limit('t' || i, 'calls', i)
FROM generate_series(1, 30) i;
SELECT flagmeter.track('t' || i, 'calls') FROM generate_series(1, 30) i;});
is( $node->safe_psql(
		'postgres', q{
SELECT count(*) FILTER (WHERE d.quota = i) || ' of 30 right, '
       || (SELECT capacity || ' capacity, ' || entries || ' entries, hits ' || (hits > 0)
                  || ', not stored ' || not_stored
           FROM flagmeter.shared_limit_cache())
FROM generate_series(1, 30) i, flagmeter.check('t' || i, 'calls') d;}),
	'30 of 30 right, 20 capacity, 20 entries, hits true, not stored 20',
	'preloaded: a full shared cache shares 20 limits, and all 30 are right');

# A configuration change makes those 20 stale: the next limit loaded sweeps
# them out (once for the new generation), so the 10 left out are now stored.
$node->safe_psql('postgres', q{SELECT flagmeter.override_limit('t1', 'calls', 1);});
is( $node->safe_psql(
		'postgres', q{
SELECT count(flagmeter.track('t' || i, 'calls')) FROM generate_series(21, 30) i;
SELECT entries || ' entries, not stored ' || not_stored FROM flagmeter.shared_limit_cache();}),
	"10\n10 entries, not stored 20",
	'after a configuration change the stale entries are swept and new limits stored');

$node->stop;

done_testing();
