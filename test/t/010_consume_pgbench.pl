# test/t/010_consume_pgbench.pl -- consume at a hard limit under load.
#
# 32 pgbench clients race for one tenant's lifetime hard limit of 1000 units,
# each running 100 consumes of a random 1..10 units: about 17 600 units asked
# for, so the limit is reached early and most later calls are refused.  Each
# transaction logs the decision it got into a table of this test, in the
# same transaction as the consume, so the decisions can be checked against
# the usage and the raw events afterwards:
#   - used never exceeds the quota, and equals the sum of the events rows
#     (one per granted consume) and of the granted amounts;
#   - the grants form one chain (each grant's used is the previous grant's
#     used plus its amount): no two grants decided on the same usage;
#   - every refusal was for more than what was left at that moment, and the
#     quota is used up to less than the smallest refused amount (< 10);
#   - pgbench reports no failed transaction.
#
# Twice: on a server without flagmeter preloaded, where every consume
# decides under its period's stripe 0 row lock, and preloaded, where they
# decide without it (src/inflight.c); the second round also checks that
# they did.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $clients = 32;
my $per_client = 100;
my $transactions = $clients * $per_client;
my $quota = 1000;

our $node;

# One value of a one-row, one-column query.
sub query
{
	my ($sql) = @_;
	return $::node->safe_psql('postgres', $sql);
}

foreach my $mode ('row_lock', 'lock_free')
{
	note "consumes deciding: $mode";
	$node = PostgreSQL::Test::Cluster->new("consume_pgbench_$mode");
	$node->init;
	$node->append_conf('postgresql.conf', 'max_connections = 60');
	$node->append_conf('postgresql.conf', "shared_preload_libraries = 'flagmeter'")
	  if $mode eq 'lock_free';
	# 3 200 statements: keep the server log short
	$node->append_conf('postgresql.conf', 'log_statement = none');
	$node->start;

	$node->safe_psql(
		'postgres', qq{
		CREATE EXTENSION flagmeter;
		SELECT flagmeter.define_meter('m');
		SELECT flagmeter.define_plan('p');
		SELECT flagmeter.set_limit('p', 'm', $quota, 'lifetime');
		SELECT flagmeter.assign_plan('t', 'p');
		CREATE TABLE decisions (
			amount		bigint NOT NULL,
			granted		boolean NOT NULL,
			used		bigint NOT NULL,
			remaining	bigint NOT NULL
		);
	});

	$node->pgbench(
		"--no-vacuum --client=$clients --jobs=4 --transactions=$per_client",
		0,
		[
			qr{number of transactions actually processed: $transactions/$transactions},
			qr{number of failed transactions: 0 \(0\.000%\)}
		],
		[qr{^$}],
		"$mode: pgbench: $clients clients x $per_client consumes, no failed transaction",
		{
			'010_consume_pgbench_consume' => q{
	\set amount random(1, 10)
	INSERT INTO decisions (amount, granted, used, remaining)
	SELECT :amount, d.granted, d.used, d.remaining
	FROM flagmeter.consume('t', 'm', (:amount)::bigint) AS d;
	}
		});

	my $used = query("SELECT flagmeter.used(flagmeter.usage('t', 'm'))");
	my $events_sum = query(
		"SELECT coalesce(sum(amount), 0) FROM flagmeter.events WHERE tenant = 't' AND meter = 'm'"
	);
	my $events = query(
		"SELECT count(*) FROM flagmeter.events WHERE tenant = 't' AND meter = 'm'");
	my $logged = query("SELECT count(*) FROM decisions");
	my $granted = query("SELECT count(*) FROM decisions WHERE granted");
	my $granted_sum =
	  query("SELECT coalesce(sum(amount), 0) FROM decisions WHERE granted");
	note "used $used of $quota, $granted of $logged consumes granted";

	cmp_ok($used, '<=', $quota, 'used never exceeds the hard limit');
	cmp_ok($events_sum, '<=', $quota,
		'the recorded events never add up past the hard limit');
	is($events_sum, $used, 'used equals the sum of the recorded events');
	cmp_ok($quota - $used, '<', 10,
		'the quota is used up to less than the largest amount asked (remaining < 10)'
	);
	is(
		query("SELECT remaining FROM flagmeter.check('t', 'm', 1)"),
		$quota - $used,
		'check reports remaining = quota - used');

	is($logged, $transactions, 'every transaction logged its decision');
	is($events, $granted, 'one events row per granted consume, none for a refusal');
	is($granted_sum, $used, 'used equals the sum of the granted amounts');
	cmp_ok($granted, '>=', int(($used + 9) / 10),
		'at least used / 10 consumes were granted (each asks for at most 10)');
	cmp_ok($granted, '<=', $used,
		'at most used consumes were granted (each asks for at least 1)');
	cmp_ok($granted, '<', $transactions,
		'demand exceeded the quota: some consumes were refused');

	is( query(
			q{SELECT count(*) FROM (
				SELECT used, amount, lag(used, 1, 0::bigint) OVER (ORDER BY used) AS before
				FROM decisions WHERE granted) g
			  WHERE used - amount <> before}),
		'0',
		'the grants form one chain: each grant adds its amount to the previous grant\'s used'
	);
	is(query("SELECT count(*) FROM decisions WHERE used + remaining <> $quota"),
		'0', 'every decision reports used + remaining = quota');
	is( query(
			"SELECT count(*) FROM decisions WHERE NOT granted AND amount <= remaining"),
		'0',
		'every refusal was for more than what remained when it was decided');
	cmp_ok(
		$quota - $used, '<',
		query("SELECT min(amount) FROM decisions WHERE NOT granted"),
		'what is left is less than the smallest refused amount');

	if ($mode eq 'lock_free')
	{
		cmp_ok(query('SELECT lock_free FROM flagmeter.consumes_in_flight()'),
			'>=', $transactions, 'every consume decided without the row lock');
		is(query('SELECT fell_back FROM flagmeter.consumes_in_flight()'),
			'0', 'none fell back to the row lock');
		is(query('SELECT in_flight FROM flagmeter.consumes_in_flight()'),
			'0', 'nothing is left in flight');
	}

	$node->stop;
}

done_testing();
