-- Entitlements: features per plan, per-tenant overrides, has_feature and
-- feature_config, the tenant_features and entitlements views, and the
-- decision's reason.
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

SELECT define_plan('free'), define_plan('pro'), define_meter('api_calls');
SELECT set_limit('free', 'api_calls', 100);
SELECT set_limit('pro', 'api_calls', 1000, mode => 'soft');
SELECT define_feature('sso', 'single sign-on');
SELECT define_feature('bulk_export');
SELECT define_feature('max_projects');
SELECT define_feature('support', 'support level');
SELECT assign_plan('acme', 'free', '2026-01-01', 'UTC');
SELECT assign_plan('globex', 'pro', '2026-01-01', 'UTC');

-- a plan grants, denies, configures; what it does not mention is not granted
SELECT set_feature('pro', 'sso');
SELECT set_feature('pro', 'bulk_export');
SELECT set_feature('pro', 'max_projects', config => '100');
SELECT set_feature('free', 'max_projects', config => '3');
SELECT set_feature('free', 'bulk_export', enabled => false);
SELECT set_feature('pro', 'support', config => '"priority"');

SELECT t, f, has_feature(t, f), feature_config(t, f)
FROM unnest(ARRAY['acme', 'globex', 'initech']) t,
     unnest(ARRAY['sso', 'bulk_export', 'max_projects', 'support']) f
ORDER BY t, f;

-- the C reads agree with the SQL definition for every tenant and feature
SELECT count(*) AS disagreements
FROM tenant_features tf
WHERE has_feature(tf.tenant, tf.feature) IS DISTINCT FROM tf.enabled
   OR feature_config(tf.tenant, tf.feature) IS DISTINCT FROM tf.config;

-- an override wins over the plan, both ways, with its own configuration
SELECT override_feature('acme', 'bulk_export', true, '{"formats": ["csv"]}');
SELECT override_feature('globex', 'sso', false);
SELECT has_feature('acme', 'bulk_export'), feature_config('acme', 'bulk_export'),
       has_feature('globex', 'sso');
SELECT tenant, feature, enabled, config, source FROM tenant_features ORDER BY 1, 2;
SELECT drop_feature_override('acme', 'bulk_export'), drop_feature_override('acme', 'bulk_export');
SELECT has_feature('acme', 'bulk_export');

-- a change of a plan's row is seen by the next statement, also in this session
SELECT set_feature('free', 'sso');
SELECT has_feature('acme', 'sso');
SELECT set_feature('free', 'sso', false);
SELECT has_feature('acme', 'sso');
-- and rolled back with its transaction
BEGIN;
SELECT set_feature('free', 'sso');
SELECT has_feature('acme', 'sso');
ROLLBACK;
SELECT has_feature('acme', 'sso');
-- an override made earlier in the transaction counts at once, though
-- the tenant had none when the backend last looked (entitlements.c keeps
-- every override), and is gone with its rollback
BEGIN;
SELECT has_feature('acme', 'sso');
SELECT override_feature('acme', 'sso', true);
SELECT has_feature('acme', 'sso');
ROLLBACK;
SELECT has_feature('acme', 'sso');
-- moving a tenant to another plan changes what it may do
SELECT assign_plan('acme', 'pro', '2026-01-01', 'UTC');
SELECT has_feature('acme', 'sso'), feature_config('acme', 'max_projects');
SELECT assign_plan('acme', 'free', '2026-01-01', 'UTC');
SELECT has_feature('acme', 'sso'), feature_config('acme', 'max_projects');

-- in a WHERE clause and a join of the app's own tables
CREATE TABLE public.reports (id int PRIMARY KEY, tenant_id text NOT NULL, title text);
INSERT INTO public.reports VALUES (1, 'acme', 'a1'), (2, 'globex', 'g1'), (3, 'globex', 'g2'),
	(4, 'initech', 'i1');
SELECT id, title FROM public.reports WHERE has_feature(tenant_id, 'bulk_export') ORDER BY id;

-- in a row-level-security policy of the app's table, as an unprivileged role
-- that may call has_feature and read the table, nothing else of flagmeter
CREATE ROLE regress_fm_reports;
GRANT USAGE ON SCHEMA flagmeter TO regress_fm_reports;
GRANT EXECUTE ON FUNCTION has_feature(text, text) TO regress_fm_reports;
GRANT SELECT ON public.reports TO regress_fm_reports;
ALTER TABLE public.reports ENABLE ROW LEVEL SECURITY;
CREATE POLICY exports ON public.reports USING (flagmeter.has_feature(tenant_id, 'bulk_export'));
SET ROLE regress_fm_reports;
SELECT id, tenant_id FROM public.reports ORDER BY id;
SELECT has_feature('acme', 'sso');
SELECT define_feature('sneaky');
SELECT * FROM flagmeter.plan_features;
RESET ROLE;
-- acme on pro, then an override: the policy follows at the next statement
SELECT override_feature('acme', 'bulk_export', true);
SET ROLE regress_fm_reports;
SELECT id, tenant_id FROM public.reports ORDER BY id;
RESET ROLE;
SELECT drop_feature_override('acme', 'bulk_export');
SET ROLE regress_fm_reports;
SELECT id, tenant_id FROM public.reports ORDER BY id;
RESET ROLE;
-- without EXECUTE the policy cannot be evaluated: an error, not a silent pass
REVOKE EXECUTE ON FUNCTION has_feature(text, text) FROM regress_fm_reports;
SET ROLE regress_fm_reports;
SELECT id FROM public.reports;
RESET ROLE;
DROP POLICY exports ON public.reports;
REVOKE ALL ON public.reports FROM regress_fm_reports;
REVOKE USAGE ON SCHEMA flagmeter FROM regress_fm_reports;
DROP ROLE regress_fm_reports;

