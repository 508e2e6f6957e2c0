-- Credit grants (issue 19): grant_credits, void_grant, the grants view,
-- balance, and how consume, track, track_batch, consume_batch and check
-- draw the period quota first and then the grants, in order.
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

-- try(sql): 'ok', or the SQLSTATE and message of the error it raised
CREATE FUNCTION pg_temp.try(sql text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
	EXECUTE sql;
	RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
	RETURN SQLSTATE || ': ' || SQLERRM;
END $$;

-- the grants of a tenant as the view shows them
CREATE FUNCTION pg_temp.grants_of(t text)
RETURNS TABLE (grant_id bigint, meter text, amount bigint, drawn bigint, remaining bigint, state text)
LANGUAGE sql AS $$
	SELECT g.grant_id - (SELECT min(grant_id) FROM flagmeter.grants) + 1, g.meter, g.amount, g.drawn,
	       g.remaining, g.state
	FROM flagmeter.grants g WHERE g.tenant = t ORDER BY g.grant_id
$$;

SELECT define_meter('api_calls'), define_meter('tokens'), define_meter('seats', 'max'),
       define_meter('requests', 'count');
SELECT define_plan('hard'), define_plan('soft');
-- lifetime limits keep this file independent of the day it runs on
SELECT set_limit('hard', 'api_calls', 10, 'lifetime'),
       set_limit('hard', 'tokens', 100, 'lifetime'),
       set_limit('hard', 'requests', 2, 'lifetime'),
       set_limit('soft', 'api_calls', 10, 'lifetime', 'soft');
SELECT assign_plan('acme', 'hard'), assign_plan('multi', 'hard'), assign_plan('order', 'hard'),
       assign_plan('flex', 'soft'), assign_plan('tracker', 'hard'), assign_plan('batcher', 'hard'),
       assign_plan('edge', 'hard');

-- 1. grant_credits: arguments ------------------------------------------------------
SELECT sql, pg_temp.try(sql) AS result FROM (VALUES
	($$SELECT grant_credits('acme', 'api_calls', 0)$$),
	($$SELECT grant_credits('acme', 'api_calls', -5)$$),
	($$SELECT grant_credits('acme', 'api_calls', NULL)$$),
	($$SELECT grant_credits(NULL, 'api_calls', 5)$$),
	($$SELECT grant_credits('', 'api_calls', 5)$$),
	($$SELECT grant_credits('acme', NULL, 5)$$),
	($$SELECT grant_credits('acme', 'nope', 5)$$),
	($$SELECT grant_credits('acme', 'seats', 5)$$),
	($$SELECT grant_credits('acme', 'api_calls', 5, priority => NULL)$$),
	($$SELECT grant_credits('acme', 'api_calls', 5, starts_at => NULL)$$),
	($$SELECT grant_credits('acme', 'api_calls', 5, '2026-01-01', starts_at => '2026-01-01')$$),
	($$SELECT grant_credits('acme', 'api_calls', 5, '2026-01-01', starts_at => '2026-02-01')$$),
	($$SELECT grant_credits('acme', 'api_calls', 5, idempotency_key => '')$$)
) v(sql);
SELECT count(*) AS no_grant_made FROM credit_grants;

-- An idempotency key names one grant: a retry returns it, another grant
-- under the key is an error.
SELECT grant_credits('acme', 'api_calls', 5, idempotency_key => 'promo') =
       grant_credits('acme', 'api_calls', 5, idempotency_key => 'promo') AS same_grant;
SELECT pg_temp.try($$SELECT grant_credits('acme', 'api_calls', 6, idempotency_key => 'promo')$$) AS other_amount,
       pg_temp.try($$SELECT grant_credits('acme', 'tokens', 5, idempotency_key => 'promo')$$) AS other_meter;
SELECT * FROM pg_temp.grants_of('acme');

-- 2. consume draws the quota first, then the grants --------------------------------
SELECT granted, used, quota, remaining, overage, reason, from_grants, balance
FROM consume('acme', 'api_calls', 8);
-- 2 from the quota, 3 from the grant
SELECT granted, used, quota, remaining, overage, reason, from_grants, balance
FROM consume('acme', 'api_calls', 5);
-- 3 left: 4 is refused (hard, all or nothing), nothing drawn
SELECT granted, used, remaining, reason, from_grants, balance FROM consume('acme', 'api_calls', 4);
SELECT * FROM pg_temp.grants_of('acme');
SELECT granted, used, reason, from_grants, balance FROM consume('acme', 'api_calls', 2);
SELECT granted, used, reason, from_grants, balance FROM consume('acme', 'api_calls', 1, 'acme-k1');
-- exhausted
SELECT granted, used, reason, from_grants, balance FROM consume('acme', 'api_calls', 1);
SELECT * FROM pg_temp.grants_of('acme');
-- a retried key returns its decision, from_grants and balance included
SELECT granted, used, reason, from_grants, balance FROM consume('acme', 'api_calls', 1, 'acme-k1');
SELECT balance('acme', 'api_calls') AS acme_balance, balance('acme', 'tokens') AS tokens_balance,
       balance('nobody', 'api_calls') AS unlimited_balance;
SELECT pg_temp.try($$SELECT balance('acme', 'nope')$$) AS unknown_meter;

-- 3. Draw order: lowest priority number, then soonest expiry (never last),
-- then oldest ---------------------------------------------------------------------
SELECT (consume('order', 'api_calls', 10)).granted AS quota_used_up;
SELECT grant_credits('order', 'api_calls', 10, priority => 5) AS g1,
       grant_credits('order', 'api_calls', 10, now() + interval '2 days', priority => 1) AS g2,
       grant_credits('order', 'api_calls', 10, now() + interval '1 day', priority => 1) AS g3,
       grant_credits('order', 'api_calls', 10, priority => 1) AS g4,
       grant_credits('order', 'api_calls', 10, priority => 1) AS g5
\gset
SELECT granted, from_grants, balance FROM consume('order', 'api_calls', 15);
SELECT grant_id - :g1 + 1 AS n, drawn, state FROM grants WHERE tenant = 'order' ORDER BY grant_id;
SELECT granted, from_grants, balance FROM consume('order', 'api_calls', 20);
SELECT grant_id - :g1 + 1 AS n, drawn, state FROM grants WHERE tenant = 'order' ORDER BY grant_id;
SELECT granted, from_grants, balance FROM consume('order', 'api_calls', 10);
SELECT grant_id - :g1 + 1 AS n, drawn, state FROM grants WHERE tenant = 'order' ORDER BY grant_id;

-- 4. Expiry and start, at the boundary, before maintain() --------------------------
-- within one transaction now() stands still: a grant expiring at now() is
-- expired, one expiring a microsecond later is active; one starting a
-- microsecond later has not started
SELECT (consume('edge', 'api_calls', 10)).granted AS quota_used_up;
BEGIN;
SELECT grant_credits('edge', 'api_calls', 3, now(), starts_at => now() - interval '1 day') AS expired_now,
       grant_credits('edge', 'api_calls', 4, starts_at => now() + interval '1 microsecond') AS starts_later;
SELECT granted, reason, from_grants, balance FROM consume('edge', 'api_calls', 1);
SELECT granted, from_grants, balance FROM "check"('edge', 'api_calls', 1);
SELECT grant_credits('edge', 'api_calls', 2, now() + interval '1 microsecond') > 0 AS expires_later;
SELECT granted, reason, from_grants, balance FROM consume('edge', 'api_calls', 2);
SELECT granted, reason, from_grants, balance FROM consume('edge', 'api_calls', 1);
SELECT amount, drawn, remaining, state FROM grants WHERE tenant = 'edge' ORDER BY grant_id;
COMMIT;
-- in a later transaction the 1 µs grant has expired with nothing left, and
-- the pending one has started
SELECT amount, drawn, remaining, state FROM grants WHERE tenant = 'edge' ORDER BY grant_id;
SELECT granted, from_grants, balance FROM consume('edge', 'api_calls', 4);

-- 5. void_grant ------------------------------------------------------------------
SELECT grant_credits('acme', 'api_calls', 7) AS v1 \gset
SELECT balance('acme', 'api_calls') AS before_void;
SELECT void_grant(:v1) AS voided, void_grant(:v1) AS voided_again;
SELECT balance('acme', 'api_calls') AS after_void;
SELECT granted, from_grants FROM consume('acme', 'api_calls', 1);
SELECT amount, drawn, remaining, state FROM grants WHERE grant_id = :v1;
SELECT pg_temp.try($$SELECT void_grant(NULL)$$) AS null_id,
       pg_temp.try($$SELECT void_grant(-1)$$) AS unknown_id;

-- 6. Several meters: all or nothing, grants included -------------------------------
SELECT grant_credits('multi', 'api_calls', 5), grant_credits('multi', 'tokens', 20);
SELECT meter, granted, used, reason, from_grants, balance
FROM consume('multi', ARRAY['api_calls', 'tokens'], ARRAY[15, 121]);
SELECT meter, granted, used, reason, from_grants, balance
FROM consume('multi', ARRAY['api_calls', 'tokens'], ARRAY[15, 120]);
SELECT meter, amount, drawn, remaining, state FROM pg_temp.grants_of('multi');

-- 7. A soft limit draws what the grants hold; the rest is overage -----------------
SELECT grant_credits('flex', 'api_calls', 3);
SELECT granted, used, overage, reason, from_grants, balance FROM consume('flex', 'api_calls', 12);
SELECT granted, used, overage, reason, from_grants, balance FROM consume('flex', 'api_calls', 2);
SELECT amount, drawn, state FROM pg_temp.grants_of('flex');

-- 8. A tenant without a limit on the meter: its grants are its quota ------------
SELECT grant_credits('prepaid', 'api_calls', 10);
SELECT granted, used, quota, remaining, overage, reason, from_grants, balance
FROM consume('prepaid', 'api_calls', 6);
SELECT granted, used, reason, from_grants, balance FROM consume('prepaid', 'api_calls', 5);
SELECT granted, used, reason, from_grants, balance FROM "check"('prepaid', 'api_calls', 4);
SELECT granted, used, reason, from_grants, balance FROM consume('prepaid', 'api_calls', 4, 'pre-k1');
-- the retry draws nothing more
SELECT granted, used, reason, from_grants, balance FROM consume('prepaid', 'api_calls', 4, 'pre-k1');
SELECT amount, drawn, state FROM pg_temp.grants_of('prepaid');
SELECT granted, used, reason, from_grants, balance FROM consume('prepaid', 'api_calls', 1);
-- one never granted credits stays unlimited
SELECT granted, quota, reason, from_grants, balance FROM consume('postpaid', 'api_calls', 1000);

-- 9. track draws past the quota, never refused; track_batch too ------------------
SELECT grant_credits('tracker', 'api_calls', 5);
SELECT track('tracker', 'api_calls', 8), track('tracker', 'api_calls', 4);
SELECT amount, drawn, remaining FROM pg_temp.grants_of('tracker');
SELECT track('tracker', 'api_calls', 10);
SELECT amount, drawn, remaining, state FROM pg_temp.grants_of('tracker');
SELECT used(usage('tracker', 'api_calls')) AS tracked;
SELECT grant_credits('batcher', 'api_calls', 5), grant_credits('batcher', 'requests', 5);
SELECT track_batch(ARRAY['batcher', 'batcher', 'batcher', 'batcher'],
                   ARRAY['api_calls', 'api_calls', 'requests', 'requests'],
                   ARRAY[6, 6, 1, 1]);
SELECT meter, amount, drawn, remaining FROM pg_temp.grants_of('batcher');
SELECT track_events(ARRAY['batcher', 'batcher'], ARRAY['requests', 'api_calls'], ARRAY[7, 1]);
SELECT meter, amount, drawn, remaining FROM pg_temp.grants_of('batcher');

-- 10. consume_batch decides each item with the grants -----------------------------
SELECT grant_credits('batch2', 'tokens', 10), assign_plan('batch2', 'hard');
SELECT item, granted, used, reason, from_grants, balance
FROM consume_batch(ARRAY['batch2', 'batch2', 'batch2'], ARRAY['tokens', 'tokens', 'tokens'],
                   ARRAY[95, 20, 15]);

-- 11. Announcements: a hard limit reached does not block while grants are
-- left; a tenant blocked is unblocked by a new grant, and blocked again when
-- its last grant is voided ---------------------------------------------------------
SELECT kind, tenant, meter FROM outbox WHERE tenant IN ('acme', 'prepaid', 'tracker', 'order')
  AND kind IN ('blocked', 'unblocked') ORDER BY version;
SELECT grant_credits('acme', 'api_calls', 3);
SELECT kind, tenant, meter FROM outbox WHERE tenant = 'acme' AND kind IN ('blocked', 'unblocked')
ORDER BY version;
SELECT tenant, meter FROM blocked WHERE tenant = 'acme';

-- 12. The limits' caches learn of a tenant's first grant ---------------------------
SELECT granted, reason FROM consume('latecomer', 'tokens', 5);
SELECT grant_credits('latecomer', 'tokens', 3);
SELECT granted, reason, from_grants, balance FROM consume('latecomer', 'tokens', 5);
SELECT granted, reason, from_grants, balance FROM consume('latecomer', 'tokens', 3);

-- 13. Grant events: grant_low (remaining under low_balance_percent of the
-- amount), grant_exhausted, grant_expired, each once per grant, at commit ---------
SELECT pg_temp.try($$SELECT grant_credits('acme', 'api_calls', 5, low_balance_percent => 0)$$) AS zero,
       pg_temp.try($$SELECT grant_credits('acme', 'api_calls', 5, low_balance_percent => 100)$$) AS hundred;
SELECT grant_credits('evt', 'tokens', 100, low_balance_percent => 25) AS e1,
       grant_credits('evt', 'tokens', 10, low_balance_percent => NULL, priority => 1) AS e2,
       grant_credits('evt', 'tokens', 50, now() + interval '1 day', priority => 2) AS e3,
       grant_credits('evt', 'tokens', 50, now() + interval '1 day', priority => 3) AS e4
\gset
CREATE TEMP VIEW evt_events AS
SELECT kind, grant_id - :e1 + 1 AS g, threshold, used, quota FROM outbox
WHERE tenant = 'evt' AND grant_id IS NOT NULL ORDER BY version;
-- 25 left of 100 is not under 25 %; 24 is
SELECT granted, from_grants FROM consume('evt', 'tokens', 75);
SELECT * FROM evt_events;
SELECT granted, from_grants FROM consume('evt', 'tokens', 1);
SELECT * FROM evt_events;
-- a rolled-back draw announces nothing
BEGIN;
SELECT granted, from_grants FROM consume('evt', 'tokens', 24);
ROLLBACK;
SELECT count(*) AS evt_events FROM evt_events;
-- one call: the rest of g1 (low already announced: only exhausted), all of
-- g2 (no low mark: only exhausted), and g3 down to 4 of 50 (low)
SELECT granted, from_grants FROM consume('evt', 'tokens', 80);
SELECT * FROM evt_events;
-- grant_expired: maintain() announces a grant that expired with units left,
-- once; an exhausted or voided one is not announced
SELECT void_grant(:e4);
UPDATE credit_grants SET starts_at = now() - interval '1 day', expires_at = now() - interval '1 second'
WHERE grant_id IN (:e1, :e3, :e4);
SELECT events_folded >= 0 AS maintained FROM maintain();
SELECT * FROM evt_events;
SELECT announce_expired_grants() AS announced_again;
SELECT pg_temp.try($$SELECT announce('grant_exhausted', 'evt', 'tokens')$$) AS not_by_hand;
