#!/bin/sh
# A flaky job for retry_loop.sh: it changes the workspace (the current
# directory) and fails until its attempt number passes FLAKY_FAILURES
# (default 2). Each attempt writes junk/attempt-<n>.bin, appends to notes.txt
# and, when it fails, deletes data.txt (the one that succeeds leaves it). The counter (FLAKY_COUNTER) lives outside the
# workspace so that a restore does not rewind it.
set -eu
attempt=$(( $(cat "$FLAKY_COUNTER") + 1 ))
echo "$attempt" >"$FLAKY_COUNTER"

mkdir -p junk
head -c 4096 /dev/urandom >"junk/attempt-$attempt.bin"
echo "attempt $attempt was here" >>notes.txt

if [ "$attempt" -le "${FLAKY_FAILURES:-2}" ]; then
	rm -f data.txt # the damage a restore must undo
	echo "flaky: attempt $attempt failed (simulated)" >&2
	exit 1
fi
echo "succeeded on attempt $attempt" >result.txt
