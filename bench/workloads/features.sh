# shellcheck shell=bash
# bench/workloads/features.sh -- has_feature against the plain SQL an app
# would read its entitlements with: a primary-key SELECT of a boolean, and a
# row-level-security policy that calls has_feature against the same query
# filtered by a boolean column.

register_workload features "has_feature over $TENANTS tenants vs primary-key SELECT; an RLS policy calling it vs a boolean column"

# The feature, granted by plan bench to every tenant but the multiples of 3
# (an override denies those), and the peers: a table of the same answers,
# and two copies of an app table of 10 000 rows over 100 tenants, one with
# a policy that calls has_feature, one filtered by a boolean column.
features_setup() {
	run_as_pg psql -X -q -v ON_ERROR_STOP=1 -d "$DB" >/dev/null <<EOF
SELECT flagmeter.define_feature('bulk_export');
SELECT flagmeter.set_feature('bench', 'bulk_export');
SELECT count(flagmeter.override_feature(i::text, 'bulk_export', false))
FROM generate_series(3, $TENANTS, 3) i;

CREATE TABLE peer.entitled (tenant text PRIMARY KEY, bulk_export boolean NOT NULL);
INSERT INTO peer.entitled SELECT i::text, i % 3 <> 0 FROM generate_series(1, $TENANTS) i;

CREATE TABLE peer.reports_rls (id bigint PRIMARY KEY, tenant_id text NOT NULL, title text);
INSERT INTO peer.reports_rls
SELECT g, (1 + g % 100)::text, 'report ' || g FROM generate_series(1, 10000) g;
CREATE TABLE peer.reports_flag (LIKE peer.reports_rls INCLUDING ALL, bulk_export boolean NOT NULL);
INSERT INTO peer.reports_flag SELECT r.*, e.bulk_export
FROM peer.reports_rls r JOIN peer.entitled e ON e.tenant = r.tenant_id;
ALTER TABLE peer.reports_rls ENABLE ROW LEVEL SECURITY;
CREATE POLICY exports ON peer.reports_rls USING (flagmeter.has_feature(tenant_id, 'bulk_export'));

-- the app's role: row-level security binds it (the bench's superuser
-- would bypass it)
CREATE ROLE bench_app;
GRANT USAGE ON SCHEMA peer, flagmeter TO bench_app;
GRANT SELECT ON peer.reports_rls, peer.reports_flag TO bench_app;
GRANT EXECUTE ON FUNCTION flagmeter.has_feature(text, text) TO bench_app;
VACUUM ANALYZE peer.entitled, peer.reports_rls, peer.reports_flag;
EOF
}

wl_features() {
	local disagree rls_rows flag_rows
	features_setup
	disagree=$(psql_q "SELECT count(*) FROM peer.entitled e
	                   WHERE flagmeter.has_feature(e.tenant, 'bulk_export') <> e.bulk_export")
	rls_rows=$(psql_q "SET ROLE bench_app; SELECT count(*) FROM peer.reports_rls")
	flag_rows=$(psql_q "SELECT count(*) FROM peer.reports_flag WHERE bulk_export")
	if [[ $disagree != 0 || $rls_rows != "$flag_rows" ]]; then
		fm_err "has_feature disagrees with the peer table ($disagree tenants; $rls_rows vs $flag_rows rows)"
		return 1
	fi
	script fm_has_feature <<EOF
\set t random(1, $TENANTS)
SELECT flagmeter.has_feature((:t)::text, 'bulk_export');
EOF
	script peer_flag <<EOF
\set t random(1, $TENANTS)
SELECT bulk_export FROM peer.entitled WHERE tenant = (:t)::text;
EOF
	# one transaction each: the app's role, then its query of 10 000 rows
	script fm_rls_query <<'EOF'
BEGIN;
SET LOCAL ROLE bench_app;
SELECT count(*) FROM peer.reports_rls;
COMMIT;
EOF
	script peer_flag_query <<'EOF'
BEGIN;
SET LOCAL ROLE bench_app;
SELECT count(*) FROM peer.reports_flag WHERE bulk_export;
COMMIT;
EOF
	show_scripts fm_has_feature peer_flag fm_rls_query peer_flag_query
	measure features "$CLIENTS" prepared 0 peer_flag fm_has_feature
	ratio_row features "$CLIENTS" features.fm_has_feature features.peer_flag \
		"primary-key SELECT of a boolean" 0.8 "" \
		"has_feature over $TENANTS tenants, a third denied by overrides"
	measure features "$CLIENTS" prepared 0 peer_flag_query fm_rls_query
	diag_row features "$CLIENTS" features.fm_rls_query features.peer_flag_query \
		"the query filtered by a boolean column" \
		"count(*) of a 10 000-row app table ($rls_rows rows pass) under a policy calling has_feature, against the same rows filtered by a column"
}
