# test/t/100_inflight.pl -- consumes deciding without the row lock
# (src/inflight.c) across what ends a server's shared memory, and with its
# table full.
#
# The table holds nothing but the consumes of transactions in flight; the
# usage is the rows.  So:
#   1. crash: 16 pgbench clients consume one tenant's lifetime quota without
#      the row lock, each logging its decision in its own transaction; a
#      backend is killed (SIGKILL) in the middle, and the postmaster
#      restarts them all with fresh shared memory.  After recovery the
#      usage equals the logged grants and the events, nothing is in flight,
#      and a second load uses the quota up exactly, never past it;
#   2. restart with another table size (what a new library version or an
#      upgrade of PostgreSQL does: both restart the server), while a
#      transaction holds a consume in flight: it is rolled back, and the
#      next consume gets its units; a transaction of 400 consumes of one
#      period keeps one slot of it per kind;
#   3. pg_dump and restore into another database while a consume is in
#      flight: the copy has the committed usage and decides on it;
#   4. failover: a physical standby promoted after the primary stops
#      decides on the replicated rows: the quota is used up exactly;
#   5. a table of 16 entries under 24 clients consuming 64 tenants, with a
#      consume under the row lock (with a key) in the same transactions:
#      consumes fall back to the row lock and lockers overflow the table,
#      no call fails, and every tenant's usage is exact and within its
#      quota; a transaction that overflowed the table cannot be prepared.
use strict;
use warnings;

use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);

# the crash node's quota: the crash comes long before it is used up
my $quota = 200000;
# the standby's, used up on it
my $failover_quota = 3000;

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
	my ($node, $db, $quota) = @_;
	$node->safe_psql(
		$db, qq{
		SET client_min_messages = warning;
		CREATE EXTENSION flagmeter;
		SELECT flagmeter.define_meter('m');
		SELECT flagmeter.define_plan('p');
		SELECT flagmeter.set_limit('p', 'm', $quota, 'lifetime');
		SELECT flagmeter.assign_plan('hot', 'p');
		CREATE TABLE decisions (amount bigint, granted boolean, used bigint);
	});
}

# pgbench in the background: the harness, and its output
sub start_pgbench
{
	my ($node, $args, $script) = @_;
	my $dir = PostgreSQL::Test::Utils::tempdir;
	my $file = "$dir/script.sql";
	open my $fh, '>', $file or die $!;
	print $fh $script;
	close $fh;
	my ($out, $err) = ('', '');
	my @cmd = ('pgbench', '--no-vacuum', split(/ /, $args), '-f', $file,
		'-h', $node->host, '-p', $node->port, 'postgres');
	my $h = IPC::Run::start(\@cmd, '>', \$out, '2>', \$err);
	return { h => $h, out => \$out, err => \$err };
}

# consumes of lo .. hi units, each logging its decision
sub consume_script
{
	my ($lo, $hi) = @_;
	return qq{
\\set amount random($lo, $hi)
INSERT INTO decisions SELECT :amount, d.granted, d.used
FROM flagmeter.consume('hot', 'm', (:amount)::bigint) AS d;
};
}
my $consume_script = consume_script(1, 10);

# the invariants of one tenant's usage against its logged decisions
sub check_exact
{
	my ($node, $db, $what, $quota) = @_;
	my $row = $node->safe_psql(
		$db, qq{
		SELECT flagmeter.used(flagmeter.usage('hot', 'm')),
		       (SELECT coalesce(sum(amount), 0) FROM flagmeter.events WHERE tenant = 'hot'),
		       (SELECT coalesce(sum(amount), 0) FROM decisions WHERE granted),
		       (SELECT count(*) FROM decisions WHERE granted AND used > $quota)});
	my ($used, $events, $granted, $broken) = split /\|/, $row;
	cmp_ok($used, '<=', $quota, "$what: used never exceeds the quota");
	is($events, $used, "$what: used equals the sum of the events");
	is($granted, $used, "$what: used equals the sum of the granted amounts");
	# A grant's used counts the consumes in flight it was decided with, and
	# those the crash rolled back never committed: so grants do not form one
	# chain here (010_consume_pgbench checks that where nothing rolls back),
	# but none saw usage past the quota.
	is($broken, '0', "$what: no grant reported usage past the quota");
	return $used;
}

# 1. crash
my $node = preloaded_node('inflight_crash');
$node->append_conf('postgresql.conf', 'restart_after_crash = on');
$node->start;
setup_meter($node, 'postgres', $quota);
my $load = start_pgbench($node, '--client=16 --jobs=4 --time=60', $consume_script);
# kill once a few hundred consumes have committed
my $waited = 0;
while ($node->safe_psql('postgres', 'SELECT count(*) FROM decisions') < 300
	&& $waited++ < 600)
{
	usleep(50_000);
}
# a backend killed: the postmaster ends every other one and starts afresh,
# shared memory and the table of consumes in flight with it
my $victim = $node->safe_psql('postgres',
	q{SELECT pid FROM pg_stat_activity
	  WHERE backend_type = 'client backend' AND pid <> pg_backend_pid() LIMIT 1});
