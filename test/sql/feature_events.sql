-- feature_changed: what the feature calls write to the outbox, when, and
-- what changes_since() replays of it.  The rows are those a client caches:
-- a plan's row for a feature (tenant NULL), a tenant's override (plan
-- NULL), enabled NULL when the row is gone.  The payloads of the same
-- changes are in the isolation test notify_payloads.
-- Every test file runs in the same database: start from a fresh extension.
SET client_min_messages = warning;
DROP EXTENSION flagmeter CASCADE;
CREATE EXTENSION flagmeter;
RESET client_min_messages;
SET search_path = flagmeter, public;
SET TimeZone = 'UTC';
\set SHOW_CONTEXT never

CREATE FUNCTION pg_temp.try(sql text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
	EXECUTE sql;
	RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
	RETURN SQLSTATE || ': ' || SQLERRM;
END $$;

-- the events since the last look, then the version to look from next
CREATE TABLE pg_temp.seen (version bigint);
INSERT INTO pg_temp.seen VALUES (0);
CREATE FUNCTION pg_temp.news()
RETURNS TABLE (kind text, tenant text, plan text, feature text, enabled boolean, config jsonb, notified boolean)
LANGUAGE plpgsql AS $$
DECLARE
	since bigint := (SELECT s.version FROM pg_temp.seen s);
BEGIN
	UPDATE pg_temp.seen SET version = flagmeter.latest_version();
	RETURN QUERY SELECT o.kind, o.tenant, o.plan, o.feature, o.enabled, o.config, o.notified
	FROM flagmeter.changes_since(since) o ORDER BY o.version;
END $$;

SELECT define_plan('free'), define_plan('pro');
SELECT define_feature('sso'), define_feature('max_projects');
SELECT assign_plan('acme', 'free', '2026-01-01', 'UTC');
-- defining plans and features announces nothing; assigning is plan_changed
SELECT * FROM pg_temp.news();

-- set_feature: the plan's row, once per change
SELECT set_feature('pro', 'sso');
SELECT set_feature('pro', 'sso');
SELECT set_feature('pro', 'max_projects', config => '{"limit": 100}');
SELECT set_feature('pro', 'max_projects', config => '{"limit": 100}');
SELECT set_feature('pro', 'max_projects', config => '{"limit": 200}');
SELECT set_feature('free', 'sso', false);
SELECT * FROM pg_temp.news();
-- a denial keeps its config in the row (the answer hides it)
SELECT set_feature('free', 'max_projects', false, '{"limit": 3}');
SELECT * FROM pg_temp.news();
SELECT has_feature('acme', 'max_projects'), feature_config('acme', 'max_projects');

-- override_feature: the tenant's override, once per change; dropping it:
-- enabled NULL (the plan decides again); dropping none: nothing
SELECT override_feature('acme', 'sso', true, '{"idp": "okta"}');
SELECT override_feature('acme', 'sso', true, '{"idp": "okta"}');
SELECT override_feature('acme', 'sso', true, '{"idp": "azure"}');
SELECT drop_feature_override('acme', 'sso');
SELECT drop_feature_override('acme', 'sso');
SELECT * FROM pg_temp.news();

-- a plan change is plan_changed only: the tenant now has the rows of its
-- new plan, and keeps its overrides
SELECT override_feature('acme', 'max_projects', true, '{"limit": 5}');
SELECT assign_plan('acme', 'pro');
SELECT * FROM pg_temp.news();
SELECT feature, enabled, config, source FROM tenant_features WHERE tenant = 'acme' ORDER BY 1;
-- leaving the plan: plan_changed without a plan; the overrides went with
-- the tenant's row
SELECT unassign_tenant('acme');
SELECT * FROM pg_temp.news();
SELECT count(*) AS overrides_left FROM feature_overrides WHERE tenant = 'acme';

-- dropping a plan: each of its rows gone, after its tenants left it
SELECT assign_plan('hooli', 'free');
SELECT drop_plan('free', force => true);
SELECT * FROM pg_temp.news();

-- nothing for a rolled-back transaction or subtransaction; a committed
-- subtransaction's change is announced with its transaction
SELECT assign_plan('initech', 'pro');
BEGIN;
SELECT set_feature('pro', 'sso', false);
ROLLBACK;
BEGIN;
SELECT set_feature('pro', 'sso', true, '{"idp": "okta"}');
SAVEPOINT s;
SELECT set_feature('pro', 'max_projects', false);
ROLLBACK TO SAVEPOINT s;
SAVEPOINT t;
SELECT override_feature('initech', 'sso', false);
RELEASE SAVEPOINT t;
COMMIT;
SELECT * FROM pg_temp.news();

-- a failed call announces nothing either
SELECT pg_temp.try($$SELECT flagmeter.set_feature('pro', 'nope')$$) AS unknown_feature,
       pg_temp.try($$SELECT flagmeter.override_feature('nobody', 'sso', true)$$) AS unassigned;
SELECT * FROM pg_temp.news();

-- versions go on in commit order with the other kinds, and changes_since()
-- replays feature_changed like them
SELECT (SELECT count(*) FROM outbox WHERE kind = 'feature_changed') AS feature_rows,
       (SELECT count(*) FROM changes_since(0) WHERE kind = 'feature_changed') AS replayed,
       (SELECT bool_and(version = rn) FROM (SELECT version, row_number() OVER (ORDER BY version) rn
                                            FROM outbox) v) AS consecutive;

-- announce_feature: a tenant or a plan, not both; a feature; and the
-- generic announce does not take the kind
SELECT pg_temp.try($$SELECT flagmeter.announce_feature(NULL, NULL, 'sso', true)$$) AS neither,
       pg_temp.try($$SELECT flagmeter.announce_feature('acme', 'pro', 'sso', true)$$) AS both,
       pg_temp.try($$SELECT flagmeter.announce_feature('acme', NULL, NULL, true)$$) AS no_feature,
       pg_temp.try($$SELECT flagmeter.announce('feature_changed', 'acme', NULL)$$) AS generic;
-- the outbox takes the kind, and no other new one
SELECT pg_temp.try($$INSERT INTO flagmeter.outbox (version, kind, notified) VALUES (-1, 'feature_gone', true)$$) AS bad_kind;
