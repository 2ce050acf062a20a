#!/bin/sh
# commits.sh: every commit since the habit began has a subject of 72
# characters or fewer, and every commit that is not a merge says why in a
# body, from the commit before the one that added this check. Older
# history is left as it was written. A shallow clone that lacks
# the starting commit checks what it has.
set -eu
cd "$(dirname "$0")/.."
since=e6fd2c961feea236e3e5a04a3f7bd00e80900c08
git rev-parse -q --verify "$since^{commit}" >/dev/null 2>&1 || since=
range=${since:+$since..}HEAD
bad=0
n=0
for c in $(git rev-list "$range"); do
	n=$((n + 1))
	subject=$(git log -1 --format=%s "$c")
	if [ ${#subject} -gt 72 ]; then
		echo "commits: $(git rev-parse --short "$c") subject is ${#subject} characters (72 at most): $subject" >&2
		bad=1
	fi
	parents=$(git log -1 --format=%p "$c" | wc -w)
	body=$(git log -1 --format=%b "$c" | grep -v '^[[:space:]]*$' | grep -cv '^[A-Za-z-]*: ' || true)
	if [ "$parents" -lt 2 ] && [ "$body" -eq 0 ]; then
		echo "commits: $(git rev-parse --short "$c") has no body saying why: $subject" >&2
		bad=1
	fi
done
[ $bad = 0 ] && echo "commits: $n commits since ${since:-the start} have short subjects and a why"
exit $bad
