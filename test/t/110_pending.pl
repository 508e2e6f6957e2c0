# test/t/110_pending.pl -- one write per track (src/pending.c) across what
# ends a server's shared memory, and with its table too small.
#
# A track's amount is pending in shared memory until maintain() folds it;
# the events are the durable record (period_start set, xid at or above
# counted_through).  So:
#   1. crash: 16 pgbench clients track 40 tenants (one by one and with
#      track_batch, whose periods are pending too), maintain() folds in the
#      middle, and a backend is killed (SIGKILL): the postmaster restarts
#      them all with empty shared memory.  The first call rebuilds the
#      pending usage from the events: every tenant's usage equals the sum
#      of its events, and stays so under a second load and another fold; a
#      transaction prepared before the crash (its amounts went into a stripe
#      as it was prepared) commits afterwards and counts once;
#   2. a restart with a table too small for the pending periods: they are
#      read from the events (exact), tracks write stripes meanwhile, and the
#      next maintain() folds the events and hands the database back to the
#      table;
#   3. a physical standby reads the pending usage from the replicated
#      events (it has no table of its own), before and after a fold on the
#      primary; promoted after the primary stops, it rebuilds and goes on;
#   4. pg_dump and restore into another cluster: after_restore() counts the
#      pending events into the rows, and the copy's usage is the original's.
use strict;
use warnings;

use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);

my $tenants = 40;

sub preloaded_node
{
	my ($name, %opts) = @_;
	my $node = PostgreSQL::Test::Cluster->new($name);
	$node->init(%opts);
	$node->append_conf('postgresql.conf', qq{
max_connections = 60
log_statement = none
shared_preload_libraries = 'flagmeter'
});
	return $node;
}

sub setup_meter
{
	my ($node) = @_;
	$node->safe_psql(
		'postgres', q{
		SET client_min_messages = warning;
		CREATE EXTENSION flagmeter;
		-- the tracked tenants t1, t2... have no plan
		SELECT flagmeter.configure(unassigned_tenants => 'unlimited');
		SELECT flagmeter.define_meter('m');
		SELECT flagmeter.define_plan('p');
		SELECT flagmeter.set_limit('p', 'm', 1000000000, 'lifetime');
	});
}

my $track_script = qq{
\\set t random(1, $tenants)
\\set amount random(1, 9)
SELECT flagmeter.track('t' || :t, 'm', :amount);
};
# a batch of four events of random tenants, each period pending as track's
my $batch_script = qq{
SELECT flagmeter.track_batch(ARRAY(SELECT 't' || (1 + floor(random() * $tenants)::int)
                                   FROM generate_series(1, 4)),
                             array_fill('m'::text, ARRAY[4]), ARRAY[1, 2, 3, 4]::bigint[]);
};

# tenants whose usage differs from the sum of their events, and the total
sub mismatches
{
	my ($node, $db) = @_;
	return $node->safe_psql(
		$db // 'postgres', q{
		SELECT count(*) FILTER (WHERE used <> events) || ' ' || coalesce(sum(used), 0)
		FROM (SELECT e.tenant, sum(e.amount) AS events,
		             flagmeter.used(flagmeter.usage(e.tenant, 'm')) AS used
		      FROM flagmeter.events e GROUP BY e.tenant) t});
}

sub stats
{
	my ($node, $db) = @_;
	return $node->safe_psql($db // 'postgres',
		'SELECT status, rebuilt, no_room FROM flagmeter.pending_usage_stats()');
}

# 1. crash
my $node = preloaded_node('pending_crash');
$node->append_conf('postgresql.conf', "restart_after_crash = on\nmax_prepared_transactions = 4");
$node->start;
setup_meter($node);
my $dir = PostgreSQL::Test::Utils::tempdir;
open my $fh, '>', "$dir/track.sql" or die $!;
print $fh $track_script;
close $fh;
open $fh, '>', "$dir/batch.sql" or die $!;
print $fh $batch_script;
close $fh;
my ($out, $err) = ('', '');
my $load = IPC::Run::start(
	[ 'pgbench', '--no-vacuum', '--client=16', '--jobs=4', '--time=60', '-f', "$dir/track.sql",
	  '-f', "$dir/batch.sql",
	  '-h', $node->host, '-p', $node->port, 'postgres' ],
	'>', \$out, '2>', \$err);
