#!/bin/sh
# layers.sh LAYER...: fail if a file under src/ includes a header from a folder
# above its own. Layers are given lowest first; src/main.c may include anything,
# src/cli/ is a program of its own and includes only src/cli/. The two backends
# share src/backend/backend.h and nothing else.
set -eu
cd "$(dirname "$0")/../src"
rank() { # rank of a path relative to src/, or nothing for main.c and cli/
	case $1 in
	main.c) return ;;
	cli/*) echo cli; return ;;
	config.*) top=config ;;
	*) top=${1%%/*} ;;
	esac
	i=0
	for l in $LAYERS; do
		[ "$l" = "$top" ] && { echo $i; return; }
		i=$((i + 1))
	done
	echo "layers: $1 is in no layer ($LAYERS)" >&2
	echo unknown
}
LAYERS="$*"
bad=0
for f in $(find . -name '*.[ch]' | sed 's|^\./||' | sort); do
	own=$(rank "$f")
	[ -n "$own" ] || continue
	for inc in $(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$f"); do
		dep=$(rank "$inc")
		up=0
		if [ "$own" = cli ] || [ "$dep" = cli ]; then
			[ "$own" = "$dep" ] || up=1
		elif [ "$own" = unknown ] || [ "$dep" = unknown ] || [ "$dep" -gt "$own" ]; then
			up=1
		fi
		case $f:$inc in
		backend/overlay/*:backend/tar/* | backend/tar/*:backend/overlay/*) up=1 ;;
		esac
		if [ $up = 1 ]; then
			echo "layers: src/$f includes \"$inc\", which is above it" >&2
			bad=1
		fi
	done
done
[ $bad = 0 ] && echo "layers: every include goes down ($LAYERS)"
exit $bad
