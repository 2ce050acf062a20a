#!/bin/sh
# Build, once, the Debian rootfs the systemd rig boots with systemd-nspawn.
# Idempotent: a stamp file marks a finished build; an interrupted build never
# leaves a half rootfs behind (it is built in a temp dir, then renamed).
#   rootfs.sh          build if missing (silent when cached)
#   rootfs.sh --path   the same, then print the rootfs path
#   rootfs.sh --force  rebuild
set -eu
here=$(cd "$(dirname "$0")" && pwd)
cache=${CKPTD_RIG_CACHE:-$here/.cache}
suite=bookworm
# Bump when the package list changes so cached rootfs are rebuilt.
version=2
rootfs=$cache/rootfs-$suite
stamp=$rootfs/.ckptd-rig-stamp

# systemd and dbus to boot; python3 for the sample units; curl for unix-socket
# requests from inside; the run-time libraries of ckptd and ckpt (same Debian
# release as the build host, so `make install` binaries run as they are).
pkgs=systemd,systemd-sysv,dbus,python3,curl,procps,libmicrohttpd12,libjansson4
pkgs=$pkgs,libarchive13,libsystemd0,libcurl4,libzstd1,attr
# pip and venv for the whole-root tests (test_rig_whole.py): a local wheel
# installed and rolled back. libcap2-bin: getcap/setcap.
pkgs=$pkgs,python3-pip,python3-venv,libcap2-bin
# .deb files the whole-root tests install with apt-get inside the rig, which
# has no network: a small daemon with a systemd unit, and what it needs
# beyond the rootfs. Fetched here, on the host, into the rootfs.
debs="cron cron-daemon-common sensible-utils"
debdir=var/cache/ckptd-rig/debs

print_path() { [ "${1:-}" != --path ] || echo "$rootfs"; }
mkdir -p "$cache"
# One build at a time; a caller that finds a build running waits for it.
exec 9>"$cache/.lock"
flock 9
if [ "${1:-}" != --force ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$version" ]; then
	print_path "${1:-}"
	exit 0
fi
if [ "$(id -u)" != 0 ]; then
	echo "rootfs.sh: must run as root (debootstrap)" >&2
	exit 1
fi
tmp=$(mktemp -d "$cache/build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
mirror=${CKPTD_RIG_MIRROR:-http://deb.debian.org/debian}
echo "rootfs.sh: debootstrap $suite into $rootfs (once; about a minute)" >&2
debootstrap --variant=minbase --include="$pkgs" "$suite" "$tmp/root" "$mirror" >"$tmp/log" 2>&1 || {
	tail -n 30 "$tmp/log" >&2
	exit 1
}
mkdir -p "$tmp/root/$debdir"
(cd "$tmp/root/$debdir" && apt-get download $debs) >"$tmp/log.debs" 2>&1 || {
	tail -n 30 "$tmp/log.debs" >&2
	exit 1
}
# A booted container needs no login prompts, and its journal stays small.
rm -f "$tmp/root/etc/systemd/system/getty.target.wants/"* 2>/dev/null || true
ln -sf /dev/null "$tmp/root/etc/systemd/system/console-getty.service"
echo ckptd-rig >"$tmp/root/etc/hostname"
: >"$tmp/root/etc/machine-id"
printf '[Journal]\nStorage=volatile\nRuntimeMaxUse=16M\n' >"$tmp/root/etc/systemd/journald.conf"
apt_clean="$tmp/root/var/cache/apt/archives"
rm -f "$apt_clean"/*.deb 2>/dev/null || true
echo "$version" >"$tmp/root/.ckptd-rig-stamp"
rm -rf "$rootfs"
mv "$tmp/root" "$rootfs"
print_path "${1:-}"
