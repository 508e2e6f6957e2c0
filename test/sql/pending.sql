-- One write per track (src/pending.c): preloaded, a track of a sum or count
-- meter without a key, credit grants or a pool writes its event only, with
-- the period it counts in; its amount is pending in shared memory until
-- maintain() folds it into the period's merged stripe.  Every read adds
-- the pending amounts its snapshot sees.  (make test runs the suite again
-- with flagmeter.one_write_track = off; this file turns it on.)
SET client_min_messages = warning;
DROP EXTENSION flagmeter CASCADE;
CREATE EXTENSION flagmeter;
RESET client_min_messages;
SET search_path = flagmeter, public;
-- this file meters tenants never assigned a plan and tracks events at
-- fixed dates, which a new database refuses (QT001, QT002): it turns
-- both off
SELECT flagmeter.configure(unassigned_tenants => 'unlimited', late_events => '100 years',
	future_events => '100 years') \gset
SET TimeZone = 'UTC';
SET flagmeter.one_write_track = on;
SET flagmeter.lock_free_consume = on;
\set SHOW_CONTEXT never

SELECT define_meter('calls'), define_meter('peak', 'max'), define_plan('p'),
       set_limit('p', 'calls', 10, 'month', 'hard', '{80,100}'),
       assign_plan('acme', 'p', '2026-01-01 00:00:00+00', 'UTC');
SELECT status, periods, transactions FROM pending_usage_stats();

-- One write: the event, with its period; no counter row
SELECT track('acme', 'calls', 3);
SELECT count(*) AS counter_rows FROM counters WHERE tenant = 'acme';
SELECT amount, period_start = date_trunc('month', now()) AS pending_in_this_month
FROM events WHERE tenant = 'acme';
SELECT used(usage('acme', 'calls')) AS used, remaining FROM flagmeter.check('acme', 'calls');

-- A transaction sees its own pending usage; rolled back (or a rolled-back
-- subtransaction), it leaves none
BEGIN;
SELECT track('acme', 'calls', 2);
SELECT used(usage('acme', 'calls')) AS own_uncommitted;
ROLLBACK;
BEGIN;
SAVEPOINT s;
SELECT track('acme', 'calls', 4);
ROLLBACK TO SAVEPOINT s;
SELECT track('acme', 'calls', 1);
SELECT used(usage('acme', 'calls')) AS after_savepoint;
COMMIT;
SELECT used(usage('acme', 'calls')) AS committed;

-- Alerts: the track that takes the period to 80 % announces it
SELECT track('acme', 'calls', 4);
SELECT kind, threshold, used, quota FROM outbox
WHERE tenant = 'acme' AND kind IN ('threshold', 'blocked') ORDER BY version;

-- consume counts the pending usage (and, deciding without the row lock,
-- writes its event alone too): 2 more reach the quota, 1 more does not fit
SELECT granted, used, remaining FROM consume('acme', 'calls', 2);
SELECT granted, used, remaining FROM consume('acme', 'calls', 1);
SELECT kind, threshold, used FROM outbox
WHERE tenant = 'acme' AND kind IN ('threshold', 'blocked') ORDER BY version;

-- A max meter, a keyed track and a refused write keep their stripes
SELECT track('acme', 'peak', 5), track('acme', 'calls', 0, now(), 'k-1');
SELECT meter, stripe > 0 AS track_stripe, used(counter) FROM counters
WHERE tenant = 'acme' ORDER BY meter, stripe;
SELECT count(*) FILTER (WHERE period_start IS NOT NULL) AS pending_events,
       count(*) FILTER (WHERE period_start IS NULL) AS counted_events
FROM events WHERE tenant = 'acme';

-- A sum that would overflow is refused, nothing written
SELECT count(*) AS events_before FROM events \gset
\set VERBOSITY terse
SELECT track('acme', 'calls', 9223372036854775807);
\set VERBOSITY default
SELECT count(*) - :events_before AS events_written FROM events;

-- A prepared transaction outlives a restart, which shared memory does not:
-- before it is prepared, its pending amounts go into a stripe and its
-- events are marked counted (those of a rolled-back savepoint are gone)
BEGIN;
SELECT track('globex', 'calls', 2);
SAVEPOINT s;
SELECT track('globex', 'calls', 40);
ROLLBACK TO SAVEPOINT s;
SELECT track('globex', 'calls', 1);
PREPARE TRANSACTION 'fm-pending';
SELECT used(usage('globex', 'calls')) AS globex_prepared;
COMMIT PREPARED 'fm-pending';
SELECT used(usage('globex', 'calls')) AS globex_committed;
SELECT stripe > 0 AS track_stripe, used(counter) FROM counters WHERE tenant = 'globex';
SELECT count(*) FILTER (WHERE period_start IS NOT NULL) AS pending_events, count(*) AS events
FROM events WHERE tenant = 'globex';

-- maintain() folds the settled amounts into the merged stripe (32767) and
-- moves counted_through past their transactions: usage stays the same
SELECT used(usage('acme', 'calls')) AS before_fold;
SELECT 1 AS maintained FROM maintain();
SELECT stripe, used(counter) FROM counters
WHERE tenant = 'acme' AND meter = 'calls' ORDER BY stripe;
SELECT used(usage('acme', 'calls')) AS after_fold, remaining FROM flagmeter.check('acme', 'calls');
SELECT count(*) AS still_pending FROM events e, current_state s
WHERE e.tenant = 'acme' AND e.period_start IS NOT NULL
  AND e.xid >= xid_int(s.counted_through);
