-- ---------------------------------------------------------------------------
-- Entitlements: features per plan, per-tenant overrides, and the reads
-- has_feature / feature_config (src/entitlements.c) that an app's own queries and
-- row-level-security policies can call.
--
-- A feature is granted to a tenant by its override when it has one, else by
-- its plan's row for the feature; a feature its plan does not mention (and a
-- tenant with no plan) is not granted.  enabled = false in a plan's row is an
-- explicit denial, which an override can still lift.
--
-- Changes are announced as feature_changed (70_notify.sql): set_feature
-- announces the plan's row, override_feature and drop_feature_override the
-- tenant's override, each only when the row changed; assign_plan and
-- unassign_tenant announce plan_changed, which moves the tenant onto the
-- rows of its new plan.
-- ---------------------------------------------------------------------------

CREATE TABLE flagmeter.features (
	feature		text PRIMARY KEY
		CONSTRAINT features_name_valid CHECK (feature OPERATOR(pg_catalog.~) '^[A-Za-z0-9][A-Za-z0-9_.:-]{0,62}$'),
	description	text,
	created_at	timestamptz NOT NULL DEFAULT pg_catalog.now()
);
COMMENT ON TABLE flagmeter.features IS
'what a plan can grant: a boolean feature, optionally with a configuration value';

CREATE TABLE flagmeter.plan_features (
	plan		text NOT NULL REFERENCES flagmeter.plans ON DELETE CASCADE,
	feature		text NOT NULL REFERENCES flagmeter.features ON DELETE CASCADE,
	enabled		boolean NOT NULL,
	config		jsonb,
	updated_at	timestamptz NOT NULL DEFAULT pg_catalog.now(),
	PRIMARY KEY (plan, feature)
);
COMMENT ON TABLE flagmeter.plan_features IS
'the features a plan grants (enabled) or explicitly denies, each with an optional configuration value';

CREATE TABLE flagmeter.feature_overrides (
	tenant		text NOT NULL REFERENCES flagmeter.tenants ON DELETE CASCADE,
	feature		text NOT NULL REFERENCES flagmeter.features ON DELETE CASCADE,
	enabled		boolean NOT NULL,
	config		jsonb,
	updated_at	timestamptz NOT NULL DEFAULT pg_catalog.now(),
	PRIMARY KEY (tenant, feature)
);
COMMENT ON TABLE flagmeter.feature_overrides IS
'per-tenant grants or denials of a feature that win over the plan''s, with their own configuration value';

CREATE TRIGGER features_changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON flagmeter.features
	FOR EACH STATEMENT EXECUTE FUNCTION flagmeter.config_changed();
CREATE TRIGGER plan_features_changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON flagmeter.plan_features
	FOR EACH STATEMENT EXECUTE FUNCTION flagmeter.config_changed();
CREATE TRIGGER feature_overrides_changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON flagmeter.feature_overrides
	FOR EACH STATEMENT EXECUTE FUNCTION flagmeter.config_changed();

SELECT pg_catalog.pg_extension_config_dump('flagmeter.features', '');
SELECT pg_catalog.pg_extension_config_dump('flagmeter.plan_features', '');
SELECT pg_catalog.pg_extension_config_dump('flagmeter.feature_overrides', '');

CREATE FUNCTION flagmeter.check_feature_exists(feature text)
RETURNS void
LANGUAGE plpgsql STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	IF feature IS NULL THEN
		RAISE EXCEPTION 'feature must not be NULL' USING ERRCODE = 'null_value_not_allowed';
	END IF;
	IF NOT EXISTS (SELECT FROM flagmeter.features f WHERE f.feature = check_feature_exists.feature) THEN
		RAISE EXCEPTION 'feature "%" does not exist', left(feature, 64) USING ERRCODE = 'undefined_object',
			HINT = 'Define it first with flagmeter.define_feature().';
	END IF;
END $$;
COMMENT ON FUNCTION flagmeter.check_feature_exists(text) IS
'raises a clear error unless the feature is defined';

