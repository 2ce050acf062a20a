#!/bin/sh
# format.sh [--fix]: every C file of src/, tests/unit/ and tests/fuzz/ is as
# clang-format (the tree's .clang-format) writes it. Without --fix, list the
# files that drift and fail; `make fmt` rewrites them.
set -eu
cd "$(dirname "$0")/.."
command -v clang-format >/dev/null || { echo "format: clang-format missing (make deps)" >&2; exit 1; }
files=$(find src tests/unit tests/fuzz -name '*.[ch]' | sort)
if [ "${1:-}" = --fix ]; then
	# shellcheck disable=SC2086
	clang-format -i $files
	exit 0
fi
bad=0
for f in $files; do
	if ! clang-format "$f" | cmp -s - "$f"; then
		echo "format: $f differs from clang-format (run make fmt)" >&2
		bad=1
	fi
done
[ $bad = 0 ] && echo "format: $(echo "$files" | wc -l) files as clang-format writes them"
exit $bad
