-- The batched calls with per-event answers: track_events and consume_batch,
-- what clients that group concurrent requests into one transaction call.
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
\set SHOW_CONTEXT never

-- try(sql): 'ok', or the SQLSTATE and message of the error it raised
CREATE FUNCTION pg_temp.try(sql text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
	EXECUTE sql;
	RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
	RETURN SQLSTATE || ': ' || SQLERRM;
END $$;

-- nothing written: events, keys and counters of the database
CREATE FUNCTION pg_temp.written() RETURNS text LANGUAGE sql AS $$
SELECT format('events=%s keys=%s counters=%s',
	(SELECT count(*) FROM flagmeter.events), (SELECT count(*) FROM flagmeter.event_keys),
	(SELECT count(*) FROM flagmeter.counters))
$$;

SELECT define_meter('api_calls'), define_meter('tokens'), define_meter('seats', 'max');
SELECT define_plan('free'), define_plan('flex');
SELECT set_limit('free', 'api_calls', 5, 'lifetime'),
       set_limit('free', 'tokens', 100, 'lifetime'),
       set_limit('flex', 'api_calls', 5, 'lifetime', 'soft');
SELECT assign_plan('acme', 'free'), assign_plan('globex', 'free'), assign_plan('initech', 'free'),
       assign_plan('soft', 'flex');

-- track_events ---------------------------------------------------------------

-- one answer per event: a key seen before, or earlier in the call, is false
SELECT track_events(ARRAY['acme', 'acme', 'acme', 'globex', 'stranger'],
                    ARRAY['tokens', 'tokens', 'tokens', 'tokens', 'api_calls'],
                    ARRAY[10, 10, 0, 7, 3], NULL,
                    ARRAY['t-1', 't-1', NULL, 't-1', NULL]);
SELECT track_events(ARRAY['acme', 'acme'], ARRAY['tokens', 'tokens'], ARRAY[1, 1], NULL,
                    ARRAY['t-1', 't-2']);
SELECT tenant, used(usage(tenant, 'tokens')) FROM unnest(ARRAY['acme', 'globex']) t(tenant);
SELECT used(usage('stranger', 'api_calls'));
-- occurred_at per event (NULL: now()); the same rules as track_batch
SELECT track_events(ARRAY['globex', 'globex'], ARRAY['tokens', 'tokens'], ARRAY[1, 2],
                    ARRAY['2001-02-03 04:05+00', NULL]::timestamptz[]);
SELECT occurred_at, amount FROM events
WHERE tenant = 'globex' AND occurred_at < '2002-01-01' ORDER BY 1;
-- empty arrays: an empty answer, nothing written
SELECT track_events('{}', '{}', '{}');
-- threshold crossings are announced as for track_batch
SELECT track_events(ARRAY['acme'], ARRAY['tokens'], ARRAY[70]);
SELECT kind, tenant, meter, threshold, used, quota FROM changes_since(7) ORDER BY version;
-- the same answers as track gives, one by one
BEGIN;
SELECT track('acme', 'api_calls', 1, now(), 'same-1') AS first,
       track('acme', 'api_calls', 1, now(), 'same-1') AS again;
ROLLBACK;
SELECT track_events(ARRAY['acme', 'acme'], ARRAY['api_calls', 'api_calls'], ARRAY[1, 1], NULL,
                    ARRAY['same-1', 'same-1']);
-- rolled back with the caller's transaction, key included
BEGIN;
SELECT track_events(ARRAY['acme'], ARRAY['api_calls'], ARRAY[100], NULL, ARRAY['gone-1']);
ROLLBACK;
SELECT track_events(ARRAY['acme'], ARRAY['api_calls'], ARRAY[1], NULL, ARRAY['gone-1']);

-- errors: each call checks every element before it writes anything
SELECT pg_temp.written() AS before \gset
SELECT pg_temp.try($$SELECT flagmeter.track_events(NULL, '{api_calls}', '{1}')$$);
SELECT pg_temp.try($$SELECT flagmeter.track_events('{acme}', NULL, '{1}')$$);
SELECT pg_temp.try($$SELECT flagmeter.track_events('{acme}', '{api_calls}', NULL)$$);
SELECT pg_temp.try($$SELECT flagmeter.track_events('{acme,acme}', '{api_calls}', '{1,1}')$$);
SELECT pg_temp.try($$SELECT flagmeter.track_events('{acme}', '{api_calls}', '{1,1}')$$);
SELECT pg_temp.try($$SELECT flagmeter.track_events('{acme,NULL}', '{api_calls,api_calls}', '{1,1}')$$);
SELECT pg_temp.try($$SELECT flagmeter.track_events('{acme,acme}', '{api_calls,NULL}', '{1,1}')$$);
SELECT pg_temp.try($$SELECT flagmeter.track_events('{acme,acme}', '{api_calls,api_calls}', '{1,NULL}')$$);
SELECT pg_temp.try($$SELECT flagmeter.track_events('{acme,acme}', '{api_calls,api_calls}', '{1,-1}')$$);
SELECT pg_temp.try($$SELECT flagmeter.track_events('{acme,""}', '{api_calls,api_calls}', '{1,1}')$$);
SELECT pg_temp.try($$SELECT flagmeter.track_events('{acme,acme}', '{api_calls,nope}', '{1,1}')$$);
SELECT pg_temp.try($$SELECT flagmeter.track_events('{acme}', '{api_calls}', '{1}', '{infinity}')$$);
SELECT pg_temp.try($$SELECT flagmeter.track_events('{acme}', '{api_calls}', '{1}', '{now,now}')$$);
SELECT pg_temp.try($$SELECT flagmeter.track_events('{acme,acme}', '{api_calls,api_calls}', '{1,1}', NULL, '{k,""}')$$);
SELECT pg_temp.try($$SELECT flagmeter.track_events('{acme}', '{api_calls}', '{1}', NULL, '{k,k}')$$);
SELECT pg_temp.try($$SELECT flagmeter.track_events('{{acme}}', '{{api_calls}}', '{{1}}')$$);
SELECT pg_temp.written() = :'before' AS nothing_written;

-- consume_batch --------------------------------------------------------------

-- acme: api_calls 2 of 5 used (tracked above)
SELECT used(usage('acme', 'api_calls'));
-- items in order, each as consume: the fourth finds the quota reached
SELECT * FROM consume_batch(ARRAY['acme', 'acme', 'acme', 'acme', 'globex'],
                            ARRAY['api_calls', 'api_calls', 'api_calls', 'api_calls', 'api_calls'],
                            ARRAY[1, 1, 1, 1, 4])
ORDER BY item;
SELECT used(usage('acme', 'api_calls')) AS acme, used(usage('globex', 'api_calls')) AS globex;
-- a multi-meter item (adjacent rows with one item id) is all or nothing within
-- itself, and independent of the others; the result keeps argument order
SELECT item, meter, granted, used, quota, remaining
FROM consume_batch(ARRAY['globex', 'globex', 'globex', 'globex', 'soft'],
                   ARRAY['tokens', 'api_calls', 'tokens', 'api_calls', 'api_calls'],
                   ARRAY[5, 5, 5, 1, 9],
                   NULL, ARRAY[10, 10, 20, 20, 30]);
SELECT used(usage('globex', 'tokens')) AS tokens, used(usage('globex', 'api_calls')) AS api_calls;
-- soft limits grant with overage; unlimited tenants have NULL figures
SELECT item, granted, used, quota, remaining, overage, resets_at IS NULL AS lifetime
FROM consume_batch(ARRAY['soft', 'nobody'], ARRAY['api_calls', 'api_calls'], ARRAY[1, 2]);
-- keys: a key given twice in one call replays the first decision, and a later
-- call replays it too, granted or denied, recording nothing
SELECT item, granted, used FROM consume_batch(ARRAY['nobody', 'nobody', 'nobody'],
    ARRAY['api_calls', 'api_calls', 'api_calls'], ARRAY[1, 1, 1], ARRAY['c-1', 'c-1', NULL]);
SELECT item, granted, used FROM consume_batch(ARRAY['nobody'], ARRAY['api_calls'], ARRAY[1],
                                              ARRAY['c-1']);
SELECT item, granted, used FROM consume_batch(ARRAY['acme'], ARRAY['api_calls'], ARRAY[9],
                                              ARRAY['d-1']);
SELECT granted, used FROM consume('acme', 'api_calls', 9, 'd-1');
SELECT used(usage('nobody', 'api_calls'));
-- a key of an item of several meters covers the item; void cancels all of it
SELECT item, meter, granted FROM consume_batch(ARRAY['nobody', 'nobody'], ARRAY['api_calls', 'tokens'],
    ARRAY[1, 10], ARRAY['m-1', 'm-1'], ARRAY[1, 1]);
-- a retry naming other meters gets the first call's decisions, one per meter it named
SELECT meter, granted, used FROM consume('nobody', ARRAY['api_calls', 'tokens', 'seats'], ARRAY[1, 1, 1], 'm-1');
SELECT item, meter, granted, used FROM consume_batch(ARRAY['nobody'], ARRAY['seats'], ARRAY[1], ARRAY['m-1']);
SELECT void('nobody', 'm-1');
SELECT used(usage('nobody', 'api_calls')) AS api_calls, used(usage('nobody', 'tokens')) AS tokens;
-- the same decisions as consume one by one, in one transaction
BEGIN;
SELECT granted, used FROM consume('initech', 'api_calls', 3);
SELECT granted, used FROM consume('initech', 'api_calls', 3);
SELECT granted, used FROM consume('initech', 'api_calls', 2);
ROLLBACK;
SELECT item, granted, used FROM consume_batch(ARRAY['initech', 'initech', 'initech'],
    ARRAY['api_calls', 'api_calls', 'api_calls'], ARRAY[3, 3, 2]);
-- rolled back with the caller's transaction
BEGIN;
SELECT item, granted FROM consume_batch(ARRAY['nobody'], ARRAY['api_calls'], ARRAY[100], ARRAY['r-1']);
ROLLBACK;
SELECT item, granted, used FROM consume_batch(ARRAY['nobody'], ARRAY['api_calls'], ARRAY[1], ARRAY['r-1']);
-- empty arrays: no rows
SELECT count(*) FROM consume_batch('{}', '{}', '{}');
-- blocked is announced as for consume
SELECT kind, tenant, meter, used, quota FROM changes_since(7) WHERE kind = 'blocked' ORDER BY version;

-- errors: every argument, and every meter, checked before the first item
SELECT pg_temp.written() AS before \gset
SELECT pg_temp.try($$SELECT * FROM flagmeter.consume_batch(NULL, '{api_calls}', '{1}')$$);
SELECT pg_temp.try($$SELECT * FROM flagmeter.consume_batch('{acme}', NULL, '{1}')$$);
SELECT pg_temp.try($$SELECT * FROM flagmeter.consume_batch('{acme}', '{api_calls}', NULL)$$);
SELECT pg_temp.try($$SELECT * FROM flagmeter.consume_batch('{acme}', '{api_calls,tokens}', '{1}')$$);
SELECT pg_temp.try($$SELECT * FROM flagmeter.consume_batch('{acme}', '{api_calls}', '{1,1}')$$);
SELECT pg_temp.try($$SELECT * FROM flagmeter.consume_batch('{nobody,NULL}', '{api_calls,api_calls}', '{1,1}')$$);
SELECT pg_temp.try($$SELECT * FROM flagmeter.consume_batch('{nobody,nobody}', '{api_calls,NULL}', '{1,1}')$$);
SELECT pg_temp.try($$SELECT * FROM flagmeter.consume_batch('{nobody,nobody}', '{api_calls,api_calls}', '{1,0}')$$);
SELECT pg_temp.try($$SELECT * FROM flagmeter.consume_batch('{nobody,nobody}', '{api_calls,api_calls}', '{1,NULL}')$$);
SELECT pg_temp.try($$SELECT * FROM flagmeter.consume_batch('{nobody,""}', '{api_calls,api_calls}', '{1,1}')$$);
SELECT pg_temp.try($$SELECT * FROM flagmeter.consume_batch('{nobody,nobody}', '{api_calls,nope}', '{1,1}')$$);
SELECT pg_temp.try($$SELECT * FROM flagmeter.consume_batch('{nobody,nobody}', ARRAY['api_calls', repeat('m', 64)], '{1,1}')$$);
SELECT pg_temp.try($$SELECT * FROM flagmeter.consume_batch('{nobody,nobody}', '{api_calls,api_calls}', '{1,1}', '{k,""}')$$);
SELECT pg_temp.try($$SELECT * FROM flagmeter.consume_batch('{nobody}', '{api_calls}', '{1}', '{k,k}')$$);
SELECT pg_temp.try($$SELECT * FROM flagmeter.consume_batch('{nobody}', '{api_calls}', '{1}', NULL, '{1,2}')$$);
SELECT pg_temp.try($$SELECT * FROM flagmeter.consume_batch('{nobody,nobody}', '{api_calls,tokens}', '{1,1}', NULL, '{1,NULL}')$$);
SELECT pg_temp.try($$SELECT * FROM flagmeter.consume_batch('{nobody}', '{api_calls}', '{1}', NULL, '{{1}}')$$);
SELECT pg_temp.try($$SELECT * FROM flagmeter.consume_batch('{{nobody}}', '{{api_calls}}', '{{1}}')$$);
-- items: rows of one item adjacent, one tenant, one key, each meter once
SELECT pg_temp.try($$SELECT * FROM flagmeter.consume_batch('{nobody,nobody,nobody}', '{api_calls,tokens,seats}', '{1,1,1}', NULL, '{1,2,1}')$$);
SELECT pg_temp.try($$SELECT * FROM flagmeter.consume_batch('{nobody,acme}', '{api_calls,tokens}', '{1,1}', NULL, '{1,1}')$$);
SELECT pg_temp.try($$SELECT * FROM flagmeter.consume_batch('{nobody,nobody}', '{api_calls,tokens}', '{1,1}', '{k,NULL}', '{1,1}')$$);
SELECT pg_temp.try($$SELECT * FROM flagmeter.consume_batch('{nobody,nobody}', '{api_calls,tokens}', '{1,1}', '{k,j}', '{1,1}')$$);
SELECT pg_temp.try($$SELECT * FROM flagmeter.consume_batch('{nobody,nobody}', '{api_calls,api_calls}', '{1,1}', NULL, '{1,1}')$$);
SELECT pg_temp.try(format($$SELECT * FROM flagmeter.consume_batch(%L, %L, %L, NULL, %L)$$,
	array_fill('nobody'::text, ARRAY[65]), (SELECT array_agg('m' || i) FROM generate_series(1, 65) i),
	array_fill(1::bigint, ARRAY[65]), array_fill(1, ARRAY[65])));
SELECT pg_temp.written() = :'before' AS nothing_written;
-- an error while deciding (a key of track reused by consume) fails the whole
-- call: the items decided before it are rolled back with the statement
SELECT pg_temp.try($$SELECT * FROM flagmeter.consume_batch('{nobody,acme}', '{api_calls,tokens}', '{1,1}', '{fresh-1,t-1}')$$);
SELECT pg_temp.written() = :'before' AS nothing_written;

-- who may call them: nobody but the owner until granted (see Security)
CREATE ROLE fm_batch_nobody;
GRANT USAGE ON SCHEMA flagmeter TO fm_batch_nobody;
SET ROLE fm_batch_nobody;
SELECT pg_temp.try($$SELECT flagmeter.track_events('{acme}', '{api_calls}', '{1}')$$);
SELECT pg_temp.try($$SELECT * FROM flagmeter.consume_batch('{acme}', '{api_calls}', '{1}')$$);
RESET ROLE;
REVOKE USAGE ON SCHEMA flagmeter FROM fm_batch_nobody;
DROP ROLE fm_batch_nobody;
