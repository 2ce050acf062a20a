#!/bin/sh
# Install what ckptd needs on Debian 12, quietly when all is present.
#   deps.sh build   packages to build and run the daemon and CLI
#   deps.sh all     also the test packages, runsc and the test rootfs
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)

build_pkgs="build-essential pkg-config libmicrohttpd-dev libjansson-dev libarchive-dev
libsystemd-dev nettle-dev libcurl4-openssl-dev libzstd-dev zstd scdoc"
test_pkgs="libcmocka-dev python3 python3-pytest python3-requests python3-websocket
python3-yaml python3-fusepy git etcd-server runsc debootstrap systemd-container prometheus attr acl curl nodejs psmisc
valgrind clang clang-format cppcheck libclang-rt-14-dev wrk python3-pip python3-setuptools python3-venv btrfs-progs rsync
gnuplot-nox libcap2-bin util-linux fuse-overlayfs docker-registry skopeo umoci apache2-utils xfsprogs
libssl-dev"

want=$build_pkgs
[ "${1:-all}" = all ] && want="$build_pkgs $test_pkgs"

missing=""
for p in $want; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
		missing="$missing $p"
done
if [ -n "$missing" ]; then
	if [ "$(id -u)" != 0 ]; then
		echo "deps: missing packages:$missing (run as root to install)" >&2
		exit 1
	fi
	echo "deps: installing$missing"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	# shellcheck disable=SC2086
	apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi

# npm: NodeSource's nodejs carries it; Debian's nodejs needs the npm package.
if [ "${1:-all}" = all ] && ! command -v npm >/dev/null; then
	echo "deps: installing npm"
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends npm >/dev/null
fi

# redocly, to lint api/openapi.yaml: the exact version and hash of
# tools/package-lock.json, from the npm registry, only when the lock changed.
if [ "${1:-all}" = all ] && ! cmp -s "$here/tools/package-lock.json" "$here/tools/node_modules/.package-lock.json.ckptd" 2>/dev/null; then
	(cd "$here/tools" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error >/dev/null)
	cp "$here/tools/package-lock.json" "$here/tools/node_modules/.package-lock.json.ckptd"
fi

# The TypeScript client's dev tools (tsc, openapi-typescript), pinned by its
# package-lock.json. npm comes with nodejs (NodeSource's; Debian's is the
# separate package npm).
if [ "${1:-all}" = all ] && [ ! -x "$here/clients/typescript/node_modules/.bin/tsc" ]; then
	command -v npm >/dev/null || { echo "deps: npm missing (apt-get install npm)" >&2; exit 1; }
	(cd "$here/clients/typescript" && npm ci --prefer-offline --no-audit --no-fund >/dev/null)
fi

if [ "${1:-all}" = all ] && [ -x "$here/tests/rig/rootfs.sh" ]; then
	"$here/tests/rig/rootfs.sh"
fi
