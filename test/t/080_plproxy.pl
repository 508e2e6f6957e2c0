# test/t/080_plproxy.pl -- flagmeter behind a PL/Proxy proxy (README "Scale-out").
#
# Clusters on loopback TCP: a proxy with flagmeter_proxy, shards A and B
# (4 partitions: 0 and 2 on A, 1 and 3 on B; A preloads flagmeter with
# flagmeter.shared_limits = 0, B does not preload it: the two ways two-phase
# commit works), a streaming standby of A, and C, first a single node
# running the same calls for reference, then the shard that partition 2
# moves to.  Claims checked:
#   - catalog calls through the proxy reach every shard identically, and
#     each shard announces set_limit to its own listeners;
#   - a catalog change that fails on one shard (a plan only A has; B down)
#     changes no shard and leaves nothing prepared; resolve_prepared()
#     finishes an interrupted two-phase commit by what the first shard
#     holds;
#   - every tenant's calls run on its partition's shard, and the proxy
#     gives the same answers as one node, errors included: track, consume
#     (both forms), check, usage, void, overrides, track_batch, assign_plan_batch,
#     idempotency keys and their retries, status, top_tenants, the series;
#   - under pgbench through the proxy, 16 clients racing for 8 tenants'
#     hard limits on both shards: used never exceeds the quota and equals
#     the granted amounts and the recorded events;
#   - with B down, B's tenants get a clear error naming the shard, A's
#     are served; a batch across both counts A's part, and its retry with
#     the same keys counts only B's;
#   - listeners, one per shard, hear the quota events of their own shard,
#     in version order, and catch up per shard with changes_since;
#   - the standby answers check, usage and status once it has replayed;
#   - a fenced partition's tenants are refused with 55000 through the
#     proxy; flagmeter-move-partition moves partition 2 from A to C while
#     a client keeps tracking: every acknowledged event is on C exactly
#     once, none of the refused ones anywhere, A keeps nothing of the
#     partition, usage, limits and idempotency keys survive the move.
use strict;
use warnings;

use File::Basename qw(dirname);
use IPC::Run;
use JSON::PP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);

# PL/Proxy is a Debian package of its own: missing where the archive has it
# is a broken set-up (tools/common.sh installs it), not a reason to skip.
my $sharedir = `pg_config --sharedir`;
chomp $sharedir;
my ($major) = `pg_config --version` =~ /(\d+)/;
if (!-f "$sharedir/extension/plproxy.control")
{
	my $policy = `apt-cache policy postgresql-$major-plproxy 2>/dev/null`;
	plan skip_all => "PL/Proxy is not packaged for PostgreSQL $major"
	  if $policy !~ /Candidate: (?!\(none\))/;
	plan tests => 1;
	fail("PL/Proxy is not installed: apt-get install postgresql-$major-plproxy");
	exit;
}
if (!-f "$sharedir/extension/flagmeter_proxy.control")
{
	plan tests => 1;
	fail("flagmeter_proxy is not installed in $sharedir/extension (make install)");
	exit;
}

my $root = dirname(__FILE__) . '/../..';
my $P = 4;

# A cluster reachable on 127.0.0.1, as shards and proxies are.
sub new_node
{
	my ($name, %opts) = @_;
	my $conf = $opts{conf} // '';
	my $node = PostgreSQL::Test::Cluster->new($name);
	$node->init(allows_streaming => $opts{streaming} ? 1 : 0);
	$node->append_conf('postgresql.conf', qq{
listen_addresses = '127.0.0.1'
max_connections = 60
max_prepared_transactions = 10
log_statement = none
$conf
});
	$node->append_conf('pg_hba.conf', 'host all all 127.0.0.1/32 trust');
	$node->start;
	return $node;
}

sub connstr
{
	my ($node) = @_;
	return 'host=127.0.0.1 port=' . $node->port . ' dbname=postgres';
}

my $proxy = new_node('proxy');
my $a = new_node('shard_a', streaming => 1,
	conf => "shared_preload_libraries = 'flagmeter'\nflagmeter.shared_limits = 0");
my $b = new_node('shard_b');
my $c = new_node('shard_c');

