# test/t/001_smoke.pl -- smoke test: the installed extension loads into a
# fresh cluster and reports the expected version.
#
# Run by `make installcheck` (prove) from tools/test.sh; the cluster here is
# a separate one made by PostgreSQL::Test::Cluster, not the harness's.
use strict;
use warnings;

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

is( $node->safe_psql(
		'postgres',
		"SELECT extversion FROM pg_extension WHERE extname = 'flagmeter'"),
	'0.1.0',
	'installed flagmeter version is 0.1.0');

$node->stop;

done_testing();
