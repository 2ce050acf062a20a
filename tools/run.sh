#!/bin/sh
# run.sh CKPTD PORT WORKSPACE STATE: `make run`. Serves WORKSPACE on 127.0.0.1:PORT
# in the foreground and prints the URL only once ckptd answers. Ctrl-C releases
# WORKSPACE (POST /v1/roots/release: it keeps what it holds, as a plain
# directory, and the checkpoints are kept) and stops ckptd; the next make run
# adopts it again.
set -u
ckptd=$1 port=$2 ws=$3 state=$4
url=http://127.0.0.1:$port
case $port in
'' | *[!0-9]*) echo "make run: PORT must be a number, not '$port'" >&2; exit 2 ;;
esac
if ss -Hltn "sport = :$port" 2>/dev/null | grep -q .; then
	echo "make run: port $port is already in use; pick another: make run PORT=$((port + 1))" >&2
	exit 1
fi
mkdir -p "$ws" "$state" || exit 1
# Its own session: the terminal's Ctrl-C reaches this script only, which
# releases the workspace before it stops ckptd.
setsid "$ckptd" --listen "127.0.0.1:$port" --state-dir "$state" --root "$ws" --unmount-on-exit &
pid=$!
release() {
	out=$(curl -sS -XPOST -H 'Content-Type: application/json' -d '{}' "$url/v1/roots/release" 2>&1)
	case $out in
	*'"released"'*) echo "make run: $ws keeps what it held (released); the next make run adopts it again" ;;
	*) echo "make run: could not release $ws ($out); ckptd unmounts it, its contents stay in $state" >&2 ;;
	esac
}
trap 'trap "" INT TERM; release; kill -TERM $pid 2>/dev/null' INT TERM
i=0
until curl -fsS -o /dev/null "$url/v1/health" 2>/dev/null; do
	if ! kill -0 $pid 2>/dev/null; then
		wait $pid
		rc=$?
		echo "make run: ckptd stopped before it served (exit $rc); its message is above" >&2
		exit 1
	fi
	i=$((i + 1))
	[ $i -lt 600 ] || { echo "make run: ckptd did not answer on $url in 60 s" >&2; kill $pid; exit 1; }
	sleep 0.1
done
echo "ckptd: serving $url for $ws (state in $state); Ctrl-C stops it"
echo "try:   curl -s -XPOST -H 'Content-Type: application/json' -d '{\"name\":\"first\"}' $url/v1/checkpoints"
wait $pid
rc=$?
# A signal interrupts the first wait; wait again for ckptd's clean exit.
kill -0 $pid 2>/dev/null && { wait $pid; rc=$?; }
exit $rc
