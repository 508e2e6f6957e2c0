# test/t/030_maintain_under_load.pl -- maintain() racing ingest.
#
# 8 pgbench clients track events for a few seconds while a ninth client
# runs maintain() in a loop.  Afterwards, one more maintain() folds what is
# left, and the rollups must hold exactly the committed events: as many as
# pgbench counted for the track script, as many as the events table holds,
# and nothing counted twice.  Also: no client failed (maintain never
# deadlocked with or aborted a tracker).
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('load');
$node->init;
$node->append_conf('postgresql.conf', 'max_connections = 50');
$node->start;

$node->safe_psql('postgres', q{
CREATE EXTENSION flagmeter;
SELECT flagmeter.define_meter('calls');
SELECT flagmeter.define_plan('p');
SELECT flagmeter.set_limit('p', 'calls', 1000000000, 'day');
SELECT flagmeter.assign_plan('t' || g, 'p') FROM generate_series(1, 20) g;
});

# -n: no pgbench tables to vacuum.  Nine clients pick between two scripts
# by weight (track 8, maintain 1), so maintain() also races itself; any
# client error makes pgbench exit non-zero and fails this test.
$node->pgbench(
	'-n -c 9 -j 3 -T 8 -M prepared',
	0,
	[qr/processed: \d+/],
	[qr/^$/],
	'8 trackers and a maintain() loop run without errors',
	{
		'track.sql@8' => q{
\set tenant random(1, 20)
\set amount random(1, 5)
SELECT flagmeter.track('t' || :tenant, 'calls', :amount);
},
		'maintain.sql@1' => q{
SELECT flagmeter.maintain();
}
	});

$node->safe_psql('postgres', 'SELECT flagmeter.maintain()');

my $result = $node->safe_psql('postgres', q{
SELECT (SELECT count(*) FROM flagmeter.events) || ' ' ||
       (SELECT sum(amount) FROM flagmeter.events) || ' ' ||
       (SELECT sum(flagmeter.events(counter)) FROM flagmeter.rollup_hour) || ' ' ||
       (SELECT sum(flagmeter.used(counter)) FROM flagmeter.rollup_hour) || ' ' ||
       (SELECT sum(flagmeter.used(counter)) FROM flagmeter.rollup_day) || ' ' ||
       (SELECT sum(flagmeter.used(flagmeter.usage('t' || g, 'calls'))) FROM generate_series(1, 20) g) || ' ' ||
       (SELECT pending_events FROM flagmeter.stats) || ' ' ||
       (SELECT runs FROM flagmeter.stats)
});
my ($events, $sum, $rolled_events, $rolled_hour, $rolled_day, $counted, $pending, $runs) =
  split / /, $result;

cmp_ok($events, '>', 100, "the trackers committed events ($events)");
cmp_ok($runs, '>', 2, "maintain() ran repeatedly during the load ($runs runs)");
is($rolled_events, $events, 'the hourly rollups hold every committed event once');
is($rolled_hour, $sum, 'hourly rollup usage equals the raw events');
is($rolled_day, $sum, 'daily rollup usage equals the raw events');
is($counted, $sum, 'the period counters equal the raw events');
is($pending, 0, 'nothing is left to fold');

$node->stop;
done_testing();
