-- Credit pools (issue 19): define_meter(..., draws => pool, rate => r), and
-- how consume, check, track, track_batch, track_events, consume_batch,
-- balance and void treat a meter that draws from another meter's balance.
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

-- what a tenant has used of each meter (events of a count meter)
CREATE FUNCTION pg_temp.used(t text)
RETURNS TABLE (meter text, used bigint) LANGUAGE sql AS $$
	SELECT m.meter, CASE m.aggregation WHEN 'count' THEN flagmeter.events(flagmeter.usage(t, m.meter))
	                ELSE flagmeter.used(flagmeter.usage(t, m.meter)) END
	FROM flagmeter.meters m
	WHERE m.meter IN ('credits', 'gpt4', 'images', 'cheap', 'plain') ORDER BY 1
$$;

SELECT define_meter('credits'), define_meter('seats', 'max'), define_meter('calls', 'count'),
       define_meter('plain');

-- 1. define_meter: a pool and its rate --------------------------------------------
SELECT sql, pg_temp.try(sql) AS result FROM (VALUES
	($$SELECT define_meter('gpt4', rate => 3)$$),
	($$SELECT define_meter('gpt4', draws => 'credits', rate => 0)$$),
	($$SELECT define_meter('gpt4', draws => 'credits', rate => -1)$$),
	($$SELECT define_meter('gpt4', draws => 'credits', rate => 0.0000001)$$),
	($$SELECT define_meter('gpt4', draws => 'credits', rate => 1e12)$$),
	($$SELECT define_meter('gpt4', draws => 'gpt4', rate => 2)$$),
	($$SELECT define_meter('gpt4', draws => 'nope', rate => 2)$$),
	($$SELECT define_meter('gpt4', draws => 'calls', rate => 2)$$),
	($$SELECT define_meter('gpt4', 'max', draws => 'credits', rate => 2)$$),
	($$SELECT define_meter('gpt4', 'latest', draws => 'credits')$$)
) v(sql);
SELECT count(*) AS no_meter_made FROM meters WHERE meter = 'gpt4';

SELECT define_meter('gpt4', draws => 'credits', rate => 3.000),
       define_meter('images', 'count', draws => 'credits', rate => 40),
       define_meter('cheap', draws => 'credits', rate => 0.25),
       define_meter('calls_one', 'count', draws => 'credits');
-- the rate as given, exact, without trailing zeros; 1 when left out
SELECT meter, aggregation, draws, rate FROM meters WHERE draws IS NOT NULL ORDER BY meter;

-- one level: a pool draws from no pool, a drawer is no pool; a pool stays a sum meter
SELECT sql, pg_temp.try(sql) AS result FROM (VALUES
	($$SELECT define_meter('credits', draws => 'plain')$$),
	($$SELECT define_meter('deep', draws => 'gpt4')$$),
	($$SELECT define_meter('credits', 'count')$$),
	($$SELECT drop_meter('credits')$$),
	($$SELECT drop_meter('credits', force => true)$$)
) v(sql);
-- a meter with credit grants of its own cannot become a drawer
SELECT grant_credits('acme', 'plain', 5) > 0 AS granted;
SELECT pg_temp.try($$SELECT define_meter('plain', draws => 'credits')$$);
-- and a drawer takes no grants or reservations of its own: its pool's are its
SELECT pg_temp.try($$SELECT grant_credits('acme', 'gpt4', 5)$$);
SELECT pg_temp.try($$SELECT reserve('acme', 'gpt4', 5)$$);
SELECT count(*) AS only_the_plain_grant FROM credit_grants;

-- 2. consume: the drawer's units and the pool's, all or nothing --------------------
SELECT define_plan('pro');
-- lifetime limits keep this file independent of the day it runs on
SELECT set_limit('pro', 'credits', 1000, 'lifetime'), set_limit('pro', 'images', 1, 'lifetime');
SELECT assign_plan('acme', 'pro'), assign_plan('multi', 'pro'), assign_plan('keys', 'pro'),
       assign_plan('tracker', 'pro'), assign_plan('batcher', 'pro');

-- 100 gpt4 tokens cost 300 credits: used and quota are gpt4's (unlimited), the
-- balance is the pool's
SELECT granted, used, quota, remaining, reason, from_grants, balance FROM consume('acme', 'gpt4', 100);
SELECT * FROM pg_temp.used('acme');
-- 3 tokens at 0.25 cost 0.75 credits: rounded up to 1
SELECT granted, used, reason, balance FROM consume('acme', 'cheap', 3);
-- more than the pool holds: refused, nothing recorded on either meter
SELECT granted, used, reason, from_grants, balance FROM consume('acme', 'gpt4', 300);
SELECT * FROM pg_temp.used('acme');
-- check says the same without recording
SELECT granted, used, reason, balance FROM flagmeter.check('acme', 'gpt4', 233);
SELECT granted, used, reason, balance FROM flagmeter.check('acme', 'gpt4', 234);
SELECT balance('acme', 'gpt4') AS gpt4_balance, balance('acme', 'credits') AS credits_balance;
-- the drawer's own limit counts too: one image (a count meter: 40 credits an
-- event, whatever its amount), then refused by its own limit
SELECT granted, used, quota, remaining, reason, balance FROM consume('acme', 'images', 2);
SELECT granted, used, quota, remaining, reason, balance FROM consume('acme', 'images');
SELECT * FROM pg_temp.used('acme');

