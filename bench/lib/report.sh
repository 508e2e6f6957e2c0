# shellcheck shell=bash
# bench/lib/report.sh -- the rows a workload adds to the table, and the
# table, WAL, wait-event and CSV output at the end of the run.  Sourced by
# bench/run.

# ---------------------------------------------------------------------------
# Result rows: RES/rows.tsv, one line per row:
# workload clients unit flagmeter fm_p95 peer peer_rate peer_p95 ratio target met note
# ---------------------------------------------------------------------------

emit_row() {
	local IFS=$'\t'
	echo "$*" >>"$RES/rows.tsv"
}

# ratio A B: A / B, two decimals (0 when B is 0)
ratio() {
	awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", (b > 0) ? a / b : 0 }'
}

# ratio_of A B: rate(A) / rate(B), two decimals
ratio_of() {
	ratio "$(rate_of "$1")" "$(rate_of "$2")"
}

# met VALUE MIN: "yes" when VALUE >= MIN, else "NO"
met() {
	awk -v v="$1" -v m="$2" 'BEGIN { print (v + 0 >= m + 0) ? "yes" : "NO" }'
}

# ratio_row WORKLOAD CLIENTS FM_LABEL PEER_LABEL PEER_NAME MIN_RATIO GATE NOTE
#   met when rate(fm) >= MIN_RATIO x rate(peer) and GATE is empty (GATE is
#   the reason otherwise, e.g. errors or over-grants).
ratio_row() {
	local wl=$1 clients=$2 fm=$3 peer=$4 peer_name=$5 min=$6 gate=$7 note=$8
	local ratio met
	ratio=$(ratio_of "$fm" "$peer")
	met=$(met "$ratio" "$min")
	if [[ -n $gate ]]; then
		met=NO
		note="$gate${note:+; $note}"
	fi
	emit_row "$wl" "$clients" tps "$(rate_of "$fm")" "$(p95_ms "$fm")" "$peer_name" \
		"$(rate_of "$peer")" "$(p95_ms "$peer")" "$ratio" ">= $min x peer" "$met" "$note"
}

# rate_row WORKLOAD CLIENTS UNIT FM_RATE FM_P95 PEER_NAME PEER_RATE PEER_P95 MIN NOTE
#   an absolute target (events/s); the ratio to the peer, if any, is shown
#   for information.
rate_row() {
	local wl=$1 clients=$2 unit=$3 fm_rate=$4 fm_p95=$5 peer_name=$6 peer_rate=$7 peer_p95=$8
	local min=$9 note=${10} ratio=- met
	if [[ $peer_rate != - ]]; then
		ratio=$(ratio "$fm_rate" "$peer_rate")
	fi
	met=$(met "$fm_rate" "$min")
	emit_row "$wl" "$clients" "$unit" "$fm_rate" "$fm_p95" "$peer_name" "$peer_rate" "$peer_p95" \
		"$ratio" ">= $min $unit" "$met" "$note"
}

# diag_row WORKLOAD CLIENTS FM_LABEL REF_LABEL REF_NAME NOTE
#   flagmeter against plain SQL doing the same writes (or, for check, the
#   same read) as it does: no target; it shows how much of the gap to the
#   peer that work explains.
diag_row() {
	local wl=$1 clients=$2 fm=$3 ref=$4 ref_name=$5 note=$6
	emit_row "$wl" "$clients" tps "$(rate_of "$fm")" "$(p95_ms "$fm")" "$ref_name" \
		"$(rate_of "$ref")" "$(p95_ms "$ref")" "$(ratio_of "$fm" "$ref")" "none (diagnostic)" - "$note"
}

skip_row() {
	local wl=$1 clients=$2 peer_name=$3 target=$4 reason=$5
	emit_row "$wl" "$clients" - - - "$peer_name" - - - "$target" skipped "$reason"
}

# ---------------------------------------------------------------------------
# Output
# ---------------------------------------------------------------------------

print_table() {
	local header=$'workload\tclients\tunit\tflagmeter\tP95 ms\tpeer\tpeer rate\tP95 ms\tratio\ttarget\tmet'
	echo
	echo "== results (rate = median of $ROUNDS round(s) of ${DURATION} s; P95 over all rounds; ratio = flagmeter / peer)"
	echo
	{
		echo "$header"
		cut -f1-11 "$RES/rows.tsv" |
			awk -F'\t' -v OFS='\t' '{ if ($4 ~ /^[0-9.]+$/) $4 = sprintf("%.0f", $4)
			                         if ($7 ~ /^[0-9.]+$/) $7 = sprintf("%.0f", $7)
			                         print }'
	} | column -t -s $'\t' | sed 's/^/  /'
	echo
	echo "  notes:"
	awk -F'\t' '$12 != "" { printf "    %-16s %s\n", $1 ":", $12 }' "$RES/rows.tsv"
}

# WAL per transaction of each script: with synchronous_commit on, most
# workloads here wait on the commit flush, so WAL volume is their cost.
print_wal() {
	local f
	echo
	echo "== WAL written per transaction (median of the rounds; batch: per call)"
	for f in "$RES"/*.wal; do
		[[ -e $f ]] || continue
		printf '  %-44s %8.0f B\n' "$(basename "$f" .wal)" "$(median_file "$f")"
	done
}

print_waits() {
	((WAITS)) || return 0
	local f label total
	echo
	echo "== wait events of active client backends (share of 0.1 s samples, top 6)"
	for f in "$RES"/*.waits; do
		[[ -e $f ]] || continue
		label=$(basename "$f" .waits)
		total=$(wc -l <"$f")
		echo "  $label ($total samples)"
		sort "$f" | uniq -c | sort -rn | head -n 6 |
			awk -v t="$total" '{ printf "    %5.1f%%  %s\n", 100 * $1 / t, $2 }'
	done
}

write_csv() {
	[[ -n $CSV_FILE ]] || return 0
	{
		echo "workload,clients,unit,flagmeter,flagmeter_p95_ms,peer,peer_rate,peer_p95_ms,ratio,target,met,note"
		awk -F'\t' '{
			line = ""
			for (i = 1; i <= 12; i++) {
				v = $i
				if (v ~ /[",]/) { gsub(/"/, "\"\"", v); v = "\"" v "\"" }
				line = line (i > 1 ? "," : "") v
			}
			print line
		}' "$RES/rows.tsv"
	} >"$CSV_FILE"
	fm_log "table written to $CSV_FILE"
}