my $waited = 0;
while ($node->safe_psql('postgres', 'SELECT count(*) FROM flagmeter.events') < 2000
	&& $waited++ < 600)
{
	usleep(50_000);
}
$node->safe_psql('postgres', 'SELECT flagmeter.maintain()');
$waited = 0;
while ($node->safe_psql('postgres', 'SELECT count(*) FROM flagmeter.events') < 4000
	&& $waited++ < 600)
{
	usleep(50_000);
}
my ($pending_before) = $node->safe_psql('postgres',
	q{SELECT count(*) FROM flagmeter.events e, flagmeter.current_state s
	  WHERE e.period_start IS NOT NULL AND e.xid >= flagmeter.xid_int(s.counted_through)});
cmp_ok($pending_before, '>', 0, 'before the crash, some events are pending');
cmp_ok($node->safe_psql('postgres',
		q{SELECT count(*) FROM flagmeter.counters WHERE stripe = 32767}),
	'>', 0, 'and maintain() folded others into the merged stripes');
$node->safe_psql('postgres', q{BEGIN; SELECT flagmeter.track('t1', 'm', 1000);
	SELECT flagmeter.track_batch(ARRAY['t2', 't3'], ARRAY['m', 'm'], ARRAY[100, 200]::bigint[]);
	PREPARE TRANSACTION 'before_the_crash'});
my $victim = $node->safe_psql('postgres',
	q{SELECT pid FROM pg_stat_activity
	  WHERE backend_type = 'client backend' AND pid <> pg_backend_pid() LIMIT 1});
die "no backend of the load to kill: $err" unless $victim =~ /^\d+$/;
kill 'KILL', $victim;
$load->finish;
$node->poll_query_until('postgres', 'SELECT NOT pg_is_in_recovery()')
  or die 'the server did not come back';
like(slurp_file($node->logfile), qr/terminated by signal 9/,
	'the server went through a crash restart');
my ($bad, $total) = split / /, mismatches($node);
is($bad, '0', 'after the crash every tenant\'s usage equals the sum of its events');
cmp_ok($total, '>', 0, 'and there is usage');
is(stats($node), 'in memory|1|0', 'the pending usage was rebuilt once, in memory');
$node->safe_psql('postgres', q{COMMIT PREPARED 'before_the_crash'});
($bad) = split / /, mismatches($node);
is($bad, '0', 'a transaction prepared before the crash commits after it and counts once');
$node->pgbench('--no-vacuum --client=16 --jobs=4 --transactions=200', 0,
	[qr{number of failed transactions: 0 }], [qr{^$}],
	'a second load after the crash: no failed transaction',
	{ '110_pending_track' => $track_script, '110_pending_batch' => $batch_script });
$node->safe_psql('postgres', 'SELECT flagmeter.maintain()');
($bad) = split / /, mismatches($node);
is($bad, '0', 'after the second load and a fold, still exact');

# 2. a restart with a table too small for the pending periods
$node->safe_psql('postgres', 'SELECT flagmeter.track(\'t\' || g, \'m\', 1) FROM generate_series(1, 40) g');
my $exact = mismatches($node);
$node->append_conf('postgresql.conf', 'flagmeter.pending_periods = 8');
$node->restart;
is(mismatches($node), $exact, 'pending usage that does not fit is read from the events: exact');
like(stats($node), qr/^read from the events \(did not fit\)\|1\|/,
	'the table does not hold the database');
