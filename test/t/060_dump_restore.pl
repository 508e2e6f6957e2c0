# test/t/060_dump_restore.pl -- pg_dump of a database that uses flagmeter
# restores into a fresh cluster with the same usage.
#
# Node "source" holds two databases with meters of every aggregation,
# plans, limits of every kind, overrides, tenants with anchors and time
# zones (and one with no plan), usage tracked over the past 45 days, a
# track_batch, consumes with keys up to a hard limit (some refused, the
# tenant blocked), voids of tracks and of a consume, a maintain() run
# (rollups, partitions for the coming days), and then more usage and a void
# that maintain() has not folded yet.  "app" ran maintain() before any usage,
# so its events are in a daily partition that maintain() created (not an
# extension member: dumped as an ordinary table attached to flagmeter.events);
# "early" tracked before the first maintain(), so its events are in
# flagmeter.events_default (an extension member, dumped as configuration).
# Like any database in use, the source cluster has run more transactions
# than a freshly made one.
#
# "app" is dumped in the custom format and restored with pg_restore, "early"
# as plain SQL and restored with psql, each into a fresh cluster, followed
# by the documented flagmeter.after_restore().  "app" is restored a second
# time, into a third cluster, in parallel as the operations guide says
# (pre-data; data with --jobs and --disable-triggers, the configuration
# tables' foreign keys being checked by nobody while their rows arrive in
# any order; post-data with --jobs), and everything below is claimed of
# both of its restores.  Claims:
#   - every restore finishes without an error;
#   - maintain() refuses to fold with the source cluster's transaction ids
#     until after_restore() has run, which works once;
#   - the restored database answers as the source does: status, check,
#     usage (now and a month ago), usage_series by hour, day and month (UTC
#     and a tenant's zone), stats, the outbox, the row counts of every
#     flagmeter table, the catalog and the settings, the partitions;
#   - idempotency survives: retried track keys answer false, retried consume
#     keys return the decision first given, a voided key voids no more, and
#     none of them records anything;
#   - after the same new usage and a maintain() on both sides, they still
#     answer the same, and the restored side is consistent on its own: a new
#     event shows in usage_series at once, the rollups equal the raw events
#     minus the voids, and nothing is left to fold.
use strict;
use warnings;

use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my @tenants = qw(acme globex initech umbrella);
my @meters = qw(calls tokens seats storage_gb);
my %format = (app => 'custom', early => 'plain');

my $source = PostgreSQL::Test::Cluster->new('source');
$source->init;
$source->append_conf('postgresql.conf', 'log_statement = none');
$source->start;

# A database in use has a transaction counter well ahead of a new cluster's.
$source->safe_psql(
	'postgres', q{
	CREATE PROCEDURE burn(n int) LANGUAGE plpgsql AS $$
	BEGIN
		FOR i IN 1 .. n LOOP
			PERFORM pg_current_xact_id();
			COMMIT;
		END LOOP;
	END $$;
	CALL burn(3000);
});

# Run a command; its exit status, stdout and stderr.
sub run
{
	my (@cmd) = @_;
	my ($out, $err) = ('', '');
	IPC::Run::run(\@cmd, '>', \$out, '2>', \$err);
	return ($? >> 8, $out, $err);
}

sub conn
{
	my ($node) = @_;
	return ('-h', $node->host, '-p', $node->port);
}

