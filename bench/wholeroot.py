"""The whole sandbox as a root (docs/whole-root.md), `bench/run.py --cases
wholeroot`: a checkpoint of a Debian rootfs (the rig's, a few hundred MB),
then a restore after an `apt-get install` of a few MB, against
`rsync -a --delete` of the rootfs from a pristine copy of the same state.

ckptd runs on "/" of a copy of the rootfs, on an ext4 filesystem of its own
(a loop device): chrooted in a mount namespace of its own (proc and a tmpfs
/tmp mounted there), with CAP_SYS_ADMIN, so fanotify tracks changes. This machine's / is never its root. The .deb files
are fetched on the host with `apt-get download` (the chroot has no sources).
"""
import os
import pathlib
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import requests

TOP = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TOP / "tests/rig"))
import rig as rigmod  # noqa: E402

# A few MB installed, with what they need beyond the rig's rootfs.
DEBS = ["gawk", "libmpfr6", "libsigsegv2", "busybox", "cron", "cron-daemon-common", "sensible-utils"]
EXCLUDES = ["/var/lib/ckptd", "/proc", "/tmp", "/wr"]


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def timed(argv):
    t0 = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
    return (time.perf_counter() - t0) * 1000


class ChrootDaemon:
    """ckptd --root / inside root (a chroot in a mount namespace of its own)."""

    def __init__(self, ckptd, root):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        (root / "wr").mkdir(exist_ok=True)
        shutil.copy2(ckptd, root / "wr/ckptd")
        script = (f"mount --make-rprivate / && mount --bind {root} {root} && mount -t proc proc {root}/proc && "
                  f"mount -t tmpfs tmpfs {root}/tmp && exec chroot {root} /wr/ckptd --root / --backend tar "
                  f"--state-dir /var/lib/ckptd --listen 127.0.0.1:{self.port}")
        self.log = open(root.parent.parent / "ckptd-wholeroot.log", "wb")
        # its own pid namespace too, as a sandbox: the services step scans
        # the sandbox's processes, not every process of this machine
        argv = ["unshare", "-m", "-p", "-f", "--kill-child=SIGTERM", "sh", "-c", script]
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=self.log, start_new_session=True)
        self.s = requests.Session()
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            try:
                h = self.s.get(self.url + "/v1/health", timeout=5).json()
                if h.get("status") == "ok":
                    self.health = h
                    return
            except (requests.ConnectionError, ValueError):
                pass
            if self.proc.poll() is not None:
                raise RuntimeError("ckptd exited; see " + self.log.name)
            time.sleep(0.1)
        raise RuntimeError("ckptd did not get ready")

    def create(self, name):
        r = self.s.post(self.url + "/v1/checkpoints", json={"name": name}, timeout=3600)
        assert r.status_code == 201, r.text
        return r.json()

    def restore(self, cid):
        t0 = time.perf_counter()
        r = self.s.post(self.url + f"/v1/checkpoints/{cid}/restore", json={}, timeout=3600)
        wall = (time.perf_counter() - t0) * 1000
        assert r.status_code == 200 and r.json()["ok"], r.text
        return r.json(), wall

    def stop(self):
        # ckptd is the init of its pid namespace: a signal it takes with
        # sigwait, not a handler, does not reach it from outside. SIGKILL does.
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(60)
        self.log.close()


