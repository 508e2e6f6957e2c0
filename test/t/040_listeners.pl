# test/t/040_listeners.pl -- two app instances listening on "flagmeter".
#
# Two long-lived psql sessions LISTEN on channel "flagmeter", standing for
# two app instances; a third session plays the app's request path.  Each
# step is followed by a sync: a marker NOTIFY on a channel of this test,
# sent after the step committed.  One queue carries both channels in commit
# order, so when a listener has read the marker it has read every
# notification of the step: "nothing arrived" is checked without sleeping.
#
# The listeners connect as a role with the shipped listener layout only
# (flagmeter.grant_access).  Claims checked, for both listeners:
#   - nothing for transactions that only track or consume below every
#     threshold, nor for a rolled-back crossing (transaction or savepoint);
#   - a crossing is announced after commit, not before, in exactly one
#     notification per transaction (several events come as one batch);
#   - a crossing raced by 16 pgbench clients is announced once: one
#     threshold-80, one threshold-100 and one blocked event, and one outbox
#     row for each;
#   - a listener that disconnects, and reconnects later, gets from
#     flagmeter.changes_since(last version it saw) exactly the events the
#     other listener received meanwhile, in the same (version) order;
#   - a blocked event carries resets_at, the end of the blocked period;
#   - under backpressure (notifications skipped, notified events, resync
#     hints, in every order of three steps), instances that follow the
#     README's client protocol apply every event and agree with the
#     database on who is blocked.
use strict;
use warnings;

use JSON::PP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

my $quota = 100;
my $race_clients = 16;
my $race_per_client = 12;    # 192 units asked for against a quota of 100
my $sync_channel = 'flagmeter_test_sync';

my $node = PostgreSQL::Test::Cluster->new('listeners');
$node->init;
$node->append_conf('postgresql.conf', 'max_connections = 40');
$node->append_conf('postgresql.conf', 'log_statement = none');
$node->start;

my @tenants = qw(quiet rb solo race away1 away2 away3 after);
$node->safe_psql(
	'postgres', qq{
	SET client_min_messages = warning;
	CREATE EXTENSION flagmeter;
	SELECT flagmeter.define_meter('calls');
	SELECT flagmeter.define_plan('p');
	SELECT flagmeter.set_limit('p', 'calls', $quota, 'lifetime', 'hard', '{80,100}');
	SELECT flagmeter.assign_plan(t, 'p')
	FROM unnest(ARRAY['@{[ join "','", @tenants ]}']) t;
	CREATE ROLE app_listener LOGIN;
	SELECT flagmeter.grant_access('app_listener', 'listener');
});

# One value (or several lines) of a query, in a fresh session.
sub query
{
	my ($sql) = @_;
	return $node->safe_psql('postgres', $sql);
}

# The same as the app instances' role, which has the shipped listener
# layout (flagmeter.grant_access(role, 'listener')) and nothing else.
sub query_as_listener
{
	my ($sql) = @_;
	return $node->safe_psql('postgres', $sql, extra_params => [ '-U', 'app_listener' ]);
}

# The set-up's own events (limit_changed, plan_changed) are not this test's.
my $setup_version = query('SELECT flagmeter.latest_version()');

# ---------------------------------------------------------------------------
# Listeners
# ---------------------------------------------------------------------------

# A listening app instance: a psql session that stays connected.
sub start_listener
{
	my ($name) = @_;
	my $psql = $node->background_psql('postgres', extra_params => [ '-U', 'app_listener' ]);
	$psql->query_safe('SET client_min_messages = warning');
	$psql->query_safe('LISTEN flagmeter');
	$psql->query_safe("LISTEN $sync_channel");
	return {
		name => $name,
		psql => $psql,
		pid => $psql->query_safe('SELECT pg_backend_pid()'),
		buffer => [],     # notifications read, not yet handed out by sync
		received => [],   # every "flagmeter" notification handed out
	};
}

