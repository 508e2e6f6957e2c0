# shellcheck shell=bash
# bench/workloads/track_hot.sh -- track with every client on one tenant,
# against the plain INSERT and against the hot-row upsert that a counter
# row per tenant would be.

register_workload track_hot "track, all clients on one tenant vs plain INSERT and vs the hot-row upsert"

wl_track_hot() {
	script fm_track_hot <<'EOF'
SELECT flagmeter.track('hot', 'api_calls');
EOF
	script peer_insert_hot <<'EOF'
INSERT INTO peer.events (tenant, meter, amount) VALUES ('hot', 'api_calls', 1);
EOF
	script peer_upsert_hot <<'EOF'
INSERT INTO peer.usage AS u (tenant, meter, used) VALUES ('hot', 'api_calls', 1)
ON CONFLICT (tenant, meter) DO UPDATE SET used = u.used + EXCLUDED.used;
EOF
	show_scripts fm_track_hot peer_insert_hot peer_upsert_hot
	measure track_hot "$CLIENTS" prepared 0 peer_insert_hot peer_upsert_hot fm_track_hot
	ratio_row track_hot "$CLIENTS" track_hot.fm_track_hot track_hot.peer_insert_hot \
		"INSERT event row" 0.9 "" ""
	ratio_row track_hot "$CLIENTS" track_hot.fm_track_hot track_hot.peer_upsert_hot \
		"hot-row upsert" 3.5 "" ""
}