SELECT has_pending_events('acme', 'calls') AS acme_pending;
SELECT track('acme', 'calls', 0);
SELECT has_pending_events('acme', NULL) AS acme_pending_again;

-- recount_current_period leaves the pending usage pending and counts the
-- rest into stripe 0: the total stays
SELECT track('initech', 'calls', 2), track('initech', 'calls', 3, now(), 'k-2');
SELECT recount_current_period('initech', 'calls');
SELECT used(usage('initech', 'calls')) AS initech_after_recount;
SELECT stripe, used(counter) FROM counters WHERE tenant = 'initech' ORDER BY stripe;

-- delete_usage takes the pending usage with the rows; rolled back, it stays
BEGIN;
SELECT delete_usage('initech', NULL);
SELECT used(usage('initech', 'calls')) AS deleted_in_transaction;
ROLLBACK;
SELECT used(usage('initech', 'calls')) AS after_rollback;
SELECT delete_usage('initech', NULL);
SELECT used(usage('initech', 'calls')) AS after_delete;
SELECT has_pending_events('initech', NULL) AS initech_pending;
SELECT pending_drop('acme', NULL, NULL);

-- track_batch writes events alone where track would, per (tenant, meter,
-- period) of the call: pending unless one of the period's events has a key
-- (or the meter is not a sum or count); a threshold reached by its pending
-- usage is announced, and a rolled-back batch leaves nothing pending
SELECT define_plan('q'), set_limit('q', 'calls', 100, 'month', 'hard', '{50,100}'),
       assign_plan('batcher', 'q', '2026-01-01 00:00:00+00', 'UTC'),
       assign_plan('keyed', 'q', '2026-01-01 00:00:00+00', 'UTC');
SELECT track_batch(ARRAY['batcher', 'batcher', 'batcher', 'keyed', 'keyed', 'batcher'],
                   ARRAY['calls', 'calls', 'peak', 'calls', 'calls', 'calls'],
                   ARRAY[20, 20, 5, 1, 2, 15]::bigint[], NULL,
                   ARRAY[NULL, NULL, NULL, 'k-b1', NULL, NULL]);
SELECT tenant, meter, count(*) FILTER (WHERE period_start IS NOT NULL) AS pending_events,
       count(*) FILTER (WHERE period_start IS NULL) AS counted_events,
       (SELECT count(*) FROM counters c WHERE c.tenant = e.tenant AND c.meter = e.meter) AS counter_rows
FROM events e WHERE tenant IN ('batcher', 'keyed') GROUP BY 1, 2 ORDER BY 1, 2;
SELECT t AS tenant, c.used, c.remaining
FROM unnest(ARRAY['batcher', 'keyed']) t, LATERAL flagmeter.check(t, 'calls') c ORDER BY 1;
SELECT kind, threshold, used FROM outbox WHERE tenant = 'batcher' AND kind = 'threshold';
BEGIN;
SELECT track_batch(ARRAY['batcher'], ARRAY['calls'], ARRAY[30]::bigint[]);
SELECT used(usage('batcher', 'calls')) AS own_uncommitted;
ROLLBACK;
SELECT used(usage('batcher', 'calls')) AS after_rollback;

-- A transaction keeps one slot per period however many calls add to it: a
-- batch that is the transaction's first add does not look for its slot in
-- the periods (each of its groups is a period of its own), later calls do
SELECT transactions AS slots_before FROM pending_usage_stats() \gset
BEGIN;
SELECT track_batch(ARRAY['slotted', 'slotted'], ARRAY['calls', 'calls'], ARRAY[1, 2]::bigint[]);
SELECT track('slotted', 'calls', 3);
SELECT track_batch(ARRAY['slotted'], ARRAY['calls'], ARRAY[4]::bigint[]);
SELECT transactions - :slots_before AS slots_of_this_transaction,
       used(usage('slotted', 'calls')) AS own_uncommitted
FROM pending_usage_stats();
COMMIT;
SELECT used(usage('slotted', 'calls')) AS slotted_used;

-- With one_write_track off, the same call writes a stripe; both count
SET flagmeter.one_write_track = off;
SELECT track('acme', 'calls', 0, '2026-01-05 00:00:00+00'), track('hooli', 'calls', 7);
SELECT count(*) AS hooli_rows FROM counters WHERE tenant = 'hooli';
RESET flagmeter.one_write_track;
SELECT track('hooli', 'calls', 5);
SELECT used(usage('hooli', 'calls')) AS hooli_both_ways;

-- An amount added and rolled back is not usage: it cannot make a later add
-- overflow (the entry counts what did not roll back before refusing), in
-- either call; a true overflow is still refused
SET flagmeter.one_write_track = on;
BEGIN;
SELECT track('huge', 'calls', 9223372036854775000);
ROLLBACK;
SELECT track('huge', 'calls', 9223372036854775000),
       track_batch(ARRAY['huge'], ARRAY['calls'], ARRAY[800]::bigint[]);
SELECT used(usage('huge', 'calls')) AS huge_used;
\set VERBOSITY terse
SELECT track('huge', 'calls', 8);
\set VERBOSITY default
SELECT delete_usage('huge', NULL);
RESET flagmeter.one_write_track;

SELECT status, periods > 0 AS has_periods, added > 0 AS added, folded > 0 AS folded,
       rebuilt > 0 AS rebuilt, no_room
FROM pending_usage_stats();