# psql prints each notification it got during a command after its result.
sub read_notifications
{
	my ($l) = @_;
	my $out = $l->{psql}->query_safe('SELECT 1');
	my $n = 0;
	for my $line (split /\r?\n/, $out)
	{
		next
		  unless $line =~
		  /^Asynchronous notification "([^"]*)"(?: with payload "(.*)")? received from server process with PID (\d+)\.$/;
		push @{ $l->{buffer} },
		  { channel => $1, payload => $2 // '', pid => $3 };
		$n++;
	}
	return $n;
}

my $sync_count = 0;

# Sends a marker after everything committed so far and reads each listener
# until its marker arrives.  Returns, per listener name, the "flagmeter"
# notifications received before the marker, in arrival order.
sub sync_listeners
{
	my @listeners = @_;
	my $marker = 'sync ' . ++$sync_count;
	my %got;

	query("NOTIFY $sync_channel, '$marker'");
	for my $l (@listeners)
	{
		my @new;
		my $deadline = time + $PostgreSQL::Test::Utils::timeout_default;
		my $found = 0;

		until ($found)
		{
			while (!$found && @{ $l->{buffer} })
			{
				my $n = shift @{ $l->{buffer} };

				if ($n->{channel} eq $sync_channel)
				{
					die "$l->{name}: marker \"$n->{payload}\" while waiting for \"$marker\""
					  unless $n->{payload} eq $marker;
					$found = 1;
				}
				else
				{
					push @new, $n;
				}
			}
			last if $found;
			die "$l->{name}: no \"$marker\" within the timeout"
			  if time > $deadline;
			# the signal to the listener's backend may still be on its way
			usleep(10_000) unless read_notifications($l);
		}
		push @{ $l->{received} }, @new;
		$got{ $l->{name} } = \@new;
	}
	return \%got;
}

my $json = JSON::PP->new->canonical;