$node->safe_psql('postgres', 'SELECT flagmeter.track(\'t1\', \'m\', 55)');
is($node->safe_psql('postgres',
		q{SELECT count(*) FROM flagmeter.events WHERE tenant = 't1' AND amount = 55
		  AND period_start IS NULL}),
	'1', 'meanwhile a track writes its stripe');
$node->safe_psql('postgres', 'SELECT flagmeter.maintain()');
is(stats($node), 'in memory|1|0', 'the fold of the events hands the database back to the table');
($bad) = split / /, mismatches($node);
is($bad, '0', 'and usage is exact');
$node->safe_psql('postgres', 'SELECT flagmeter.track(\'t2\', \'m\', 1)');
like($node->safe_psql('postgres', 'SELECT transactions FROM flagmeter.pending_usage_stats()'),
	qr/^[1-9]/, 'tracks are pending in memory again');
($bad) = split / /, mismatches($node);
is($bad, '0', 'still exact');
$node->stop;

# 3. a standby reads the replicated pending events; promoted, it rebuilds
my $primary = preloaded_node('pending_primary', allows_streaming => 1);
$primary->start;
setup_meter($primary);
$primary->backup('b');
my $standby = PostgreSQL::Test::Cluster->new('pending_standby');
$standby->init_from_backup($primary, 'b', has_streaming => 1);
$standby->start;
$primary->pgbench('--no-vacuum --client=8 --jobs=2 --transactions=100', 0,
	[qr{number of failed transactions: 0 }], [qr{^$}],
	'the primary tracks',
	{ '110_pending_primary' => $track_script, '110_pending_primary_batch' => $batch_script });
$primary->wait_for_catchup($standby);
my $on_primary = mismatches($primary);
is(mismatches($standby), $on_primary, 'the standby reads the same usage as the primary');
like(stats($standby), qr/^read from the events \(standby\)/, 'from the events');
$primary->safe_psql('postgres', 'SELECT flagmeter.maintain()');
$primary->wait_for_catchup($standby);
is(mismatches($standby), $on_primary, 'and the same after the primary folded');
$primary->safe_psql('postgres', 'SELECT flagmeter.track(\'t3\', \'m\', 4)');
$primary->wait_for_catchup($standby);
$on_primary = mismatches($primary);
$primary->stop;
$standby->promote;
is(mismatches($standby), $on_primary, 'promoted, it has the usage the primary had');
is(stats($standby), 'in memory|1|0', 'rebuilt in its own memory');
$standby->safe_psql('postgres', 'SELECT flagmeter.track(\'t3\', \'m\', 6)');
($bad) = split / /, mismatches($standby);
is($bad, '0', 'and it tracks on, exact');

# 4. pg_dump and restore into another cluster
my $dump = PostgreSQL::Test::Utils::tempdir . '/dump.sql';
$standby->command_ok(
	[ 'pg_dump', '-h', $standby->host, '-p', $standby->port, '-f', $dump, 'postgres' ],
	'pg_dump of a database with pending usage');
my $copy = preloaded_node('pending_copy');
$copy->start;
$copy->command_ok([ 'psql', '-X', '-q', '-v', 'ON_ERROR_STOP=1', '-h', $copy->host,
	'-p', $copy->port, '-f', $dump, 'postgres' ], 'restored into another cluster');
$copy->safe_psql('postgres', 'SELECT flagmeter.after_restore()');
is(mismatches($copy), mismatches($standby), 'after after_restore() the copy has the same usage');
is($copy->safe_psql('postgres',
		q{SELECT count(*) FROM flagmeter.events e, flagmeter.current_state s
		  WHERE e.period_start IS NOT NULL AND e.xid >= flagmeter.xid_int(s.counted_through)}),
	'0', 'counted into its rows: nothing pending');
$copy->safe_psql('postgres', 'SELECT flagmeter.track(\'t1\', \'m\', 2), flagmeter.maintain()');
($bad) = split / /, mismatches($copy);
is($bad, '0', 'the copy tracks and folds on, exact');

done_testing();