die "no backend of the load to kill: ${$load->{err}}" unless $victim =~ /^\d+$/;
kill 'KILL', $victim;
$load->{h}->finish;
note "the load, killed: ${$load->{err}}";
$node->poll_query_until('postgres', 'SELECT NOT pg_is_in_recovery()')
  or die 'the server did not come back';
like(slurp_file($node->logfile), qr/terminated by signal 9/,
	'the server went through a crash restart');
my $before = check_exact($node, 'postgres', 'after the crash', $quota);
cmp_ok($before, '>', 0, 'the crash came after some consumes were granted');
cmp_ok($before, '<', $quota, 'and before the quota was used up');
is($node->safe_psql('postgres', 'SELECT in_flight FROM flagmeter.consumes_in_flight()'),
	'0', 'nothing is in flight after the restart');
$node->pgbench('--no-vacuum --client=16 --jobs=4 --transactions=40', 0,
	[qr{number of failed transactions: 0 }], [qr{^$}],
	'a second load after the crash: no failed transaction',
	{ '100_inflight_consume' => consume_script(100, 1000) });
my $after = check_exact($node, 'postgres', 'after the second load', $quota);
cmp_ok($quota - $after, '<', 1000, 'the quota is used up to less than the largest call');
cmp_ok($node->safe_psql('postgres', 'SELECT lock_free FROM flagmeter.consumes_in_flight()'),
	'>=', 16 * 40, 'the second load decided without the row lock');

# 2. restart with another table size, a consume in flight
$node->safe_psql('postgres', q{SELECT flagmeter.assign_plan('r', 'p')});
my ($in, $out, $err) = ('', '', '');
my $psql = IPC::Run::start(
	[ 'psql', '-X', '-At', '-h', $node->host, '-p', $node->port, 'postgres' ],
	'<', \$in, '>', \$out, '2>', \$err);
$in .= "BEGIN;\nSELECT granted FROM flagmeter.consume('r', 'm', $quota);\n";
$psql->pump until $out =~ /t\n/ or $err ne '';
is($node->safe_psql('postgres', 'SELECT in_flight FROM flagmeter.consumes_in_flight()'),
	'1', 'a consume is in flight');
$node->append_conf('postgresql.conf', 'flagmeter.inflight_periods = 64');
$node->restart;
$psql->kill_kill;
is($node->safe_psql('postgres', 'SELECT capacity FROM flagmeter.consumes_in_flight()'),
	'64', 'the restarted server has the new table size');
is($node->safe_psql('postgres', "SELECT granted FROM flagmeter.consume('r', 'm', $quota)"),
	't', 'the units of the consume the restart rolled back are granted again');

# one transaction, 200 consumes of one period with keys, then 200 without:
# one slot of the period each way, no overflow, no fall-back
$node->safe_psql('postgres', q{SELECT flagmeter.assign_plan('many', 'p');
	BEGIN;
	SELECT count(*) FROM generate_series(1, 200) g, flagmeter.consume('many', 'm', 1, 'k' || g) d;
	SELECT count(*) FROM generate_series(1, 200) g, flagmeter.consume('many', 'm', 1 + 0 * g) d;
	COMMIT;});
is( $node->safe_psql('postgres',
		q{SELECT fell_back || ' ' || overflowed || ' ' || in_flight FROM flagmeter.consumes_in_flight();
		  SELECT flagmeter.used(flagmeter.usage('many', 'm'))}),
	"0 0 0
400",
	'400 consumes in one transaction take one slot each way: nothing fell back or overflowed');

# 3. pg_dump and restore while a consume is in flight
$node->safe_psql('postgres', q{SELECT flagmeter.assign_plan('d', 'p');
	SELECT flagmeter.consume('d', 'm', 100)});
($in, $out, $err) = ('', '', '');
$psql = IPC::Run::start(
	[ 'psql', '-X', '-At', '-h', $node->host, '-p', $node->port, 'postgres' ],
	'<', \$in, '>', \$out, '2>', \$err);
$in .= "BEGIN;\nSELECT granted FROM flagmeter.consume('d', 'm', 2900);\n";
$psql->pump until $out =~ /t\n/ or $err ne '';
my $dump = PostgreSQL::Test::Utils::tempdir . '/dump.sql';
$node->command_ok([ 'pg_dump', '-h', $node->host, '-p', $node->port, '-f', $dump, 'postgres' ],
	'pg_dump while a consume is in flight');
$node->safe_psql('postgres', 'CREATE DATABASE restored');
$node->command_ok([ 'psql', '-X', '-q', '-v', 'ON_ERROR_STOP=1', '-h', $node->host,
	'-p', $node->port, '-f', $dump, 'restored' ], 'the dump restores');
is($node->safe_psql('restored', q{SELECT flagmeter.used(flagmeter.usage('d', 'm'))}),
	'100', 'the copy has the committed usage, not the consume in flight');
