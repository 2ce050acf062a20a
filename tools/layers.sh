#!/bin/sh
# layers.sh [--objects DIR] LAYER...: fail if a file under src/ includes a
# header from a folder above its own. Layers are given lowest first; src/main.c
# may include anything, src/cli/ is a program of its own and includes only
# src/cli/. The two backends share src/backend/backend.h and nothing else.
#
# With --objects DIR (the build's obj/ folder), also read the calls between
# files from the object files (nm: a symbol one file uses and another defines
# is a call from the first to the second) and fail when a file calls one in a
# folder above its own, or when the files of one folder (src/cli/ included)
# call each other in a cycle. CYCLES_ALLOW names folders whose cycles are
# reported, not fatal.
set -eu
objs=
if [ "${1:-}" = --objects ]; then
	objs=$(cd "$2" && pwd)
	shift 2
fi
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
[ -n "$objs" ] || exit $bad

# Calls: "caller.c callee.c" for every symbol that crosses files.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for o in $(cd "$objs" && find . -name '*.o' ! -name main.o | sed 's|^\./||' | sort); do
	[ -e "${o%.o}.c" ] || continue # an object left by a source that moved or went
	nm -g --defined-only "$objs/$o" | awk -v f="${o%.o}.c" 'NF == 3 { print $3, f }' >>"$tmp/defs"
	nm -u "$objs/$o" | awk -v f="${o%.o}.c" '{ print $2, f }' >>"$tmp/uses"
done
sort -o "$tmp/defs" "$tmp/defs"
sort -o "$tmp/uses" "$tmp/uses"
join "$tmp/uses" "$tmp/defs" | awk '$2 != $3 { print $2, $3 }' | sort -u >"$tmp/calls"
[ -s "$tmp/calls" ] || { echo "layers: no calls found in $objs" >&2; exit 1; }
while read -r from to; do
	a=$(rank "$from") b=$(rank "$to")
	if [ "$a" = cli ] && [ "$b" = cli ]; then
		: # the CLI calls only itself; its folder is checked for cycles below
	elif [ "$a" = unknown ] || [ "$b" = unknown ] || [ "$a" = cli ] || [ "$b" = cli ] || [ "$b" -gt "$a" ]; then
		echo "layers: src/$from calls into src/$to, which is above it" >&2
		bad=1
	fi
	[ "$(dirname "$from")" = "$(dirname "$to")" ] && echo "$from $to" >>"$tmp/dir.$(dirname "$from" | tr / _)"
done <"$tmp/calls"
for g in "$tmp"/dir.*; do
	[ -e "$g" ] || continue
	folder=$(echo "${g##*/dir.}" | tr _ /)
	tsort "$g" >/dev/null 2>"$tmp/loop" && continue
	loop=$(sed -n 's/^tsort: \([^-].*\.c\)$/\1/p' "$tmp/loop" | sort -u | tr '\n' ' ')
	case " ${CYCLES_ALLOW:-} " in
	*" $folder "*) echo "layers: known call cycle in src/$folder/ (allowed for now): $loop" >&2 ;;
	*)
		echo "layers: call cycle between files of src/$folder/: $loop" >&2
		bad=1
		;;
	esac
done
[ $bad = 0 ] && echo "layers: every call goes down, or within a folder without a cycle ($(wc -l <"$tmp/calls") calls between files${CYCLES_ALLOW:+; cycles allowed in: $CYCLES_ALLOW})"
exit $bad