for my $db (sort keys %format)
{
	$source->safe_psql('postgres', "CREATE DATABASE $db");
	my $first_maintain = $db eq 'app' ? 'SELECT flagmeter.maintain();' : '';
	$source->safe_psql(
		$db, qq{
		SET client_min_messages = warning;
		CREATE EXTENSION flagmeter;
		$first_maintain
		SELECT flagmeter.define_meter('calls');
		SELECT flagmeter.define_meter('tokens', 'sum', 'tokens');
		SELECT flagmeter.define_meter('seats', 'max');
		SELECT flagmeter.define_meter('storage_gb', 'latest', 'GB');
		SELECT flagmeter.define_plan('free');
		SELECT flagmeter.define_plan('pro');
		SELECT flagmeter.set_limit('free', 'calls', 1000, 'month', 'hard', '{50,80,100}');
		SELECT flagmeter.set_limit('free', 'tokens', 20000, 'day', 'soft');
		SELECT flagmeter.set_limit('free', 'seats', 3, 'lifetime');
		SELECT flagmeter.set_limit('pro', 'calls', 100000, 'month', 'hard');
		SELECT flagmeter.set_limit('pro', 'tokens', 1000000, 'week', 'soft');
		SELECT flagmeter.set_limit('pro', 'storage_gb', 100, 'year', 'soft');
		-- anchored on the last day of a month, 10:00 in New York
		SELECT flagmeter.assign_plan('acme', 'free',
			(date_trunc('month', now() AT TIME ZONE 'America/New_York') - interval '14 hours')
				AT TIME ZONE 'America/New_York',
			'America/New_York');
		SELECT flagmeter.assign_plan('globex', 'pro', now() - interval '400 days', 'Asia/Tokyo');
		SELECT flagmeter.assign_plan('initech', 'free', now() - interval '20 days', 'Europe/Berlin');
		SELECT flagmeter.override_limit('initech', 'calls', 60);
		SELECT flagmeter.override_limit('globex', 'seats', 25, 'lifetime', 'hard', '{90}');
		-- umbrella has no plan, and usage goes back 45 days: both settings
		-- must survive the restore for the new usage tracked there below
		SELECT flagmeter.configure(retention => '120 days', partitions_ahead => 5,
		                           unassigned_tenants => 'unlimited', late_events => '60 days');

		-- usage over the past 45 days; umbrella has no plan
		SELECT count(flagmeter.track(t, 'calls', g % 7 + 1, now() - make_interval(hours => g * 5),
		                             t || '-h' || g))
		FROM unnest(ARRAY['acme', 'globex', 'umbrella']) t, generate_series(1, 200) g;
		SELECT flagmeter.track_batch(
			array_fill('globex'::text, ARRAY[50]), array_fill('tokens'::text, ARRAY[50]),
			ARRAY(SELECT g * 37::bigint FROM generate_series(1, 50) g),
			ARRAY(SELECT now() - make_interval(hours => g * 3) FROM generate_series(1, 50) g),
			ARRAY(SELECT 'tok-' || g FROM generate_series(1, 50) g));
		SELECT count(flagmeter.track('globex', 'seats', s, now() - make_interval(days => s)))
		FROM generate_series(1, 12) s;
		SELECT count(flagmeter.track('globex', 'storage_gb', g, now() - make_interval(days => g)))
		FROM generate_series(1, 30) g;
		SELECT count(flagmeter.track('acme', 'tokens', 700, now() - make_interval(hours => g)))
		FROM generate_series(0, 30) g;
		SELECT count(flagmeter.track('acme', 'seats', 2));

		-- consumes up to initech's hard limit of 60: ten granted, two refused
		CREATE TABLE decisions AS
		SELECT g, d.* FROM generate_series(1, 12) g,
		     LATERAL flagmeter.consume('initech', 'calls', 6, 'c' || g) d;
		SELECT count(flagmeter.void('acme', 'acme-h' || g)) FROM generate_series(10, 200, 10) g;
		SELECT flagmeter.void('initech', 'c2');
		SELECT flagmeter.maintain();

		-- after the last maintain(): not folded yet
		SELECT count(flagmeter.track(t, 'calls', 3, now() - make_interval(mins => g * 7), t || '-late' || g))
		FROM unnest(ARRAY['acme', 'globex', 'umbrella']) t, generate_series(1, 20) g;
		INSERT INTO decisions SELECT 13, d.* FROM flagmeter.consume('initech', 'calls', 6, 'c13') d;
		SELECT flagmeter.void('globex', 'globex-h7');
	});
}