is($node->safe_psql('restored',
	q{SELECT granted || ' ' || used FROM flagmeter.consume('d', 'm', 2900)}),
	'true 3000', 'the copy decides on its own rows');
$in .= "ROLLBACK;\n\\q\n";
$psql->finish;
$node->stop;

# 4. failover to a physical standby
my $primary = preloaded_node('inflight_primary', allows_streaming => 1);
$primary->start;
setup_meter($primary, 'postgres', $failover_quota);
$primary->pgbench('--no-vacuum --client=8 --jobs=2 --transactions=20', 0,
	[qr{number of failed transactions: 0 }], [qr{^$}],
	'consumes on the primary',
	{ '100_inflight_primary' => $consume_script });
$primary->backup('b');
my $standby = PostgreSQL::Test::Cluster->new('inflight_standby');
$standby->init_from_backup($primary, 'b', has_streaming => 1);
$standby->start;
$primary->pgbench('--no-vacuum --client=8 --jobs=2 --transactions=20', 0,
	[qr{number of failed transactions: 0 }], [qr{^$}],
	'more consumes on the primary, streamed',
	{ '100_inflight_streamed' => $consume_script });
$primary->wait_for_catchup($standby);
$primary->stop('immediate');
$standby->promote;
$standby->pgbench('--no-vacuum --client=16 --jobs=4 --transactions=100', 0,
	[qr{number of failed transactions: 0 }], [qr{^$}],
	'consumes on the promoted standby',
	{ '100_inflight_promoted' => $consume_script });
my $promoted = check_exact($standby, 'postgres', 'after the failover', $failover_quota);
cmp_ok($failover_quota - $promoted, '<', 10, 'the promoted standby used the quota up exactly');
$standby->stop;

# 5. a full table
my $full = preloaded_node('inflight_full');
$full->append_conf('postgresql.conf',
	"flagmeter.inflight_periods = 16\nmax_prepared_transactions = 2");
$full->start;
$full->safe_psql(
	'postgres', q{
	SET client_min_messages = warning;
	CREATE EXTENSION flagmeter;
	SELECT flagmeter.define_meter('m');
	SELECT flagmeter.define_plan('p');
	SELECT flagmeter.set_limit('p', 'm', 30, 'lifetime');
	SELECT flagmeter.assign_plan('t' || g, 'p') FROM generate_series(1, 64) g;
});
# tenants in one order in every transaction: no deadlock of two row locks
$full->pgbench('--no-vacuum --client=24 --jobs=4 --transactions=60', 0,
	[qr{number of failed transactions: 0 }], [qr{^$}],
	'24 clients over 64 tenants with a table of 16: no failed transaction',
	{
		'100_inflight_full' => q{
\set a random(1, 32)
\set b :a + 32
BEGIN;
SELECT flagmeter.consume('t' || :a, 'm', 1);
SELECT pg_sleep(0.002);
SELECT flagmeter.consume('t' || :b, 'm', 1, 'k' || :client_id || '-' || random());
COMMIT;
}
	});
is( $full->safe_psql(
		'postgres', q{
		SELECT count(*) FROM generate_series(1, 64) g
		WHERE flagmeter.used(flagmeter.usage('t' || g, 'm')) > 30
		   OR flagmeter.used(flagmeter.usage('t' || g, 'm')) <>
		      (SELECT count(*) FROM flagmeter.events e WHERE e.tenant = 't' || g)}),
	'0', 'every tenant within its quota, its usage equal to its events');
my ($fell_back, $overflowed, $in_flight) = split /\|/,
  $full->safe_psql('postgres',
	'SELECT fell_back, overflowed, in_flight FROM flagmeter.consumes_in_flight()');
cmp_ok($fell_back, '>', 0, 'consumes fell back to the row lock');
cmp_ok($overflowed, '>', 0, 'lockers found the table full');
is($in_flight, '0', 'nothing is left in flight');

# 64 tenants in one transaction over 16 entries: some of its consumes find
# no room, take the row lock and are counted as overflowing lockers, whose
# end only this backend's commit or rollback records: it cannot be prepared
my ($prep_rc, $prep_out, $prep_err) = $full->psql(
	'postgres', q{
	SELECT count(*) FROM generate_series(1, 64) g, flagmeter.assign_plan('p' || g, 'p') a;
	BEGIN;
	SELECT count(*) FROM generate_series(1, 64) g, flagmeter.consume('p' || g, 'm', 1) d;
	PREPARE TRANSACTION 'fm_full';});
like($prep_err,
	qr/cannot PREPARE a transaction that consumed while flagmeter's table of consumes in flight was full/,
	'a transaction that overflowed the table cannot be prepared');
is($full->safe_psql('postgres',
		q{SELECT count(*) FROM pg_prepared_xacts; SELECT in_flight FROM flagmeter.consumes_in_flight()}),
	"0\n0", 'nothing was prepared, and nothing is left in flight');
$full->stop;

done_testing();