def apt_install(root):
    debs = sorted(p.name for p in (root / "wr/debs").glob("*.deb"))
    subprocess.run(["chroot", str(root), "env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "install", "-y",
                    "--no-install-recommends"] + [f"/wr/debs/{d}" for d in debs], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def bench_wholeroot(ckptd, runs):
    lower = rigmod.build_rootfs()
    work = pathlib.Path(tempfile.mkdtemp(prefix="ckptd-bench-wholeroot-", dir="/tmp"))
    d = None
    fs = work / "fs"
    try:
        # A filesystem of its own, as a sandbox's root is: fanotify marks a
        # whole filesystem, and this machine's is busy with other work.
        subprocess.run(["truncate", "-s", "3G", str(work / "fs.img")], check=True)
        subprocess.run(["mkfs.ext4", "-q", "-F", str(work / "fs.img")], check=True)
        fs.mkdir()
        subprocess.run(["mount", "-o", "loop", str(work / "fs.img"), str(fs)], check=True)
        root, pristine = fs / "root", fs / "pristine"
        subprocess.run(["cp", "-a", str(lower), str(root)], check=True)
        (root / "wr/debs").mkdir(parents=True)
        subprocess.run(["apt-get", "download"] + DEBS, cwd=root / "wr/debs", check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deb_mb = sum(p.stat().st_size for p in (root / "wr/debs").glob("*.deb")) / 1e6
        size_mb = int(subprocess.run(["du", "-sm", str(root)], capture_output=True, text=True).stdout.split()[0])
        subprocess.run(["cp", "-a", str(root), str(pristine)], check=True)
        subprocess.run(["sync"])
        t0 = time.perf_counter()
        d = ChrootDaemon(ckptd, root)
        base_ms = (time.perf_counter() - t0) * 1000  # the base: a full capture at first start
        tracking = [t.get("tracking") for t in d.health.get("root_details", [])]
        clean = d.create("clean")
        rs, restores, walls, creates = [], [], [], []
        rsync = ["rsync", "-a", "--delete"] + [f"--exclude={x}" for x in EXCLUDES] + [f"{pristine}/", f"{root}/"]
        # The restore follows the install with no create between: the
        # trackers count from "clean", the roots' head, so it reads only the
        # directories that changed (a create would make a new head).
        for i in range(runs):
            apt_install(root)
            rs.append(timed(rsync))
            apt_install(root)
            rep, wall = d.restore(clean["checkpoint_id"])
            restores.append(rep["restore_duration_ms"])
            walls.append(wall)
            t = d.s.get(d.url + "/v1/health").json().get("root_details", [{}])[0]
            phases = rep.get("phases", {})
            log(f"wholeroot: restore {i}: {rep['restore_duration_ms']} ms {phases}, tracked {t.get('tracked')}, "
                f"walked {t.get('walked')}, {t.get('tracking_reason')}")
        for i in range(runs):
            apt_install(root)
            creates.append(d.create(f"installed{i}")["duration_ms"])
            d.restore(clean["checkpoint_id"])
        h = d.s.get(d.url + "/v1/health").json()
        last = h.get("tar_last_restore", {})
        tracking = [(t.get("tracking"), t.get("tracked"), t.get("walked")) for t in h.get("root_details", [])]
        log(f"wholeroot: rootfs {size_mb} MB, debs {deb_mb:.1f} MB, base {base_ms:.0f} ms, clean create "
            f"{clean['duration_ms']} ms, creates after install {creates}, restores {restores} (wall "
            f"{[round(w) for w in walls]}), rsync {[round(x) for x in rs]}, last restore {last}, "
            f"tracking (method, tracked, walked) {tracking}")
        return {"size_mb": size_mb, "deb_mb": deb_mb, "base_ms": base_ms, "clean_ms": clean["duration_ms"],
                "create_ms": statistics.median(creates), "restore_ms": statistics.median(restores),
                "restore_wall_ms": statistics.median(walls), "rsync_ms": statistics.median(rs),
                "tracking": tracking, "last": last}
    finally:
        if d:
            d.stop()
        subprocess.run(["umount", str(fs)], check=False)
        subprocess.run(["rm", "-rf", str(work)], check=False)


def table(r):
    ratio = r["restore_ms"] / r["rsync_ms"] if r["rsync_ms"] else float("nan")
    return (f"### Whole root: a Debian rootfs of {r['size_mb']} MB, apt-get install of {r['deb_mb']:.1f} MB of .deb\n\n"
            "| step | ckptd (ms) | rsync -a --delete (ms) | ratio |\n| --- | --- | --- | --- |\n"
            f"| first start (base, full capture) | {r['base_ms']:.0f} | | |\n"
            f"| checkpoint after the install | {r['create_ms']:.0f} | | |\n"
            f"| restore after the install | {r['restore_ms']:.0f} (wall {r['restore_wall_ms']:.0f}) | "
            f"{r['rsync_ms']:.0f} | {ratio:.2f}x |\n\n"
            f"Change tracking (method, operations that read only what changed, operations that walked all): "
            f"{r['tracking']}. Target: restore at most 0.25x rsync.\n")
