#!/bin/sh
# kinds.sh: fail if a file below the engine chooses an error kind. Only
# src/engine (engine_err.c classifies what comes up from below) and src/http
# do; lib, config, services and the backends report an errno, a message and
# at most a reason code (err_set). util.[ch] define the kinds.
set -eu
cd "$(dirname "$0")/../src"
pat='err_set_kind|err_mark|ERR_(INVALID|NOT_FOUND|CONFLICT|EXPIRED|LIMIT|NO_SPACE|UNAVAILABLE|INTERNAL)'
hits=$(find lib services backend config.c config.h -name '*.[ch]' ! -name 'util.[ch]' | sort |
	xargs grep -nE "$pat" || true)
if [ -n "$hits" ]; then
	echo "$hits" | sed 's|^|src/|' >&2
	echo "kinds: only src/engine and src/http choose an error kind; report errno and a message (err_set)" >&2
	exit 1
fi
echo "kinds: no file below the engine chooses an error kind"
