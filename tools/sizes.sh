#!/bin/sh
# sizes.sh [MAX]: fail if a file under src/ is over MAX lines (800 unless
# given), or does not open with a comment that names it and says its
# purpose ("/* name.c: what it is for"). A file past the limit holds more
# than one concern: split it by concern rather than raise MAX.
set -eu
max=${1:-800}
cd "$(dirname "$0")/../src"
bad=0
n=0
for f in $(find . -name '*.[ch]' | sed 's|^\./||' | sort); do
	n=$((n + 1))
	lines=$(wc -l <"$f")
	if [ "$lines" -gt "$max" ]; then
		echo "sizes: src/$f has $lines lines, over $max: split it by concern" >&2
		bad=1
	fi
	name=${f##*/}
	case $(head -n 1 "$f") in
	"/* $name: "?*) ;;
	*)
		echo "sizes: src/$f does not open with \"/* $name: <its purpose>\"" >&2
		bad=1
		;;
	esac
done
[ $bad = 0 ] && echo "sizes: all $n files in src/ have $max lines or fewer and open with their name and purpose"
exit $bad
