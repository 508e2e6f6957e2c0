-- The plans and tenants of `make dashboard` (tools/dashboard.sh): two
-- plans, eight tenants, a little usage already.  tools/load.js then drives
-- usage so that some tenants cross 80 % and reach their hard limit within
-- a few minutes.  The free plan's calls are also rate limited, 10 a second
-- in bursts of 20: acme, the busiest (about 12 a second), is refused for its
-- rate now and then until its quota blocks it.
SELECT flagmeter.define_meter('api_calls', 'sum', 'calls'),
       flagmeter.define_meter('tokens', 'sum', 'tokens');
SELECT flagmeter.define_plan('free'), flagmeter.define_plan('pro');
SELECT flagmeter.set_limit('free', 'api_calls', 2000, 'month', 'hard', '{80,100}'),
       flagmeter.set_limit('free', 'tokens', 200000, 'month', 'soft', '{80,100}'),
       flagmeter.set_limit('pro', 'api_calls', 20000, 'month', 'hard', '{80,100}'),
       flagmeter.set_limit('pro', 'tokens', 2000000, 'month', 'soft', '{80,100}');
SELECT flagmeter.set_rate_limit('free', 'api_calls', 10, '1 second', 20);
SELECT flagmeter.assign_plan(t, p)
FROM (VALUES ('acme', 'free'), ('globex', 'free'), ('initech', 'free'), ('umbrella', 'free'),
             ('hooli', 'pro'), ('stark', 'pro'), ('wayne', 'pro'), ('wonka', 'pro')) v(t, p);
-- what each tenant had used before the demo started
SELECT flagmeter.track_batch(ARRAY['acme', 'globex', 'initech', 'hooli', 'stark', 'acme', 'umbrella'],
                             ARRAY['api_calls', 'api_calls', 'api_calls', 'api_calls', 'api_calls', 'tokens', 'tokens'],
                             ARRAY[1500, 900, 300, 12000, 4000, 150000, 60000]::bigint[]);