# Fixed bounds for the series, the same on both sides.
my ($t_from, $t_to) = split /\|/, $source->safe_psql('postgres',
	q{SELECT date_trunc('day', now()) - interval '50 days', date_trunc('day', now()) + interval '2 days'});
my $t_month = $source->safe_psql('postgres',
	q{SELECT date_trunc('month', now()) - interval '13 months'});

# What a database answers, by aspect, in one session.
sub snapshot
{
	my ($node, $db) = @_;
	my $tm = q{unnest(ARRAY['} . join(q{','}, @tenants) . q{']) t, unnest(ARRAY['}
	  . join(q{','}, @meters) . q{']) m};
	my %queries = (
		status => 'SELECT * FROM flagmeter.status ORDER BY 1, 2',
		check => "SELECT t, m, (flagmeter.check(t, m, 5)).* FROM $tm ORDER BY 1, 2",
		usage => "SELECT t, m, flagmeter.usage(t, m) FROM $tm ORDER BY 1, 2",
		usage_month_ago => "SELECT t, m, flagmeter.usage(t, m, now() - interval '35 days') FROM $tm ORDER BY 1, 2",
		series_hour => "SELECT t, m, s.* FROM $tm, flagmeter.usage_series(t, m, '$t_to'::timestamptz - interval '3 days', '$t_to', 'hour') s WHERE s.used <> 0 ORDER BY 1, 2, 3",
		series_day => "SELECT t, m, s.* FROM $tm, flagmeter.usage_series(t, m, '$t_from', '$t_to', 'day') s WHERE s.used <> 0 ORDER BY 1, 2, 3",
		series_month => "SELECT t, m, s.* FROM $tm, flagmeter.usage_series(t, m, '$t_month', '$t_to', 'month') s WHERE s.used <> 0 ORDER BY 1, 2, 3",
		series_local => "SELECT t, m, s.* FROM $tm, flagmeter.usage_series(t, m, '$t_from', '$t_to', 'day', 'America/New_York') s WHERE s.used <> 0 ORDER BY 1, 2, 3",
		stats => 'SELECT pending_events, pending_voids, partitions, default_partition_events, notifications_sent, notifications_skipped, blocked FROM flagmeter.stats',
		outbox => 'SELECT version, created_at, kind, tenant, meter, plan, period_start, threshold, used, quota, notified FROM flagmeter.outbox ORDER BY version',
		counts => q{SELECT (SELECT count(*) FROM flagmeter.events), (SELECT count(*) FROM flagmeter.events_default),
		            (SELECT count(*) FROM flagmeter.event_keys), (SELECT count(*) FROM flagmeter.voids),
		            (SELECT count(*) FROM flagmeter.counters), (SELECT count(*) FROM flagmeter.rollup_hour),
		            (SELECT count(*) FROM flagmeter.rollup_day), (SELECT count(*) FROM flagmeter.outbox),
		            (SELECT count(*) FROM flagmeter.blocked), flagmeter.latest_version()},
		catalog => q{SELECT * FROM flagmeter.effective_limits ORDER BY 1, 2},
		settings => q{SELECT * FROM flagmeter.current_settings},
		partitions => q{SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i
		                JOIN pg_class c ON c.oid = i.inhrelid
		                WHERE i.inhparent = 'flagmeter.events'::regclass ORDER BY 1});
	my $sql = join("\n",
		map { "\\echo ==$_\n$queries{$_};" } sort keys %queries);
	my %result;
	my $aspect;
	for my $line (split /\n/, $node->safe_psql($db, $sql))
	{
		if ($line =~ /^==(\w+)$/) { $aspect = $1; $result{$aspect} = ''; next; }
		$result{$aspect} .= "$line\n";
	}
	return \%result;
}

# Is each aspect (or each one named) the same on both sides?
sub same_answers
{
	my ($db, $when, $restored, $how, @aspects) = @_;
	my $want = snapshot($source, $db);
	my $got = snapshot($restored, $db);
	@aspects = sort keys %$want unless @aspects;
	for my $aspect (@aspects)
	{
		is($got->{$aspect}, $want->{$aspect},
			"$db ($how): $aspect $when is as in the source");
	}
}

# Every restore, per database: [the cluster restored into, how].
my %restores;
my @targets;
for my $name (qw(target parallel))
{
	my $node = PostgreSQL::Test::Cluster->new($name);
	push @targets, $node;
	$node->init;
	$node->append_conf('postgresql.conf', 'log_statement = none');
	$node->start;
	for my $db (sort keys %format)
	{
		next if $name eq 'parallel' && $format{$db} ne 'custom';
		push @{ $restores{$db} },
		  [ $node, $name eq 'parallel' ? 'custom, pg_restore in parallel' : $format{$db} ];
	}
}

my $dir = PostgreSQL::Test::Utils::tempdir;
for my $db (sort keys %format)
{
	my $file = "$dir/$db.dump";
	my ($rc, $out, $err) = run('pg_dump', conn($source), '--format', $format{$db},
		'--file', $file, $db);
	is($rc, 0, "$db: pg_dump --format $format{$db} succeeds") or diag($err);

	for my $restore (@{ $restores{$db} })
	{
		my ($target, $how) = @$restore;
		$target->safe_psql('postgres', "CREATE DATABASE $db");
		if ($how =~ /parallel/)
		{
			# the three steps of docs/guides/operations.md, "Backup and restore"
			for my $step (['--section=pre-data'],
				[ '--section=data', '--jobs=2', '--disable-triggers' ],
				[ '--section=post-data', '--jobs=2' ])
			{
				($rc, $out, $err) = run('pg_restore', conn($target), @$step, '--dbname', $db,
					$file);
				is($rc, 0, "$db: pg_restore @$step succeeds");
				is($err, '', "$db: pg_restore @$step reports no error");
				note "$db restore errors:\n$err" if $err ne '';
			}
		}
		elsif ($format{$db} eq 'custom')
		{
			($rc, $out, $err) = run('pg_restore', conn($target), '--dbname', $db, $file);
			is($rc, 0, "$db: pg_restore succeeds");
			is($err, '', "$db: pg_restore reports no error");
		}
		else
		{
			($rc, $out, $err) = run('psql', '-X', '-q', conn($target), '--dbname', $db,
				'--file', $file);
			is($rc, 0, "$db: psql runs the plain dump");
			unlike($err, qr/ERROR/, "$db: the plain dump restores without an error");
		}
		note "$db restore errors:\n$err" if $err ne '';
	}
}

# Each phase acts on the source once and on every restore of the database.
for my $db (sort keys %format)
{
	my @restores = @{ $restores{$db} };

	# The documented step after a restore: the fold watermark and the events'
	# transaction ids came from the source cluster; maintain() refuses to run
	# on them, after_restore() folds what was pending and renumbers them.
	for my $restore (@restores)
	{
		my ($target, $how) = @$restore;
		my ($rc, $out, $err) = $target->psql($db, 'SELECT flagmeter.maintain()');
		isnt($rc, 0, "$db ($how): maintain() refuses to run on ids from another cluster");
		like($err, qr/HINT:.*flagmeter\.after_restore\(\)/,
			"$db ($how): and says to run after_restore()");
		is($target->safe_psql($db, 'SELECT events_folded >= 0 FROM flagmeter.after_restore()'),
			't', "$db ($how): after_restore() runs once");
		($rc, $out, $err) = $target->psql($db, 'SELECT flagmeter.after_restore()');
		isnt($rc, 0, "$db ($how): and not twice");
	}
	# the source folds the same pending events, so both sides compare
	$source->safe_psql($db, 'SELECT flagmeter.maintain()');
	same_answers($db, 'after the restore', @$_) for @restores;

	# Retried keys, on both sides: nothing is recorded again.
	my $retries = q{
		SELECT flagmeter.track('acme', 'calls', 1, now(), 'acme-h5')
		     || ' ' || flagmeter.track_batch(ARRAY['globex'], ARRAY['tokens'], ARRAY[37::bigint],
		                                     NULL, ARRAY['tok-1'])
		     || ' ' || flagmeter.track('globex', 'calls', 3, now(), 'globex-late4')
		     || ' ' || flagmeter.void('acme', 'acme-h10')
		     || ' ' || flagmeter.void('initech', 'c2');
		SELECT g, d.* FROM generate_series(1, 13) g,
		     LATERAL flagmeter.consume('initech', 'calls', 6, 'c' || g) d
		EXCEPT SELECT * FROM decisions;
		SELECT count(*) FROM decisions};
	my $want = "false 0 false false false\n13";
	is($source->safe_psql($db, $retries), $want,
		"$db: in the source, retried keys record nothing and return the first decisions");
	for my $restore (@restores)
	{
		my ($target, $how) = @$restore;
		is($target->safe_psql($db, $retries), $want,
			"$db ($how): in the restored database, retried keys record nothing and return the first decisions"
		);
		same_answers($db, 'after retrying keys', $target, $how, qw(counts usage outbox));
	}

	# The same new usage on both sides, then maintain().
	my $at = $source->safe_psql('postgres', 'SELECT now()');
	my $series_sum = qq{
		SELECT sum(used) FROM flagmeter.usage_series('umbrella', 'calls', '$t_from', '$t_to')};
	my %before = map { $_->[1] => $_->[0]->safe_psql($db, $series_sum) } @restores;
	my $new_usage = qq{
		SELECT flagmeter.track('umbrella', 'calls', 7, '$at', 'new-1');
		SELECT flagmeter.track_batch(ARRAY['umbrella', 'globex'], ARRAY['tokens', 'tokens'],
		                             ARRAY[2, 500]::bigint[], ARRAY['$at', '$at']::timestamptz[]);
		SELECT flagmeter.void('umbrella', 'umbrella-late3');
	};
	$source->safe_psql($db, $new_usage);
	for my $restore (@restores)
	{
		my ($target, $how) = @$restore;
		$target->safe_psql($db, $new_usage);
		is($target->safe_psql($db, $series_sum), $before{$how} + 7 - 3,
			"$db ($how): in the restored database, new usage and a void show in usage_series at once"
		);
	}

	$source->safe_psql($db, 'SELECT flagmeter.maintain()');
	for my $restore (@restores)
	{
		my ($target, $how) = @$restore;
		my ($rc, $out, $err) = $target->psql($db, 'SELECT flagmeter.maintain()');
		is($rc, 0, "$db ($how): maintain() runs in the restored database") or diag($err);
		same_answers($db, 'after new usage and maintain()', $target, $how);

		is( $target->safe_psql($db, q{
				SELECT ((SELECT sum(amount) FROM flagmeter.events) - (SELECT sum(amount) FROM flagmeter.voids))
				       || ' ' || ((SELECT count(*) FROM flagmeter.events) - (SELECT count(*) FROM flagmeter.voids))
				       || ' ' || (SELECT pending_events + pending_voids FROM flagmeter.stats)}),
			$target->safe_psql($db, q{
				SELECT (SELECT sum(flagmeter.used(counter)) FROM flagmeter.rollup_hour)
				       || ' ' || (SELECT sum(flagmeter.events(counter)) FROM flagmeter.rollup_hour)
				       || ' 0'}),
			"$db ($how): in the restored database the rollups equal the raw events minus the voids, nothing pending"
		);

		# A consume in the restored database decides on the restored usage.
		my ($used, $quota) = split /\|/, $target->safe_psql($db,
			q{SELECT used, quota FROM flagmeter.status WHERE tenant = 'acme' AND meter = 'calls'});
		is( $target->safe_psql($db,
				q{SELECT granted || ' ' || used FROM flagmeter.consume('acme', 'calls', 4, 'new-c1')}),
			$used + 4 <= $quota ? 'true ' . ($used + 4) : "false $used",
			"$db ($how): a new consume in the restored database counts from the restored usage");
	}
}

$_->stop for @targets;
$source->stop;
done_testing();
