# test/t/120_rate_limits.pl -- rate limits under load, across restarts, and
# without the shared memory they need.
#
#   1. 16 pgbench clients (16 sessions, as 16 app instances would be) call
#      limit() on one key for 10 s, far faster than it allows: the grants
#      never exceed burst + rate * t / per in any window of length t, over
#      the whole run and over every window of 1 s, and reach at least 95 %
#      of it.
#   2. The same with consume on a tenant whose plan has a rate limit and a
#      monthly quota: the usage recorded is exactly the consumes granted,
#      and it keeps the same bound.
#   3. A restart forgets the limiters (docs/design.md, "Rate limits"): a
#      key whose burst was spent has its whole burst again after it.
#   4. A table of 16 keys (flagmeter.rate_limit_keys = 16, one bucket): the
#      17th key that is not idle fails with 53400 and is counted, an idle
#      key makes room, and no key is granted more than its limit meanwhile.
#   5. Without flagmeter preloaded, the calls that need a limiter fail with
#      55000 and say to preload; consume without a rate limit works.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $clients = 16;
my $seconds = 10;

my $node = PostgreSQL::Test::Cluster->new('rate_limits');
$node->init;
$node->append_conf('postgresql.conf', "shared_preload_libraries = 'flagmeter'");
$node->append_conf('postgresql.conf', 'max_connections = 40');
$node->append_conf('postgresql.conf', 'log_statement = none');
$node->start;

sub query
{
	my ($sql) = @_;
	return $node->safe_psql('postgres', $sql);
}

# The answer of the last statement of several (set_test_clock's empty one
# comes first).
sub last_answer
{
	my @lines = split /\n/, query(@_);
	return $lines[-1];
}

query(
	q{
	CREATE EXTENSION flagmeter;
	SELECT flagmeter.configure(unassigned_tenants => 'unlimited');
	SELECT flagmeter.define_meter('calls', 'count');
	SELECT flagmeter.define_plan('api');
	SELECT flagmeter.set_limit('api', 'calls', 1000000);
	SELECT flagmeter.set_rate_limit('api', 'calls', 100, '1 second', 20);
	SELECT flagmeter.assign_plan('acme', 'api');
	-- one row per granted call: the clock read before the call and after it,
	-- so the limiter decided it at some time in [before, after]
	CREATE TABLE limit_grants (before timestamptz NOT NULL, after timestamptz NOT NULL);
	CREATE TABLE consume_grants (before timestamptz NOT NULL, after timestamptz NOT NULL);
});

# The grants of one run against the bound: over the whole run and over
# every window of 1 s that starts at a grant.  rate and burst are per
# second.  A grant was decided somewhere in its [before, after]: on a busy
# machine a backend may wait long between deciding and reading the clock,
# so each bound is taken over the widest span the decisions can have had,
# and each window counts only the grants that surely fell in it.
sub check_bound
{
	my ($table, $rate, $burst, $what) = @_;
	my ($granted, $widest, $narrowest) = split /\|/, query(
		"SELECT count(*), extract(epoch FROM max(after) - min(before)),
		        extract(epoch FROM max(before) - min(after)) FROM $table");
	my $bound = $burst + $rate * $widest;
	note "$what: $granted granted in $narrowest to $widest s, bound $bound";
	cmp_ok($granted, '<=', $bound,
		"$what: at most burst + rate * t granted over the run");
	cmp_ok($granted, '>=', 0.95 * $rate * $narrowest,
		"$what: at least 95 % of rate * t granted");
	# the grants decided in [a's decision, a's decision + 1 s): a itself and
	# every b decided surely after a's clock read and before a's first one
	# plus 1 s
	my $most = query(
		"SELECT max(n) FROM (SELECT 1 + (SELECT count(*) FROM $table b
		                                 WHERE b.before >= a.after
		                                   AND b.after < a.before + interval '1 second') AS n
		                      FROM $table a) w");
	cmp_ok($most, '<=', $burst + $rate,
		"$what: at most burst + rate granted in any window of 1 s");
}

# 1. limit() on one hot key
$node->pgbench(
	"--no-vacuum --client=$clients --jobs=4 --time=$seconds",
	0,
	[qr{number of failed transactions: 0 \(0\.000%\)}],
	[qr{^$}],
	"limit(): $clients clients for $seconds s, no failed transaction",
	{
		'120_rate_limits_limit' => q{
	INSERT INTO limit_grants SELECT c.before, clock_timestamp()
	FROM (SELECT clock_timestamp() AS before OFFSET 0) c
	WHERE (flagmeter.limit('hot', 100, '1 second', 20)).allowed;
}
	});
check_bound('limit_grants', 100, 20, 'limit()');
cmp_ok(query('SELECT count(*) FROM limit_grants'), '>', 0, 'limit() granted something');

