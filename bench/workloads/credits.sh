# shellcheck shell=bash
# bench/workloads/credits.sh -- consume drawing from three active credit
# grants (issue 19) against consume of tenants without grants, same run.
#
# The flagmeter side is the worst case of a tenant with grants: every call
# draws from them, so it locks stripe 0, then its grants (src/grants.c).
# Its tenants are prepaid (no plan: their grants are their quota; the
# set-up configures unassigned_tenants => 'unlimited'), which also spares
# the set-up 10 000 assign_plan calls.  The peer is the consume
# workload's call on tenants never granted credits (one conditional
# UPDATE).  A diagnostic row times 1 000 tenants with grants that are still
# within their plan's quota (stripe 0 and the grants locked, none drawn).

register_workload credits "consume drawing from 3 active grants vs consume without grants ($TENANTS tenants)"

credits_setup() {
	fm_log "credits: $TENANTS prepaid tenants with three grants each, 1000 on a plan with grants within its quota"
	psql_q "SELECT count(flagmeter.assign_plan('w' || i, 'bench')) FROM generate_series(1, 1000) i" >/dev/null
	# The prepaid tenants have no plan, which is refused (QT001) unless
	# configured: metered without limit, their grants are their quota.
	# (The other workloads' tenants all have a plan.)
	psql_q "SELECT unassigned_tenants FROM flagmeter.configure(unassigned_tenants => 'unlimited')" >/dev/null
	psql_q "
SELECT count(*)
FROM (SELECT 'g' || i FROM generate_series(1, $TENANTS) i
      UNION ALL SELECT 'w' || i FROM generate_series(1, 1000) i
      UNION ALL SELECT 'ghot') t(tenant),
	LATERAL (SELECT flagmeter.grant_credits(t.tenant, 'api_calls', $BIG_QUOTA, now() + interval '1 day', 0),
	                flagmeter.grant_credits(t.tenant, 'api_calls', $BIG_QUOTA, now() + interval '2 days', 1),
	                flagmeter.grant_credits(t.tenant, 'api_calls', $BIG_QUOTA, NULL, 2)) g" >/dev/null
}

wl_credits() {
	if [[ $(psql_q "SELECT count(*) FROM pg_proc WHERE proname = 'grant_credits'") != 1 ]]; then
		skip_row credits "$CLIENTS" "consume without grants" ">= 0.8 x peer" "no flagmeter.grant_credits"
		return 0
	fi
	[[ $(psql_q "SELECT count(*) FROM flagmeter.credit_accounts") != 0 ]] || credits_setup
	script fm_consume_grants <<SQL
\set t random(1, $TENANTS)
SELECT flagmeter.consume('g' || :t, 'api_calls', 1);
SQL
	script fm_consume_grants_within <<SQL
\set t random(1, 1000)
SELECT flagmeter.consume('w' || :t, 'api_calls', 1);
SQL
	script fm_consume_plain <<SQL
\set t random(1, $TENANTS)
SELECT flagmeter.consume(:t, 'api_calls', 1);
SQL
	# one hot prepaid tenant against the hot conditional UPDATE (issue 39)
	script fm_consume_grants_hot <<'SQL'
SELECT flagmeter.consume('ghot', 'api_calls', 1);
SQL
	script peer_update_grants_hot <<'SQL'
UPDATE peer.quota SET used = used + 1
WHERE tenant = 'hot' AND meter = 'api_calls' AND used + 1 <= quota
RETURNING used;
SQL
	show_scripts fm_consume_grants fm_consume_plain fm_consume_grants_within fm_consume_grants_hot peer_update_grants_hot
	measure credits "$CLIENTS" prepared 0 fm_consume_plain fm_consume_grants_within fm_consume_grants \
		peer_update_grants_hot fm_consume_grants_hot
	ratio_row credits "$CLIENTS" credits.fm_consume_grants_hot credits.peer_update_grants_hot \
		"conditional UPDATE (hot)" 0.8 "" "one prepaid tenant with 3 grants from every client: each call locks stripe 0 and the grants, draws one"
	ratio_row credits "$CLIENTS" credits.fm_consume_grants credits.fm_consume_plain \
		"consume without grants" 0.8 "" "every call draws: stripe 0 and 3 grants locked, one drawn"
	diag_row credits "$CLIENTS" credits.fm_consume_grants_within credits.fm_consume_plain \
		"consume without grants" "1 000 tenants with 3 grants within their quota: stripe 0 and the grants locked, none drawn"
	echo "    grants: $(psql_q "SELECT count(*) FILTER (WHERE drawn > amount) || ' over-drawn, ' ||
		sum(drawn) || ' units drawn' FROM flagmeter.credit_grants")"
}
