# ckptd.sh: curl functions for ckptd's HTTP API (v1). Source it:
#
#   . examples/shell/ckptd.sh
#   cp=$(ckptd_create baseline) && id=$(printf '%s' "$cp" | ckptd_json checkpoint_id)
#   ckptd_restore "$id" | ckptd_json restore_duration_ms
#
# Settings: CKPTD_URL (default http://127.0.0.1:7070), CKPTD_SOCKET (a unix
# socket path; wins over the URL), CKPTD_TOKEN (bearer token, handed to curl
# on stdin so that it does not show in `ps`), CKPTD_TIMEOUT (seconds to wait
# for an answer), CKPTD_RETRIES (curl --retry for POSTs, default 3),
# CKPTD_IDEMPOTENCY_KEY (the POST's Idempotency-Key; default a fresh UUID).
# Each function prints the JSON answer and returns 0 on success. On an error
# answer it prints "ckptd: error status=<n> code=<code> detail=<text>" on
# stderr and returns 1 (3 when the daemon cannot be reached, 4 when it did not
# answer in time: the outcome is unknown, retry with the same key).
# JSON is read with python3 when there is one, else with sed (flat fields
# only); CKPTD_JSON=sed forces the sed reader.
# `local` is not POSIX, but dash, bash, busybox ash and ksh all have it.
# shellcheck shell=sh disable=SC3043

ckptd_request() { # METHOD PATH [JSON-BODY] [curl args...]
	local method="$1" path="$2" body="${3-}" base out status rc
	shift 2
	[ $# -gt 0 ] && shift
	out=$(mktemp) || return 3
	set -- -sS -X "$method" -H 'Accept: application/json' -o "$out" -w '%{http_code}' "$@"
	if [ -n "$body" ]; then
		set -- "$@" -H 'Content-Type: application/json' --data-binary "$body"
	fi
	if [ "$method" = POST ]; then
		# One key per call: curl's retries (timeouts, 503) resend it, and
		# ckptd answers a repeat with the first answer instead of redoing it.
		set -- "$@" -H "Idempotency-Key: ${CKPTD_IDEMPOTENCY_KEY:-$(cat /proc/sys/kernel/random/uuid)}" \
			--retry "${CKPTD_RETRIES:-3}"
	fi
	[ -n "${CKPTD_TIMEOUT-}" ] && set -- "$@" --max-time "$CKPTD_TIMEOUT"
	if [ -n "${CKPTD_SOCKET-}" ]; then
		set -- "$@" --unix-socket "$CKPTD_SOCKET"
		base=http://localhost
	else
		base="${CKPTD_URL:-http://127.0.0.1:7070}"
		base="${base%/}"
	fi
	if [ -n "${CKPTD_TOKEN-}" ]; then
		status=$(printf 'header = "Authorization: Bearer %s"\n' "$CKPTD_TOKEN" | curl -K - "$@" "$base$path")
	else
		status=$(curl "$@" "$base$path")
	fi
	rc=$?
	if [ $rc -eq 28 ] || [ $rc -eq 52 ] || [ $rc -eq 56 ]; then
		echo "ckptd: error status=0 code=timeout detail=no answer from ckptd at ${CKPTD_SOCKET:-$base}; the $method may still happen (curl exit $rc)" >&2
		rm -f "$out"
		return 4
	fi
	if [ $rc -ne 0 ] || [ "${status:-000}" = 000 ]; then
		echo "ckptd: error status=0 code=not_reachable detail=cannot reach ckptd at ${CKPTD_SOCKET:-$base} (curl exit $rc)" >&2
		rm -f "$out"
		return 3
	fi
	case "$status" in
	2??) cat "$out"; rc=0 ;;
	*)
		echo "ckptd: error status=$status code=$(ckptd_json code <"$out") detail=$(ckptd_json detail <"$out")" >&2
		rc=1 ;;
	esac
	rm -f "$out"
	return $rc
}

_ckptd_jstr() { # escape a value for a JSON string
	printf '%s' "$1" | sed -e 's/\\/\\\\/g' -e 's/"/\\"/g'
}

ckptd_create() { # NAME [TTL_SECS]
	local body
	body="{\"name\":\"$(_ckptd_jstr "$1")\""
	[ -n "${2-}" ] && body="$body,\"ttl_secs\":$2"
	ckptd_request POST /v1/checkpoints "$body}"
}