for my $node ($a, $b, $c)
{
	# the calls compared below track events of March 2026
	$node->safe_psql('postgres', q{CREATE EXTENSION flagmeter;
		SELECT flagmeter.configure(late_events => '100 years')});
}
my ($ca, $cb, $cc) = map { connstr($_) } $a, $b, $c;
$proxy->safe_psql(
	'postgres', qq{
	SET client_min_messages = warning;
	CREATE EXTENSION plproxy;
	CREATE EXTENSION dblink;
	CREATE EXTENSION flagmeter_proxy;
	CREATE SERVER flagmeter FOREIGN DATA WRAPPER plproxy OPTIONS (
		partition_0 '$ca', partition_1 '$cb', partition_2 '$ca', partition_3 '$cb');
	CREATE USER MAPPING FOR PUBLIC SERVER flagmeter;
	-- errors as values: SQLSTATE and message (PL/Proxy's prefix left out)
	CREATE FUNCTION try(sql text) RETURNS text LANGUAGE plpgsql AS \$\$
	BEGIN
		EXECUTE sql;
		RETURN 'ok';
	EXCEPTION WHEN OTHERS THEN
		RETURN SQLSTATE || ': ' || regexp_replace(SQLERRM, '^\\S+\\(\\d+\\): \\[[^]]*\\] REMOTE ERROR: ', '');
	END \$\$;
});
$c->safe_psql(
	'postgres', q{
	CREATE FUNCTION try(sql text) RETURNS text LANGUAGE plpgsql AS $$
	BEGIN
		EXECUTE sql;
		RETURN 'ok';
	EXCEPTION WHEN OTHERS THEN
		RETURN SQLSTATE || ': ' || SQLERRM;
	END $$;
});

sub db
{
	my ($node, $sql) = @_;
	return $node->safe_psql('postgres', $sql);
}

is( db($proxy, 'SELECT shard, partitions FROM flagmeter.shards()'),
	"1|{0,2}\n2|{1,3}",
	'the proxy sees two shards, holding partitions 0 and 2, and 1 and 3');

# ---------------------------------------------------------------------------
# The catalog reaches every shard, or none
# ---------------------------------------------------------------------------
my $catalog = q{
	SELECT flagmeter.define_meter('calls');
	SELECT flagmeter.define_meter('tokens', 'sum', 'token');
	SELECT flagmeter.define_meter('seats', 'max');
	SELECT flagmeter.define_meter('disk', 'latest');
	SELECT flagmeter.define_plan('free');
	SELECT flagmeter.define_plan('flex');
	SELECT flagmeter.define_plan('carry');
	SELECT flagmeter.set_limit('free', 'calls', 10, 'lifetime');
	SELECT flagmeter.set_limit('free', 'tokens', 1000, 'lifetime', 'hard', '{50,100}');
	SELECT flagmeter.set_limit('free', 'seats', 5, 'lifetime');
	SELECT flagmeter.set_limit('flex', 'calls', 10, 'lifetime', 'soft');
	SELECT flagmeter.set_limit('carry', 'tokens', 1000, 'month', rollover => 25, rollover_cap => 100,
	                           rollover_periods => 2);
	SELECT flagmeter.define_feature('sso', 'single sign-on');
	SELECT flagmeter.define_feature('seats_max');
	SELECT flagmeter.set_feature('free', 'sso', false);
	SELECT flagmeter.set_feature('flex', 'sso');
	SELECT flagmeter.set_feature('flex', 'seats_max', true, '{"max": 10}');
};
db($proxy, $catalog);
db($c, $catalog);
my $catalog_of = q{
	SELECT string_agg(concat_ws('|', meter, aggregation, unit), ',' ORDER BY meter) FROM flagmeter.meters
	UNION ALL SELECT string_agg(plan, ',' ORDER BY plan) FROM flagmeter.plans
	UNION ALL SELECT string_agg(concat_ws('|', plan, meter, quota, period, mode, thresholds,
	                                      rollover, rollover_cap, rollover_periods), ',' ORDER BY 1)
	FROM flagmeter.limits
	UNION ALL SELECT string_agg(concat_ws('|', feature, description), ',' ORDER BY feature) FROM flagmeter.features
	UNION ALL SELECT string_agg(concat_ws('|', plan, feature, enabled, config), ',' ORDER BY plan, feature)
	FROM flagmeter.plan_features};
is(db($a, $catalog_of), db($c, $catalog_of), 'shard A has the catalog one node has');
is(db($b, $catalog_of), db($c, $catalog_of), 'shard B has the same catalog');
is(db($b, q{SELECT concat_ws('|', rollover, rollover_cap, rollover_periods) FROM flagmeter.limits
            WHERE plan = 'carry'}),
	'25|100|2', 'the proxy\'s set_limit passes the rollover to the shards');
for my $s ([ A => $a ], [ B => $b ])
{
	is( db($s->[1], q{SELECT string_agg(plan || '/' || meter, ' ' ORDER BY version) FROM flagmeter.outbox
		             WHERE kind = 'limit_changed'}),
		'free/calls free/tokens free/seats flex/calls carry/tokens',
		"shard $s->[0] announced each set_limit to its own listeners");
	is( db($s->[1], q{SELECT string_agg(concat_ws('/', plan, feature, enabled, config), ' ' ORDER BY version)
		             FROM flagmeter.outbox WHERE kind = 'feature_changed'}),
		'free/sso/f flex/sso/t flex/seats_max/t/{"max": 10}',
		"shard $s->[0] announced each set_feature to its own listeners");
}
my $prepared = 'SELECT count(*) FROM pg_prepared_xacts';

# A plan that only A has: set_limit fails on B, so A does not change either.
db($a, q{SELECT flagmeter.define_plan('only_a')});
like(
	db($proxy, q{SELECT try($$SELECT flagmeter.set_limit('only_a', 'calls', 5)$$)}),
	qr/^42704: shard 2 of 2: plan "only_a" does not exist$/,
	'a set_limit that fails on shard B says so');
is(db($a, q{SELECT count(*) FROM flagmeter.limits WHERE plan = 'only_a'}),
	'0', 'and changed nothing on shard A');
is(db($a, $prepared) . db($b, $prepared), '00', 'nothing is left prepared');
db($a, q{DELETE FROM flagmeter.plans WHERE plan = 'only_a'});
like(
	db($proxy, q{SELECT try($$SELECT flagmeter.set_feature('free', 'nope')$$)}),
	qr/^42704: shard 1 of 2: feature "nope" does not exist$/,
	'a set_feature of an unknown feature fails on the first shard, and says so');

# B down: the change fails at B's connection, A stays as it was.
$b->stop;
my $down = db($proxy, q{SELECT try($$SELECT flagmeter.define_meter('extra')$$)});
like($down, qr/^08001: shard 2 of 2: could not establish connection/,
	'with shard B down, a catalog change fails at its connection');
is(db($a, q{SELECT count(*) FROM flagmeter.meters WHERE meter = 'extra'}),
	'0', 'and shard A did not get it');
is(db($a, $prepared), '0', 'nothing is left prepared on A');
$b->start;

# An interrupted two-phase commit: prepared on both shards, committed on the
# first only (the coordinator went away) -> committed on the rest; prepared
# on both, committed nowhere -> rolled back everywhere.
for my $change ([ 'flagmeter:t-commit:', 'half' ], [ 'flagmeter:t-abort:', 'none' ])
{
	my ($gid, $meter) = @$change;
	my $i = 0;
	for my $node ($a, $b)
	{
		$i++;
		db($node, qq{BEGIN; SELECT flagmeter.define_meter('$meter'); PREPARE TRANSACTION '$gid$i'});
	}
}
db($a, q{COMMIT PREPARED 'flagmeter:t-commit:1'});
is( db($proxy, q{SELECT gid, shard, action FROM flagmeter.resolve_prepared('0') ORDER BY 1, 2}),
	"flagmeter:t-abort:1|1|rolled back\nflagmeter:t-abort:2|2|rolled back\nflagmeter:t-commit:2|2|committed",
	'resolve_prepared commits what the first shard committed, rolls back what it still holds');
is( db($a, q{SELECT string_agg(meter, ',' ORDER BY meter) FROM flagmeter.meters WHERE meter IN ('half', 'none')})
	  . ' ' . db($b, q{SELECT string_agg(meter, ',' ORDER BY meter) FROM flagmeter.meters WHERE meter IN ('half', 'none')}),
	'half half', 'both shards have the committed change, neither the rolled-back one');
is(db($a, $prepared) . db($b, $prepared), '00', 'nothing is left prepared after resolve_prepared');

# ---------------------------------------------------------------------------
# Tenants live on their partition's shard
# ---------------------------------------------------------------------------
my @tenants = map { sprintf 't%02d', $_ } 1 .. 40;
my $assign = join "\n", map {
	my $plan = $_ =~ /[13579]$/ ? 'free' : 'flex';
	"SELECT flagmeter.assign_plan('$_', '$plan', '2026-01-01 00:00+00', 'UTC');"
} @tenants;
db($proxy, $assign);
db($c, $assign);
my $on_a = db($a, 'SELECT count(*) FROM flagmeter.tenants');
my $on_b = db($b, 'SELECT count(*) FROM flagmeter.tenants');
note "tenants: $on_a on A, $on_b on B";
is($on_a + $on_b, 40, 'every tenant is on one shard');
cmp_ok($on_a * $on_b, '>', 0, 'both shards have tenants');
is( db($a, "SELECT count(*) FROM flagmeter.tenants WHERE flagmeter.partition_of(tenant, $P) NOT IN (0, 2)")
	  . db($b, "SELECT count(*) FROM flagmeter.tenants WHERE flagmeter.partition_of(tenant, $P) NOT IN (1, 3)"),
	'00', "each shard holds exactly its partitions' tenants");

# ---------------------------------------------------------------------------
# The same answers as one node
# ---------------------------------------------------------------------------
my $events = join ', ', map { "'$tenants[$_]'" } 0 .. 39;
my @calls = (
	q{SELECT * FROM flagmeter.consume('t01', 'calls', 4)},
	q{SELECT * FROM flagmeter.consume('t01', 'calls', 7)},
	q{SELECT * FROM flagmeter.consume('t01', 'calls', 6, 'c-1')},
	q{SELECT * FROM flagmeter.consume('t01', 'calls', 6, 'c-1')},
	q{SELECT * FROM flagmeter.check('t01', 'calls', 1)},
	q{SELECT * FROM flagmeter.check('t01', 'calls', 0)},
	q{SELECT * FROM flagmeter.consume('t02', 'calls', 15)},
	q{SELECT * FROM flagmeter.consume('t03', ARRAY['calls', 'tokens'], ARRAY[5, 2000]::bigint[])},
	q{SELECT * FROM flagmeter.consume('t03', ARRAY['calls', 'tokens'], ARRAY[5, 500]::bigint[], 'm-1')},
	q{SELECT * FROM flagmeter.consume('t03', ARRAY['calls', 'tokens'], ARRAY[5, 500]::bigint[], 'm-1')},
	q{SELECT flagmeter.track('t05', 'calls', 3, '2026-03-01 10:00+00', 'k5')},
	q{SELECT flagmeter.track('t05', 'calls', 3, '2026-03-01 10:00+00', 'k5')},
	q{SELECT flagmeter.track('t05', 'calls', 2, '2026-03-02 10:00+00')},
	q{SELECT flagmeter.void('t05', 'k5'), flagmeter.void('t05', 'k5')},
	q{SELECT flagmeter.override_limit('t07', 'calls', 2)},
	q{SELECT * FROM flagmeter.consume('t07', 'calls', 3)},
	q{SELECT flagmeter.drop_override('t07', 'calls'), flagmeter.drop_override('t07', 'calls')},
	q{SELECT * FROM flagmeter.consume('t07', 'calls', 3)},
	q{SELECT flagmeter.track('t09', 'seats', 4, '2026-03-01 10:00+00')},
	q{SELECT * FROM flagmeter.consume('t09', 'seats', 5)},
	q{SELECT * FROM flagmeter.consume('t09', 'seats', 6)},
	"SELECT flagmeter.track_batch(ARRAY[$events], array_fill('tokens'::text, ARRAY[40]),
	        ARRAY(SELECT g::bigint FROM generate_series(1, 40) g),
	        array_fill('2026-03-01 12:00+00'::timestamptz, ARRAY[40]),
	        ARRAY(SELECT 'b-' || g FROM generate_series(1, 40) g))",
	"SELECT flagmeter.track_batch(ARRAY[$events], array_fill('tokens'::text, ARRAY[40]),
	        ARRAY(SELECT g::bigint FROM generate_series(1, 40) g), NULL,
	        ARRAY(SELECT 'b-' || g FROM generate_series(1, 40) g))",
	"SELECT flagmeter.track_batch(ARRAY['t11', 't12', 't11'], ARRAY['disk', 'disk', 'disk'],
	        ARRAY[30, 20, 10]::bigint[], ARRAY['2026-03-01 10:00+00', '2026-03-01 11:00+00', '2026-03-01 12:00+00']::timestamptz[])",
	q{SELECT t, flagmeter.used(u), flagmeter.events(u), flagmeter.max_amount(u), flagmeter.quota(u)
	  FROM unnest(ARRAY['t01', 't02', 't03', 't05', 't07', 't09', 't11', 't12', 't40']) t,
	       LATERAL (SELECT flagmeter.usage(t, 'tokens') u) x ORDER BY t},
	q{SELECT flagmeter.usage('t11', 'disk', '2026-03-01 12:00+00'), flagmeter.usage('t05', 'calls', '2026-03-01')},
	q{SELECT try($$SELECT flagmeter.track(NULL, 'calls')$$), try($$SELECT flagmeter.track('t01', 'nope')$$)},
	q{SELECT try($$SELECT flagmeter.consume('t01', 'calls', -1)$$), try($$SELECT flagmeter.void('t01', 'no-such-key')$$)},
	q{SELECT try($$SELECT flagmeter.track_batch(ARRAY['t01'], ARRAY['calls', 'calls'], ARRAY[1, 2]::bigint[])$$),
	         try($$SELECT flagmeter.track_batch(NULL, NULL, NULL)$$), flagmeter.track_batch('{}', '{}', '{}')},
	q{SELECT flagmeter.assign_plan_batch(ARRAY(SELECT 'n' || g FROM generate_series(1, 30) g), 'flex',
	                                     '2026-01-01 00:00+00', 'UTC')},
	q{SELECT flagmeter.assign_plan_batch(ARRAY['n1', 'n2', 'n40'], 'free')},
	q{SELECT t, c.plan, c.quota, c.anchor = '2026-01-01 00:00+00' FROM unnest(ARRAY['n1', 'n2', 'n3', 'n29', 'n30', 'n40']) t,
	         LATERAL flagmeter.limit_config(t, 'calls') c ORDER BY t},
	q{SELECT try($$SELECT flagmeter.assign_plan_batch(ARRAY['n50', 'n51', 'n52', 'n53', 'n50'], 'flex')$$),
	         try($$SELECT flagmeter.assign_plan_batch(ARRAY['n50', NULL], 'flex')$$),
	         try($$SELECT flagmeter.assign_plan_batch(ARRAY['n50', 'n51'], 'nope')$$),
	         flagmeter.assign_plan_batch('{}', 'flex')},
	q{SELECT t, c.plan FROM unnest(ARRAY['n50', 'n51', 'n52', 'n53']) t,
	         LATERAL flagmeter.limit_config(t, 'calls') c ORDER BY t},
	q{SELECT try($$SELECT flagmeter.track('t01', 'calls', 1, now(), 'c-1')$$),
	         try($$SELECT flagmeter.consume('t01', 'calls', 1, 'k5')$$)},
	q{SELECT flagmeter.grant_credits('t13', 'calls', 5) > 0},
	q{SELECT flagmeter.balance('t13', 'calls')},
	q{SELECT granted, reserved, balance FROM flagmeter.reserve('t13', 'calls', 3, '1 hour', 'r-1')},
	q{SELECT granted, reserved, balance FROM flagmeter.reserve('t13', 'calls', 3, '1 hour', 'r-1')},
	q{SELECT * FROM flagmeter.consume('t13', 'calls', 10)},
	q{SELECT * FROM flagmeter.limit_config('t07', 'calls')},
	q{SELECT t, flagmeter.has_feature(t, 'sso'), flagmeter.feature_config(t, 'seats_max')
	  FROM unnest(ARRAY['t01', 't02', 't03', 't04']) t ORDER BY t},
	q{SELECT flagmeter.override_feature('t01', 'sso', true, '{"idp": "okta"}');
	  SELECT flagmeter.has_feature('t01', 'sso'), flagmeter.feature_config('t01', 'sso')},
	q{SELECT flagmeter.drop_feature_override('t01', 'sso'), flagmeter.drop_feature_override('t01', 'sso');
	  SELECT flagmeter.has_feature('t01', 'sso')},
	q{SELECT try($$SELECT flagmeter.has_feature('t01', 'nope')$$), try($$SELECT flagmeter.override_feature('t02', 'nope', true)$$)},
	"SELECT flagmeter.track_events(ARRAY[$events, 't01', 't02'], array_fill('tokens'::text, ARRAY[42]),
	        array_fill(1::bigint, ARRAY[42]), array_fill('2026-03-02 12:00+00'::timestamptz, ARRAY[42]),
	        ARRAY(SELECT 'e-' || (g % 41) FROM generate_series(1, 42) g))",
	"SELECT flagmeter.track_events(ARRAY[$events], array_fill('tokens'::text, ARRAY[40]),
	        array_fill(1::bigint, ARRAY[40]), NULL, ARRAY(SELECT 'e-' || g FROM generate_series(1, 40) g))",
	q{SELECT * FROM flagmeter.consume_batch(ARRAY['t13', 't14', 't13', 't15', 't16', 't16', 't14'],
	        ARRAY['calls', 'calls', 'calls', 'calls', 'calls', 'tokens', 'calls'],
	        ARRAY[6, 4, 6, 3, 2, 5000, 7]::bigint[], ARRAY[NULL, 'cb-14', NULL, NULL, 'cb-16', 'cb-16', 'cb-14b'],
	        ARRAY[1, 2, 3, 4, 5, 5, 6])},
	q{SELECT * FROM flagmeter.consume_batch(ARRAY['t17', 't18', 't17', 't19'], ARRAY['calls', 'calls', 'calls', 'calls'],
	        ARRAY[9, 11, 2, 1]::bigint[])},
	q{SELECT try($$SELECT * FROM flagmeter.consume_batch(ARRAY['t13', 't14'], ARRAY['calls', 'calls'], ARRAY[1, 1]::bigint[], NULL, ARRAY[1, 1])$$),
	         try($$SELECT * FROM flagmeter.consume_batch(ARRAY['t13', 't14', 't13'], ARRAY['calls', 'calls', 'calls'], ARRAY[1, 1, 1]::bigint[], NULL, ARRAY[1, 2, 1])$$),
	         try($$SELECT * FROM flagmeter.consume_batch(ARRAY['t13'], ARRAY['calls', 'calls'], ARRAY[1]::bigint[])$$),
	         try($$SELECT flagmeter.track_events(ARRAY['t01', 't02'], ARRAY['calls'], ARRAY[1, 1]::bigint[])$$)},
	q{SELECT t, flagmeter.used(flagmeter.usage(t, 'calls')) FROM unnest(ARRAY['t13', 't14', 't15', 't16', 't17', 't18', 't19']) t ORDER BY t},
	q{SELECT tenant, meter, used, quota, remaining, ratio, state, mode, period, plan FROM flagmeter.status ORDER BY 1, 2},
	q{SELECT tenant, meter, used, state FROM flagmeter.status('t03')},
	q{SELECT tenant, used FROM flagmeter.top_tenants('tokens', 5)},
	q{SELECT tenant, ratio FROM flagmeter.top_tenants('calls', 4, 'ratio')},
	q{SELECT try($$SELECT * FROM flagmeter.top_tenants('tokens', 0)$$)},
	q{SELECT * FROM flagmeter.usage_series('t05', 'calls', '2026-03-01', '2026-03-04')},
	q{SELECT * FROM flagmeter.usage_series_all('tokens', '2026-03-01', '2026-03-02', 'hour')},
	q{SELECT * FROM flagmeter.usage_series_all('disk', '2026-03-01', '2026-03-03')},
	q{SELECT * FROM flagmeter.usage_series_all('seats', '2026-03-01', '2026-03-03')});
