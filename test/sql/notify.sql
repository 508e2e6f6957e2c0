-- Notifications: the outbox of quota events, block state, and the invalidate
-- trigger's argument checks.  (Payloads are checked by the isolation spec
-- notify_payloads, which can show what a listener receives.)
SET client_min_messages = warning;
DROP EXTENSION flagmeter CASCADE;
CREATE EXTENSION flagmeter;
RESET client_min_messages;
SET search_path = flagmeter, public;
SET TimeZone = 'UTC';
\set SHOW_CONTEXT never

SELECT define_meter('calls'), define_plan('small'),
       set_limit('small', 'calls', 10, 'lifetime', 'hard', '{50,80,100}'),
       assign_plan('acme', 'small');
SELECT version, kind, tenant, meter, plan, notified FROM outbox ORDER BY version;

-- The hot path below every threshold records nothing
SELECT track('acme', 'calls', 1), track('acme', 'calls', 3);
SELECT count(*) AS events_after_4_of_10 FROM outbox WHERE kind = 'threshold';

-- Reaching thresholds: each once per period, whatever else happens
SELECT track('acme', 'calls', 1);					-- 5 of 10: 50 %
SELECT track('acme', 'calls', 4);					-- 9 of 10: 80 %
SELECT track('acme', 'calls', 1);					-- 10: 100 % and blocked
SELECT track('acme', 'calls', 1);					-- past it: nothing new
SELECT granted, used FROM consume('acme', 'calls', 1);	-- refused: nothing new
SELECT version, kind, tenant, meter, threshold, used, quota, period_start FROM outbox
WHERE kind IN ('threshold', 'blocked') ORDER BY version;
SELECT tenant, meter, period_start FROM blocked;

-- A rolled-back transaction announces nothing; a rolled-back subtransaction
-- drops what it queued
SELECT assign_plan('globex', 'small');
BEGIN;
SELECT track('globex', 'calls', 10);
ROLLBACK;
BEGIN;
SAVEPOINT s;
SELECT track('globex', 'calls', 10);
ROLLBACK TO SAVEPOINT s;
SELECT track('globex', 'calls', 2);
COMMIT;
SELECT count(*) AS globex_events FROM outbox WHERE tenant = 'globex' AND kind NOT IN ('plan_changed', 'limit_changed');

-- Raising the limit unblocks; changes are recorded with the plan
SELECT set_limit('small', 'calls', 100, 'lifetime', 'hard', '{50,80,100}');
SELECT kind, tenant, meter, plan, used, quota FROM outbox
WHERE version > (SELECT max(version) FROM outbox WHERE kind = 'blocked') ORDER BY version;
SELECT count(*) AS still_blocked FROM blocked;

-- Overrides and plan moves are recorded too
SELECT define_plan('big'), override_limit('acme', 'calls', 5);
SELECT latest_version() AS before_move \gset
-- big has no limit for calls: the override stays, now counted in months (the
-- override inherits the period) from acme's anchor, which stays, so its
-- usage stays, and is over 5: blocked in the new period, unblocked in the
-- old one first
SELECT assign_plan('acme', 'big');
SELECT kind, tenant, meter, plan, threshold, used, quota, period FROM outbox
WHERE version > :before_move ORDER BY version;

-- Resync: versions are consecutive in commit order; changes_since replays
SELECT count(*) AS all_events, min(version) AS first, max(version) AS last FROM outbox;
SELECT latest_version() = (SELECT max(version) FROM outbox) AS latest_is_max;
SELECT kind, tenant FROM changes_since((SELECT max(version) - 2 FROM outbox));

-- A void that brings a blocked tenant back under its limit unblocks it
SELECT define_plan('tiny'), set_limit('tiny', 'calls', 3, 'lifetime'), assign_plan('initech', 'tiny');
SELECT track('initech', 'calls', 2, idempotency_key => 'two'), track('initech', 'calls', 1);
SELECT count(*) AS initech_blocked FROM blocked WHERE tenant = 'initech';
SELECT void('initech', 'two');
SELECT count(*) AS initech_blocked FROM blocked WHERE tenant = 'initech';
SELECT kind, used, quota FROM outbox WHERE tenant = 'initech' ORDER BY version DESC LIMIT 1;

-- Blocked is a state: blocked again after being unblocked, in the same
-- session, is announced again
SELECT define_plan('again'), set_limit('again', 'calls', 10, 'lifetime', 'hard', '{100}'),
       assign_plan('hooli', 'again');
SELECT granted, used FROM consume('hooli', 'calls', 10);
SELECT override_limit('hooli', 'calls', 20);
SELECT granted, used FROM consume('hooli', 'calls', 10);
SELECT granted, used FROM consume('hooli', 'calls', 1);
SELECT count(*) AS hooli_blocked FROM blocked WHERE tenant = 'hooli';
SELECT kind, threshold, used, quota FROM outbox WHERE tenant = 'hooli' ORDER BY version;

-- limit_changed carries the limit now in force: the plan's own (no tenant)
-- from set_limit, and one per tenant whose limit changed, so that an app
-- instance needs no reload query; no quota means no limit any more.
SELECT define_plan('monthly'), set_limit('monthly', 'calls', 10, 'month', 'hard', '{80,100}'),
       assign_plan('umbrella', 'monthly', '2026-01-15 00:00:00+00', 'UTC');
