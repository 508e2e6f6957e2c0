# test/t/050_crash_safety.pl -- the server crashes under load; nothing a
# client saw commit is lost or counted twice.
#
# Two rounds.  In each, 8 pgbench clients run one script over and over:
# track(tenant 'tr0'..'tr3', 'calls'), then consume('hardR', 'units') against
# a lifetime hard limit of 150 units, and on every fifth transaction a void of
# the track; a ninth client runs maintain() every 50 ms.  Every call has an
# idempotency key made of the round, the client and a per-client sequence
# number ("r1-3-17"), and its amount is derived from the same numbers, so
# the whole key space is known afterwards.  After each call returns (in
# autocommit: after its COMMIT, with synchronous_commit on) the client
# appends a line to an ack file with \shell: the transactions the clients
# saw commit.  Once the hard limit refuses consumes, the server is crashed
# in the middle of the load: round 1 kills the postmaster with SIGKILL (its
# backends die on their own), round 2 is an immediate shutdown (SIGQUIT, no
# checkpoint).  Both leave recovery to replay the WAL.  fsync is off in TAP
# clusters; that does not matter here, since only processes die, not the
# operating system's page cache.
#
# After the restart, with the ack file loaded into a table:
#   - every acked track has its key and exactly one raw event; every acked
#     consume has its key, with the decision the client got, and one event
#     if granted, none if refused; every acked void is marked and logged;
#   - no key has two events, and no keyed event lacks its key;
#   - the counters equal a recount from the raw events (minus the voided
#     ones), for every tenant and meter;
#   - the hard limit was never exceeded, the grants form one chain (each
#     grant's used is the previous grant's plus its amount) and the outbox
#     holds exactly the thresholds that the committed usage crossed;
#   - every call is replayed with its key (what a client does when its
#     connection breaks): acked tracks and voids answer "already done",
#     acked consumes return the original decision, unacked ones are done
#     now, and afterwards every key of the run is counted exactly once;
#   - maintain() completes after the restart, and the rollups then equal
#     the raw events minus the voids, with nothing left to fold.
use strict;
use warnings;

use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);

my $clients = 8;
my $quota = 150;

my $node = PostgreSQL::Test::Cluster->new('crash');
$node->init;
$node->append_conf('postgresql.conf', qq{
max_connections = 40
log_statement = none
synchronous_commit = on
});
$node->start;

my $dir = PostgreSQL::Test::Utils::tempdir;
my $ack_file = "$dir/acked";

$node->safe_psql(
	'postgres', qq{
	SET client_min_messages = warning;
	CREATE EXTENSION flagmeter;
	-- the trackers' tenants tr0..tr3 have no plan
	SELECT flagmeter.configure(unassigned_tenants => 'unlimited');
	SELECT flagmeter.define_meter('calls');
	SELECT flagmeter.define_meter('units');
	SELECT flagmeter.define_plan('p');
	SELECT flagmeter.set_limit('p', 'units', $quota, 'lifetime', 'hard', '{80,100}');
	SELECT flagmeter.assign_plan('hard1', 'p');
	SELECT flagmeter.assign_plan('hard2', 'p');
	SELECT flagmeter.maintain();
	-- what the clients were told, loaded from the ack file after a crash
	CREATE TABLE acked (kind text, round int, client int, seq int, r1 text, r2 bigint);
	-- what replaying every key answered
	CREATE TABLE replayed (kind text, round int, client int, seq int, r1 text, r2 bigint);
	-- the key, tenant and amount of a call, as the pgbench script makes them
	CREATE FUNCTION k(round int, client int, seq int) RETURNS text
		LANGUAGE sql IMMUTABLE AS \$\$ SELECT 'r' || round || '-' || client || '-' || seq \$\$;
	CREATE FUNCTION tr(seq int) RETURNS text
		LANGUAGE sql IMMUTABLE AS \$\$ SELECT 'tr' || seq % 4 \$\$;
	CREATE FUNCTION amt(client int, seq int) RETURNS bigint
		LANGUAGE sql IMMUTABLE AS \$\$ SELECT 1 + (client + seq) % 3 \$\$;
});