CREATE FUNCTION flagmeter.define_feature(feature text, description text DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	e_state text; e_message text; e_detail text; e_hint text;	-- the error, raised again
BEGIN
	PERFORM flagmeter.check_name('feature', feature);
	INSERT INTO flagmeter.features AS f (feature, description)
	VALUES (define_feature.feature, define_feature.description)
	ON CONFLICT ON CONSTRAINT features_pkey DO UPDATE SET description = EXCLUDED.description;
EXCEPTION WHEN OTHERS THEN	-- without the CONTEXT of the helpers (raise_plain)
	GET STACKED DIAGNOSTICS e_state = RETURNED_SQLSTATE, e_message = MESSAGE_TEXT,
	                        e_detail = PG_EXCEPTION_DETAIL, e_hint = PG_EXCEPTION_HINT;
	PERFORM flagmeter.raise_plain(e_state, e_message, e_detail, e_hint);
END $$;
COMMENT ON FUNCTION flagmeter.define_feature(text, text) IS
'defines a feature, or changes the description of one that exists';

-- set_feature is store_feature then, when the row changed, its
-- announcement, like set_limit: a proxy runs the two apart, store_feature
-- under two-phase commit on every shard and announce_plan_feature after it
-- (a transaction with announcements pending cannot be prepared).
CREATE FUNCTION flagmeter.store_feature(plan text, feature text, enabled boolean DEFAULT true,
	config jsonb DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	PERFORM flagmeter.check_plan_exists(plan);
	PERFORM flagmeter.check_feature_exists(feature);
	IF enabled IS NULL THEN
		RAISE EXCEPTION 'enabled must not be NULL' USING ERRCODE = 'null_value_not_allowed';
	END IF;
	-- a row written again as it was is not news: nothing is updated or announced
	INSERT INTO flagmeter.plan_features AS pf (plan, feature, enabled, config)
	VALUES (store_feature.plan, store_feature.feature, store_feature.enabled, store_feature.config)
	ON CONFLICT ON CONSTRAINT plan_features_pkey DO UPDATE
		SET enabled = EXCLUDED.enabled, config = EXCLUDED.config, updated_at = now()
		WHERE (pf.enabled, pf.config) IS DISTINCT FROM (EXCLUDED.enabled, EXCLUDED.config);
	RETURN FOUND;
END $$;
COMMENT ON FUNCTION flagmeter.store_feature(text, text, boolean, jsonb) IS
'the part of set_feature that announces nothing: validates and stores the plan''s row; true when it changed';

CREATE FUNCTION flagmeter.announce_plan_feature(plan text, feature text)
RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	r flagmeter.plan_features;
BEGIN
	SELECT * INTO r FROM flagmeter.plan_features pf
	WHERE pf.plan = announce_plan_feature.plan AND pf.feature = announce_plan_feature.feature;
	-- no row (any more): announced as gone, enabled NULL
	PERFORM flagmeter.announce_feature(NULL, plan, feature, r.enabled, r.config);
END $$;
COMMENT ON FUNCTION flagmeter.announce_plan_feature(text, text) IS
'announces the plan''s row of the feature as it is now (feature_changed; enabled NULL when there is none): the second half of set_feature on a proxy';

CREATE FUNCTION flagmeter.set_feature(plan text, feature text, enabled boolean DEFAULT true,
	config jsonb DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	e_state text; e_message text; e_detail text; e_hint text;	-- the error, raised again
BEGIN
	IF flagmeter.store_feature(plan, feature, enabled, config) THEN
		PERFORM flagmeter.announce_feature(NULL, plan, feature, enabled, config);
	END IF;
EXCEPTION WHEN OTHERS THEN	-- without the CONTEXT of the helpers (raise_plain)
	GET STACKED DIAGNOSTICS e_state = RETURNED_SQLSTATE, e_message = MESSAGE_TEXT,
	                        e_detail = PG_EXCEPTION_DETAIL, e_hint = PG_EXCEPTION_HINT;
	PERFORM flagmeter.raise_plain(e_state, e_message, e_detail, e_hint);
END $$;
COMMENT ON FUNCTION flagmeter.set_feature(text, text, boolean, jsonb) IS
'a plan grants a feature (enabled) or denies it, with an optional configuration value; replaces the plan''s earlier row, announced (feature_changed) when it changed';

CREATE FUNCTION flagmeter.override_feature(tenant text, feature text, enabled boolean,
	config jsonb DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	e_state text; e_message text; e_detail text; e_hint text;	-- the error, raised again
BEGIN
	PERFORM flagmeter.check_tenant(tenant);
	PERFORM flagmeter.check_feature_exists(feature);
	IF enabled IS NULL THEN
		RAISE EXCEPTION 'enabled must not be NULL' USING ERRCODE = 'null_value_not_allowed';
	END IF;
	IF NOT EXISTS (SELECT FROM flagmeter.tenants t WHERE t.tenant = override_feature.tenant) THEN
		RAISE EXCEPTION 'tenant "%" has no plan', left(tenant, 64) USING ERRCODE = 'undefined_object',
			HINT = 'Assign a plan first with flagmeter.assign_plan().';
	END IF;
	INSERT INTO flagmeter.feature_overrides AS o (tenant, feature, enabled, config)
	VALUES (override_feature.tenant, override_feature.feature, override_feature.enabled,
	        override_feature.config)
	ON CONFLICT ON CONSTRAINT feature_overrides_pkey DO UPDATE
		SET enabled = EXCLUDED.enabled, config = EXCLUDED.config, updated_at = now()
		WHERE (o.enabled, o.config) IS DISTINCT FROM (EXCLUDED.enabled, EXCLUDED.config);
	IF FOUND THEN
		PERFORM flagmeter.announce_feature(tenant, NULL, feature, enabled, config);
	END IF;
EXCEPTION WHEN OTHERS THEN	-- without the CONTEXT of the helpers (raise_plain)
	GET STACKED DIAGNOSTICS e_state = RETURNED_SQLSTATE, e_message = MESSAGE_TEXT,
	                        e_detail = PG_EXCEPTION_DETAIL, e_hint = PG_EXCEPTION_HINT;
	PERFORM flagmeter.raise_plain(e_state, e_message, e_detail, e_hint);
END $$;
COMMENT ON FUNCTION flagmeter.override_feature(text, text, boolean, jsonb) IS
'grants (enabled) or denies a feature to one tenant, winning over its plan''s row; replaces the tenant''s earlier override';

CREATE FUNCTION flagmeter.drop_feature_override(tenant text, feature text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	e_state text; e_message text; e_detail text; e_hint text;	-- the error, raised again
BEGIN
	PERFORM flagmeter.check_tenant(tenant);
	PERFORM flagmeter.check_feature_exists(feature);
	DELETE FROM flagmeter.feature_overrides o
	WHERE o.tenant = drop_feature_override.tenant AND o.feature = drop_feature_override.feature;
	IF NOT FOUND THEN
		RETURN false;
	END IF;
	PERFORM flagmeter.announce_feature(tenant, NULL, feature, NULL);
	RETURN true;
EXCEPTION WHEN OTHERS THEN	-- without the CONTEXT of the helpers (raise_plain)
	GET STACKED DIAGNOSTICS e_state = RETURNED_SQLSTATE, e_message = MESSAGE_TEXT,
	                        e_detail = PG_EXCEPTION_DETAIL, e_hint = PG_EXCEPTION_HINT;
	PERFORM flagmeter.raise_plain(e_state, e_message, e_detail, e_hint);
END $$;
COMMENT ON FUNCTION flagmeter.drop_feature_override(text, text) IS
'removes a tenant''s override of a feature so that its plan decides again; false when there was none';

-- The reads.  STABLE and PARALLEL SAFE: they can stand in a WHERE clause, a
-- join or a row-level-security policy.  Answers are cached per backend and
-- every committed change of the feature tables, tenants or plans empties the
-- caches before the next statement (src/entitlements.c says what each snapshot
-- sees).  An unknown feature is an error, as an unknown meter is.

CREATE FUNCTION flagmeter.has_feature(tenant text, feature text)
RETURNS boolean
AS 'MODULE_PATHNAME', 'fm_has_feature'
LANGUAGE C STABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION flagmeter.has_feature(text, text) IS
'whether the tenant may use the feature: its override, else its plan''s row, else not granted';

CREATE FUNCTION flagmeter.feature_config(tenant text, feature text)
RETURNS jsonb
AS 'MODULE_PATHNAME', 'fm_feature_config'
LANGUAGE C STABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION flagmeter.feature_config(text, text) IS
'the configuration value of the feature for the tenant (from the same row as has_feature), NULL when none or not granted';

-- The same answer as a relation, for every assigned tenant and feature, with
-- where it comes from: the one definition the C reads are tested against.
CREATE VIEW flagmeter.tenant_features AS
SELECT t.tenant, f.feature,
       COALESCE(o.enabled, pf.enabled, false) AS enabled,
       CASE WHEN COALESCE(o.enabled, pf.enabled, false)
            THEN CASE WHEN o.tenant IS NOT NULL THEN o.config ELSE pf.config END END AS config,
       CASE WHEN o.tenant IS NOT NULL THEN 'override'
            WHEN pf.plan IS NOT NULL THEN 'plan'
            ELSE 'none' END AS source,
       t.plan
FROM flagmeter.tenants t
CROSS JOIN flagmeter.features f
LEFT JOIN flagmeter.plan_features pf
       ON pf.plan OPERATOR(pg_catalog.=) t.plan AND pf.feature OPERATOR(pg_catalog.=) f.feature
LEFT JOIN flagmeter.feature_overrides o
       ON o.tenant OPERATOR(pg_catalog.=) t.tenant AND o.feature OPERATOR(pg_catalog.=) f.feature;
COMMENT ON VIEW flagmeter.tenant_features IS
'every assigned tenant and feature: enabled, its configuration value (when enabled), and its source (override, plan, or none: not mentioned)';

-- Privileges (see 80_security.sql for the layout): changing features is
-- configuration; the reads take their rows as the owner of the tables (a
-- direct scan, as check does), so EXECUTE on them is the permission to read
-- any tenant's entitlements: granted to the roles whose queries or policies
-- call them.
REVOKE ALL ON FUNCTION flagmeter.define_feature(text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.set_feature(text, text, boolean, jsonb) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.store_feature(text, text, boolean, jsonb) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.announce_plan_feature(text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.override_feature(text, text, boolean, jsonb) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.drop_feature_override(text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.has_feature(text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION flagmeter.feature_config(text, text) FROM PUBLIC;