SELECT kind, tenant, meter, plan, quota, period, mode, thresholds FROM outbox
WHERE version > (SELECT max(version) FROM outbox WHERE tenant = 'hooli') ORDER BY version;
SELECT track('umbrella', 'calls', 8);
-- Lowering the limit below the usage blocks at once (every consume would be
-- refused and record nothing, so nothing else would say so), and every
-- blocked event says when the block ends by itself: the end of the period.
SELECT override_limit('umbrella', 'calls', 5);
SELECT kind, meter, threshold, used, quota, period, mode, thresholds,
       resets_at = (SELECT period_end FROM period_bounds(now(), 'month', '2026-01-15 00:00:00+00', 'UTC'))
         AS resets_at_period_end
FROM outbox WHERE tenant = 'umbrella' ORDER BY version;
SELECT meter, resets_at = (SELECT period_end FROM period_bounds(now(), 'month', '2026-01-15 00:00:00+00', 'UTC'))
         AS resets_at_period_end
FROM blocked WHERE tenant = 'umbrella';
SELECT granted, used, quota FROM consume('umbrella', 'calls', 1);
-- Dropping the override gives the plan's limit back: unblocked, and the
-- limit it has now
SELECT drop_override('umbrella', 'calls');
SELECT kind, used, quota, period, mode, thresholds, resets_at IS NULL AS no_resets_at
FROM outbox WHERE tenant = 'umbrella' ORDER BY version DESC LIMIT 2;
-- A limit of a plan changed to the same values announces the plan's limit
-- only: no tenant's limit in force changed
SELECT set_limit('monthly', 'calls', 10, 'month', 'hard', '{80,100}');
SELECT kind, tenant, quota FROM outbox ORDER BY version DESC LIMIT 1;

-- Stats
SELECT notifications_sent > 0 AS sent, notifications_skipped, blocked FROM stats;

-- announce() is for flagmeter's own functions; it checks its arguments
SELECT announce('threshold', 'acme', 'calls');
SELECT announce('bogus', 'acme', 'calls');
SELECT announce(NULL, 'acme', 'calls');
SELECT announce('blocked', 'acme', NULL);

-- invalidate(): wrong timing, unknown column, no primary key, not a trigger
CREATE TABLE app_items (id int PRIMARY KEY, name text);
CREATE TABLE app_nokey (name text);
CREATE TRIGGER too_early BEFORE INSERT ON app_items
	FOR EACH ROW EXECUTE FUNCTION flagmeter.invalidate();
INSERT INTO app_items VALUES (1, 'a');
DROP TRIGGER too_early ON app_items;
CREATE TRIGGER bad_column AFTER INSERT ON app_items
	FOR EACH ROW EXECUTE FUNCTION flagmeter.invalidate('nope');
INSERT INTO app_items VALUES (1, 'a');
DROP TRIGGER bad_column ON app_items;
CREATE TRIGGER no_key AFTER INSERT ON app_nokey
	FOR EACH ROW EXECUTE FUNCTION flagmeter.invalidate();
INSERT INTO app_nokey VALUES ('a');
DROP TRIGGER no_key ON app_nokey;
SELECT flagmeter.invalidate();
-- nothing was written by the failed statements
SELECT (SELECT count(*) FROM app_items) AS items, (SELECT count(*) FROM app_nokey) AS nokey;
DROP TABLE app_items, app_nokey;

-- Alerts from track without reading the whole period on every call: a
-- stripe's recheck_at says when track must read again.  One writer reaches
-- each level at exactly the call that crosses it (used = the level).
SELECT define_plan('stepped'),
       set_limit('stepped', 'calls', 1000, 'lifetime', 'soft', '{10,50,90}'),
       assign_plan('stepper', 'stepped'), assign_plan('batcher', 'stepped');
SET flagmeter.one_write_track = off;	-- the figure below is a stripe's
SELECT count(track('stepper', 'calls')) FROM generate_series(1, 949);
SELECT threshold, used FROM outbox WHERE tenant = 'stepper' AND kind = 'threshold' ORDER BY version;
-- past the last threshold of a soft limit nothing is left to reach, but the
-- bigint range: the next read is far away
SELECT recheck_at > 1000000000000 AS next_read_far FROM counters WHERE tenant = 'stepper';
-- a changed limit is seen on the next call (its fingerprint differs)
SELECT set_limit('stepped', 'calls', 1000, 'lifetime', 'soft', '{10,50,90,95}');
SELECT track('stepper', 'calls');
SELECT threshold, used FROM outbox WHERE tenant = 'stepper' AND kind = 'threshold' ORDER BY version;
RESET flagmeter.one_write_track;
-- track_batch: the same figures; each level announced by the batch that crosses it
SELECT track_batch(array_fill('batcher'::text, ARRAY[40]), array_fill('calls'::text, ARRAY[40]),
                   array_fill(1::bigint, ARRAY[40]))
FROM generate_series(1, 25);
SELECT threshold, used FROM outbox WHERE tenant = 'batcher' AND kind = 'threshold' ORDER BY version;
-- max: the period's max is its greatest stripe's, no read needed
SELECT define_meter('peak', 'max');
SELECT set_limit('stepped', 'peak', 100, 'lifetime', 'hard', '{50}');
SELECT track('stepper', 'peak', 40), track('stepper', 'peak', 60), track('stepper', 'peak', 10);
SELECT kind, threshold, used FROM outbox WHERE tenant = 'stepper' AND meter = 'peak' ORDER BY version;