-- grants on the pool serve every drawer, after the pool's quota
SELECT grant_credits('acme', 'credits', 500) > 0 AS granted;
SELECT granted, used, reason, from_grants, balance FROM consume('acme', 'gpt4', 300);
SELECT * FROM pg_temp.used('acme');
SELECT meter, amount, drawn FROM grants WHERE tenant = 'acme' ORDER BY grant_id;

-- 3. several meters in one consume --------------------------------------------------
-- two drawers of one pool: their pool units add up (3 * 100 + 40 * 1 = 340)
SELECT meter, granted, used, reason, balance
FROM consume('multi', ARRAY['gpt4', 'images'], ARRAY[100, 1]);
SELECT * FROM pg_temp.used('multi');
-- the pool named too: its row shows the whole draw (3 * 100 + 10)
SELECT meter, granted, used, reason, balance
FROM consume('multi', ARRAY['credits', 'gpt4'], ARRAY[10, 100]);
SELECT * FROM pg_temp.used('multi');
-- the pool refuses: every meter refused, the drawers with quota_exceeded
SELECT meter, granted, used, reason, balance
FROM consume('multi', ARRAY['gpt4', 'plain'], ARRAY[200, 1]);
SELECT * FROM pg_temp.used('multi');

-- 4. idempotency keys and void ------------------------------------------------------
SELECT granted, used, balance FROM consume('keys', 'gpt4', 10, 'k1');
-- a retry returns the one decision named, records nothing
SELECT granted, used, balance FROM consume('keys', 'gpt4', 10, 'k1');
SELECT count(*) AS decisions FROM consume('keys', ARRAY['gpt4'], ARRAY[10], 'k1');
SELECT seq, meter, amount, kind FROM event_keys WHERE tenant = 'keys' ORDER BY seq;
SELECT * FROM pg_temp.used('keys');
-- void takes the pool's part out too
SELECT void('keys', 'k1');
SELECT * FROM pg_temp.used('keys');
SELECT track('keys', 'gpt4', 5, idempotency_key => 't1'), track('keys', 'gpt4', 5, idempotency_key => 't1');
SELECT seq, meter, amount, kind FROM event_keys WHERE tenant = 'keys' AND idempotency_key = 't1' ORDER BY seq;
SELECT * FROM pg_temp.used('keys');
SELECT void('keys', 't1');
SELECT * FROM pg_temp.used('keys');
-- consume cannot reuse track's key
SELECT pg_temp.try($$SELECT consume('keys', 'gpt4', 1, 't1')$$);

-- 5. track, track_batch, track_events, consume_batch -------------------------------
-- track is never refused: past the pool's quota it draws the pool's grants
SELECT grant_credits('tracker', 'credits', 100) > 0 AS granted;
SELECT track('tracker', 'gpt4', 340);
SELECT * FROM pg_temp.used('tracker');
SELECT amount, drawn FROM grants WHERE tenant = 'tracker';
SELECT track_batch(ARRAY['batcher', 'batcher', 'batcher', 'batcher'],
                   ARRAY['gpt4', 'images', 'plain', 'gpt4'], ARRAY[10, 1, 7, 10],
                   NULL, ARRAY['b1', NULL, NULL, 'b1']) AS counted;
SELECT * FROM pg_temp.used('batcher');
SELECT track_events(ARRAY['batcher', 'batcher', 'batcher'], ARRAY['gpt4', 'cheap', 'gpt4'],
                    ARRAY[1, 2, 1], NULL, ARRAY['b1', 'b2', 'b3']) AS counted;
SELECT * FROM pg_temp.used('batcher');
SELECT seq, idempotency_key, meter, amount, kind FROM event_keys WHERE tenant = 'batcher'
ORDER BY idempotency_key, seq;
SELECT item, meter, granted, used, reason, balance
FROM consume_batch(ARRAY['batcher', 'batcher', 'acme'], ARRAY['gpt4', 'images', 'gpt4'],
                   ARRAY[10, 1, 1000]);
SELECT * FROM pg_temp.used('batcher');

-- 6. a drawer stops drawing when defined without draws ------------------------------
SELECT define_meter('cheap');
SELECT granted, used, reason, balance FROM consume('batcher', 'cheap', 4);
SELECT * FROM pg_temp.used('batcher');

-- rollover makes grants of the meter's own: not for a drawer, and a meter that
-- rolls over does not start drawing
SELECT pg_temp.try($$SELECT set_limit('pro', 'gpt4', 100, 'month', rollover => 50)$$);
SELECT define_meter('monthly'), set_limit('pro', 'monthly', 100, 'month', rollover => 50);
SELECT pg_temp.try($$SELECT define_meter('monthly', draws => 'credits')$$);
SELECT meter, rollover FROM limits WHERE plan = 'pro' ORDER BY meter;

-- 7. out of range -----------------------------------------------------------------
SELECT define_meter('dear', draws => 'credits', rate => 999999999999);
SELECT pg_temp.try($$SELECT consume('acme', 'dear', 10000000)$$);
SELECT pg_temp.try($$SELECT track('acme', 'dear', 10000000)$$);
SELECT pg_temp.try($$SELECT flagmeter.check('acme', 'dear', 10000000)$$);
