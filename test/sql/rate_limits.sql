-- Rate limits (issue 37): flagmeter.limit() for any key, the catalog's rate limits of
-- plans and tenants, and consume, consume_batch, check and reserve applying
-- them with the quota.  The test clock (set_test_clock) stands still unless
-- moved, so every figure below is exact.
SET search_path = flagmeter, public;
SELECT configure(unassigned_tenants => 'unlimited') IS NOT NULL AS configured;
SELECT set_test_clock('2030-01-01 00:00:00+00');

-- flagmeter.limit(): 5 a second, bursts of 5 (burst NULL: the rate) --------------------------
SELECT * FROM flagmeter.limit('rl:a', 5, '1 second');
SELECT * FROM flagmeter.limit('rl:a', 5, '1 second', cost => 4);
-- the burst is spent: refused, and told when one unit fits again (1/5 s)
SELECT * FROM flagmeter.limit('rl:a', 5, '1 second');
-- a cost beyond the burst never fits: no retry_after
SELECT * FROM flagmeter.limit('rl:a', 5, '1 second', cost => 6);
-- cost 0 looks without spending
SELECT * FROM flagmeter.limit('rl:a', 5, '1 second', cost => 0);
-- another key is another limiter
SELECT allowed, remaining FROM flagmeter.limit('rl:b', 5, '1 second');
-- time refills at the rate: 0.4 s later, two units
SELECT set_test_clock('2030-01-01 00:00:00.4+00');
SELECT * FROM flagmeter.limit('rl:a', 5, '1 second', cost => 2);
SELECT allowed FROM flagmeter.limit('rl:a', 5, '1 second');
-- a whole second later it is full again
SELECT set_test_clock('2030-01-01 00:00:01.4+00');
SELECT * FROM flagmeter.limit('rl:a', 5, '1 second', cost => 0);

-- 3 a second: units 333 333 334 ns apart (rounded up to the nanosecond),
-- and still the whole burst at one instant
SELECT (flagmeter.limit('rl:third', 3, '1 second')).remaining AS first;
SELECT (flagmeter.limit('rl:third', 3, '1 second')).remaining AS second;
SELECT (flagmeter.limit('rl:third', 3, '1 second')).remaining AS third;
SELECT allowed, retry_after FROM flagmeter.limit('rl:third', 3, '1 second');

-- A bigger burst than the rate: 1 a minute, bursts of 3.
SELECT (flagmeter.limit('rl:c', 1, '1 minute', 3)).remaining AS first;
SELECT (flagmeter.limit('rl:c', 1, '1 minute', 3)).remaining AS second;
SELECT (flagmeter.limit('rl:c', 1, '1 minute', 3)).remaining AS third;
SELECT * FROM flagmeter.limit('rl:c', 1, '1 minute', 3);

-- The bound, exactly: over 10 s of test clock in steps of 10 ms, a limiter
-- of 50 a second with bursts of 20 grants at most 20 + 50 * 9.99 (the last
-- step is at 9.99 s): 519, and here exactly that, since every step asks for
-- more than it can have.
CREATE TEMP TABLE granted_steps (step integer, granted integer);
DO $$
DECLARE
	n integer;
BEGIN
	FOR step IN 0 .. 999 LOOP
		PERFORM flagmeter.set_test_clock('2030-01-02 00:00:00+00'::timestamptz + step * interval '10 ms');
		n := 0;
		FOR i IN 1 .. 3 LOOP
			IF (flagmeter.limit('rl:bound', 50, '1 second', 20)).allowed THEN
				n := n + 1;
			END IF;
		END LOOP;
		INSERT INTO granted_steps VALUES (step, n);
	END LOOP;
END $$;
-- and in every window of 1 s (100 steps) at most 20 + 50
SELECT sum(granted) AS granted_in_10s,
       (SELECT max(w) FROM (SELECT sum(granted) OVER (ORDER BY step ROWS 99 PRECEDING) AS w
                            FROM granted_steps) x) AS most_in_1s
FROM granted_steps;

-- limit_batch: in order, one row each, defaults for NULL bursts and costs
SELECT set_test_clock('2030-01-03 00:00:00+00');
SELECT * FROM limit_batch(ARRAY['rl:d', 'rl:e', 'rl:d', 'rl:d'], ARRAY[2, 1, 2, 2]::bigint[],
                          ARRAY['1 second', '1 hour', '1 second', '1 second']::interval[],
                          NULL, ARRAY[1, 1, NULL, 1]::bigint[]);
-- bad input anywhere spends nothing anywhere
SELECT limit_batch(ARRAY['rl:f', 'rl:g'], ARRAY[1, 0]::bigint[],
                   ARRAY['1 second', '1 second']::interval[], NULL, NULL);
