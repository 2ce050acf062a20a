#!/usr/bin/python3
"""Power cuts on a real file system: the crash harness (crash.py) with a cut
of power in place of its SIGKILL, on both backends.

    powercut.py [--backend tar|overlay|both] [--rounds N] [--seed S] [--fs xfs|ext4] [--dir DIR]
    powercut.py --model [--fs xfs|ext4]

ckptd's state dir, its two roots and its forks live on xfs (or ext4) on a
loop device. At a random point of an operation the file system is shut down
without a log flush: the ioctl of `xfs_io -x -c shutdown` without -f
(XFS_IOC_GOINGDOWN, EXT4_IOC_SHUTDOWN, with the NOLOGFLUSH flag), as in
xfstests' "godown" tests. What was not durable yet is dropped, as at a power
cut. ckptd is killed at the same moment; everything is unmounted (the
overlays first), the file system is mounted again (log recovery) and ckptd
starts on what survived. The harness's checks follow: every acknowledged
checkpoint is listed and restores exactly; an interrupted create, import or
fork is whole or absent; a restore leaves the roots as before or as the
checkpoint, never a mix of roots; no temp file survives a second restart.

Each round cuts one create (the first after a start: full), one create
after 1-4 others (a delta, a tracked tar create), one restore, delete,
import, fork and release, in an order drawn from the seed; and, when the
restart drew the busy configuration, one create with the compaction,
flattening or sweeping it sets off. The test's own writes to the roots are
fsynced file by file before each operation: they are the user's to keep,
not ckptd's. A canary file, written just before each cut and never synced,
must be gone after it: the cut really dropped something.

--model checks the model alone: what was fsynced survives, what was not
does not. The script runs itself in a private mount namespace (unshare -m):
a namespace made elsewhere meanwhile would copy the disk's mount and keep the
shut-down file system alive after its unmount here. See
docs/reliability.md for what the model drops and what it keeps."""
import argparse
import ctypes
import fcntl
import os
import pathlib
import random
import struct
import subprocess
import sys
import tempfile
import time

from crash import Broken, Harness
from conftest import Daemon  # crash.py puts tests/integration on the path

# XFS_IOC_GOINGDOWN and EXT4_IOC_SHUTDOWN: both _IOR('X', 125, __u32).
GOINGDOWN = 0x8004587D
# XFS_FSOP_GOING_FLAGS_NOLOGFLUSH, EXT4_GOING_FLAGS_NOLOGFLUSH: drop the log
# not yet on the disk (0 would freeze and sync first, 1 flush the log).
NOLOGFLUSH = 2
CANARY = b"c" * 4096
LIBC = ctypes.CDLL(None, use_errno=True)  # mount(2), umount2(2): no umount process for each of a cut's mounts


def mountinfo():
    """(mount point, super options) of every mount of this namespace."""
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, right = line.split(" - ")
            out.append((left.split()[4].encode().decode("unicode_escape"), right.split()[2]))
    return out