# The load.  Variables persist from one run of the script to the next in a
# client, so :seq numbers its transactions.  A \shell line is written only
# once the statement before it has returned, i.e. has committed.
my $load_script = qq{
\\set seq :seq + 1
\\set amount 1 + (:client_id + :seq) % 3
SELECT flagmeter.track('tr' || :seq % 4, 'calls', :amount, now(), 'r' || :round || '-' || :client_id || '-' || :seq) AS counted \\gset
\\shell echo track :round :client_id :seq :counted 0 >> $ack_file
SELECT d.granted, d.used FROM flagmeter.consume('hard' || :round, 'units', :amount, 'r' || :round || '-' || :client_id || '-' || :seq) AS d \\gset
\\shell echo consume :round :client_id :seq :granted :used >> $ack_file
\\if :seq % 5 = 0
SELECT flagmeter.void('tr' || :seq % 4, 'r' || :round || '-' || :client_id || '-' || :seq) AS voided \\gset
\\shell echo void :round :client_id :seq :voided 0 >> $ack_file
\\endif
};
my $maintain_script = q{
SELECT flagmeter.maintain();
\sleep 50 ms
};
my $load_file = "$dir/load.sql";
my $maintain_file = "$dir/maintain.sql";
PostgreSQL::Test::Utils::append_to_file($load_file, $load_script);
PostgreSQL::Test::Utils::append_to_file($maintain_file, $maintain_script);

# One value (or several lines) of a query, in a fresh session.
sub query
{
	my ($sql) = @_;
	return $node->safe_psql('postgres', $sql);
}

# A pgbench run in the background; -j = -c, since \shell blocks its thread.
sub start_pgbench
{
	my ($file, $nclients, @vars) = @_;
	my ($out, $err) = ('', '');
	my @cmd = (
		'pgbench', '-n', '-h', $node->host, '-p', $node->port,
		'-c', $nclients, '-j', $nclients, '-T', 60,
		(map { ('-D', $_) } @vars), '-f', $file, 'postgres');
	my $h = IPC::Run::start(\@cmd, '>', \$out, '2>', \$err,
		IPC::Run::timeout($PostgreSQL::Test::Utils::timeout_default));
	return { h => $h, out => \$out, err => \$err };
}

sub finish_pgbench
{
	my ($run) = @_;
	$run->{h}->finish;
	return ($run->{h}->result(0), ${ $run->{out} }, ${ $run->{err} });
}

# Acked lines of a round in the ack file, and how many were refusals.
sub acked_so_far
{
	my ($round) = @_;
	return (0, 0) unless -e $ack_file;
	my @lines = grep { /^\w+ $round / } split /\n/,
	  PostgreSQL::Test::Utils::slurp_file($ack_file);
	my $refused = grep { /^consume $round \d+ \d+ f / } @lines;
	return (scalar(@lines), $refused);
}

# The postmaster's children, to wait for after SIGKILL: until the last one
# has exited a new postmaster refuses the old shared memory.
sub postmaster_children
{
	my ($pm) = @_;
	my @children;
	opendir(my $proc, '/proc') or die "cannot read /proc: $!";
	for my $pid (grep { /^\d+$/ } readdir $proc)
	{
		open(my $fh, '<', "/proc/$pid/stat") or next;
		my $stat = <$fh>;
		close $fh;
		# pid (comm) state ppid ...
		push @children, $pid if $stat && $stat =~ /\)\s+\S+\s+(\d+)/ && $1 == $pm;
	}
	closedir $proc;
	return @children;
}

sub alive
{
	my ($pid) = @_;
	open(my $fh, '<', "/proc/$pid/stat") or return 0;
	my $stat = <$fh>;
	close $fh;
	return $stat !~ /\)\s+Z\s/;    # a zombie holds no shared memory
}

sub crash_and_restart
{
	my ($how) = @_;
	if ($how eq 'SIGKILL')
	{
		my ($pm) = split /\n/,
		  PostgreSQL::Test::Utils::slurp_file($node->data_dir . '/postmaster.pid');
		my @children = postmaster_children($pm);
		$node->kill9;
		# The new postmaster takes over the lock file only once the old PID
		# is gone (reaped, not merely a zombie), and the shared memory once
		# the old backends have exited.
		my $deadline = time + $PostgreSQL::Test::Utils::timeout_default;
		usleep(100_000)
		  while (kill(0, $pm) || grep({ alive($_) } @children)) && time < $deadline;
		# a child forked just before the kill may still hold the memory
		for my $try (1 .. 50)
		{
			last if $node->start(fail_ok => 1);
			usleep(200_000);
		}
	}
	else
	{
		$node->stop('immediate');
		$node->start;
	}
	$node->poll_query_until('postgres', 'SELECT NOT pg_is_in_recovery()')
	  or die 'the server did not finish recovery';
}

