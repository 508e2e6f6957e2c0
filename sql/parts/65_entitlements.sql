-- ---------------------------------------------------------------------------
-- "What may this tenant do": every feature and every limited meter of each
-- assigned tenant in one relation, the one query an app or a dashboard needs.
-- ---------------------------------------------------------------------------

CREATE VIEW flagmeter.entitlements AS
SELECT f.tenant, 'feature'::pg_catalog.text AS kind, f.feature AS name, f.plan,
       f.enabled, f.config, f.source,
       NULL::bigint AS quota, NULL::bigint AS used, NULL::bigint AS remaining,
       NULL::timestamptz AS resets_at, NULL::pg_catalog.text AS state
FROM flagmeter.tenant_features f
UNION ALL
SELECT s.tenant, 'meter', s.meter, s.plan,
       s.mode OPERATOR(pg_catalog.=) 'soft' OR s.used OPERATOR(pg_catalog.<) s.quota,
       NULL, CASE WHEN o.tenant IS NOT NULL THEN 'override' ELSE 'plan' END,
       s.quota, s.used, s.remaining,
       CASE WHEN pg_catalog.isfinite(s.period_end) THEN s.period_end END, s.state
FROM flagmeter.status s
LEFT JOIN flagmeter.overrides o
       ON o.tenant OPERATOR(pg_catalog.=) s.tenant AND o.meter OPERATOR(pg_catalog.=) s.meter;
COMMENT ON VIEW flagmeter.entitlements IS
'per assigned tenant: every feature (kind feature: enabled, config, source override, plan or none) and every limited meter of its current period (kind meter: quota, used, remaining, resets_at, state; enabled is false once a hard limit is reached)';
