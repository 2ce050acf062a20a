#!/bin/sh
# Run every fuzz target for SECS seconds from its seed corpus.
#   run.sh BUILD SECS [target...]
# New inputs go to BUILD/corpus/<target> (the seed dir is only read); a crash is
# written to BUILD/crashes/<target>/ and fails the run: copy it into
# tests/fuzz/corpus/<target>/ as a regression input once fixed.
set -u
build=$1 secs=$2
shift 2
here=$(cd "$(dirname "$0")" && pwd)
targets=${*:-$(cd "$here" && ls fuzz_*.c | sed 's/^fuzz_//; s/\.c$//')}
fail=0
for t in $targets; do
	mkdir -p "$build/corpus/$t" "$build/crashes/$t"
	log="$build/crashes/$t/log"
	if "$build/fuzz_$t" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
		-artifact_prefix="$build/crashes/$t/" "$build/corpus/$t" "$here/corpus/$t" >"$log" 2>&1; then
		echo "fuzz[$t]: $(grep -o 'Done [0-9]* runs in [0-9]* second(s)' "$log" | tail -n1): ok"
	else
		echo "fuzz[$t]: CRASH, see $log and $build/crashes/$t/"
		grep -m3 -E 'ERROR|runtime error|==ERROR|deadly signal' "$log"
		fail=1
	fi
done
exit $fail
