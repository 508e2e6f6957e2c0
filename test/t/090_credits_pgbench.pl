# test/t/090_credits_pgbench.pl -- credit grants and reservations under load
# (issue 19).
#
# 32 pgbench clients ask 1..10 units at a time of one tenant with a lifetime
# hard quota of 100 and five grants: three active ones of priorities 0, 1
# and 1 (the two of priority 1 expiring at different times), one that
# expired before the run with units left, and one that starts after it.
# Two transactions in three consume; the third reserves, then at random
# settles an actual amount of at most what it reserved, or releases the
# hold.  About 17 600 units are asked for, so quota and grants run out early
# and most later calls are refused.  Each transaction logs its decisions in
# the same transaction as its calls.  Afterwards:
#   - no grant is drawn past its amount or below zero, and neither the
#     expired nor the pending grant is drawn at all;
#   - what the grants lost equals the sum of from_grants of the granted
#     consumes and the settles, and every unit past the quota came from
#     them;
#   - usage is the granted consumes plus the settled amounts, and no hold
#     is left open;
#   - the draw order held: a grant was drawn only once every grant before
#     it in the order was used up (priority, then soonest expiry, then id);
#   - the balance is less than the smallest refused amount;
#   - pgbench reports no failed transaction.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $clients = 32;
my $per_client = 100;
my $transactions = $clients * $per_client;
my $quota = 100;

my $node = PostgreSQL::Test::Cluster->new('credits_pgbench');
$node->init;
$node->append_conf('postgresql.conf', 'max_connections = 60');
$node->append_conf('postgresql.conf', 'log_statement = none');
$node->start;

$node->safe_psql(
	'postgres', qq{
	CREATE EXTENSION flagmeter;
	SELECT flagmeter.define_meter('m');
	SELECT flagmeter.define_plan('p');
	SELECT flagmeter.set_limit('p', 'm', $quota, 'lifetime');
	SELECT flagmeter.assign_plan('t', 'p');
	SELECT flagmeter.grant_credits('t', 'm', 300, priority => 1, expires_at => now() + interval '2 days', idempotency_key => 'late');
	SELECT flagmeter.grant_credits('t', 'm', 200, priority => 0, idempotency_key => 'first');
	SELECT flagmeter.grant_credits('t', 'm', 250, priority => 1, expires_at => now() + interval '1 day', idempotency_key => 'soon');
	SELECT flagmeter.grant_credits('t', 'm', 500, priority => -1, starts_at => now() - interval '2 days',
	                               expires_at => now() - interval '1 day', idempotency_key => 'expired');
	SELECT flagmeter.grant_credits('t', 'm', 500, priority => -1, starts_at => now() + interval '1 day',
	                               idempotency_key => 'pending');
	CREATE TABLE decisions (
		kind		text NOT NULL,
		amount		bigint NOT NULL,
		granted		boolean NOT NULL,
		from_grants	bigint NOT NULL,
		balance		bigint NOT NULL
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
	"pgbench: $clients clients x $per_client consumes and reservations of a tenant with grants, no failed transaction",
	{
		'090_credits_pgbench_consume@2' => q{
\set amount random(1, 10)
INSERT INTO decisions (kind, amount, granted, from_grants, balance)
SELECT 'consume', :amount, d.granted, d.from_grants, d.balance
FROM flagmeter.consume('t', 'm', (:amount)::bigint) AS d;
},
		'090_credits_pgbench_reserve@1' => q{
\set amount random(1, 10)
\set actual random(0, :amount)
\set settle random(0, 1)
WITH r AS (SELECT * FROM flagmeter.reserve('t', 'm', (:amount)::bigint, ttl => '1 hour')),
s AS (SELECT d.* FROM r, LATERAL flagmeter.settle(r.reservation_id, (:actual)::bigint) d
      WHERE r.granted AND :settle = 1),
l AS (SELECT flagmeter.release(r.reservation_id) AS released FROM r
      WHERE r.granted AND :settle = 0)
INSERT INTO decisions (kind, amount, granted, from_grants, balance)
SELECT 'settle', :actual, s.granted, s.from_grants, s.balance FROM s
UNION ALL SELECT 'reserve', :amount, r.granted, 0, r.balance FROM r
UNION ALL SELECT 'release', 0, l.released, 0, 0 FROM l;
}
	});

sub query
{
	my ($sql) = @_;
	return $node->safe_psql('postgres', $sql);
}

my $used = query("SELECT flagmeter.used(flagmeter.usage('t', 'm'))");
my $drawn = query("SELECT sum(drawn) FROM flagmeter.credit_grants");
my $active = 200 + 300 + 250;
note "used $used, $drawn drawn from grants";

is(query("SELECT count(*) FROM flagmeter.credit_grants WHERE drawn > amount OR drawn < 0"),
	'0', 'no grant drawn past its amount or below zero');
is( query(
		"SELECT string_agg(idempotency_key || '=' || drawn, ',' ORDER BY idempotency_key) FROM flagmeter.credit_grants WHERE idempotency_key IN ('expired', 'pending')"
	),
	'expired=0,pending=0',
	'neither the expired nor the not yet started grant was drawn');
cmp_ok(query("SELECT count(*) FROM decisions WHERE kind = 'settle'"), '>', 0,
	'reservations were settled');
cmp_ok(query("SELECT count(*) FROM decisions WHERE kind = 'release'"), '>', 0,
	'reservations were released');
is(query("SELECT count(*) FROM decisions WHERE kind = 'settle' AND NOT granted"),
	'0', 'a settle is never refused');
is(query("SELECT coalesce(sum(from_grants), 0) FROM decisions WHERE granted"),
	$drawn, 'what the grants lost is the sum of from_grants of the granted consumes and settles');
is(query("SELECT count(*) FROM decisions WHERE NOT granted AND from_grants <> 0"),
	'0', 'a refused consume drew nothing');
is($used - $quota, $drawn, 'every unit past the quota came from the grants');
is( query(
		"SELECT coalesce(sum(amount), 0) FROM decisions WHERE granted AND kind IN ('consume', 'settle')"),
	$used, 'used equals the granted consumes plus the settled amounts');
is( query(
		"SELECT count(*) FROM flagmeter.reservations WHERE settled_at IS NULL AND released_at IS NULL"),
	'0', 'no hold is left open');
cmp_ok($used, '<=', $quota + $active, 'used never exceeds quota plus the active grants');
cmp_ok($quota + $active - $used, '<', 10,
	'quota and grants are used up to less than the largest amount asked');
is( query(
		"SELECT string_agg(idempotency_key || '=' || drawn, ',' ORDER BY idempotency_key) FROM flagmeter.credit_grants WHERE idempotency_key IN ('first', 'soon', 'late')"
	),
	$quota + $active - $used > 0
	? query(q{SELECT 'first=200,late=' || (300 - (SELECT flagmeter.balance('t', 'm'))) || ',soon=250'})
	: 'first=200,late=300,soon=250',
	'drawn in order: priority 0, then the sooner of the two of priority 1, then the later');
is(query("SELECT flagmeter.balance('t', 'm')"), $quota + $active - $used,
	'balance is what quota and active grants have left');
is( query(
		"SELECT count(*) FROM decisions WHERE NOT granted AND kind IN ('consume', 'reserve') AND amount <= balance"),
	'0', 'every refusal was for more than the balance it reported');

$node->stop;
done_testing();