# Violations of a claim: the query returns the offending rows, one per line.
sub none
{
	my ($sql, $name) = @_;
	my $rows = query($sql);
	is($rows, '', $name);
}

for my $round (1, 2)
{
	my $how = $round == 1 ? 'SIGKILL' : 'immediate shutdown';
	my $hard = "hard$round";

	my $load = start_pgbench($load_file, $clients, 'seq=0', "round=$round");
	my $maint = start_pgbench($maintain_file, 1);

	# Crash once the limit refuses consumes and the load is well under way.
	my $deadline = time + 60;
	my ($lines, $refused) = (0, 0);
	while (time < $deadline)
	{
		($lines, $refused) = acked_so_far($round);
		last if $lines >= 150 && $refused >= 5;
		usleep(100_000);
	}
	note "round $round: $lines calls acked, $refused refusals, then $how";
	cmp_ok($refused, '>=', 5,
		"round $round: the hard limit refuses consumes before the crash");

	crash_and_restart($how);

	my ($load_rc, undef, $load_err) = finish_pgbench($load);
	my ($maint_rc, undef, $maint_err) = finish_pgbench($maint);
	isnt($load_rc, 0, "round $round: the $how cut the load short (pgbench failed)");
	unlike($load_err . $maint_err, qr/ERROR:/,
		"round $round: no call failed except by losing its connection")
	  or diag($load_err . $maint_err);

	query(qq{TRUNCATE acked; COPY acked FROM '$ack_file' (DELIMITER ' ')});
	my $acked = query("SELECT count(*) FROM acked WHERE round = $round");
	note "round $round: $acked acked calls after the restart";

	# --- nothing acked is lost, nothing counted twice ---------------------

	none(qq{
		SELECT a.* FROM acked a
		WHERE a.kind = 'track'
		  AND (a.r1 <> 't'
		    OR (SELECT count(*) FROM flagmeter.event_keys k
		        WHERE k.tenant = tr(a.seq) AND k.idempotency_key = k(a.round, a.client, a.seq)
		          AND k.kind = 'track' AND k.meter = 'calls'
		          AND k.amount = amt(a.client, a.seq)) <> 1
		    OR (SELECT count(*) FROM flagmeter.events e
		        WHERE e.tenant = tr(a.seq) AND e.idempotency_key = k(a.round, a.client, a.seq)
		          AND e.meter = 'calls' AND e.amount = amt(a.client, a.seq)) <> 1)},
		"round $round: every acked track has its key and exactly one event");

	none(qq{
		SELECT a.* FROM acked a
		WHERE a.kind = 'consume'
		  AND ((SELECT count(*) FROM flagmeter.event_keys k
		        WHERE k.tenant = 'hard' || a.round AND k.idempotency_key = k(a.round, a.client, a.seq)
		          AND k.kind = 'consume' AND k.amount = amt(a.client, a.seq)
		          AND k.granted = a.r1::boolean AND k.used = a.r2) <> 1
		    OR (SELECT count(*) FROM flagmeter.events e
		        WHERE e.tenant = 'hard' || a.round AND e.idempotency_key = k(a.round, a.client, a.seq)
		          AND e.meter = 'units' AND e.amount = amt(a.client, a.seq))
		       <> CASE WHEN a.r1::boolean THEN 1 ELSE 0 END)},
		"round $round: every acked consume has its key and decision, and one event iff granted"
	);

	none(qq{
		SELECT a.* FROM acked a
		WHERE a.kind = 'void'
		  AND (a.r1 <> 't'
		    OR NOT EXISTS (SELECT FROM flagmeter.event_keys k
		                   WHERE k.tenant = tr(a.seq) AND k.idempotency_key = k(a.round, a.client, a.seq)
		                     AND k.voided_at IS NOT NULL)
		    OR (SELECT count(*) FROM flagmeter.voids v
		        WHERE v.tenant = tr(a.seq) AND v.idempotency_key = k(a.round, a.client, a.seq)) <> 1)},
		"round $round: every acked void is marked on its key and logged once");

	none(q{
		SELECT tenant, idempotency_key, meter, count(*) FROM flagmeter.events
		WHERE idempotency_key IS NOT NULL
		GROUP BY 1, 2, 3 HAVING count(*) > 1},
		"round $round: no key has more than one event");

	none(q{
		SELECT e.tenant, e.idempotency_key FROM flagmeter.events e
		WHERE NOT EXISTS (SELECT FROM flagmeter.event_keys k
		                  WHERE k.tenant = e.tenant AND k.idempotency_key = e.idempotency_key
		                    AND k.meter = e.meter)},
		"round $round: every event has its key (same transaction)");

	# --- counters, hard limit, outbox -------------------------------------

	my $recount = q{
		SELECT * FROM (
			SELECT tenant, meter,
			       sum(flagmeter.used(counter)) AS used, sum(flagmeter.events(counter)) AS n
			FROM flagmeter.counters GROUP BY 1, 2) c
		FULL JOIN (
			SELECT e.tenant, e.meter, sum(e.amount) AS used, count(*) AS n
			FROM flagmeter.events e
			WHERE NOT EXISTS (SELECT FROM flagmeter.event_keys k
			                  WHERE k.tenant = e.tenant AND k.idempotency_key = e.idempotency_key
			                    AND k.meter = e.meter AND k.voided_at IS NOT NULL)
			GROUP BY 1, 2) e USING (tenant, meter)
		WHERE coalesce(c.used, 0) <> coalesce(e.used, 0) OR coalesce(c.n, 0) <> coalesce(e.n, 0)};
	none($recount,
		"round $round: counters equal a recount of the raw events minus the voided ones");

	# consume's meter has no voids: the whole counter must match
	none(q{
		SELECT c.tenant FROM (
			SELECT tenant, flagmeter.merge_agg(counter) AS counter
			FROM flagmeter.counters WHERE meter = 'units' GROUP BY 1) c
		FULL JOIN (
			SELECT tenant, flagmeter.quota_counter_agg(amount, occurred_at) AS counter
			FROM flagmeter.events WHERE meter = 'units' GROUP BY 1) e USING (tenant)
		WHERE c.counter IS NULL OR e.counter IS NULL
		   OR NOT c.counter OPERATOR(flagmeter.=) e.counter},
		"round $round: the consumed counters equal quota_counter_agg of their events");

	my $used = query(
		"SELECT flagmeter.used(flagmeter.usage('$hard', 'units'))");
	cmp_ok($used, '<=', $quota, "round $round: used ($used) never exceeds the hard limit");
	is( query(
			"SELECT coalesce(sum(amount), 0) FROM flagmeter.event_keys WHERE tenant = '$hard' AND granted"
		),
		$used,
		"round $round: used equals the sum of the committed grants");
	none(qq{
		SELECT * FROM (
			SELECT used, amount, lag(used, 1, 0::bigint) OVER (ORDER BY used) AS before
			FROM flagmeter.event_keys WHERE tenant = '$hard' AND granted) g
		WHERE used - amount <> before},
		"round $round: the committed grants form one chain");
	none(qq{
		SELECT * FROM flagmeter.event_keys
		WHERE tenant = '$hard' AND NOT granted AND amount <= remaining},
		"round $round: every committed refusal was for more than what remained");
	is( query(
			qq{SELECT string_agg(threshold::text, ',' ORDER BY threshold) FROM flagmeter.outbox
			   WHERE kind = 'threshold' AND tenant = '$hard'}),
		join(',', grep { $used * 100 >= $quota * $_ } (80, 100)),
		"round $round: the outbox holds the thresholds the committed usage crossed, once each"
	);

	# --- maintain() after the crash ---------------------------------------

	my ($rc, $out, $err) = $node->psql('postgres', 'SELECT flagmeter.maintain()');
	is($rc, 0, "round $round: maintain() completes after the restart") or diag($err);

	my $rollups = q{
		SELECT (SELECT sum(flagmeter.used(counter)) FROM flagmeter.rollup_hour) || ' ' ||
		       (SELECT sum(flagmeter.events(counter)) FROM flagmeter.rollup_hour) || ' ' ||
		       (SELECT sum(flagmeter.used(counter)) FROM flagmeter.rollup_day) || ' ' ||
		       (SELECT pending_events FROM flagmeter.stats) || ' ' ||
		       (SELECT pending_voids FROM flagmeter.stats)};
	my $expected = q{
		SELECT ((SELECT sum(amount) FROM flagmeter.events) - (SELECT coalesce(sum(amount), 0) FROM flagmeter.voids)) || ' ' ||
		       ((SELECT count(*) FROM flagmeter.events) - (SELECT count(*) FROM flagmeter.voids)) || ' ' ||
		       ((SELECT sum(amount) FROM flagmeter.events) - (SELECT coalesce(sum(amount), 0) FROM flagmeter.voids)) ||
		       ' 0 0'};
	is(query($rollups), query($expected),
		"round $round: after maintain() the rollups equal the raw events minus the voids, nothing pending"
	);

	# --- replay every key of the round -------------------------------------

	# Each client's calls up to the one after its last acked call (the one
	# in flight at the crash, committed or not), in the clients' order.
	query(qq{
		DO \$\$
		DECLARE
			c int;
			s int;
			last_seq int;
			d flagmeter.decision;
		BEGIN
			FOR c IN 0 .. $clients - 1 LOOP
				SELECT coalesce(max(seq), 0) + 1 INTO last_seq
				FROM acked WHERE round = $round AND client = c;
				FOR s IN 1 .. last_seq LOOP
					INSERT INTO replayed
					VALUES ('track', $round, c, s,
					        flagmeter.track(tr(s), 'calls', amt(c, s), now(), k($round, c, s))::text, 0);
					d := flagmeter.consume('$hard', 'units', amt(c, s), k($round, c, s));
					INSERT INTO replayed VALUES ('consume', $round, c, s, d.granted::text, d.used);
					IF s % 5 = 0 THEN
						INSERT INTO replayed
						VALUES ('void', $round, c, s, flagmeter.void(tr(s), k($round, c, s))::text, 0);
					END IF;
				END LOOP;
			END LOOP;
		END \$\$});

	none(qq{
		SELECT a.* FROM acked a
		JOIN replayed r USING (kind, round, client, seq)
		WHERE a.round = $round
		  AND (a.kind IN ('track', 'void') AND r.r1 <> 'false'
		    OR a.kind = 'consume' AND (r.r1::boolean <> a.r1::boolean OR r.r2 <> a.r2))},
		"round $round: replayed acked calls answer 'already done' (tracks, voids) or the original decision (consumes)"
	);
	is( query(qq{
			SELECT count(*) FROM acked a
			WHERE a.round = $round
			  AND NOT EXISTS (SELECT FROM replayed r
			                  WHERE (r.kind, r.round, r.client, r.seq) = (a.kind, a.round, a.client, a.seq))}),
		'0',
		"round $round: the replay covered every acked call");
	my $in_flight = query(qq{
		SELECT count(*) FROM replayed r
		WHERE r.round = $round AND r.kind = 'track' AND r.r1 = 'true'});
	cmp_ok($in_flight, '<=', $clients,
		"round $round: only calls in flight at the crash ($in_flight) are counted by the replay");

	none(qq{
		SELECT r.* FROM replayed r
		WHERE r.round = $round AND r.kind = 'track'
		  AND (SELECT count(*) FROM flagmeter.events e
		       WHERE e.tenant = tr(r.seq) AND e.idempotency_key = k(r.round, r.client, r.seq)) <> 1},
		"round $round: after the replay every tracked key has exactly one event");
	none(qq{
		SELECT r.* FROM replayed r
		WHERE r.round = $round AND r.kind = 'consume'
		  AND (SELECT count(*) FROM flagmeter.events e
		       WHERE e.tenant = '$hard' AND e.idempotency_key = k(r.round, r.client, r.seq))
		      <> (SELECT count(*) FROM flagmeter.event_keys k
		          WHERE k.tenant = '$hard' AND k.idempotency_key = k(r.round, r.client, r.seq)
		            AND k.granted)},
		"round $round: after the replay every consumed key has one event iff granted");
	none(qq{
		SELECT r.* FROM replayed r
		WHERE r.round = $round AND r.kind = 'void'
		  AND (SELECT count(*) FROM flagmeter.voids v
		       WHERE v.tenant = tr(r.seq) AND v.idempotency_key = k(r.round, r.client, r.seq)) <> 1},
		"round $round: after the replay every voided key is voided once");
	none($recount, "round $round: after the replay the counters still equal a recount");
	cmp_ok(query("SELECT flagmeter.used(flagmeter.usage('$hard', 'units'))"),
		'<=', $quota, "round $round: after the replay used still within the hard limit");
}

$node->stop;
done_testing();
