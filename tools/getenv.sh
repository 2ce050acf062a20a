#!/bin/sh
# getenv.sh: fail if a file in src/ reads the environment where it should
# receive a field. The daemon's settings are read in config.c (the file,
# the flags and the sandbox API's SANDBOX_CHECKPOINT_* variables) and main.c
# (the process's entry; today libsystemd reads NOTIFY_SOCKET and LISTEN_FDS
# for it). Allowed besides them: src/cli/ (the ckpt client is another
# program with its own environment: CKPTD_URL, CKPTD_SOCKET, CKPTD_TOKEN)
# and src/lib/log.c (JOURNAL_STREAM tells the logging library whether its
# stderr is the journal, before any config exists).
set -eu
cd "$(dirname "$0")/../src"
hits=$(find . -name '*.[ch]' ! -path './cli/*' ! -path './config.c' ! -path './main.c' ! -path './lib/log.c' |
	sort | xargs grep -nE '\b(secure_)?getenv *\(' || true)
if [ -n "$hits" ]; then
	echo "$hits" | sed 's|^\./|src/|' >&2
	echo "getenv: only config.c, main.c, src/cli/ and lib/log.c read the environment; pass a field" >&2
	exit 1
fi
echo "getenv: the environment is read only in config.c, main.c, src/cli/ and lib/log.c"