def fsync_path(p):
    fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Disk:
    """A file system on a loop device whose power can be cut."""

    def __init__(self, base, fstype):
        self.fstype = fstype
        self.img, self.mnt = base / "disk.img", base / "mnt"
        self.mnt.mkdir(parents=True)
        with open(self.img, "wb") as f:
            f.truncate(512 << 20)  # sparse; mkfs.xfs wants 300 MiB at least
        mkfs = ["mkfs.xfs", "-q", "-f"] if fstype == "xfs" else ["mkfs.ext4", "-q", "-F"]
        subprocess.run(mkfs + [str(self.img)], check=True)
        self.dev = subprocess.run(["losetup", "-f", "--show", str(self.img)], check=True, capture_output=True,
                                  text=True).stdout.strip()
        self.cuts = 0
        self.canaries_lost = 0
        self.mount()

    def mount(self):
        if LIBC.mount(self.dev.encode(), str(self.mnt).encode(), self.fstype.encode(), 0, None) < 0:
            raise Broken(f"mount {self.dev}: {os.strerror(ctypes.get_errno())}")
        # A fresh superblock, not the one shut down (that one answers EIO).
        probe = self.mnt / ".probe"
        try:
            probe.write_text("up")
            probe.unlink()
        except OSError as e:
            raise Broken(f"the file system came back shut down ({e}): is its mount held elsewhere?")

    def cut(self):
        """The power cut, just after a canary that is never synced."""
        (self.mnt / f".canary-{self.cuts}").write_bytes(CANARY)
        fd = os.open(self.mnt, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            fcntl.ioctl(fd, GOINGDOWN, struct.pack("I", NOLOGFLUSH))
        finally:
            os.close(fd)
        self.cuts += 1

    def stacked(self, also):
        """The mounts on this file system or using it, itself left out:
        under its mount point or a path of `also`, or with a layer here
        (an overlay). Deepest first."""
        top, tops = str(self.mnt), [str(p) for p in also]
        found = [mp for mp, sopts in mountinfo()
                 if mp != top and (mp.startswith(top + "/") or top + "/" in sopts
                                   or any(mp == t or mp.startswith(t + "/") for t in tops))]
        return sorted(found, key=len, reverse=True)

    def power_on(self, also=()):
        """Unmount what lies on the dead file system, then itself (never
        lazily: a lazily detached superblock would be found again by the
        mount), and mount it again: the log recovery of a boot."""
        deadline = time.monotonic() + 30
        while True:
            busy = [mp for mp in self.stacked(also) + [str(self.mnt)] if LIBC.umount2(mp.encode(), 0) < 0]
            if not busy:
                break
            if time.monotonic() > deadline:
                raise Broken(f"cannot unmount after a cut: {busy}")
            time.sleep(0.1)
        self.mount()
        canary = self.mnt / f".canary-{self.cuts - 1}"
        if not canary.exists() or canary.read_bytes() != CANARY:
            self.canaries_lost += 1
        canary.unlink(missing_ok=True)

    def close(self, also=()):
        for mp in self.stacked(also) + [str(self.mnt)]:
            subprocess.run(["umount", "-l", mp], stderr=subprocess.DEVNULL)
        subprocess.run(["losetup", "-d", self.dev], stderr=subprocess.DEVNULL)


def check_model(disk):
    """What was fsynced survives a cut; data never synced does not, nor a
    rename or a create that no fsync followed. The log is one: an fsync
    commits every create and rename made before it, not their data."""
    m = disk.mnt
    (m / "kept").write_text("v1")
    fsync_path(m / "kept")
    (m / "renamed").write_text("r")
    fsync_path(m / "renamed")
    fsync_path(m)
    (m / "named").write_bytes(os.urandom(65536))  # its create is committed below, its data never
    (m / "forcer").write_text("f")
    fsync_path(m / "forcer")
    os.rename(m / "renamed", m / "renamed-later")
    (m / "never-synced").write_bytes(os.urandom(65536))
    disk.cut()
    disk.power_on()
    left = {p.name: p.read_bytes() for p in m.iterdir() if p.name != "lost+found"}
    want = {"kept": b"v1", "renamed": b"r", "named": b"", "forcer": b"f"}
    if left != want or disk.canaries_lost != 1:
        raise Broken(f"the cut kept {sorted((k, len(v)) for k, v in left.items())}, "
                     f"canaries lost {disk.canaries_lost}")


def check_fdatasync(top, backend, fstype):
    """A file rewritten in place and fdatasynced (as databases do) keeps
    its new data through a cut, and its old ctime: fdatasync does not log
    a timestamp. Inode, size and ctime are then those of the checkpoint
    before, the data is not: a restore must still bring that checkpoint's
    data back, and a create must take the new data. Overlay on xfs never
    gets there: its layers share the upper's blocks (reflink), the rewrite
    copies on write, and that fdatasync logs the ctime too (ext4 gets
    there)."""
    disk = Disk(top / "disk", fstype)
    d = Daemon(top / "d", backend=backend, config={"cleanup_interval_secs": 3600, "default_ttl_secs": 0})
    d.state_dir, d.roots = disk.mnt / "state", [disk.mnt / "root"]
    f = d.roots[0] / "db"
    try:
        d.roots[0].mkdir()
        os.sync()
        d.start(timeout=60)
        f.write_bytes(b"A" * 8192)  # overlay: in the upper
        os.sync()
        old = d.create("old")["checkpoint_id"]
        was = os.stat(f)
        time.sleep(0.01)  # a ctime of its own
        fd = os.open(f, os.O_WRONLY | os.O_CLOEXEC)
        os.pwrite(fd, b"B" * 4096, 0)
        os.fdatasync(fd)
        os.close(fd)
        disk.cut()
        d.kill9()
        disk.power_on(also=[d.base])
        d.start(timeout=60)  # overlay: the root shows its upper again
        st = os.stat(f)
        if f.read_bytes()[:1] != b"B" or (st.st_ino, st.st_ctime_ns, st.st_size) != (was.st_ino, was.st_ctime_ns,
                                                                                   was.st_size):
            raise Broken("the data came back without its ctime: the scenario did not happen")
        new = d.create("new")["checkpoint_id"]
        d.restore(old)
        if f.read_bytes() != b"A" * 8192:
            raise Broken(f"restore of the checkpoint before the cut kept the rewritten data ({backend})")
        d.restore(new)
        if f.read_bytes() != b"B" * 4096 + b"A" * 4096:
            raise Broken(f"a create after the cut took the old data from the checkpoint before ({backend})")
    finally:
        try:
            d.cleanup()
        finally:
            disk.close(also=[d.base])


class PowerHarness(Harness):
    """The crash harness with a power cut for each kill."""

    SEED_FILES = (60, 20)  # half the harness's: each cut costs a remount and a start

    def __init__(self, base, backend, rng, disk):
        super().__init__(base, backend, rng, registry=False)
        self.disk = disk
        self.d.state_dir = disk.mnt / "state"
        self.d.roots[:] = [disk.mnt / f"root{k}" for k in range(len(self.d.roots))]
        for r in self.d.roots:
            r.mkdir()
        self.durations["release"] = 0.2
        self.late = 0  # answers that came after their cut: not counted

    def crash(self):
        # Mostly at once; at times the machine dies a moment after its disk:
        # ckptd then meets EIO first, and must not answer that it succeeded.
        lag = self.rng.choice([0, 0, 0, self.rng.uniform(0, 0.03)])
        self.cut_at = time.monotonic()
        self.disk.cut()
        time.sleep(lag)
        self.d.kill9()
        self.disk.power_on(also=[self.d.base])

    def answered_before_crash(self, t):
        """Only an answer that came before the cut began is an
        acknowledgement. xfs, once shut down, answers an fsync of a
        directory with success and drops what it was to make durable (the
        rename of write_file_atomic, the unlink of a record): ckptd may then
        answer 201 or 204 for what the cut undid. A machine without power
        answers nothing; such an answer counts as lost."""
        self.late += t >= self.cut_at
        return t < self.cut_at

    def sync_roots(self):
        """The test's own writes are durable before an operation starts, so
        that "as before" means what it says after a cut. File by file: a
        syncfs would sync what ckptd left unsynced too."""
        for root in self.roots:
            for top, dirs, files in os.walk(root):
                for n in files + dirs:
                    if not os.path.islink(os.path.join(top, n)):
                        fsync_path(os.path.join(top, n))
                fsync_path(top)

    def mutate(self):
        super().mutate()
        self.sync_roots()

    def new_fork_dir(self):
        self.fork_dirs += 1
        path = self.disk.mnt / "forks" / f"f{self.fork_dirs}"
        path.mkdir(parents=True)
        fsync_path(path.parent)
        fsync_path(self.disk.mnt)
        return path

    def round_release(self):
        """Release the roots (the forks deleted first, or overlay refuses),
        cut: the roots show what they showed, every checkpoint is kept."""
        for fid in sorted(self.forks):
            r = self.d.request("DELETE", f"/v1/forks/{fid}")
            self.check(r.status_code == 204, f"delete fork {fid}: {r.status_code} {r.text}")
            del self.forks[fid]
        self.mutate()
        before = self.state()
        r = self.run_killed("release", lambda: self.d.request("POST", "/v1/roots/release", json={}))
        if r is not None:  # 500 release_incomplete: cut under it (the start finishes it)
            self.check(r.status_code in (200, 500), f"release: {r.status_code} {r.text}")
        self.restart()
        self.check_catalog()
        self.check(self.state() == before, "a release cut short changed what the roots show")
        self.check_forks()
        if self.acked:
            cid = self.rng.choice(sorted(self.acked))
            self.check_restores_to(cid, self.acked[cid][1])

    def round_busy(self):
        """Under the busy configuration only: a create and the background
        work it sets off."""
        if self.busy:
            self.round_background()

    def run(self, rounds):
        self.seed_tree()
        os.sync()  # the roots' first contents, before ckptd starts
        self.busy = False
        self.d.start(timeout=60)
        self.calibrate()
        ops = [self.round_create, self.round_series, self.round_restore, self.round_delete, self.round_import,
               self.round_fork, self.round_release, self.round_busy]
        for _ in range(rounds):
            for op in self.rng.sample(ops, len(ops)):
                op()
        self.finish()


def run_backend(top, backend, a):
    disk = Disk(top / backend / "disk", a.fs)
    h = PowerHarness(top / backend / "d", backend, random.Random(a.seed), disk)
    t0 = time.monotonic()
    verdict = "ok"
    try:
        h.run(a.rounds)
    except Broken as e:
        verdict = f"BROKEN: {e}"
    finally:
        try:
            h.d.cleanup()  # stops ckptd, scans its log for sanitizer reports
        except AssertionError as e:
            verdict = verdict if verdict != "ok" else f"BROKEN: {e}"
        disk.close(also=[h.d.base])
    if verdict == "ok" and disk.canaries_lost < h.kills - 2:
        # ckptd's own syncfs between the canary and the cut may keep one or two
        verdict = f"BROKEN: only {disk.canaries_lost} of {h.kills} cuts dropped their canary"
    print(f"powercut[{a.fs}/{backend}]: seed {a.seed}: {h.kills} cuts"
          f" ({', '.join(f'{k} {v}' for k, v in sorted(h.counts.items()))}; {h.busy_starts} starts busy),"
          f" {disk.canaries_lost} canaries dropped, {h.late} answers after a cut not counted,"
          f" {h.checks} invariants checked,"
          f" {len(h.acked)} checkpoints at the end, {time.monotonic() - t0:.0f} s: {verdict}", flush=True)
    if verdict != "ok":
        print(f"powercut[{a.fs}/{backend}]: log in {h.d.logfile}", flush=True)
    return verdict == "ok"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="both", choices=["tar", "overlay", "both"])
    ap.add_argument("--rounds", type=int, default=8, help="cuts per operation and backend")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--fs", default="xfs", choices=["xfs", "ext4"])
    ap.add_argument("--dir", default=None, help="work dir (default: a new temp dir)")
    ap.add_argument("--model", action="store_true", help="check the model alone")
    ap.add_argument("--fdatasync", action="store_true", help="a file rewritten and fdatasynced before the cut")
    ap.add_argument("--in-ns", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if not a.in_ns:
        os.execvp("unshare", ["unshare", "-m", "--propagation", "private", sys.executable, __file__,
                              *sys.argv[1:], "--in-ns"])
    a.seed = a.seed if a.seed is not None else random.randrange(1 << 30)
    top = pathlib.Path(a.dir or tempfile.mkdtemp(prefix="ckptd-powercut-"))
    if a.fdatasync:
        check_fdatasync(top / "fdatasync", "tar" if a.backend == "both" else a.backend, a.fs)
        print(f"powercut[{a.fs}]: fdatasync: ok", flush=True)
        return 0
    if a.model:
        disk = Disk(top / "model", a.fs)
        try:
            check_model(disk)
        except Broken as e:
            print(f"powercut[{a.fs}]: model: BROKEN: {e}", flush=True)
            return 1
        finally:
            disk.close()
        print(f"powercut[{a.fs}]: model: ok", flush=True)
        return 0
    backends = ["overlay", "tar"] if a.backend == "both" else [a.backend]
    for b in backends:
        if not run_backend(top, b, a):
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
