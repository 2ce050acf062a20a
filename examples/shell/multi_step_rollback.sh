#!/bin/sh
# Multi-step rollback: checkpoint before each step of a workflow; when a step
# fails, restore the second-to-last checkpoint and stop.
#
#   CKPTD_URL=http://127.0.0.1:7070 sh multi_step_rollback.sh /path/to/workspace [FAIL_STEP]
#
# As in the SDK's example, the checkpoint restored on a failure at step k is
# the one taken before step k-1 (none when step 1 fails). Step FAIL_STEP
# (default 3, or CKPTD_FAIL_STEP; 0 = none) does its work, then damages the
# tree and exits 1. Exit status: 0 when every step succeeded, 1 after a
# failed step, 2 on errors.
set -u
here=$(cd "$(dirname "$0")" && pwd)
. "$here/ckptd.sh"

ws=$(ckptd_workspace "${1-}") || exit 2
fail_step="${2:-${CKPTD_FAIL_STEP:-3}}"

# The steps: shell code run in the workspace ($ in it expands there, not here).
# shellcheck disable=SC2016
step_code() {
	case "$1" in
	prepare) printf '%s\n' 'mkdir -p app && echo "{\"stage\": \"prepared\", \"rows\": 3}" >app/config.json' ;;
	fetch) printf '%s\n' 'mkdir -p app/data && printf "id,value\n1,10\n2,20\n3,30\n" >app/data/input.csv' ;;
	build) printf '%s\n' 'mkdir -p app/build &&
		awk -F, "NR > 1 { s += \$2 } END { print s }" app/data/input.csv >app/build/total.txt &&
		echo "{\"stage\": \"built\", \"rows\": 3}" >app/config.json' ;;
	test) printf '%s\n' 'total=$(cat app/build/total.txt)
		if [ "$total" = 60 ]; then r=pass; else r=FAIL; fi
		echo "total $total: $r" >app/report.txt' ;;
	esac
}
# Appended to the failing step: half-done work, then failure.
sabotage='
	echo "half written" >app/partial.tmp
	rm -rf app/data app/config.json
	echo "step failed (simulated)" >&2
	exit 1'

checkpoints=""
cleanup() {
	for c in $checkpoints; do ckptd_delete "$c"; done
}
trap cleanup EXIT

k=0
last=""        # the checkpoint taken before this step
second_last="" # the one taken before the previous step
for step in prepare fetch build test; do
	k=$((k + 1))
	cp=$(ckptd_create "before-$step") || exit 2
	ckptd_report_checkpoint "$cp"
	id=$(printf '%s' "$cp" | ckptd_json checkpoint_id)
	checkpoints="$checkpoints $id"
	second_last="$last"
	last="$id"
	code=$(step_code "$step")
	[ "$k" = "$fail_step" ] && code="$code$sabotage"
	(cd "$ws" && sh -c "$code")
	rc=$?
	if [ $rc -eq 0 ]; then
		echo "STEP $k $step ok"
		continue
	fi
	echo "STEP $k $step failed exit=$rc"
	if [ -n "$second_last" ]; then
		result=$(ckptd_restore "$second_last") || exit 2
		ckptd_report_restore "$result"
	else
		echo "NO-RESTORE no checkpoint before the previous step"
	fi
	echo "GAVE UP"
	exit 1
done
echo "DONE ok"