ckptd_list() { # [NAME]
	if [ -n "${1-}" ]; then
		ckptd_request GET /v1/checkpoints "" --get --data-urlencode "name=$1"
	else
		ckptd_request GET /v1/checkpoints
	fi
}

ckptd_get() { ckptd_request GET "/v1/checkpoints/$1"; }
ckptd_delete() { ckptd_request DELETE "/v1/checkpoints/$1"; }
ckptd_health() { ckptd_request GET /v1/health; }

ckptd_restore() { # ID [force]
	if [ "${2-}" = force ]; then
		ckptd_request POST "/v1/checkpoints/$1/restore" '{"force":true}'
	else
		ckptd_request POST "/v1/checkpoints/$1/restore" '{}'
	fi
}

_ckptd_python() {
	if [ -x /usr/bin/python3 ]; then echo /usr/bin/python3
	else command -v python3
	fi
}

ckptd_json() { # FIELD: print one top-level field of the JSON on stdin (lists joined by ",")
	local py
	py=$(_ckptd_python)
	if [ -n "$py" ] && [ "${CKPTD_JSON-}" != sed ]; then
		"$py" -c '
import json, sys
try:
    v = json.load(sys.stdin).get(sys.argv[1], "")
except ValueError:
    v = ""
if isinstance(v, bool):
    v = str(v).lower()
elif isinstance(v, list):
    v = ",".join(map(str, v))
elif v is None:
    v = "null"
print(v)' "$1"
		return
	fi
	# Flat fields only: a string, a list of strings, or a number/bool/null.
	{ tr -d '\n'; echo; } | sed -n \
		-e "s/.*\"$1\" *: *\"\\([^\"]*\\)\".*/\\1/p;t" \
		-e "s/.*\"$1\" *: *\\[\\([^]]*\\)\\].*/\\1/;t list" \
		-e "s/.*\"$1\" *: *\\([-0-9.a-z]*\\).*/\\1/p;t" \
		-e 'd' -e ':list' -e 's/[" ]//g;p'
}

# The report lines of all the examples (Python and TypeScript print the same):
#   CHECKPOINT <id> name=<name> duration_ms=<n> size_bytes=<n>
#   RESTORED <id> duration_ms=<n> ok=<bool> stopped=[..] started=[..] failed=[..]
# followed by CKPTD_AFTER_CREATE_HOOK / CKPTD_AFTER_RESTORE_HOOK <id> when set.
ckptd_report_checkpoint() { # RECORD-JSON
	local id
	id=$(printf '%s' "$1" | ckptd_json checkpoint_id)
	echo "CHECKPOINT $id name=$(printf '%s' "$1" | ckptd_json name)" \
		"duration_ms=$(printf '%s' "$1" | ckptd_json duration_ms)" \
		"size_bytes=$(printf '%s' "$1" | ckptd_json size_bytes)"
	[ -z "${CKPTD_AFTER_CREATE_HOOK-}" ] || "$CKPTD_AFTER_CREATE_HOOK" "$id"
}

ckptd_report_restore() { # RESTORE-RESULT-JSON
	local id f line
	id=$(printf '%s' "$1" | ckptd_json checkpoint_id)
	line="RESTORED $id duration_ms=$(printf '%s' "$1" | ckptd_json restore_duration_ms)"
	line="$line ok=$(printf '%s' "$1" | ckptd_json ok)"
	for f in stopped started failed; do
		line="$line $f=[$(printf '%s' "$1" | ckptd_json "${f}_services")]"
	done
	echo "$line"
	[ -z "${CKPTD_AFTER_RESTORE_HOOK-}" ] || "$CKPTD_AFTER_RESTORE_HOOK" "$id"
}

ckptd_workspace() { # [DIR]: the managed root, from the argument or CKPTD_WORKSPACE
	local ws="${1:-${CKPTD_WORKSPACE-}}"
	if [ -z "$ws" ] || [ ! -d "$ws" ]; then
		echo "usage: give the workspace (a directory ckptd manages) as an argument or in CKPTD_WORKSPACE" >&2
		return 2
	fi
	(cd "$ws" && pwd -P)
}
