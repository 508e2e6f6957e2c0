# test/t/020_pg_cron.pl -- pg_cron really runs flagmeter.maintain().
#
# schedule() registers the job "flagmeter-maintain" every minute (pg_cron
# 1.4 has no seconds schedules), so this waits up to two minutes for
# cron.job_run_details to show a successful run, then checks its effect:
# the events tracked before are folded into the rollups.  unschedule()
# removes the job.  It also checks that flagmeter installs and works in a
# database without pg_cron, and that schedule() there says why it cannot.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('cron');
$node->init;
$node->append_conf('postgresql.conf', qq{
shared_preload_libraries = 'pg_cron'
cron.database_name = 'postgres'
# jobs run in background workers: the test cluster has no TCP listener for
# pg_cron's default libpq connection to localhost
cron.use_background_workers = on
});
$node->start;

$node->safe_psql('postgres', q{
CREATE EXTENSION pg_cron;
CREATE EXTENSION flagmeter;
-- tenants without a plan, events of March 2026
SELECT flagmeter.configure(unassigned_tenants => 'unlimited', late_events => '100 years');
SELECT flagmeter.define_meter('calls');
SELECT flagmeter.track('t' || g % 5, 'calls', g, '2026-03-01 10:00:00+00')
FROM generate_series(1, 100) g;
});

my $job = $node->safe_psql('postgres', 'SELECT flagmeter.schedule()');
like($job, qr/^\d+$/, 'schedule() returns the job id');
is( $node->safe_psql('postgres',
		q{SELECT schedule || ' ' || command FROM cron.job WHERE jobname = 'flagmeter-maintain'}),
	'* * * * * SELECT flagmeter.maintain()',
	'the job runs maintain() every minute');
is($node->safe_psql('postgres', 'SELECT flagmeter.schedule()'),
	$job, 'scheduling again replaces the job in place');

# pg_cron starts jobs at the top of the minute: wait up to two of them.
my $ran = $node->poll_query_until('postgres', qq{
SELECT EXISTS (SELECT FROM cron.job_run_details
               WHERE jobid = $job AND status = 'succeeded')
}, 't');
ok($ran, 'pg_cron ran maintain() successfully');

is( $node->safe_psql('postgres', q{
SELECT (SELECT sum(flagmeter.used(counter)) FROM flagmeter.rollup_day)
       || ' ' || (SELECT pending_events FROM flagmeter.stats)
       || ' ' || (SELECT runs > 0 FROM flagmeter.stats)}),
	'5050 0 true',
	'the scheduled run folded every event');

is($node->safe_psql('postgres', 'SELECT flagmeter.unschedule()'),
	't', 'unschedule() removes the job');
is($node->safe_psql('postgres', 'SELECT flagmeter.unschedule()'),
	'f', 'unschedule() without a job says so');
is( $node->safe_psql('postgres',
		q{SELECT count(*) FROM cron.job WHERE jobname = 'flagmeter-maintain'}),
	'0', 'no job is left');

# Without pg_cron in the database, flagmeter installs and works; schedule()
# explains.
$node->safe_psql('postgres', 'CREATE DATABASE nocron');
$node->safe_psql('nocron', q{
CREATE EXTENSION flagmeter;
SELECT flagmeter.configure(unassigned_tenants => 'unlimited');
SELECT flagmeter.define_meter('calls');
SELECT flagmeter.track('t', 'calls');
SELECT flagmeter.maintain();
});
my ($ret, $stdout, $stderr) = $node->psql('nocron', 'SELECT flagmeter.schedule()');
isnt($ret, 0, 'schedule() fails without pg_cron');
like($stderr, qr/extension "pg_cron" is not installed in this database/,
	'and says pg_cron is missing');
like($stderr, qr/HINT:.*flagmeter\.maintain\(\)/, 'with a hint to run maintain() otherwise');

$node->stop;
done_testing();