for my $sql (@calls)
{
	(my $name = $sql) =~ s/\s+/ /g;
	is(db($proxy, $sql), db($c, $sql), 'as one node: ' . substr($name, 0, 110));
}
is( db($proxy, q{SELECT used FROM flagmeter.usage_series_all('tokens', '2026-03-01', '2026-03-02')}),
	'820', 'the series of all tenants merges both shards (1 + 2 + ... + 40)');

# ---------------------------------------------------------------------------
# pgbench through the proxy: hard limits hold on both shards
# ---------------------------------------------------------------------------
my @race = map { "r$_" } 1 .. 8;
db($proxy, q{SELECT flagmeter.define_plan('race'); SELECT flagmeter.set_limit('race', 'calls', 200, 'lifetime')});
db($proxy, join "\n", map { "SELECT flagmeter.assign_plan('$_', 'race');" } @race);
db($proxy, q{CREATE TABLE decisions (tenant text, amount bigint, granted boolean, used bigint)});
my $race_on_a = db($a, "SELECT count(*) FROM flagmeter.tenants WHERE tenant LIKE 'r_'");
cmp_ok($race_on_a * (8 - $race_on_a), '>', 0, 'the raced tenants are on both shards');
$proxy->pgbench(
	'--no-vacuum --client=16 --jobs=2 --transactions=60',
	0,
	[
		qr{number of transactions actually processed: 960/960},
		qr{number of failed transactions: 0 \(0\.000%\)}
	],
	[qr{^$}],
	'pgbench: 16 clients x 60 consumes through the proxy',
	{
		'080_plproxy_consume' => q{
\set t random(1, 8)
\set amount random(1, 5)
INSERT INTO decisions SELECT 'r' || :t, :amount, d.granted, d.used
FROM flagmeter.consume('r' || :t, 'calls', (:amount)::bigint) d;
}
	});
