"""Real programs ckptd was not written for, in a managed root on the host
(the overlay backend, fanotify tracking), again under gVisor (its overlay,
inotify tracking: test_the_same_under_gvisor), and where ckptd may not mount,
in a user namespace and without CAP_SYS_ADMIN (tar, inotify tracking:
test_the_same_without_mounts), and on the host's tar backend untracked
(test_the_same_on_tar_untracked): sqlite in WAL mode with mmap_size,
git with gc, repack and a local clone (hard-linked objects), and a program
that writes through a shared mapping, with write(2) and by making files,
while creates run. Creates and restores are interleaved with the programs
running or just stopped.

Each checkpoint taken while its program was quiet must restore exactly the
tree recorded then (tree_state: type, mode, owner, size, mtime, sha256,
link target, xattrs, hard-link groups). A checkpoint taken while a program
writes must hold every write that completed before the request.

track_changes is "always" (a production setting): these roots are below the
2,000 entries from which "auto" tracks an overlay upper, and the delta path
is what these programs are to exercise. The daemon also runs with
track_check, which compares each tracked layer with a walk, read-only."""
import os
import pathlib
import random
import re
import shutil
import sqlite3
import struct
import subprocess
import sys
import tempfile
import threading
import time

import pytest

from conftest import assert_same_tree, make_acl_tree, tree_state
from test_environments import NOBODY, wrap

GIT_ENV = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t",
               GIT_COMMITTER_EMAIL="t@t", GIT_CONFIG_NOSYSTEM="1", HOME="/nonexistent")


class Checker:
    """Creates recording the tree at create time; restores compared with it."""

    def __init__(self, d):
        self.d = d
        self.root = d.roots[0]
        self.refs = {}
        self.backend = d.health()["backend"]

    def create(self, name):
        want = tree_state(self.root)
        cid = self.d.create(name)["checkpoint_id"]
        self.refs[cid] = (name, want)
        return cid

    def restore(self, cid):
        rep = self.d.restore(cid)
        assert rep["ok"], rep
        try:
            assert_same_tree(self.refs[cid][1], tree_state(self.root))
        except AssertionError as e:
            raise AssertionError(f"restore of {self.refs[cid][0]} answered ok: {e}") from None
        return rep

    def deltas(self):
        """Creates that read only what changed: on overlay those that made a
        delta layer (the daemon logs each one's pass), on tar those health
        counts as tracked."""
        if self.backend == "tar":
            return self.d.health()["root_details"][0]["tracked"]
        return self.d.log().count("create: first delta pass of")

    def assert_deltas(self, n):
        """At least n creates read only what changed; untracked, none did
        and every one walked."""
        if TRACK == "never":
            t = self.d.health()["root_details"][0]
            assert t["tracked"] == 0 and t["walked"] >= n, t
        else:
            assert self.deltas() >= n

    def restore_all(self, cids, seed):
        order = list(cids) * 2
        random.Random(seed).shuffle(order)
        for cid in order:
            self.restore(cid)


# test_the_same_on_tar_untracked runs this file with tar forced and
# track_changes "never"; other runs take what auto picks, tracked
TRACK = os.environ.get("CKPTD_TEST_PROGRAMS_TRACK", "always")


@pytest.fixture
def checker(daemon_factory):
    d = daemon_factory(backend="tar" if TRACK == "never" else None, config={"track_changes": TRACK})
    h = d.health()
    # where test_the_same_without_mounts runs this file: tar, as auto picks there
    assert h["backend"] == os.environ.get("CKPTD_TEST_PROGRAMS_BACKEND", "overlay"), h
    # an overlay's tracker is armed by its first create; tar's at start
    want = "none" if TRACK == "never" else "inotify"
    assert h["backend"] == "overlay" or h["root_details"][0]["tracking"] == want, h
    return Checker(d)


