"""Change tracking with inotify, where fanotify is refused: the daemon runs as
root with CAP_SYS_ADMIN dropped (Docker's default; the tar backend is chosen
there), so fanotify_init answers EPERM and the tracker watches with inotify.

Every create runs with track_check (conftest), which fails a create
whose journal missed an entry of the live tree; every checkpoint is also
restored and compared with the tree it was made of. Health's root_details
counts the creates and restores that read only what changed ("tracked") or
the whole tree ("walked"): a test asserts the tracker was really used."""
import mmap
import os
import random
import re
import shutil
import subprocess

import pytest

from conftest import assert_same_tree, tree_state

NO_SYS_ADMIN = ["capsh", "--drop=cap_sys_admin", "--", "-c", 'exec "$@"', "ckptd"]
INOTIFY = "/proc/sys/fs/inotify"
# test_the_same_under_gvisor runs these tests again inside runsc, where
# fanotify is not implemented at all and the daemon needs no wrapper
IN_GVISOR = os.environ.get("CKPTD_TEST_IN_GVISOR") == "1"
WRAP = () if IN_GVISOR else NO_SYS_ADMIN
REFUSED = "Function not implemented" if IN_GVISOR else "Operation not permitted"


def tracking(d):
    (t,) = d.health()["root_details"]
    return t


def metric(d, name):
    text = d.request("GET", "/metrics").text
    m = re.search(rf"^{name} (\d+)$", text, re.M)
    assert m, f"{name} missing from /metrics"
    return int(m.group(1))


def start(daemon_factory, populate=None, **kw):
    d = daemon_factory(backend="tar", start=False, wrap=WRAP, extra_args=("-v",), **kw)
    if populate:
        populate(d.roots[0])
    d.start()
    t = tracking(d)
    assert t["tracking"] == "inotify", t
    assert t["tracking_reason"] == f"fanotify refused: {REFUSED}", t
    return d


def small_tree(root, dirs=6, files=15):
    for i in range(dirs):
        (root / f"d{i}" / "sub").mkdir(parents=True)
        for j in range(files):
            (root / f"d{i}" / f"f{j}").write_bytes(os.urandom(500 + 97 * j))
        (root / f"d{i}" / "sub" / "g").write_text(f"g{i}")


class sysctl:
    """Set an inotify limit for a while; put back even on failure."""

    def __init__(self, name, value):
        self.path = os.path.join(INOTIFY, name)
        self.value = value

    def __enter__(self):
        with open(self.path) as f:
            self.old = f.read().strip()
        with open(self.path, "w") as f:
            f.write(str(self.value))
        return self

    def restore(self):
        with open(self.path, "w") as f:
            f.write(self.old)

    def __exit__(self, *exc):
        self.restore()