# The quota events a notification carries: itself, or a batch's events.
# A payload that is not what docs/design.md promises yields a "bad" event, so
# that the counts below fail and show it.
sub events_of
{
	my ($n) = @_;
	my $p = $n->{payload};
	my $doc = eval { $json->decode($p) };

	return ({ kind => 'bad', why => 'not JSON', payload => $p })
	  unless ref $doc eq 'HASH';
	return ({ kind => 'bad', why => 'payload of 1 kB or more', payload => $p })
	  if length($p) >= 1000;
	return ({ kind => 'bad', why => 'resync hint', payload => $p })
	  if $doc->{resync};
	if (($doc->{kind} // '') eq 'batch')
	{
		my @events = @{ $doc->{events} // [] };

		return ({ kind => 'bad', why => 'inconsistent batch', payload => $p })
		  unless @events
		  && @events == $doc->{count}
		  && $events[0]{version} == $doc->{from_version}
		  && $events[-1]{version} == $doc->{to_version};
		return @events;
	}
	return ($doc);
}

sub events_of_all
{
	my ($notes) = @_;
	return map { events_of($_) } @$notes;
}

# version|kind|tenant|meter|threshold: how the outbox rows are compared
sub event_line
{
	my ($e) = @_;
	return join '|', map { $_ // '' }
	  @$e{qw(version kind tenant meter threshold)};
}

sub event_lines
{
	return map { event_line($_) } @_;
}

sub outbox_lines
{
	my ($where) = @_;
	my $out = query(
		"SELECT version, kind, tenant, meter, threshold FROM flagmeter.outbox WHERE version > $setup_version AND ($where) ORDER BY version"
	);
	return grep { $_ ne '' } split /\n/, $out;
}

sub describe
{
	my ($notes) = @_;
	return join("\n", map { "  pid $_->{pid}: $_->{payload}" } @$notes);
}

my $la = start_listener('A');
my $lb = start_listener('B');
my $app = $node->background_psql('postgres');
$app->query_safe('SET client_min_messages = warning');
my $app_pid = $app->query_safe('SELECT pg_backend_pid()');

# What the set-up announced was committed before anyone listened.
my $got = sync_listeners($la, $lb);
is(scalar @{ $got->{$_} }, 0, "$_: nothing from before LISTEN")
  for qw(A B);

# ---------------------------------------------------------------------------
# Below every threshold: no notification
# ---------------------------------------------------------------------------
query(q{SELECT flagmeter.track('quiet', 'calls', 10)});
query(
	q{BEGIN;
	  SELECT bool_and(flagmeter.track('quiet', 'calls', 1)) FROM generate_series(1, 50);
	  COMMIT;});
query(q{SELECT granted FROM flagmeter.consume('quiet', 'calls', 19)});
$got = sync_listeners($la, $lb);
for my $name (qw(A B))
{
	is(scalar @{ $got->{$name} },
		0, "$name: no notification for transactions below every threshold")
	  or diag describe($got->{$name});
}
is(query(q{SELECT flagmeter.used(flagmeter.usage('quiet', 'calls'))}),
	'79', 'the quiet tenant is at 79 of 100');
is(query(qq{SELECT count(*) FROM flagmeter.outbox WHERE tenant = 'quiet' AND version > $setup_version}),
	'0', 'no outbox row below every threshold');

# ---------------------------------------------------------------------------
# Rolled-back crossings: no notification, nothing recorded
# ---------------------------------------------------------------------------
query(
	q{BEGIN;
	  SELECT flagmeter.track('rb', 'calls', 85);
	  ROLLBACK;});
query(
	q{BEGIN;
	  SELECT granted FROM flagmeter.consume('rb', 'calls', 100);
	  ROLLBACK;});
query(
	q{BEGIN;
	  SAVEPOINT s;
	  SELECT flagmeter.track('rb', 'calls', 90);
	  ROLLBACK TO SAVEPOINT s;
	  SELECT flagmeter.track('rb', 'calls', 1);
	  COMMIT;});
$got = sync_listeners($la, $lb);
for my $name (qw(A B))
{
	is(scalar @{ $got->{$name} },
		0, "$name: no notification for rolled-back crossings")
	  or diag describe($got->{$name});
}
is( query(
		qq{SELECT (SELECT count(*) FROM flagmeter.outbox WHERE tenant = 'rb' AND version > $setup_version) || ' ' ||
		         (SELECT count(*) FROM flagmeter.blocked WHERE tenant = 'rb') || ' ' ||
		         flagmeter.used(flagmeter.usage('rb', 'calls'))}),
	'0 0 1',
	'rolled-back crossings leave no outbox row, no block and no usage');

# ---------------------------------------------------------------------------
# A crossing is announced at commit, once, to each listener
# ---------------------------------------------------------------------------
$app->query_safe('BEGIN');
$app->query_safe(q{SELECT flagmeter.track('solo', 'calls', 85)});
$got = sync_listeners($la, $lb);
is(scalar @{ $got->{$_} }, 0, "$_: nothing before the crossing commits")
  for qw(A B);
$app->query_safe('COMMIT');
$got = sync_listeners($la, $lb);
my @solo80 = outbox_lines(q{tenant = 'solo'});
is(scalar @solo80, 1, 'one outbox row for the 80 % crossing');
for my $name (qw(A B))
{
	my $notes = $got->{$name};

	is(scalar @$notes, 1, "$name: exactly one notification after the commit")
	  or diag describe($notes);
	is($notes->[0]{pid} // '', $app_pid,
		"$name: sent by the committing session");
	my @events = events_of_all($notes);
	is_deeply(
		[ map { "$_->{kind} $_->{threshold} $_->{used}/$_->{quota}" } @events ],
		['threshold 80 85/100'],
		"$name: the 80 % threshold with used and quota");
	is_deeply([ event_lines(@events) ],
		\@solo80, "$name: the payload matches the outbox row and its version");
}

# 100 % and blocked in one transaction: one notification, a batch of two
$app->query_safe(q{SELECT granted FROM flagmeter.consume('solo', 'calls', 15)});
$got = sync_listeners($la, $lb);
my @solo100 = outbox_lines(q{tenant = 'solo' AND version > } . (split /\|/, $solo80[0])[0]);
is_deeply(
	[ map { (split /\|/)[1] . ' ' . (split /\|/)[4] } @solo100 ],
	[ 'threshold 100', 'blocked ' ],
	'the outbox records the 100 % threshold, then blocked');
for my $name (qw(A B))
{
	my $notes = $got->{$name};

	is(scalar @$notes, 1,
		"$name: one notification for a transaction with two events")
	  or diag describe($notes);
	is_deeply([ event_lines(events_of_all($notes)) ],
		\@solo100, "$name: it carries both events with their outbox versions");
}
is($got->{A}[0]{payload} // '', $got->{B}[0]{payload} // '',
	'both listeners got the same payload');

# Already announced: more usage, from this session and from a fresh one,
# announces nothing again.
$app->query_safe(q{SELECT granted FROM flagmeter.consume('solo', 'calls', 1)});
$app->query_safe(q{SELECT flagmeter.track('solo', 'calls', 3)});
query(q{SELECT flagmeter.track('solo', 'calls', 2)});
$got = sync_listeners($la, $lb);
for my $name (qw(A B))
{
	is(scalar @{ $got->{$name} },
		0, "$name: no repeated announcement of a crossing already announced")
	  or diag describe($got->{$name});
}
is(query(qq{SELECT count(*) FROM flagmeter.outbox WHERE tenant = 'solo' AND version > $setup_version}),
	'3', 'still three outbox rows for the solo tenant');

# ---------------------------------------------------------------------------
# A crossing raced by 16 consumers is announced once
# ---------------------------------------------------------------------------
my $race_total = $race_clients * $race_per_client;
$node->pgbench(
	"--no-vacuum --client=$race_clients --jobs=4 --transactions=$race_per_client",
	0,
	[
		qr{number of transactions actually processed: $race_total/$race_total},
		qr{number of failed transactions: 0 \(0\.000%\)}
	],
	[qr{^$}],
	"pgbench: $race_clients clients race to consume past the limit",
	{
		'040_listeners_consume' => q{
SELECT granted FROM flagmeter.consume('race', 'calls', 1);
}
	});
$got = sync_listeners($la, $lb);

is(query(q{SELECT flagmeter.used(flagmeter.usage('race', 'calls'))}),
	$quota, 'the racers used the quota up exactly');
is( query(
		qq{SELECT string_agg(kind || ':' || coalesce(threshold::text, '-') || ':' || n, ' ' ORDER BY kind, threshold)
		  FROM (SELECT kind, threshold, count(*) AS n FROM flagmeter.outbox
		        WHERE tenant = 'race' AND version > $setup_version
		        GROUP BY kind, threshold) s}),
	'blocked:-:1 threshold:80:1 threshold:100:1',
	'the outbox holds one row per event of the raced crossing');
is(query(q{SELECT count(*) FROM flagmeter.blocked WHERE tenant = 'race'}),
	'1', 'the raced tenant is blocked once');
my @race_outbox = outbox_lines(q{tenant = 'race'});
for my $name (qw(A B))
{
	my $notes = $got->{$name};
	my @events = events_of_all($notes);
	my %by = (t80 => 0, t100 => 0, blocked => 0, other => 0);

	note "$name received the race in " . scalar(@$notes) . " notification(s):\n"
	  . describe($notes);
	for my $e (@events)
	{
		my $k =
		    ($e->{tenant} // '') ne 'race' ? 'other'
		  : $e->{kind} eq 'threshold' ? 't' . ($e->{threshold} // '?')
		  : $e->{kind};
		$k = 'other' unless exists $by{$k};
		$by{$k}++;
	}
	is_deeply(
		\%by,
		{ t80 => 1, t100 => 1, blocked => 1, other => 0 },
		"$name: one threshold-80, one threshold-100 and one blocked event, nothing else"
	) or diag describe($notes);
	is_deeply([ event_lines(@events) ],
		\@race_outbox,
		"$name: the events arrived in version order with the outbox versions");
	cmp_ok(scalar @$notes, '<=', 3,
		"$name: at most one notification per committed crossing");
	is_deeply(
		[
			map {
				my $t = $_->{kind} eq 'threshold' ? $_->{threshold} : '';
				"$_->{kind} $t "
				  . ($_->{used} >= $quota * ($t || 100) / 100 ? 'reached' : $_->{used})
				  . " $_->{quota}"
			} @events
		],
		[ "threshold 80 reached $quota", "threshold 100 reached $quota",
		  "blocked  reached $quota" ],
		"$name: each event reports the usage that reached it and the quota");
}
is_deeply(
	[ map { $_->{payload} } @{ $got->{A} } ],
	[ map { $_->{payload} } @{ $got->{B} } ],
	'both listeners received the same notifications');

# ---------------------------------------------------------------------------
# A listener that reconnects resyncs from the outbox and misses nothing
# ---------------------------------------------------------------------------
my @seen_by_b = events_of_all($lb->{received});
my $b_last = (sort { $a <=> $b } map { $_->{version} } @seen_by_b)[-1];
is($b_last, query('SELECT flagmeter.latest_version()'),
	'B has seen up to the latest version before it disconnects');
$lb->{psql}->quit;

query(q{SELECT flagmeter.track('away1', 'calls', 90)});
query(q{SELECT granted FROM flagmeter.consume('away2', 'calls', 100)});
query(q{SELECT flagmeter.track('after', 'calls', 5)});
query(q{BEGIN; SELECT flagmeter.track('away3', 'calls', 95); ROLLBACK;});
query(q{SELECT flagmeter.override_limit('away2', 'calls', 1000)});
$got = sync_listeners($la);
my @missed = events_of_all($got->{A});
is_deeply(
	[ sort map { $_->{kind} } @missed ],
	[qw(blocked limit_changed threshold threshold threshold unblocked)],
	'A received the crossings and the limit change while B was away')
  or diag describe($got->{A});

$lb = start_listener('B, reconnected');
my @resync = split /\n/,
  $lb->{psql}->query_safe(
	"SELECT version, kind, tenant, meter, threshold FROM flagmeter.changes_since($b_last)"
  );
is_deeply(\@resync, [ event_lines(@missed) ],
	'changes_since(last version B saw) returns exactly what A received meanwhile, in the same order'
);
is_deeply(
	[ map { (split /\|/)[0] } @resync ],
	[ sort { $a <=> $b } map { (split /\|/)[0] } @resync ],
	'the resync is in version order');

# and B, listening again, gets what comes next, once
query(q{SELECT flagmeter.track('after', 'calls', 80)});
$got = sync_listeners($la, $lb);
my @after = outbox_lines(q{tenant = 'after'});
for my $l ($la, $lb)
{
	my $notes = $got->{ $l->{name} };

	is(scalar @$notes, 1,
		"$l->{name}: one notification for the next crossing")
	  or diag describe($notes);
	is_deeply([ event_lines(events_of_all($notes)) ],
		\@after, "$l->{name}: it is the next outbox row");
}

# ---------------------------------------------------------------------------
# A blocked event says when the block ends by itself
# ---------------------------------------------------------------------------
query(
	q{SELECT flagmeter.define_plan('monthly'),
	         flagmeter.set_limit('monthly', 'calls', 10, 'month', 'hard', '{100}'),
	         flagmeter.assign_plan('monthly-t', 'monthly', '2026-01-15 10:00:00+00', 'UTC')});
sync_listeners($la, $lb);
query(q{SELECT flagmeter.track('monthly-t', 'calls', 10)});
$got = sync_listeners($la, $lb);
my ($blocked_event) = grep { $_->{kind} eq 'blocked' } events_of_all($got->{A});
is( ($blocked_event->{period_start} // '') . ' ' . ($blocked_event->{resets_at} // ''),
	query(
		q{SELECT to_char(period_start AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"') || ' ' ||
		         to_char(period_end AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')
		  FROM flagmeter.period_bounds(now(), 'month', '2026-01-15 10:00:00+00', 'UTC')}),
	'blocked carries period_start and resets_at, the end of the period, in UTC');

# ---------------------------------------------------------------------------
# Backpressure: no sequence of skipped notifications, notified events and
# resync hints makes an instance that follows the README's protocol miss an
# event
# ---------------------------------------------------------------------------
# The queue looks full to a session whose flagmeter.notify_queue_limit is 0
# once pg_notification_queue_usage() is above 0: a listener that never
# reads (it sits in a transaction) holds the queue's tail while three
# notifications of 7 kB move its head two pages on.  The app session then
# skips (limit 0) or notifies (the default, 0.5) as each step wants, and
# maintain(), in a session of its own, finds room and sends the hint.
my $stuck = $node->background_psql('postgres');
$stuck->query_safe('LISTEN flagmeter_test_stuck');
$stuck->query_safe('BEGIN');
query(q{SELECT pg_notify('flagmeter_test_stuck', g || repeat('x', 7000)) FROM generate_series(1, 3) g});
is(query(q{SELECT pg_notification_queue_usage() > 0}), 't',
	'a listener that does not read keeps the NOTIFY queue above 0');

# An app instance as the README's client protocol describes it: its
# version, the blocked tenants it caches, and every version it applied.
# Queries go through a connection of their own (psql prints notifications
# among a query's output), as the listener role like the listening session.
sub load_instance    # step 2
{
	my ($i) = @_;
	my $out = query_as_listener(
		q{BEGIN ISOLATION LEVEL REPEATABLE READ;
		  SELECT 'v', flagmeter.latest_version();
		  SELECT 'b', tenant, meter FROM flagmeter.blocked;
		  SELECT 'l', count(*) FROM flagmeter.effective_limits;
		  COMMIT;});
	$i->{blocked} = {};
	for my $line (split /\n/, $out)
	{
		my @f = split /\|/, $line;
		$i->{version} = $f[1] if $f[0] eq 'v';
		$i->{blocked}{"$f[1]|$f[2]"} = 1 if $f[0] eq 'b';
	}
	return $i;
}

sub apply_event
{
	my ($i, $e) = @_;
	return if $e->{version} <= $i->{version};    # in the snapshot already
	my $key = ($e->{tenant} // '') . '|' . ($e->{meter} // '');
	$i->{blocked}{$key} = 1 if $e->{kind} eq 'blocked';
	delete $i->{blocked}{$key} if $e->{kind} eq 'unblocked';
	$i->{applied}{ $e->{version} } = 1;
	$i->{version} = $e->{version};
}

sub replay    # changes_since(V), in version order
{
	my ($i) = @_;
	$i->{replays}++;
	for my $line (split /\n/,
		query_as_listener("SELECT version, kind, tenant, meter FROM flagmeter.changes_since($i->{version})"))
	{
		my %e;
		@e{qw(version kind tenant meter)} = split /\|/, $line, -1;
		apply_event($i, \%e);
	}
}

sub handle_notification    # step 3
{
	my ($i, $payload) = @_;
	my $msg = $json->decode($payload);

	return if $msg->{kind} eq 'invalidate';
	if ($msg->{kind} eq 'resync')
	{
		replay($i) if $msg->{version} > $i->{version};
	}
	elsif ($msg->{resync}
		|| (defined $msg->{prev_version} && $msg->{prev_version} > $i->{version}))
	{
		replay($i);    # the notification's own events are in the outbox too
	}
	else
	{
		apply_event($i, $_)
		  for ($msg->{kind} eq 'batch' ? @{ $msg->{events} } : $msg);
	}
}

my %instances = map {
	$_->{name} => load_instance({ name => $_->{name}, applied => {}, replays => 0 })
} ($la, $lb);
my $bp_from = query('SELECT flagmeter.latest_version()');

# Each step is one transaction; "S" and "N" change the tenant's limit so
# that it is blocked or unblocked (two events: limit_changed, then blocked
# or unblocked), with the notification skipped (S) or sent (N); "H" runs
# maintain(), which sends a resync hint when something was skipped.
query(q{SELECT flagmeter.assign_plan('bp', 'p'), flagmeter.track('bp', 'calls', 10)});
my $bp_blocked = 0;
sub bp_step
{
	my ($step) = @_;
	if ($step eq 'H')
	{
		query('SELECT 1 FROM flagmeter.maintain()');
		return;
	}
	$app->query_safe(
		$step eq 'S'
		? 'SET flagmeter.notify_queue_limit = 0'
		: 'RESET flagmeter.notify_queue_limit');
	# the track of 0 sees the lowered limit and blocks (a lowered limit
	# alone may not say blocked)
	$app->query_safe(
		$bp_blocked
		? q{SELECT flagmeter.override_limit('bp', 'calls', 1000)}
		: q{BEGIN; SELECT flagmeter.override_limit('bp', 'calls', 5);
		    SELECT flagmeter.track('bp', 'calls', 0); COMMIT;});
	$bp_blocked = !$bp_blocked;
}

# Every sequence of three steps, each followed by a hint; and the one of
# issue 15 (two skipped events, then one notified, then the hint).
my @sequences = ([qw(S S N H)]);
for my $a (qw(S N H))
{
	for my $b (qw(S N H))
	{
		push @sequences, [ $a, $b, $_, 'H' ] for qw(S N H);
	}
}
my @lost;
for my $seq (@sequences)
{
	for my $step (@$seq)
	{
		bp_step($step);
		my $got = sync_listeners($la, $lb);
		for my $name (keys %instances)
		{
			note "$name, step $step: $_->{payload}" for @{ $got->{$name} };
			handle_notification($instances{$name}, $_->{payload})
			  for @{ $got->{$name} };
		}
	}
	my %db_blocked = map { $_ => 1 } grep { $_ ne '' } split /\n/,
	  query(q{SELECT tenant || '|' || meter FROM flagmeter.blocked});
	my @versions = grep { $_ ne '' } split /\n/,
	  query("SELECT version FROM flagmeter.outbox WHERE version > $bp_from ORDER BY version");
	for my $i (values %instances)
	{
		my @missed = grep { !$i->{applied}{$_} } @versions;
		push @lost, "$i->{name} after @$seq: missed versions @missed" if @missed;
		push @lost, "$i->{name} after @$seq: blocked "
		  . join(',', sort keys %{ $i->{blocked} }) . ' but the database has '
		  . join(',', sort keys %db_blocked)
		  unless join(',', sort keys %{ $i->{blocked} }) eq join(',', sort keys %db_blocked);
	}
}
is_deeply(\@lost, [],
	scalar(@sequences) . ' sequences of skips, notifications and hints: both instances applied every event and agree with the database on who is blocked')
  or diag join "\n", @lost;
cmp_ok(query('SELECT count(*) FROM flagmeter.outbox WHERE NOT notified'),
	'>', 0, 'some events were skipped');
cmp_ok($instances{A}{replays}, '>', 0, 'the instances replayed from the outbox');
is(query(q{SELECT count(*) FROM flagmeter.notification_skips}), '0',
	'no invalidation was skipped');
$stuck->quit;

$_->{psql}->quit for ($la, $lb);
$app->quit;
$node->stop;

done_testing();