# 2. consume with a plan's rate limit and a quota
$node->pgbench(
	"--no-vacuum --client=$clients --jobs=4 --time=$seconds",
	0,
	[qr{number of failed transactions: 0 \(0\.000%\)}],
	[qr{^$}],
	"consume: $clients clients for $seconds s, no failed transaction",
	{
		'120_rate_limits_consume' => q{
	INSERT INTO consume_grants SELECT c.before, clock_timestamp()
	FROM (SELECT clock_timestamp() AS before OFFSET 0) c,
	     LATERAL flagmeter.consume('acme', 'calls') d WHERE d.granted;
}
	});
check_bound('consume_grants', 100, 20, 'consume');
is( query("SELECT flagmeter.used(flagmeter.usage('acme', 'calls'))"),
	query('SELECT count(*) FROM consume_grants'),
	'consume: the usage recorded is exactly the consumes granted');
is( query(
		q{SELECT count(*) FROM flagmeter.events WHERE tenant = 'acme' AND meter = 'calls'}),
	query('SELECT count(*) FROM consume_grants'),
	'consume: one event per granted consume, none for a refusal');

# 3. A restart forgets the limiters: the burst comes back
query(
	q{SELECT flagmeter.limit('restart', 1, '1 hour', 3, 3)});
is(query(q{SELECT (flagmeter.limit('restart', 1, '1 hour', 3)).allowed}),
	'f', 'before the restart the key\'s burst is spent');
$node->restart;
is(query(q{SELECT (flagmeter.limit('restart', 1, '1 hour', 3, 3)).allowed}),
	't', 'after the restart the key has its whole burst again');
is(query(q{SELECT keys > 0 FROM flagmeter.rate_limiter()}),
	't', 'rate_limiter() counts the key');

# 4. A table of 16 keys
$node->append_conf('postgresql.conf', 'flagmeter.rate_limit_keys = 16');
$node->restart;
is(query('SELECT capacity FROM flagmeter.rate_limiter()'), '16', 'the table holds 16 keys');
query(
	q{SELECT flagmeter.set_test_clock('2030-01-01 00:00:00+00');
	  SELECT flagmeter.limit('full:' || i, 1, '1 hour') FROM generate_series(1, 16) i});
my ($ret, $stdout, $stderr) = $node->psql(
	'postgres', q{
	SELECT flagmeter.set_test_clock('2030-01-01 00:00:00+00');
	SELECT flagmeter.limit('full:17', 1, '1 hour');
});
like($stderr, qr/no room for another key.*\n.*\n.*flagmeter\.rate_limit_keys/,
	'the 17th key that is not idle fails, saying what to raise');
($ret, $stdout, $stderr) = $node->psql(
	'postgres', q{
	\set VERBOSITY verbose
	SELECT flagmeter.set_test_clock('2030-01-01 00:00:00+00');
	SELECT flagmeter.limit('full:17', 1, '1 hour');
});
like($stderr, qr/53400/, 'with SQLSTATE 53400');
is( last_answer(
		q{SELECT flagmeter.set_test_clock('2030-01-01 00:00:00+00');
	  SELECT (flagmeter.limit('full:1', 1, '1 hour')).allowed}),
	'f', 'a key of the full table is still refused past its limit');
is(query('SELECT full_refusals FROM flagmeter.rate_limiter()'), '2', 'the failures are counted');
# an hour later every key is idle: the 17th takes the place of one
is( last_answer(
		q{SELECT flagmeter.set_test_clock('2030-01-01 01:00:00+00');
	  SELECT (flagmeter.limit('full:17', 1, '1 hour')).allowed}),
	't', 'an idle key makes room for a new one');
$node->stop;

# 5. Without flagmeter preloaded
my $plain = PostgreSQL::Test::Cluster->new('rate_limits_not_preloaded');
$plain->init;
$plain->start;
$plain->safe_psql(
	'postgres', q{
	CREATE EXTENSION flagmeter;
	SELECT flagmeter.configure(unassigned_tenants => 'unlimited');
	SELECT flagmeter.define_meter('calls', 'count');
	SELECT flagmeter.define_plan('api');
	SELECT flagmeter.set_rate_limit('api', 'calls', 100, '1 second');
	SELECT flagmeter.assign_plan('acme', 'api');
});
($ret, $stdout, $stderr) = $plain->psql('postgres',
	q{SELECT flagmeter.limit('k', 1, '1 second')});
like($stderr, qr/rate limits need flagmeter in shared_preload_libraries/,
	'not preloaded: limit() fails');
like($stderr, qr/HINT:  Add flagmeter to shared_preload_libraries/, 'and says to preload');
($ret, $stdout, $stderr) = $plain->psql('postgres',
	q{SELECT granted FROM flagmeter.consume('acme', 'calls')});
like($stderr, qr/rate limits need flagmeter in shared_preload_libraries/,
	'not preloaded: consume under a rate limit fails');
is( $plain->safe_psql('postgres',
		q{SELECT granted FROM flagmeter.consume('globex', 'calls')}),
	't', 'not preloaded: consume without a rate limit works');
is( $plain->safe_psql('postgres',
		q{SELECT flagmeter.used(flagmeter.usage('acme', 'calls'))}),
	'0', 'not preloaded: the failed consume recorded nothing');
$plain->stop;

done_testing();
