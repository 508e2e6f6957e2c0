-- Reservations (issue 19): reserve, settle, release; holds count as used
-- for every decision of the tenant's meter until settled, released or
-- expired (at once, without maintain()).
-- Every test file runs in the same database: start from a fresh extension.
SET client_min_messages = warning;
DROP EXTENSION flagmeter CASCADE;
CREATE EXTENSION flagmeter;
RESET client_min_messages;
SET search_path = flagmeter, public;
-- this file meters tenants never assigned a plan, which a new database
-- refuses (QT001): it turns that off
SELECT flagmeter.configure(unassigned_tenants => 'unlimited') \gset
SET TimeZone = 'UTC';
\set SHOW_CONTEXT never

CREATE FUNCTION pg_temp.try(sql text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
	EXECUTE sql;
	RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
	RETURN SQLSTATE || ': ' || SQLERRM;
END $$;

SELECT define_meter('tokens'), define_meter('calls', 'count'), define_meter('gpu');
SELECT define_plan('hard'), define_plan('soft');
SELECT set_limit('hard', 'tokens', 100, 'lifetime'), set_limit('hard', 'gpu', 10, 'lifetime'),
       set_limit('soft', 'tokens', 100, 'lifetime', 'soft');
SELECT assign_plan('ai', 'hard'), assign_plan('flex', 'hard'), assign_plan('soft', 'soft'),
       assign_plan('edge', 'hard'), assign_plan('multi', 'hard');

-- 1. Arguments ---------------------------------------------------------------------
SELECT sql, pg_temp.try(sql) AS result FROM (VALUES
	($$SELECT reserve('ai', 'tokens', 0)$$),
	($$SELECT reserve('ai', 'tokens', -1)$$),
	($$SELECT reserve('ai', 'tokens', NULL)$$),
	($$SELECT reserve(NULL, 'tokens', 1)$$),
	($$SELECT reserve('ai', 'nope', 1)$$),
	($$SELECT reserve('ai', 'calls', 1)$$),
	($$SELECT reserve('ai', 'tokens', 1, NULL)$$),
	($$SELECT reserve('ai', 'tokens', 1, '0 seconds')$$),
	($$SELECT reserve('ai', 'tokens', 1, '-1 minute')$$),
	($$SELECT reserve('ai', 'tokens', 1, idempotency_key => '')$$),
	($$SELECT settle(NULL, 1)$$),
	($$SELECT settle(1, NULL)$$),
	($$SELECT settle(1, -1)$$),
	($$SELECT settle(12345, 1)$$),
	($$SELECT release(NULL)$$),
	($$SELECT release(12345)$$)
) v(sql);
SELECT count(*) AS no_reservation_made FROM reservations;

-- 2. A hold counts as used for every other decision ---------------------------------
SELECT granted, reservation_id AS r1, reserved, expires_at > now() AS in_future, balance
FROM reserve('ai', 'tokens', 60) \gset
SELECT :'granted' AS granted, :'reserved' AS reserved, :'in_future' AS in_future, :'balance' AS balance;
SELECT granted, reservation_id, reserved, balance FROM reserve('ai', 'tokens', 41);
SELECT granted, used, remaining, reason, balance FROM consume('ai', 'tokens', 41);
SELECT granted, used, balance FROM "check"('ai', 'tokens', 40);
SELECT balance('ai', 'tokens');
SELECT granted, used, remaining, reason, balance FROM consume('ai', 'tokens', 40);
-- 3. settle records the actual amount and frees the rest ----------------------------
SELECT granted, used, remaining, reason, from_grants, balance FROM settle(:r1, 35);
SELECT balance('ai', 'tokens');
SELECT reserved IS NULL AS no_amount_column, amount, actual, settled_at IS NOT NULL AS settled
FROM (SELECT NULL::bigint AS reserved, amount, actual, settled_at FROM reservations
      WHERE reservation_id = :r1) r;
SELECT pg_temp.try(format('SELECT settle(%s, 1)', :r1)) AS settle_twice,
       release(:r1) AS release_settled;

-- 4. release gives the hold back; release twice is false; settle after it errs -----
SELECT reservation_id AS r2, balance FROM reserve('ai', 'tokens', 20) \gset
SELECT :'balance' AS balance_held;
SELECT release(:r2) AS released, release(:r2) AS released_again, balance('ai', 'tokens');
SELECT pg_temp.try(format('SELECT settle(%s, 1)', :r2)) AS settle_released;

-- 5. Expiry at the boundary, without maintain(): within its transaction a
-- hold of 1 microsecond counts; in the next it counts for nobody ------------------
BEGIN;
SELECT reservation_id AS r3, balance FROM reserve('edge', 'tokens', 90, '1 microsecond') \gset
SELECT granted, reason FROM consume('edge', 'tokens', 20);
COMMIT;
SELECT granted, used, balance FROM consume('edge', 'tokens', 20);
SELECT pg_temp.try(format('SELECT settle(%s, 5)', :r3)) AS settle_expired,
       release(:r3) AS release_expired;

-- 6. Several reservations at the limit; a retried key returns its reservation -----
SELECT granted, reserved, balance FROM reserve('flex', 'tokens', 50, idempotency_key => 'req-1');
SELECT granted, reserved, balance FROM reserve('flex', 'tokens', 50, idempotency_key => 'req-1');
SELECT granted, reservation_id AS r9, reserved, balance FROM reserve('flex', 'tokens', 50) \gset
SELECT :'granted' AS granted, :'reserved' AS reserved, :'balance' AS balance;
SELECT granted, reserved, balance FROM reserve('flex', 'tokens', 1);
SELECT count(*) AS flex_reservations FROM reservations WHERE tenant = 'flex';

-- 7. settle past the reservation: recorded in full, hard or soft (past a
-- hard limit the tenant is blocked, the reason is over_soft_limit) ------------
SELECT release(:r9);
SELECT r.reservation_id AS r5 FROM reservations r WHERE tenant = 'flex' AND idempotency_key = 'req-1' \gset
SELECT granted, used, overage, reason FROM settle(:r5, 120);
SELECT tenant, meter FROM blocked WHERE tenant = 'flex';
SELECT reservation_id AS r6 FROM reserve('soft', 'tokens', 90) \gset
SELECT granted, used, overage, reason FROM settle(:r6, 150);
-- settle of 0 records nothing
SELECT reservation_id AS r7 FROM reserve('ai', 'tokens', 5) \gset
SELECT granted, used, balance FROM settle(:r7, 0);

-- 8. With credit grants: a hold counts against quota and grants; settle draws --------
SELECT grant_credits('ai', 'tokens', 50);
SELECT balance('ai', 'tokens');
SELECT reservation_id AS r8, balance FROM reserve('ai', 'tokens', 40) \gset
SELECT :'balance' AS balance_after_hold;
SELECT granted, reason, balance FROM consume('ai', 'tokens', 20);
SELECT granted, used, from_grants, balance FROM consume('ai', 'tokens', 15);
SELECT granted, used, from_grants, balance FROM settle(:r8, 40);
SELECT amount, drawn, remaining FROM grants WHERE tenant = 'ai';

-- 9. A tenant without a limit reserves freely; with grants only, they bound it ------
SELECT granted, reserved, balance FROM reserve('nolimit', 'tokens', 1000000);
SELECT grant_credits('prepaid', 'tokens', 10);
SELECT granted, reserved, balance FROM reserve('prepaid', 'tokens', 11);
SELECT granted, reserved, balance FROM reserve('prepaid', 'tokens', 10);
SELECT granted, reason FROM consume('prepaid', 'tokens', 1);

-- 10. Several meters: a hold on one refuses the whole consume ---------------------
SELECT granted FROM reserve('multi', 'gpu', 10);
SELECT meter, granted, reason FROM consume('multi', ARRAY['gpu', 'tokens'], ARRAY[1, 1]);

-- 11. maintain() deletes reservations expired for longer than the retention -------
UPDATE reservations SET created_at = now() - interval '100 days', expires_at = now() - interval '99 days'
WHERE tenant = 'edge';
SELECT count(*) FILTER (WHERE tenant = 'edge') AS edge_before FROM reservations;
SELECT events_folded >= 0 AS maintained FROM maintain();
SELECT count(*) FILTER (WHERE tenant = 'edge') AS edge_after, count(*) > 0 AS others_kept FROM reservations;