SELECT limit_batch(ARRAY['rl:f'], ARRAY[1, 1]::bigint[], ARRAY['1 second']::interval[], NULL, NULL);
SELECT limit_batch(ARRAY['rl:f', NULL], ARRAY[1, 1]::bigint[],
                   ARRAY['1 second', '1 second']::interval[], NULL, NULL);
SELECT remaining FROM flagmeter.limit('rl:f', 1, '1 second', cost => 0);

-- Bad input: the error says what, nothing is spent.
SELECT flagmeter.limit(NULL, 1, '1 second');
SELECT flagmeter.limit('rl:x', NULL, '1 second');
SELECT flagmeter.limit('rl:x', 1, NULL);
SELECT flagmeter.limit('rl:x', 1, '1 second', 1, NULL);
SELECT flagmeter.limit('', 1, '1 second');
SELECT flagmeter.limit(repeat('k', 257), 1, '1 second');
SELECT flagmeter.limit('rl:x', 0, '1 second');
SELECT flagmeter.limit('rl:x', -1, '1 second');
SELECT flagmeter.limit('rl:x', 1, '999 milliseconds');
SELECT flagmeter.limit('rl:x', 1, '1 hour 1 second');
SELECT flagmeter.limit('rl:x', 1, '1 day');
SELECT flagmeter.limit('rl:x', 1, '1 month');
SELECT flagmeter.limit('rl:x', 1, '1 second', 0);
SELECT flagmeter.limit('rl:x', 1, '1 second', -5);
SELECT flagmeter.limit('rl:x', 1, '1 second', 1, -1);
SELECT flagmeter.limit('rl:x', 1000000001, '1 second');
SELECT flagmeter.limit('rl:x', 1, '1 second', 40000000);
SELECT set_test_clock('infinity');

-- The catalog -------------------------------------------------------------------------
SELECT define_meter('rl_calls', 'count'), define_meter('rl_tokens', 'sum'), define_plan('rl_free');
SELECT set_limit('rl_free', 'rl_calls', 10);
SELECT set_limit('rl_free', 'rl_tokens', 1000);
SELECT set_rate_limit('rl_free', 'rl_calls', 2, '1 second');
SELECT set_rate_limit('rl_free', 'rl_tokens', 100, '1 minute', 300);
SELECT assign_plan('rl_acme', 'rl_free'), assign_plan('rl_globex', 'rl_free');
SELECT plan, meter, rate, per, burst FROM rate_limits WHERE plan = 'rl_free' ORDER BY meter;
SELECT * FROM rate_limit_config('rl_acme', 'rl_calls');
SELECT * FROM rate_limit_config('rl_nobody', 'rl_calls');
SELECT kind, tenant, meter, plan, quota FROM outbox WHERE meter LIKE 'rl_%' ORDER BY version;

-- errors of the catalog calls: nothing stored
SELECT set_rate_limit('rl_free', 'rl_calls', 0, '1 second');
SELECT set_rate_limit('rl_free', 'rl_calls', 1, '2 hours');
SELECT set_rate_limit('rl_free', 'rl_calls', 1, '1 second', 0);
SELECT set_rate_limit('rl_free', 'rl_calls', NULL, '1 second');
SELECT set_rate_limit(NULL, 'rl_calls', 1, '1 second');
SELECT set_rate_limit('rl_nope', 'rl_calls', 1, '1 second');
SELECT set_rate_limit('rl_free', 'rl_nope', 1, '1 second');
SELECT override_rate_limit('rl_unassigned', 'rl_calls', 1, '1 second');
SELECT override_rate_limit('', 'rl_calls', 1, '1 second');
SELECT drop_rate_limit('rl_nope', 'rl_calls');
SELECT drop_rate_override('rl_acme', 'rl_nope');
SELECT rate, per, burst FROM rate_limits WHERE plan = 'rl_free' AND meter = 'rl_calls';

-- consume with a rate limit and a quota ----------------------------------------------
SELECT set_test_clock('2030-02-01 00:00:00+00');
SELECT granted, used, remaining, reason, retry_after FROM consume('rl_acme', 'rl_calls');
SELECT granted, used, remaining, reason, retry_after FROM consume('rl_acme', 'rl_calls');
-- refused for the rate: the quota is untouched, retry_after says when
SELECT granted, used, remaining, reason, retry_after FROM consume('rl_acme', 'rl_calls');
SELECT used(usage('rl_acme', 'rl_calls'));
-- check says the same without spending; another tenant has its own limiter
SELECT granted, reason, retry_after FROM "check"('rl_acme', 'rl_calls');
SELECT granted, reason FROM consume('rl_globex', 'rl_calls');
-- half a second later one unit fits
SELECT set_test_clock('2030-02-01 00:00:00.5+00');
SELECT granted, used, reason FROM "check"('rl_acme', 'rl_calls');
SELECT granted, used, reason FROM consume('rl_acme', 'rl_calls');