my %granted = map { split /\|/ }
  split /\n/, db($proxy, q{SELECT tenant, sum(amount) FILTER (WHERE granted) FROM decisions GROUP BY 1});
my $over = 0;
my $mismatch = 0;
for my $t (@race)
{
	my $shard = db($a, "SELECT count(*) FROM flagmeter.tenants WHERE tenant = '$t'") ? $a : $b;
	my ($used, $events) = split /\|/, db($shard,
		"SELECT flagmeter.used(flagmeter.usage('$t', 'calls')),
		        (SELECT coalesce(sum(amount), 0) FROM flagmeter.events WHERE tenant = '$t')");
	$over++ if $used > 200;
	$mismatch++ if $used != ($granted{$t} // 0) || $events != $used;
}
is($over, 0, 'no raced tenant went past its hard limit of 200');
is($mismatch, 0, 'on its shard, each used equals its granted amounts and its recorded events');
cmp_ok(db($proxy, 'SELECT count(*) FROM decisions WHERE NOT granted'), '>', 0,
	'demand exceeded the limits: some consumes were refused');

# ---------------------------------------------------------------------------
# Listeners, one per shard
# ---------------------------------------------------------------------------
my $json = JSON::PP->new;
my $sync = 0;

# The client protocol for N shards: LISTEN on each, then per shard the
# version the state was read at.
sub listen_to
{
	my ($name, $node) = @_;
	my $psql = $node->background_psql('postgres');
	$psql->query_safe('LISTEN flagmeter');
	$psql->query_safe('LISTEN test_sync');
	my $v = $psql->query_safe('SELECT flagmeter.latest_version()');
	return { name => $name, node => $node, psql => $psql, version => $v, events => [] };
}

# Everything the shard committed so far: read until our marker comes back.
sub hear
{
	my ($l) = @_;
	my $marker = 'm' . ++$sync;
	db($l->{node}, "NOTIFY test_sync, '$marker'");
	my @got;
	my $deadline = time + $PostgreSQL::Test::Utils::timeout_default;
	while (time < $deadline)
	{
		my $out = $l->{psql}->query_safe('SELECT 1');
		for my $line (split /\r?\n/, $out)
		{
			next unless $line =~ /^Asynchronous notification "(\w+)" with payload "(.*)" received/;
			return \@got if $1 eq 'test_sync' && $2 eq $marker;
			next unless $1 eq 'flagmeter';
			my $doc = $json->decode($2);
			# a resync hint (a payload too large, or skipped): replay
			# changes_since from the last version heard, as the README's
			# client protocol does
			my @events = $doc->{resync}
			  ? map { my @f = split / /, $_, -1; +{ version => $f[0], kind => $f[1], tenant => $f[2], threshold => ($f[3] eq '' ? undef : $f[3]) } }
			  @{ outbox_after($l->{node}, $l->{version}) }
			  : $doc->{kind} eq 'batch' ? @{ $doc->{events} } : ($doc);
			for my $e (@events)
			{
				next if $e->{version} <= $l->{version};
				$l->{version} = $e->{version};
				push @got, "$e->{version} $e->{kind} " . ($e->{tenant} // $e->{plan}) . ' ' . ($e->{threshold} // '');
			}
		}
		usleep(10_000);
	}
	die "$l->{name}: marker $marker never came";
}

sub outbox_after
{
	my ($node, $v) = @_;
	return [ split /\n/, db($node,
		"SELECT version || ' ' || kind || ' ' || coalesce(tenant, plan) || ' ' || coalesce(threshold::text, '')
		 FROM flagmeter.changes_since($v)") ];
}

my ($ta) = grep { db($a, "SELECT count(*) FROM flagmeter.tenants WHERE tenant = '$_'") } @tenants[30 .. 39];
my ($tb) = grep { db($b, "SELECT count(*) FROM flagmeter.tenants WHERE tenant = '$_'") } @tenants[30 .. 39];
my $la = listen_to('A', $a);
my $lb = listen_to('B', $b);
my ($va, $vb) = ($la->{version}, $lb->{version});
db($proxy, qq{SELECT flagmeter.track('$ta', 'calls', 8), flagmeter.track('$tb', 'calls', 9)});
db($proxy, q{SELECT flagmeter.set_limit('flex', 'seats', 3, 'lifetime')});
my $heard_a = hear($la);
my $heard_b = hear($lb);
is_deeply($heard_a, outbox_after($a, $va), "A's listener heard A's events, in version order");
is_deeply($heard_b, outbox_after($b, $vb), "B's listener heard B's events, in version order");
ok( (grep { /threshold $ta 80/ } @$heard_a) && !(grep { /$tb/ } @$heard_a),
	"A's listener heard $ta reach 80 %, nothing of $tb");
ok( (grep { /threshold $tb 80/ } @$heard_b) && !(grep { /$ta/ } @$heard_b),
	"B's listener heard $tb reach 80 %, nothing of $ta");
ok((grep { /limit_changed flex/ } @$heard_a) && (grep { /limit_changed flex/ } @$heard_b),
	'both heard the set_limit');

# B's listener goes away; what B announces meanwhile, it replays on return.
$vb = $lb->{version};
$lb->{psql}->quit;
db($proxy, qq{SELECT flagmeter.track('$tb', 'calls', 1), flagmeter.track('$ta', 'calls', 2)});
$lb = listen_to('B', $b);
my $missed = outbox_after($b, $vb);
is(scalar(grep { /$tb/ } @$missed), 2, "B recorded ${tb}'s 100 % and blocked while its listener was away");
is_deeply(outbox_after($b, $vb), $missed, 'changes_since(version B) gives them back, in order');
ok((grep { /threshold $ta 100/ } @{ hear($la) }), "A's listener, still there, heard $ta reach 100 %");

# ---------------------------------------------------------------------------
# A physical standby of shard A
# ---------------------------------------------------------------------------
$a->backup('a_backup');
my $standby = PostgreSQL::Test::Cluster->new('shard_a_standby');
$standby->init_from_backup($a, 'a_backup', has_streaming => 1);
$standby->start;
db($proxy, qq{SELECT flagmeter.track('$ta', 'tokens', 77)});
$a->wait_for_catchup($standby);
my $read = qq{SELECT flagmeter.used(flagmeter.usage('$ta', 'tokens')), (flagmeter.check('$ta', 'tokens', 1)).remaining,
	(SELECT used FROM flagmeter.status('$ta') WHERE meter = 'tokens')};
is(db($standby, $read), db($a, $read), 'the standby, caught up, answers usage, check and status as the primary');
$standby->stop;

# ---------------------------------------------------------------------------
# Shard B down
# ---------------------------------------------------------------------------
$b->stop;
like(db($proxy, qq{SELECT try(\$\$SELECT flagmeter.track('$tb', 'calls')\$\$)}),
	qr/^XX000: PL\/Proxy function flagmeter\.track\(5\): \[postgres\] PQconnectPoll: connection to server at "127\.0\.0\.1", port ${\ $b->port } failed: Connection refused/,
	"$tb (shard B) gets a connection error naming its shard");
is(db($proxy, qq{SELECT flagmeter.track('$ta', 'tokens', 1), (flagmeter.consume('$ta', 'tokens', 1)).granted}),
	't|t', "$ta (shard A) is served meanwhile");
my $batch = qq{SELECT flagmeter.track_batch(ARRAY['$ta', '$tb'], ARRAY['tokens', 'tokens'], ARRAY[10, %s]::bigint[],
	NULL, ARRAY['down-1', 'down-2'])};
my $used_a = qq{SELECT flagmeter.used(flagmeter.usage('$ta', 'tokens'))};
my $used_b = qq{SELECT flagmeter.used(flagmeter.usage('$tb', 'tokens'))};
my $before_a = db($a, $used_a);
like(db($proxy, 'SELECT try($$' . sprintf($batch, 20) . '$$)'), qr/^XX000: .*Connection refused/,
	'a batch across both shards fails while B is down');
is(db($a, $used_a), $before_a, 'and counts nothing (PL/Proxy connects to all its shards before it sends)');
$b->start;
my $before_b = db($b, $used_b);
# B refuses its part.  A's part commits on A, unless PL/Proxy, on B's error,
# cancelled it while it ran: all or nothing per shard, not across shards.
like(db($proxy, 'SELECT try($$' . sprintf($batch, -1) . '$$)'), qr/^22023: /,
	"a batch whose part on B is refused fails");
my $after_a = db($a, $used_a);
ok($after_a == $before_a || $after_a == $before_a + 10, "A's part of it is counted whole or not at all")
  or diag "A: $before_a before, $after_a after";
is(db($b, $used_b), $before_b, "B's part is not counted");
is( db($proxy, sprintf $batch, 20),
	$after_a == $before_a ? '2' : '1',
	'its retry with the same keys counts what is missing');
is(db($a, $used_a) . ' ' . db($b, $used_b), ($before_a + 10) . ' ' . ($before_b + 20),
	'each event counted once');

# ---------------------------------------------------------------------------
# Moving partition 2 from A to C
# ---------------------------------------------------------------------------
my @moving = grep { db($a, "SELECT flagmeter.partition_of('$_', $P)") == 2 } @tenants;
my ($mt) = grep { /[13579]$/ && !/^t[01]/ } @moving;    # on plan free, not used above
note 'partition 2: ' . join(' ', @moving);
cmp_ok(scalar @moving, '>', 1, 'partition 2 has tenants');

# The fence, through the proxy.
db($a, "SELECT flagmeter.fence_partition($P, 2)");
like(db($proxy, qq{SELECT try(\$\$SELECT flagmeter.track('$mt', 'calls')\$\$)}),
	qr/^55000: tenant "$mt" is being moved to another shard$/,
	'a fenced tenant is refused with 55000 through the proxy');
is(db($proxy, qq{SELECT (flagmeter.check('$mt', 'calls', 0)).granted}), 't', 'and still read');
db($a, "SELECT flagmeter.unfence_partition($P, 2)");

# C was the reference node: it starts again empty, as a new shard does.
db($c, q{DROP EXTENSION flagmeter CASCADE; CREATE EXTENSION flagmeter;
	SELECT flagmeter.configure(late_events => '100 years')});
db($proxy, qq{SELECT flagmeter.track('$mt', 'calls', 1, now(), 'before-move')});
# features: the shards' catalog (copied to the empty C) and a tenant's override (moved)
for my $shard ($a, $b)
{
	db($shard, q{SELECT flagmeter.define_feature('sso'), flagmeter.set_feature('free', 'sso')});
}
db($proxy, qq{SELECT flagmeter.override_feature('$mt', 'sso', false, '{"why": "moved"}')});
my $features = qq{SELECT flagmeter.has_feature('$moving[0]', 'sso') || ' ' || flagmeter.has_feature('$mt', 'sso')};
is(db($proxy, $features), 'true false', "partition 2's features before the move");
my $state = q{SELECT tenant, meter, used, quota, state FROM flagmeter.status WHERE tenant IN (%s) ORDER BY 1, 2};
my $moving_list = join ', ', map { "'$_'" } @moving;
my $series_before = db($proxy, q{SELECT * FROM flagmeter.usage_series_all('tokens', '2026-03-01', '2026-03-02')});
db($a, 'SELECT flagmeter.maintain()');    # some of it folded, some not
db($proxy, qq{SELECT flagmeter.track('$mt', 'tokens', 5, '2026-03-01 13:00+00', 'after-fold')});
# written alone on A (preloaded): pending there, it must arrive as usage
db($proxy, qq{SELECT flagmeter.track('$mt', 'calls', 3)});
my $status_before = db($proxy, sprintf $state, $moving_list);

# A client keeps tracking partition 2 while it moves, one call at a time.
my ($out, $err) = ('', '');
my $mover = IPC::Run::start(
	[
		"$root/contrib/plproxy/flagmeter-move-partition", '--proxy', connstr($proxy),
		'--partition', '2', '--to', $cc
	],
	'>', \$out, '2>', \$err);
my $client = $proxy->background_psql('postgres', on_error_stop => 0);
my (@acked, @refused);
my $n = 0;
while ($mover->pumpable || $n < 20)
{
	$n++;
	my ($res) = $client->query(qq{SELECT flagmeter.track('$moving[0]', 'disk', $n, now(), 'mv-$n')});
	if ($client->{stderr} eq '') { push @acked, $n if $res eq 't' }
	else { push @refused, $n; $client->{stderr} = '' }
	$mover->pump_nb;
	last if $n > 5000;
}
ok($mover->finish, 'flagmeter-move-partition succeeded') or diag "$out\n$err";
$client->quit;
note $out;
note scalar(@acked) . ' tracks acknowledged during the move, ' . scalar(@refused) . ' refused';
cmp_ok(scalar @acked, '>', 0, 'tracks were acknowledged while moving');

is( db($proxy, 'SELECT shard, partitions FROM flagmeter.shards()'),
	"1|{0}\n2|{1,3}\n3|{2}", 'the proxy routes partition 2 to C');
my $keys = db($c, qq{SELECT string_agg(substr(idempotency_key, 4), ',' ORDER BY substr(idempotency_key, 4)::int)
	FROM flagmeter.events WHERE idempotency_key LIKE 'mv-%'});
is($keys, join(',', @acked), 'every acknowledged event is on C once, and no refused one');
is(db($a, q{SELECT count(*) FROM flagmeter.events WHERE idempotency_key LIKE 'mv-%'}), '0',
	'none of them is on A');
my $left = 0;
for my $tbl (split /\n/, db($a, q{SELECT c.relname FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
	WHERE c.relnamespace = 'flagmeter'::regnamespace AND c.relkind IN ('r', 'p')
	  AND NOT c.relispartition AND a.attname = 'tenant'}))
{
	$left += db($a, "SELECT count(*) FROM flagmeter.$tbl WHERE flagmeter.partition_of(tenant, $P) = 2");
}
is($left, 0, 'A keeps no row of partition 2 in any table with a tenant column');
is(db($a, q{SELECT count(*) FROM pg_trigger WHERE tgname LIKE 'flagmeter_moving%'}), '0', 'and no fence');
my $acked_sum = 0;
$acked_sum += $_ for @acked;
is( db($proxy, qq{SELECT flagmeter.used(u) || ' ' || flagmeter.latest(u) FROM flagmeter.usage('$moving[0]', 'disk') u}),
	"$acked_sum $acked[-1]",
	'the tenant\'s usage is the acknowledged events: their sum, the latest one last');
is(db($proxy, sprintf $state, $moving_list), $status_before, 'the moved tenants\' status is what it was');
is(db($proxy, $features), 'true false', 'their features too: the plan rows and the override came along');
is(db($c, qq{SELECT config ->> 'why' FROM flagmeter.feature_overrides WHERE tenant = '$mt'}), 'moved',
	'the override is on C');
is( db($proxy, qq{SELECT flagmeter.track('$mt', 'calls', 1, now(), 'before-move')}) . ' '
	  . db($proxy, qq{SELECT flagmeter.track('$mt', 'tokens', 5, '2026-03-01 13:00+00', 'after-fold')}),
	'f f', 'keys recorded before the move are still known');
db($c, 'SELECT flagmeter.maintain()');
is( db($proxy, q{SELECT used FROM flagmeter.usage_series_all('tokens', '2026-03-01', '2026-03-02')}),
	(split /\|/, (split /\n/, $series_before)[0])[1] + 5,
	'the series of all tenants is the same after the move and folding on C (plus the 5 tracked after folding on A)');
my $room = db($proxy, qq{SELECT (flagmeter.check('$mt', 'calls', 0)).remaining});
is(db($proxy, qq{SELECT (flagmeter.consume('$mt', 'calls', $room + 1)).granted}), 'f',
	"C enforces ${mt}'s limit with the usage it brought");
is(db($proxy, qq{SELECT (flagmeter.consume('$mt', 'calls', $room)).granted}), 't', 'up to the last unit');

$proxy->stop;
$_->stop for $a, $b, $c;
done_testing();
