# shellcheck shell=bash
# bench/workloads/track.sh -- track over many tenants against the plain
# INSERT of one event row; its diagnostic row times track's two writes as
# one plain statement.  Its scripts fm_track, peer_insert and writes_track
# are shared (bench/lib/setup.sh).

register_workload track "track over $TENANTS tenants vs plain INSERT of one event row"

wl_track() {
	local cache
	show_scripts fm_track peer_insert writes_track
	measure track "$CLIENTS" prepared 0 peer_insert writes_track fm_track
	# flagmeter is preloaded (tools/common.sh): how often a limit came from
	# the shared cache instead of the catalog
	cache=$(psql_q "SELECT COALESCE(format('shared limit cache: %s hits, %s loads since start',
	                                       hits, loads), 'no shared limit cache')
	                FROM flagmeter.shared_limit_cache()")
	echo "    $cache"
	ratio_row track "$CLIENTS" track.fm_track track.peer_insert "INSERT event row" 0.9 "" "$cache"
	diag_row track "$CLIENTS" track.fm_track track.writes_track "event INSERT + counter upsert" \
		"track's two writes (event row, counter row) as one plain SQL statement; it runs at $(ratio_of track.writes_track track.peer_insert) x the INSERT"
}