-- refused by the quota: the rate is given back.  rl_tokens: 1000 a month,
-- 100 a minute in bursts of 300.
SELECT granted, reason FROM consume('rl_acme', 'rl_tokens', 1001);
SELECT granted, used, reason FROM consume('rl_acme', 'rl_tokens', 300);
SELECT granted, reason, retry_after FROM consume('rl_acme', 'rl_tokens', 1);

-- several meters, all or nothing: refused for one meter's rate, the other's
-- rate is not spent (its check still grants the whole burst)
SELECT set_test_clock('2030-02-01 00:10:00+00');
SELECT granted, used, reason FROM consume('rl_acme', 'rl_calls', 2);
SELECT meter, granted, used, reason, retry_after
FROM consume('rl_acme', ARRAY['rl_calls', 'rl_tokens'], ARRAY[1, 300]::bigint[]);
SELECT granted, reason FROM "check"('rl_acme', 'rl_tokens', 300);

-- an idempotency key: a refusal for the rate is not remembered, so the same
-- key decides again once the rate allows; then it is remembered as usual
SELECT granted, reason FROM consume('rl_acme', 'rl_calls', 1, 'rl-key-1');
SELECT set_test_clock('2030-02-01 00:10:01+00');
SELECT granted, used, reason FROM consume('rl_acme', 'rl_calls', 1, 'rl-key-1');
SELECT granted, used, reason FROM consume('rl_acme', 'rl_calls', 1, 'rl-key-1');
-- the replay spent nothing: one unit is still there
SELECT granted FROM "check"('rl_acme', 'rl_calls');

-- consume_batch: each item as consume decides it
SELECT item, granted, reason, retry_after
FROM consume_batch(ARRAY['rl_acme', 'rl_acme', 'rl_globex'], ARRAY['rl_calls', 'rl_calls', 'rl_calls'],
                   ARRAY[1, 1, 1]::bigint[]);

-- track records what happened: never rate limited
SELECT track('rl_acme', 'rl_calls'), track('rl_acme', 'rl_calls');

-- a tenant's override wins over its plan's, at once; dropping it restores it
SELECT set_test_clock('2030-02-01 00:20:00+00');
SELECT override_rate_limit('rl_acme', 'rl_calls', 1, '1 hour');
SELECT * FROM rate_limit_config('rl_acme', 'rl_calls');
SELECT granted FROM consume('rl_acme', 'rl_calls');
SELECT granted, reason, retry_after FROM consume('rl_acme', 'rl_calls');
SELECT drop_rate_override('rl_acme', 'rl_calls'), drop_rate_override('rl_acme', 'rl_calls');
SELECT granted FROM consume('rl_acme', 'rl_calls');
-- a plan's change too
SELECT set_rate_limit('rl_free', 'rl_calls', 1, '1 hour', 1);
SELECT granted, reason FROM consume('rl_globex', 'rl_calls');
SELECT drop_rate_limit('rl_free', 'rl_calls'), drop_rate_limit('rl_free', 'rl_calls');
SELECT granted, reason FROM consume('rl_globex', 'rl_calls');
SELECT kind, tenant, meter, plan FROM outbox
WHERE meter = 'rl_calls' AND kind = 'limit_changed' ORDER BY version;

-- reserve holds units against the rate too
SELECT set_test_clock('2030-02-01 00:30:00+00');
SELECT granted, reserved, retry_after FROM reserve('rl_globex', 'rl_tokens', 300);
SELECT granted, reservation_id IS NULL AS no_id, retry_after FROM reserve('rl_globex', 'rl_tokens', 10);

-- limits go with their plan, meter or tenant
SELECT unassign_tenant('rl_globex');
SELECT count(*) FROM rate_overrides WHERE tenant = 'rl_globex';

-- limit_changed carries the quota in force: a tenant's override, not its plan's
SELECT override_limit('rl_acme', 'rl_tokens', 5000);
SELECT override_rate_limit('rl_acme', 'rl_tokens', 10, '1 second');
SELECT kind, tenant, meter, quota FROM outbox ORDER BY version DESC LIMIT 1;

-- the table in shared memory
SELECT capacity >= 16 AS has_capacity, keys > 0 AS holds_keys, full_refusals FROM rate_limiter();
SELECT set_test_clock(NULL);