SQLITE_CHILD = r"""
import os, sqlite3, sys
c = sqlite3.connect(sys.argv[1], isolation_level=None)
c.execute("pragma journal_mode=wal")
c.execute("pragma mmap_size=268435456")
c.execute("pragma wal_autocheckpoint=40")
c.execute("create table if not exists t(id integer primary key, v blob)")
n = 0
for line in sys.stdin:
    cmd = line.split()
    if cmd[0] == "w":
        for i in range(int(cmd[1])):
            c.execute("begin")
            c.execute("insert into t(v) values(?)", (os.urandom(300),))
            if i % 7 == 0:
                c.execute("update t set v = ? where id = ?", (os.urandom(200), max(1, n // 2)))
            c.execute("commit")
            n += 1
    elif cmd[0] == "truncate":
        c.execute("pragma wal_checkpoint(truncate)")
    elif cmd[0] == "q":
        c.close()
    print(n, flush=True)
"""


def test_sqlite_wal_mmap(checker, tmp_path):
    """A sqlite process keeps its database open (WAL, -shm mapped shared,
    reads through mmap) across creates; a second connection writes while
    creates run. Quiet checkpoints restore exactly; each checkpoint taken
    during writes restores a database that passes integrity_check."""
    app = checker.root / "app"
    app.mkdir()
    db = app / "data.db"
    script = tmp_path / "sq.py"
    script.write_text(SQLITE_CHILD)
    p = subprocess.Popen([sys.executable, str(script), str(db)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True)

    def cmd(s):
        p.stdin.write(s + "\n")
        p.stdin.flush()
        return int(p.stdout.readline())

    rng = random.Random(1)
    quiet = []
    for rnd in range(6):
        cmd(f"w {rng.randint(5, 150)}")
        if rnd % 3 == 2:
            cmd("truncate")
        quiet.append(checker.create(f"sq{rnd}"))

    stop = threading.Event()
    committed = []

    def writer():
        c = sqlite3.connect(str(db), isolation_level=None, timeout=30)
        c.execute("pragma mmap_size=268435456")
        while not stop.is_set():
            c.execute("insert into t(v) values(zeroblob(500))")
            committed.append(c.execute("select max(id) from t").fetchone()[0])
        c.close()

    t = threading.Thread(target=writer)
    t.start()
    live = []
    try:
        for i in range(4):
            while len(committed) < 20 * (i + 1):
                time.sleep(0.01)
            before = committed[-1]
            live.append((checker.d.create(f"live{i}")["checkpoint_id"], before))
    finally:
        stop.set()
        t.join()
    cmd("q")
    p.stdin.close()
    assert p.wait() == 0

    for cid, before in live:
        assert checker.d.restore(cid)["ok"]
        copy = tmp_path / "copy"
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(app, copy)
        c = sqlite3.connect(str(copy / "data.db"))
        assert c.execute("pragma integrity_check").fetchone()[0] == "ok"
        assert c.execute("select max(id) from t").fetchone()[0] >= before, "a committed row is missing"
        c.close()
    checker.restore_all(quiet, seed=2)
    checker.assert_deltas(5)


def git(repo, *args):
    subprocess.run(["git", "-C", str(repo), *args], check=True, env=GIT_ENV, capture_output=True)


def test_git_gc_repack_and_local_clone(checker):
    """git rewrites its packs (gc --aggressive, repack -ad: new packs by
    rename, old ones deleted), and a local clone hard-links the objects of
    another repository of the root. Every checkpoint restores exactly, in
    any order, and the restored repositories pass git fsck."""
    repo = checker.root / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    rng = random.Random(3)
    cids = []
    for rnd in range(5):
        for i in range(12):
            f = repo / f"f{rng.randint(0, 20)}.txt"
            f.write_text((f.read_text() if f.exists() else "") + f"{rnd}.{i}\n")
            git(repo, "add", "-A")
            git(repo, "commit", "-qm", f"c{rnd}.{i}")
        if rnd == 1:
            git(repo, "gc", "-q", "--aggressive")
        if rnd == 2:
            git(repo, "repack", "-adq")
            subprocess.run(["git", "clone", "-q", "--local", str(repo), str(checker.root / "clone")], check=True,
                           env=GIT_ENV)
        if rnd == 3:
            git(checker.root / "clone", "repack", "-adq")
            git(repo, "gc", "-q", "--prune=now")
            os.rename(checker.root / "clone", checker.root / "clone2")
        cids.append(checker.create(f"git{rnd}"))
    checker.restore_all(cids, seed=4)
    checker.restore(cids[-1])
    git(repo, "fsck", "--full")
    git(checker.root / "clone2", "fsck", "--full")
    checker.assert_deltas(2)


RACE_CHILD = r"""
import mmap, os, struct, sys, time
root, prog = sys.argv[1], sys.argv[2]
os.makedirs(root + "/new", exist_ok=True)
fd = os.open(root + "/mm.bin", os.O_RDWR | os.O_CREAT, 0o644)
os.ftruncate(fd, 64 * 4096)
m = mmap.mmap(fd, 64 * 4096, mmap.MAP_SHARED)
fds = [os.open(root + f"/f{k}", os.O_RDWR | os.O_CREAT, 0o644) for k in range(16)]
pm = mmap.mmap(os.open(prog, os.O_RDWR), 4096, mmap.MAP_SHARED)
v = 1
while pm[8] == 0:
    m[(v % 64) * 4096:(v % 64) * 4096 + 8] = struct.pack("<Q", v)
    os.pwrite(fds[v % 16], struct.pack("<Q", v), 0)
    if v % 10 == 0:
        with open(root + f"/new/{v}", "w") as f:
            f.write(str(v))
    pm[0:8] = struct.pack("<Q", v)
    v += 1
    if v % 4 == 0:
        time.sleep(0.001)
"""


def test_writes_completed_before_the_request_are_kept(checker, tmp_path):
    """A program writes without pause: a counter into 64 pages of a shared
    mapping (never synced), into 16 files with pwrite, and a new file every
    tenth step; it publishes the last step done in a mapping outside the
    root. A create sent after step v0 must hold every write up to v0."""
    import mmap

    race = checker.root / "race"
    race.mkdir()
    prog = tmp_path / "progress"
    prog.write_bytes(b"\0" * 4096)
    script = tmp_path / "race.py"
    script.write_text(RACE_CHILD)
    p = subprocess.Popen([sys.executable, str(script), str(race), str(prog)])
    with open(prog, "r+b") as pf:
        pm = mmap.mmap(pf.fileno(), 4096)
        rng = random.Random(5)
        got = []
        try:
            while struct.unpack("<Q", pm[0:8])[0] < 100:
                assert p.poll() is None
                time.sleep(0.01)
            for i in range(10):
                time.sleep(rng.random() * 0.1)
                v0 = struct.unpack("<Q", pm[0:8])[0]
                got.append((checker.d.create(f"race{i}")["checkpoint_id"], v0))
        finally:
            pm[8] = 1
            p.wait()
        pm.close()
    assert p.returncode == 0
    for cid, v0 in got:
        assert checker.d.restore(cid)["ok"]
        missing = []
        mm = (race / "mm.bin").read_bytes()
        for pg in range(64):
            want = v0 - ((v0 - pg) % 64)
            if struct.unpack("<Q", mm[pg * 4096:pg * 4096 + 8])[0] < want:
                missing.append(f"mm.bin page {pg}")
        for k in range(16):
            want = v0 - ((v0 - k) % 16)
            if struct.unpack("<Q", (race / f"f{k}").read_bytes()[:8])[0] < want:
                missing.append(f"f{k}")
        missing += [f"new/{n}" for n in range(10, v0 + 1, 10) if not (race / "new" / str(n)).exists()]
        assert not missing, f"checkpoint taken after step {v0} lacks: {missing[:10]}"


def make_wheel(where):
    """A pure-Python wheel made by hand: pip installs it with no network."""
    import base64
    import hashlib
    import zipfile

    di = "probepkg-1.0.dist-info"
    files = {"probepkg/__init__.py": b"VALUE = 42\n", "probepkg/data.txt": b"data\n",
             f"{di}/METADATA": b"Metadata-Version: 2.1\nName: probepkg\nVersion: 1.0\n",
             f"{di}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
             f"{di}/entry_points.txt": b"[console_scripts]\nprobecli = probepkg:VALUE\n"}
    record = [f"{k},sha256={base64.urlsafe_b64encode(hashlib.sha256(v).digest()).rstrip(b'=').decode()},{len(v)}"
              for k, v in files.items()]
    files[f"{di}/RECORD"] = ("\n".join(record + [f"{di}/RECORD,,"]) + "\n").encode()
    with zipfile.ZipFile(where / "probepkg-1.0-py3-none-any.whl", "w") as z:
        for k, v in files.items():
            z.writestr(k, v)


def test_venv_pip_install_then_restore(checker, tmp_path):
    """pip installs a wheel from a local directory into a venv of the root
    (a console script, byte-compiled modules), then uninstalls it. Each
    state restores exactly, and the restored venv imports the package."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    make_wheel(wheels)
    venv = checker.root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    pip = [sys.executable, "-m", "pip", "--python", str(venv / "bin/python"), "-q", "--disable-pip-version-check"]
    empty = checker.create("empty")
    subprocess.run(pip + ["install", "--no-index", "--find-links", str(wheels), "probepkg"], check=True)
    installed = checker.create("installed")
    subprocess.run(pip + ["uninstall", "-y", "probepkg"], check=True)
    removed = checker.create("removed")
    for cid in (empty, installed, removed, installed):
        checker.restore(cid)
    out = subprocess.run([str(venv / "bin/python"), "-c", "import probepkg; print(probepkg.VALUE)"],
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "42"
    assert (venv / "bin/probecli").exists()


def test_directory_rename_storm_between_creates(checker):
    """Directories renamed across parents, swapped, moved over empty ones
    and removed between creates, with files made, moved, hard-linked and
    appended to: the layers a delta cannot express (a moved directory)
    and deltas (files only, every other round) alternate. Each checkpoint restores exactly, also after
    restores in the middle of the storm."""
    top = checker.root / "st"
    for i in range(10):
        d = top / f"d{i}"
        (d / "in" / "deep").mkdir(parents=True)
        for j in range(4):
            (d / f"f{j}").write_bytes(os.urandom(200 * j))
        (d / "in" / "deep" / "x").write_text(f"x{i}")
        os.link(d / "f0", d / "in" / "hl")
    rng = random.Random(6)
    cids = [checker.create("base")]

    def inside(a, b):
        return a == b or str(b).startswith(str(a) + "/")

    for rnd in range(12):
        for k in range(rng.randint(1, 6)):
            dirs = [pathlib.Path(p) for p, _, _ in os.walk(top)][1:]
            a = rng.choice(dirs)
            op = rng.random() if rnd % 2 else rng.uniform(0.65, 0.9)  # odd rounds move directories
            if op < 0.3:
                dest = rng.choice([top] + dirs)
                if not inside(a, dest):
                    os.rename(a, dest / f"r{rnd}_{k}")
            elif op < 0.45:
                b = rng.choice(dirs)
                if not inside(a, b) and not inside(b, a):
                    tmp = top / f"tmp{rnd}_{k}"
                    os.rename(a, tmp)
                    os.rename(b, a)
                    os.rename(tmp, b)
            elif op < 0.55:
                empty = top / f"empty{rnd}_{k}"
                empty.mkdir()
                os.rename(a, empty)
            elif op < 0.65:
                shutil.rmtree(a)
            elif op < 0.8:
                (a / f"n{rnd}_{k}").write_bytes(os.urandom(100))
                files = sorted(x for x in a.iterdir() if x.is_file() and x.stat().st_nlink == 1)
                if files:
                    os.rename(files[0], top / f"moved{rnd}_{k}")
            elif op < 0.9:
                os.chmod(a, 0o700 | rng.randint(0, 0o77))
                os.utime(a, ns=(10**18, 10**18 + rnd))
                os.setxattr(a, "user.r", str(rnd).encode())
            else:
                files = sorted(x for x in a.iterdir() if x.is_file())
                if files:
                    os.link(files[0], a / f"l{rnd}_{k}")
                    with open(files[0], "ab") as f:
                        f.write(b"more")
        cids.append(checker.create(f"st{rnd}"))
        if rnd % 4 == 3:
            checker.restore(rng.choice(cids[:-1]))
    checker.restore_all(cids, seed=7)
    checker.assert_deltas(1)


def test_image_store_opaque_mark_survives_a_delta(checker, tmp_path):
    """An image store in the root (Docker's overlay2, containerd) marks a
    layer's directory opaque: setfattr trusted.overlay.opaque. Through the
    root's own overlay the kernel keeps a user's trusted.overlay.* escaped
    (trusted.overlay.overlay.* in the upper). A delta made after the mark
    was set on a directory of the previous checkpoint must keep it; else the
    restored store's merged view shows a file the layer hides."""
    img = checker.root / "img"
    (img / "l1/etc").mkdir(parents=True)
    (img / "l1/etc/old.conf").write_text("old")
    (img / "l2/etc").mkdir(parents=True)
    (img / "l2/etc/new.conf").write_text("new")
    checker.create("layers")
    subprocess.run(["setfattr", "-n", "trusted.overlay.opaque", "-v", "y", str(img / "l2/etc")], check=True)
    merged = tmp_path / "merged"
    merged.mkdir()

    def view():
        subprocess.run(["mount", "-t", "overlay", "overlay", "-o", f"lowerdir={img}/l2:{img}/l1", str(merged)],
                       check=True)
        try:
            return sorted(os.listdir(merged / "etc"))
        finally:
            subprocess.run(["umount", str(merged)], check=True)

    assert view() == ["new.conf"]
    marked = checker.create("marked")
    checker.assert_deltas(1)
    (img / "l2/etc/new.conf").write_text("changed")
    checker.restore(marked)
    assert view() == ["new.conf"]


@pytest.mark.parametrize("backend", ["tar", None])
def test_setfacl_acls_of_directories_restored(daemon_factory, backend):
    """setfacl gives a directory an access ACL and a default ACL, which new
    files and directories in it inherit. A restore that must rewrite such a
    directory (its ACLs differ now) sets them back exactly, and entries made
    in it get only the ACLs they had: tar's and overlay's restores alike."""
    d = daemon_factory(backend=backend)
    c = Checker(d)
    shared = c.root / "shared"
    shared.mkdir()
    (shared / "f").write_text("f")
    plain = c.create("plain")
    subprocess.run(["setfacl", "-m", "u:1234:rwx", "-m", "d:g:555:rx", str(shared)], check=True)
    (shared / "sub").mkdir()  # inherits both ACLs
    os.mkfifo(shared / "fifo")  # inherits the access ACL
    (shared / "g").write_text("g")
    acl = c.create("acl")
    for cid in (plain, acl, plain, acl):
        c.restore(cid)


def test_setfacl_acls_survive_export_and_import(daemon_factory, tmp_path):
    """A checkpoint holding setfacl's ACLs (a directory's access and default
    ACL, and what entries made in it inherited), exported and imported by
    another daemon, restores there with exactly those ACLs."""
    src = daemon_factory(backend="tar")
    shared = make_acl_tree(src.roots[0])
    subprocess.run(["setfacl", "-b", str(shared / "sub")], check=True)  # none of its own
    want = tree_state(src.roots[0])
    cid = src.create("acl")["checkpoint_id"]
    r = src.request("GET", f"/v1/checkpoints/{cid}/export")
    assert r.status_code == 200, r.text
    dst = daemon_factory(backend="tar")
    r = dst.request("POST", "/v1/checkpoints/import", data=r.content)
    assert r.status_code == 201, r.text
    assert dst.restore(r.json()["checkpoint_id"])["ok"]
    assert_same_tree(want, tree_state(dst.roots[0]))


def test_the_same_under_gvisor():
    """The programs above with the checker's daemon, again inside `runsc
    --network=none do`, in a pytest of their own, its files on a tmpfs of
    the sandbox: there `auto` picks gVisor's overlay, tracked with inotify
    (checked by the checker's health, and by track_check on every create).
    The rename storm found a delta that lost the opaque mark of a directory
    moved over another (the metadata pass removed it), so the previous
    layers' entries showed through. The opaque test stays outside: gVisor's
    overlay refuses a user's trusted.overlay.* xattr; the ACL tests run
    the tar backend, tested under gVisor in test_tar_gvisor.py."""
    top = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    inner = ("mkdir -p /tmp/gv && mount -t tmpfs -o size=4g tmpfs /tmp/gv && exec /usr/bin/python3 -m pytest -q -x "
             "-p no:cacheprovider --basetemp=/tmp/gv/pt tests/integration/test_programs.py "
             "-k 'not gvisor and not without_mounts and not untracked and not opaque and not setfacl'")
    r = subprocess.run(["runsc", "--network=none", "do", "/usr/bin/env", f"BUILD={os.environ.get('BUILD', 'build')}",
                        "bash", "-c", inner], capture_output=True, text=True, timeout=1800, cwd=top)
    out = r.stdout.replace("\r", "")
    assert r.returncode == 0, out[-6000:] + r.stderr[-3000:]
    assert re.search(r"\b5 passed\b", out), out[-3000:]


# what each sandbox without mounts runs (test_environments.py's wrap makes
# them): the ACL tests name ids a user namespace does not map
NO_MOUNTS = {
    "userns": ("not gvisor and not without_mounts and not untracked and not opaque and not setfacl", 5),
    "nocap": ("not gvisor and not without_mounts and not untracked and not opaque", 8),
}


@pytest.mark.parametrize("env", sorted(NO_MOUNTS))
def test_the_same_without_mounts(env):
    """The programs above again where ckptd may not mount: as an
    unprivileged user in `unshare -Urm`, and as root without CAP_SYS_ADMIN.
    There `auto` picks tar, tracked with inotify (the checker asserts both,
    and track_check runs on every create); the whole pytest runs inside, so
    that the programs write as the daemon's user. The opaque test needs the
    host's overlay."""
    top = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    select, want = NO_MOUNTS[env]
    tmp = tempfile.mkdtemp(prefix=f"ckptd-programs-{env}-", dir="/tmp")
    try:
        os.chown(tmp, NOBODY, NOBODY)
        inner = ["env", "CKPTD_TEST_PROGRAMS_BACKEND=tar", "PYTHONDONTWRITEBYTECODE=1", sys.executable, "-m",
                 "pytest", "-q", "-x", "-p", "no:cacheprovider", f"--basetemp={tmp}/pt",
                 "tests/integration/test_programs.py", "-k", select]
        r = subprocess.run(wrap(env, inner), capture_output=True, text=True, timeout=1800, cwd=top)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-3000:]
    assert re.search(rf"\b{want} passed\b", r.stdout), r.stdout[-3000:]


def test_the_same_on_tar_untracked():
    """The programs above on the host's tar backend with track_changes
    "never", which no run of this file had used: no event says what
    changed; ctime does, with the /proc scan of each create and restore
    and the files mapped at the one before (sqlite's shared-memory index,
    the mapped writer's file). test_tar_gvisor.py holds the exact case that
    needs the last (a store into a page already dirty moves no ctime)."""
    top = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, CKPTD_TEST_PROGRAMS_BACKEND="tar", CKPTD_TEST_PROGRAMS_TRACK="never")
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                        "tests/integration/test_programs.py", "-k", NO_MOUNTS["userns"][0]],
                       capture_output=True, text=True, timeout=1800, cwd=top, env=env)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-3000:]
    assert re.search(r"\b5 passed\b", r.stdout), r.stdout[-3000:]