def test_health_and_tracked_creates_and_restores(daemon_factory):
    """Health names inotify and why; a create after a few changes and a
    restore of the head read only what changed (the counters say so), and
    both are exact."""
    d = start(daemon_factory, populate=small_tree)
    root = d.roots[0]
    base = tracking(d)
    assert base["walked"] == 1 and base["tracked"] == 0, base  # the base: read whole
    (root / "d0" / "f1").write_bytes(b"changed")
    (root / "d1" / "new").mkdir()
    want = tree_state(root)
    cid = d.create("one")["checkpoint_id"]
    t = tracking(d)
    assert (t["tracked"], t["walked"]) == (1, 1), t
    (root / "d2" / "f3").unlink()
    os.rename(root / "d3", root / "d4" / "moved")
    assert d.restore(cid)["ok"] is True
    assert_same_tree(want, tree_state(root))
    t = tracking(d)
    assert (t["tracked"], t["walked"]) == (2, 1), t
    assert "restore of '%s' read the directories that changed (change tracking)" % cid in d.log()
    assert metric(d, "ckptd_change_tracking_fallbacks_total") == 0
    r = subprocess.run([str(d.argv()[0]).replace("ckptd", "ckpt"), "--url", d.url, "status"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert re.search(rf"^Tracking: +{re.escape(str(root))}: inotify \(fanotify refused: {REFUSED}\)$",
                     r.stdout, re.M), r.stdout


def test_hard_link_made_outside_the_root(daemon_factory, tmp_path):
    """A hard link made from outside the root (no event in any directory of
    the root) and a write through it: the file's own watch hears the link
    count change, so the next create and a restore of the head see it."""
    d = start(daemon_factory, populate=small_tree)
    root = d.roots[0]
    outside = tmp_path / "outside"
    outside.mkdir()
    want0 = tree_state(root)
    c0 = d.create("before")["checkpoint_id"]
    os.link(root / "d2" / "f4", outside / "other-name")
    with open(outside / "other-name", "r+b") as f:
        f.write(b"written through the name outside")
    want1 = tree_state(root)
    assert want1 != want0
    c1 = d.create("after")["checkpoint_id"]  # track_check fails it if missed
    # written again through the outside name, then a restore of the head
    with open(outside / "other-name", "r+b") as f:
        f.write(b"and again, with no create")
    assert d.restore(c1)["ok"] is True
    assert_same_tree(want1, tree_state(root))
    # the name outside goes (one link again), then comes back and writes
    os.unlink(outside / "other-name")
    c2 = d.create("one-link")["checkpoint_id"]
    want2 = tree_state(root)
    os.link(root / "d2" / "f4", outside / "again")
    with open(outside / "again", "r+b") as f:
        f.write(b"linked a second time")
    want3 = tree_state(root)
    c3 = d.create("relinked")["checkpoint_id"]
    t = tracking(d)
    assert t["walked"] == 1 and t["tracked"] >= 4, t
    for cid, want in ((c0, want0), (c1, want1), (c2, want2), (c3, want3)):
        assert d.restore(cid)["ok"] is True
        assert_same_tree(want, tree_state(root))


def test_write_through_a_shared_mapping(daemon_factory):
    """A write through a shared mapping makes no event: the /proc scan names
    the file while it is mapped, its last close after the write names it
    after; both creates and a restore of the head are exact."""
    d = start(daemon_factory, populate=small_tree)
    root = d.roots[0]
    c0 = d.create("start")["checkpoint_id"]
    want0 = tree_state(root)
    with open(root / "d1" / "f5", "r+b") as f:
        m = mmap.mmap(f.fileno(), 0)
        m[0:6] = b"mapped"
        want = tree_state(root)
        c1 = d.create("mapped")["checkpoint_id"]
        m[6:12] = b"again!"
        m.flush()
        want2 = tree_state(root)
        c2 = d.create("mapped-again")["checkpoint_id"]
        m[12:20] = b"restored"
        assert d.restore(c2)["ok"] is True
        m.close()
    assert_same_tree(want2, tree_state(root))
    for cid, w in ((c0, want0), (c1, want), (c2, want2)):
        assert d.restore(cid)["ok"] is True
        assert_same_tree(w, tree_state(root))
    assert tracking(d)["tracked"] >= 3


class Campaign:
    """Random changes of every kind a program makes, in a small tree."""

    def __init__(self, root, outside, rng):
        self.root, self.outside, self.rng = root, outside, rng
        self.maps = []
        self.n = 0

    def _all(self):
        files, dirs = [], []
        for dp, dn, fn in os.walk(self.root):
            for n in dn:
                dirs.append(os.path.join(dp, n))
            for n in fn:
                p = os.path.join(dp, n)
                if os.path.isfile(p) and not os.path.islink(p):
                    files.append(p)
        return sorted(files), sorted(dirs)

    def _name(self, prefix):
        self.n += 1
        return f"{prefix}{self.n}"

    def step(self):
        files, dirs = self._all()
        rng = self.rng
        where = rng.choice(dirs + [str(self.root)])
        op = rng.choice(["write", "append", "truncate", "inplace", "unlink", "rename_file", "rename_dir", "tree",
                         "chmod", "xattr", "symlink", "rmtree", "link_inside", "link_outside", "mmap", "newfile"])
        if op in ("write", "append", "truncate", "inplace", "unlink", "rename_file", "chmod", "xattr",
                  "link_inside", "link_outside", "mmap") and not files:
            op = "newfile"
        if op in ("rename_dir", "rmtree") and not dirs:
            op = "tree"
        f = rng.choice(files) if files else None
        if op == "newfile":
            with open(os.path.join(where, self._name("n")), "wb") as h:
                h.write(os.urandom(rng.randrange(0, 5000)))
        elif op == "write":
            with open(f, "wb") as h:
                h.write(os.urandom(rng.randrange(0, 3000)))
        elif op == "append":
            with open(f, "ab") as h:
                h.write(b"appended")
        elif op == "truncate":
            os.truncate(f, rng.randrange(0, 100))
        elif op == "inplace":  # same size, a new ctime
            with open(f, "r+b") as h:
                h.write(b"x")
        elif op == "unlink":
            os.unlink(f)
        elif op == "rename_file":
            os.rename(f, os.path.join(where, self._name("r")))
        elif op == "rename_dir":
            src = rng.choice(dirs)
            if where == src or where.startswith(src + "/"):
                where = str(self.root)
            os.rename(src, os.path.join(where, self._name("D")))
        elif op == "tree":  # made at once, as an unpacker or a build does
            top = os.path.join(where, self._name("T"))
            for sub in ("a/b/c", "a/x", "e"):
                os.makedirs(os.path.join(top, sub))
                for k in range(rng.randrange(1, 6)):
                    with open(os.path.join(top, sub, f"t{k}"), "wb") as h:
                        h.write(os.urandom(100))
        elif op == "chmod":
            os.chmod(rng.choice([f, where]), rng.choice([0o600, 0o644, 0o755, 0o700]))
        elif op == "xattr":
            os.setxattr(f, "user.k", os.urandom(8))
        elif op == "symlink":
            p = os.path.join(where, "link")
            if os.path.lexists(p) and not os.path.isdir(p) or os.path.islink(p):
                os.unlink(p)
            if not os.path.exists(p):
                os.symlink(rng.choice(["f0", "../x", self._name("s")]), p)
        elif op == "rmtree":
            shutil.rmtree(rng.choice(dirs))
        elif op == "link_inside":
            os.link(f, os.path.join(where, self._name("h")))
        elif op == "link_outside":
            name = os.path.join(self.outside, self._name("o"))
            os.link(f, name)
            with open(name, "r+b") as h:
                h.write(b"through a name outside the root")
            if rng.random() < 0.5:
                os.unlink(name)
        elif op == "mmap":
            if os.path.getsize(f) < 4:
                with open(f, "wb") as h:
                    h.write(b"\0" * 64)
            h = open(f, "r+b")
            m = mmap.mmap(h.fileno(), 0)
            m[0:4] = os.urandom(4)
            if rng.random() < 0.5:  # kept mapped across the next create
                self.maps.append((h, m))
            else:
                m.close()
                h.close()
        return op

    def close_maps(self):
        for h, m in self.maps:
            m.close()
            h.close()
        self.maps = []


def same_tree(want, root, ops):
    try:
        assert_same_tree(want, tree_state(root))
    except AssertionError as e:
        raise AssertionError(f"{e}\nthe changes, by round: {ops}") from None


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_campaign(daemon_factory, tmp_path, seed):
    """Rounds of random changes (writes, appends, truncates, unlinks, renames
    of files and directories, trees made at once, chmod, xattrs, symlinks,
    hard links inside and from outside the root, shared mappings), a create
    after each; now and then changes and a restore of the head. Every create
    is checked by track_check, every checkpoint restored and compared."""
    rng = random.Random(seed)
    d = start(daemon_factory, populate=small_tree)
    root = d.roots[0]
    outside = tmp_path / "outside"
    outside.mkdir()
    camp = Campaign(root, outside, rng)
    acked = []
    ops = []
    for rnd in range(25):
        for _ in range(rng.randrange(1, 8)):
            ops.append((rnd, camp.step()))
        want = tree_state(root)
        acked.append((d.create(f"r{rnd}")["checkpoint_id"], want))
        camp.close_maps()
        # a mapping closed after the create wrote nothing more: the tree is
        # still the checkpoint's
        if rng.random() < 0.3:  # a retry: changes, then back to the head
            for _ in range(rng.randrange(1, 6)):
                ops.append((rnd, camp.step()))
            camp.close_maps()
            assert d.restore(acked[-1][0])["ok"] is True
            same_tree(acked[-1][1], root, ops)
    t = tracking(d)
    # the base reads the whole tree; a file whose name tracking lost (a
    # second name removed) may make one more walk
    assert t["tracked"] >= 25 and t["walked"] <= 3, (t, ops)
    assert metric(d, "ckptd_change_tracking_fallbacks_total") == 0
    rng.shuffle(acked)
    for cid, want in acked[:10]:
        assert d.restore(cid)["ok"] is True
        same_tree(want, root, ops)


def test_queue_overflow_walks_once_logged(daemon_factory):
    """A queue that overflows (max_queued_events lowered while the daemon
    arms, put back after) loses events: the create walks, exact, the
    fallback is counted in /metrics and logged once; the tracker armed again
    once the limit is back tracks the next create."""
    with sysctl("max_queued_events", 64) as low:
        d = start(daemon_factory, populate=small_tree)
        root = d.roots[0]
        wants = []
        for k in range(2):
            for i in range(200):
                (root / "d0" / f"many{k}-{i}").write_bytes(b"x")
            wants.append((d.create(f"over{k}")["checkpoint_id"], tree_state(root)))
        low.restore()
        for i in range(200):  # the tracker armed while low overflows once more
            (root / "d1" / f"many-{i}").write_bytes(b"y")
        wants.append((d.create("over-last")["checkpoint_id"], tree_state(root)))
    for i in range(200):  # armed with the limit back: no overflow
        (root / "d2" / f"many-{i}").write_bytes(b"z")
    before = tracking(d)
    wants.append((d.create("tracked")["checkpoint_id"], tree_state(root)))
    after = tracking(d)
    assert after["tracked"] == before["tracked"] + 1, (before, after)
    assert after["tracking"] == "inotify"
    assert metric(d, "ckptd_change_tracking_fallbacks_total") == 3
    assert d.log().count("lost track (inotify queue overflowed)") == 1, d.log()
    for cid, want in wants:
        assert d.restore(cid)["ok"] is True
        assert_same_tree(want, tree_state(root))


def test_watch_limit_walks_and_says_so(daemon_factory):
    """A new directory that cannot be watched (max_user_watches lowered below
    what root uses, put back in a finally): the create walks, exact; the
    fallback is counted and logged, tracking stops (arming again meets the
    same limit) and health says why."""
    d = start(daemon_factory, populate=small_tree)
    root = d.roots[0]
    want0 = tree_state(root)
    c0 = d.create("before")["checkpoint_id"]
    with sysctl("max_user_watches", 1):
        (root / "fresh" / "deep").mkdir(parents=True)
        (root / "fresh" / "deep" / "file").write_text("new")
        (root / "d0" / "f0").write_text("changed")
        want1 = tree_state(root)
        c1 = d.create("over-the-limit")["checkpoint_id"]
    t = tracking(d)
    assert t["tracking"] == "none", t
    assert "watch limit reached" in t["tracking_reason"], t
    assert t["walked"] == 2, t
    assert metric(d, "ckptd_change_tracking_fallbacks_total") >= 1
    assert d.log().count("lost track (inotify watch limit reached") == 1, d.log()
    (root / "d1" / "f1").write_text("after")
    want2 = tree_state(root)
    c2 = d.create("untracked")["checkpoint_id"]
    for cid, want in ((c0, want0), (c1, want1), (c2, want2)):
        assert d.restore(cid)["ok"] is True
        assert_same_tree(want, tree_state(root))


def test_the_same_under_gvisor():
    """The tests above, again inside `runsc --network=none do` (gVisor:
    fanotify_init is ENOSYS), in a pytest of their own: the sandbox's files
    and loopback are its own. gVisor has no inotify queue or watch limits
    (no /proc/sys/fs/inotify), so the two fallback tests stay outside."""
    here = os.path.dirname(os.path.abspath(__file__))
    r = subprocess.run(["runsc", "--network=none", "do", "/usr/bin/env", "CKPTD_TEST_IN_GVISOR=1",
                        f"BUILD={os.environ.get('BUILD', 'build')}", "/usr/bin/python3", "-m", "pytest", "-q", "-x",
                        "-p", "no:cacheprovider", os.path.join(here, "test_tracking_inotify.py"), "-k",
                        "not gvisor and not overflow and not watch_limit"],
                       capture_output=True, text=True, timeout=1800, cwd=os.path.dirname(os.path.dirname(here)))
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-3000:]
    assert re.search(r"\b6 passed\b", r.stdout), r.stdout[-3000:]
