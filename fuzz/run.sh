#!/usr/bin/env bash
# fuzz/run.sh -- one bounded run of the quota_counter fuzzer; what
# `make fuzz` and `make fuzz-smoke` call (see fuzz/fuzz.mk, fuzz/README.md).
#
#   fuzz/run.sh RUNS MAX_SECONDS [libFuzzer options...]
#
# Stops after RUNS executions or MAX_SECONDS, whichever comes first.  New
# inputs go to fuzz/build/corpus (kept between runs, removed by make clean);
# the seeds in fuzz/corpus are only read.  The full libFuzzer output is in
# fuzz/build/fuzz.log; what is shown leaves out the lines announcing each new
# input and the recommended dictionary.  The last line is the summary:
#   fuzz: N executions in S s (R/s), 0 crashes, corpus C inputs
# The exit status is non-zero on a crash, hang, leak, sanitizer report or
# broken property (the harness aborts), and the input is then in
# fuzz/build/crash-* (or timeout-*, leak-*, oom-*).

set -euo pipefail

if (($# < 2)); then
	echo "usage: $0 RUNS MAX_SECONDS [libFuzzer options...]" >&2
	exit 2
fi
runs=$1
max_time=$2
shift 2

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
build=$here/build
bin=$build/fuzz_counter
work=$build/corpus
log=$build/fuzz.log

if [[ ! -x $bin ]]; then
	echo "fuzz: $bin is missing (make fuzz-build)" >&2
	exit 2
fi
mkdir -p "$work"

# Counted before and after, so that an earlier failed run's artifacts are
# not taken for this run's.
artifacts() { compgen -G "$build/crash-*" || true; compgen -G "$build/timeout-*" || true
	compgen -G "$build/leak-*" || true; compgen -G "$build/oom-*" || true; }
before=$(artifacts | wc -l)

# -timeout: an input taking 10 s is a hang (the parsers are linear).
# -max_len: three text forms of at most FM_COUNTER_TEXT_MAX bytes, plus slack.
# ASan's leak check stays on: the harness frees what it allocates.
start=$SECONDS
set +e
"$bin" -runs="$runs" -max_total_time="$max_time" -max_len=600 -timeout=10 \
	-dict="$here/counter.dict" -artifact_prefix="$build/" -print_final_stats=1 \
	"$@" "$work" "$here/corpus" 2>&1 |
	tee "$log" | awk '
		/^#[0-9]+[[:space:]]+(NEW|REDUCE) / { next }
		/^###### Recommended dictionary/ { skip = 1 }
		/^###### End of recommended dictionary/ { skip = 0; next }
		!skip { print; fflush() }'
rc=${PIPESTATUS[0]}
set -e
elapsed=$((SECONDS - start))

execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
execs=${execs:-0}
ninputs=$(find "$work" -type f | wc -l)
after=$(artifacts | wc -l)
crashes=0
if ((rc != 0 || after > before)); then
	crashes=1
fi
rate=$((elapsed > 0 ? execs / elapsed : execs))

if ((crashes)); then
	echo "fuzz: FAILED (libFuzzer exit status $rc) after $execs executions in $elapsed s; full log: $log" >&2
	for f in $(artifacts | tail -n $((after - before > 0 ? after - before : 1))); do
		echo "fuzz: input saved as $f; replay with: $bin $f" >&2
		od -A d -c "$f" | head -n 20 >&2
	done
elif ((execs < runs)); then
	echo "fuzz: note: stopped by the time limit (${max_time} s) before ${runs} executions"
fi
echo "fuzz: $execs executions in $elapsed s ($rate/s), $crashes crashes, corpus $ninputs inputs"
exit $((crashes ? 1 : 0))
