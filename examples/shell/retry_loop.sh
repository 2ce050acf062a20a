#!/bin/sh
# Retry loop: checkpoint once, then up to 3 attempts of a flaky job,
# restoring the workspace to the checkpoint between failed attempts.
#
#   CKPTD_URL=http://127.0.0.1:7070 sh retry_loop.sh /path/to/workspace
#
# Environment as for ../python/retry_loop.py: CKPTD_URL / CKPTD_SOCKET /
# CKPTD_TOKEN, CKPTD_WORKSPACE, CKPTD_ATTEMPT_FILE, FLAKY_FAILURES,
# CKPTD_AFTER_CREATE_HOOK / CKPTD_AFTER_RESTORE_HOOK.
# Exit status 0 when an attempt succeeded, 1 when all failed, 2 on errors.
set -u
here=$(cd "$(dirname "$0")" && pwd)
. "$here/ckptd.sh"
ATTEMPTS=3

ws=$(ckptd_workspace "${1-}") || exit 2
counter="${CKPTD_ATTEMPT_FILE:-$(mktemp "${TMPDIR:-/tmp}/ckptd-attempts-XXXXXX")}"
echo 0 >"$counter" || exit 2
case "$(cd "$(dirname "$counter")" && pwd -P)/" in
"$ws"/*) echo "the attempt counter must live outside the workspace, or a restore rewinds it" >&2; exit 2 ;;
esac

cp=$(ckptd_create before-attempt) || exit 2
ckptd_report_checkpoint "$cp"
id=$(printf '%s' "$cp" | ckptd_json checkpoint_id)
trap 'ckptd_delete "$id"; [ -n "${CKPTD_ATTEMPT_FILE-}" ] || rm -f "$counter"' EXIT

ok=false
attempt=0
while [ $attempt -lt $ATTEMPTS ]; do
	(cd "$ws" && FLAKY_COUNTER="$counter" sh "$here/flaky_script.sh")
	rc=$?
	if [ $rc -eq 0 ]; then
		echo "ATTEMPT $((attempt + 1)) ok"
		ok=true
		break
	fi
	echo "ATTEMPT $((attempt + 1)) failed exit=$rc"
	if [ $attempt -lt $((ATTEMPTS - 1)) ]; then
		# Back to the same starting point before trying again.
		result=$(ckptd_restore "$id") || exit 2
		ckptd_report_restore "$result"
	fi
	attempt=$((attempt + 1))
done

if $ok; then
	echo "DONE ok"
	exit 0
fi
echo "GAVE UP after $ATTEMPTS attempts"
exit 1