-- the entitlements view: features and limited meters of every assigned tenant
SELECT track('acme', 'api_calls', 40);
SELECT tenant, kind, name, plan, enabled, config, source, quota, used, remaining,
       resets_at IS NOT NULL AS resets, state
FROM entitlements ORDER BY tenant, kind, name;

-- reason: why a decision is what it is
SELECT meter, granted, used, reason FROM consume('acme', 'api_calls', 50);
SELECT meter, granted, used, reason FROM consume('acme', 'api_calls', 50);
SELECT meter, granted, used, reason FROM flagmeter.check('acme', 'api_calls', 10);
SELECT meter, granted, used, overage, reason FROM consume('globex', 'api_calls', 1500);
SELECT meter, granted, used, reason FROM consume('initech', 'api_calls', 5);
SELECT define_meter('tokens');
SELECT set_limit('free', 'tokens', 1000);
SELECT meter, granted, used, reason
FROM consume('acme', ARRAY['api_calls', 'tokens'], ARRAY[20, 10]);
-- a retried key returns the reason it was given
SELECT meter, granted, reason FROM consume('acme', 'tokens', 2000, 'big-1');
SELECT meter, granted, reason FROM consume('acme', 'tokens', 1, 'big-1');

-- bad input: nothing written
SELECT define_feature('no spaces');
SELECT define_feature(NULL);
SELECT set_feature('gold', 'sso');
SELECT set_feature('pro', 'nope');
SELECT set_feature('pro', 'sso', NULL);
SELECT set_feature(NULL, 'sso');
SELECT override_feature('initech', 'sso', true);
SELECT override_feature('acme', 'sso', NULL);
SELECT override_feature('', 'sso', true);
SELECT override_feature('acme', 'nope', true);
SELECT drop_feature_override('acme', 'nope');
SELECT has_feature('acme', 'nope');
SELECT has_feature('', 'sso');
SELECT has_feature('acme', repeat('f', 64));
SELECT feature_config('acme', 'nope');
-- NULL arguments: NULL (a policy or WHERE then does not pass the row)
SELECT has_feature(NULL, 'sso') IS NULL AS null_tenant, has_feature('acme', NULL) IS NULL AS null_feature;

-- dropping a feature drops its grants and overrides
SELECT override_feature('acme', 'support', true);
DELETE FROM features WHERE feature = 'support';
SELECT count(*) FROM plan_features WHERE feature = 'support';
SELECT count(*) FROM feature_overrides WHERE feature = 'support';
SELECT has_feature('acme', 'support');

-- Past 10 000 overrides the backend no longer keeps them all and reads
-- each tenant's (the DEBUG1 line says so): the answers stay those of the
-- tables, overridden tenants and the others alike.
INSERT INTO tenants (tenant, plan, anchor, timezone)
SELECT 'many-' || i, CASE WHEN i % 2 = 0 THEN 'pro' ELSE 'free' END, '2026-01-01', 'UTC'
FROM generate_series(1, 10001) i;
INSERT INTO feature_overrides (tenant, feature, enabled)
SELECT 'many-' || i, 'sso', i % 4 < 2 FROM generate_series(1, 10000) i;
SELECT count(*) AS overrides FROM feature_overrides;
-- has_feature against the SQL definition for every one of them
PREPARE many_answers AS
SELECT count(*) FILTER (WHERE has_feature(t.tenant, 'sso') IS DISTINCT FROM tf.enabled)
         AS disagreements,
       count(*) FILTER (WHERE has_feature(t.tenant, 'sso')) AS granted
FROM tenants t
LEFT JOIN tenant_features tf ON tf.tenant = t.tenant AND tf.feature = 'sso'
WHERE t.tenant LIKE 'many-%';
SET client_min_messages = debug1;
SELECT has_feature('many-1', 'sso'), has_feature('many-10001', 'sso');
RESET client_min_messages;
EXECUTE many_answers;
-- at 10 000, the backend keeps them again (no DEBUG1 line): the same answers
DELETE FROM feature_overrides WHERE tenant = 'many-1';
SET client_min_messages = debug1;
SELECT has_feature('many-1', 'sso'), has_feature('many-10001', 'sso');
RESET client_min_messages;
EXECUTE many_answers;
DEALLOCATE many_answers;
DELETE FROM tenants WHERE tenant LIKE 'many-%';

DROP TABLE public.reports;
