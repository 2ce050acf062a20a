"""Fixtures for driving the real ckptd: start it on a temp state dir and temp
roots, talk to it over HTTP, kill it, restart it, compare trees."""
import hashlib
import json
import os
import pathlib
import re
import signal
import socket
import stat
import subprocess
import time

import pytest
import requests

TOP = pathlib.Path(__file__).resolve().parents[2]
BUILD = pathlib.Path(os.environ.get("BUILD", TOP / "build"))
if not BUILD.is_absolute():
    BUILD = TOP / BUILD
CKPTD = str(BUILD / "ckptd")
CKPT = str(BUILD / "ckpt")


# What ASan, LSan and UBSan print when they find something (the sanitized
# pass); found in a daemon's log, it fails the test that ran the daemon.
SANITIZER_REPORT = re.compile(r"ERROR: AddressSanitizer|AddressSanitizer:DEADLYSIGNAL|ERROR: LeakSanitizer"
                              r"|: runtime error: |SUMMARY: UndefinedBehaviorSanitizer")


def sanitizer_reports(text):
    """The lines of a daemon's log where a sanitizer reported, with context."""
    lines = text.splitlines()
    hits = [i for i, ln in enumerate(lines) if SANITIZER_REPORT.search(ln)]
    return ["\n".join(lines[max(0, i - 2):i + 30]) for i in hits[:3]]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def mounts_under(path):
    """Mount points at or below path, deepest first."""
    path = os.path.realpath(str(path))
    found = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            mp = line.split()[4].encode().decode("unicode_escape")
            if mp == path or mp.startswith(path + "/"):
                found.append(mp)
    return sorted(found, key=len, reverse=True)


def unmount_all(path):
    for _ in range(3):
        mps = mounts_under(path)
        if not mps:
            return
        for mp in mps:
            subprocess.run(["umount", "-l", mp], stderr=subprocess.DEVNULL)


class Daemon:
    """One ckptd process over a state dir and roots that outlive restarts."""

    def __init__(self, base, backend="tar", roots=None, n_roots=1, extra_args=(),
                 config=None, token=None, env=None, wrap=()):
        self.base = pathlib.Path(base)
        self.base.mkdir(parents=True, exist_ok=True)
        self.state_dir = self.base / "state"
        if roots is None:
            roots = [self.base / f"root{i}" for i in range(n_roots)]
        self.roots = [pathlib.Path(r) for r in roots]
        for r in self.roots:
            r.mkdir(parents=True, exist_ok=True)
        self.backend = backend
        self.extra_args = list(extra_args)
        self.config = config
        self.token = token
        self.env = env
        # a command the daemon is started through (capsh dropping a
        # capability): it must exec ckptd, so that the pid is ckptd's
        self.wrap = list(wrap)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = None
        self.logfile = self.base / "ckptd.log"
        self.session = requests.Session()
        if token:
            (self.base / "token").write_text(token + "\n")
            self.session.headers["Authorization"] = f"Bearer {token}"

    def argv(self):
        args = [CKPTD, "--listen", f"127.0.0.1:{self.port}", "--state-dir", str(self.state_dir)]
        for r in self.roots:
            args += ["--root", str(r)]
        if self.backend:
            args += ["--backend", self.backend]
        cfg = self.base / "config.json"
        cfg.write_text(json.dumps(self.config_json()))
        args += ["--config", str(cfg)]
        if self.token:
            args += ["--token-file", str(self.base / "token")]
        return args + self.extra_args

    def config_json(self):
        """The test's config, plus the change tracker's check: it compares
        each tracked create with a full walk, reads only, and fails the
        create on a difference (ckptd.json(5)). Production defaults
        otherwise: the test decides on track_changes itself."""
        if not isinstance(self.config, dict):
            return self.config if self.config is not None else {"track_check": True}
        return {"track_check": True, **self.config}

    def start(self, wait=True, timeout=20):
        env = dict(os.environ)
        env.update(self.env or {})
        if getattr(self, "log_fh", None):
            self.log_fh.close()  # the last run's: this one appends to the same log
        self.log_fh = open(self.logfile, "ab")
        self.start_mark = self.logfile.stat().st_size
        self.proc = subprocess.Popen(self.wrap + self.argv(), stdout=self.log_fh, stderr=subprocess.STDOUT, env=env)
        if wait:
            self.wait_ready(timeout)
        return self

    def lost_port(self):
        """free_port's port was taken by another process before this start
        bound it: the start failed on that alone."""
        with open(self.logfile, "rb") as f:
            f.seek(getattr(self, "start_mark", 0))
            return b"Address already in use" in f.read()

    def ours(self, health):
        """A health answer of this daemon, not of another that took the port."""
        paths = {os.path.realpath(d["path"]) for d in health.get("root_details") or [] if d.get("path")}
        return not paths or not self.roots or bool(paths & {os.path.realpath(r) for r in self.roots})

    def wait_ready(self, timeout=20, tries=3, preparing_cap=120):
        """Ready: health answers "ok" for this daemon. One that answers
        "preparing" is alive and taking the tar base, whose syncfs of a
        file system shared with the other CI lane's writers took over 20 s
        once (2026-11-29): it gets up to preparing_cap seconds."""
        t0 = time.monotonic()
        deadline = t0 + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                if tries > 1 and self.lost_port():  # again on a new port
                    self.port = free_port()
                    self.url = f"http://127.0.0.1:{self.port}"
                    self.start(wait=False)
                    return self.wait_ready(timeout, tries - 1)
                raise RuntimeError(f"ckptd exited with {self.proc.returncode}:\n{self.log()}")
            try:
                r = requests.get(self.url + "/v1/health", timeout=1)
                # "preparing": the tar backend still takes the base (first start)
                if r.status_code == 200 and self.ours(r.json()):
                    if r.json().get("status") != "preparing":
                        return
                    deadline = max(deadline, t0 + preparing_cap)
            except (requests.ConnectionError, requests.Timeout):  # a slow answer on a loaded box
                pass
            time.sleep(0.02)
        raise RuntimeError(f"ckptd not ready after {time.monotonic() - t0:.0f}s:\n{self.log()}")

    def log(self):
        try:
            return self.logfile.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def wait_log(self, text, count, timeout=60):
        """Until the log holds text count times (the daemon's own word that
        something happened), else fail: a wait on the event, not a sleep."""
        deadline = time.monotonic() + timeout
        while self.log().count(text) < count:
            assert time.monotonic() < deadline, f"{text!r} not logged {count} times in {timeout}s:\n{self.log()[-3000:]}"
            time.sleep(0.05)

    def maintenance_runs(self):
        """Backend maintenance runs done so far (GC, flattening): logged with -v."""
        return self.log().count("sweeper: maintenance done")

    def request(self, method, path, **kw):
        kw.setdefault("timeout", 120)
        return self.session.request(method, self.url + path, **kw)

    def create(self, name, expect=201, **fields):
        r = self.request("POST", "/v1/checkpoints", json={"name": name, **fields})
        assert r.status_code == expect, r.text
        return r.json()

    def restore(self, cid, expect=200, **body):
        r = self.request("POST", f"/v1/checkpoints/{cid}/restore", json=body)
        assert r.status_code == expect, r.text
        return r.json()

    def delete(self, cid, expect=204):
        r = self.request("DELETE", f"/v1/checkpoints/{cid}")
        assert r.status_code == expect, r.text

    def get(self, cid):
        r = self.request("GET", f"/v1/checkpoints/{cid}")
        assert r.status_code == 200, r.text
        return r.json()

    def list(self, **params):
        r = self.request("GET", "/v1/checkpoints", params=params)
        assert r.status_code == 200, r.text
        return r.json()["checkpoints"]

    def health(self):
        return self.request("GET", "/v1/health").json()

    def stop(self, timeout=30):
        """SIGTERM, and the exit status it must give: 0. A daemon that will
        not stop, or exits otherwise (a leak at exit is status 23 under
        LeakSanitizer), fails the test. One that exited by itself before
        (a test that expected it to) is left to that test."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                self.proc = None
                raise AssertionError(f"ckptd did not stop on SIGTERM within {timeout}s:\n{self.log()[-4000:]}")
            if self.proc.returncode != 0:
                rc, self.proc = self.proc.returncode, None
                raise AssertionError(f"ckptd exited with {rc} on SIGTERM:\n{self.log()[-4000:]}")
        rc = self.proc.returncode if self.proc else None
        if rc is not None and rc < 0 and self.proc:  # a signal the test did not send
            self.proc = None
            raise AssertionError(f"ckptd died of signal {-rc}:\n{self.log()[-4000:]}")
        self.proc = None
        return rc

    def kill9(self):
        """The one expected death: SIGKILL, sent by the test."""
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def check_log(self):
        """Every run of this daemon logged here: no sanitizer report."""
        found = sanitizer_reports(self.log())
        if found:
            raise AssertionError(f"sanitizer report in {self.logfile}:\n" + "\n---\n".join(found))

    def cleanup(self):
        """Stop, unmount, scan the log; what went wrong is raised after the
        unmount, so that the test fails and leaves nothing mounted."""
        problems = []
        try:
            self.stop()
        except AssertionError as e:
            problems.append(str(e))
        unmount_all(self.base)
        try:
            self.check_log()
        except AssertionError as e:
            problems.append(str(e))
        if getattr(self, "log_fh", None):
            self.log_fh.close()
        if problems:
            raise AssertionError("\n\n".join(problems))


@pytest.fixture
def daemon_factory(tmp_path):
    made = []

    def make(start=True, **kw):
        d = Daemon(tmp_path / f"d{len(made)}", **kw)
        made.append(d)
        if start:
            d.start()
        return d

    yield make
    problems = []
    for d in made:  # every daemon is cleaned up, then the first problem is raised
        try:
            d.cleanup()
        except AssertionError as e:
            problems.append(f"{d.base.name}: {e}")
    if problems:
        raise AssertionError("\n\n".join(problems))


def _xattrs(p):
    try:
        names = os.listxattr(p, follow_symlinks=False)
    except OSError:
        return ()
    out = []
    for n in sorted(names):
        try:
            out.append((n, os.getxattr(p, n, follow_symlinks=False)))
        except OSError:
            pass
    return tuple(out)


def _sha256(p):
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def tree_state(root, mtimes=True):
    """relpath -> (type, mode, uid, gid, size, mtime_ns, sha256, link, xattrs, rdev, link group).
    Directory mtimes are left out (restores touch them legitimately), as is the root itself.
    The link group names the first path of the tree sharing this inode, and is set only
    where two or more paths of the tree do: st_nlink also counts names outside the tree
    (the overlay backend shares unchanged files between its layers by hard link), and
    those say nothing about the tree."""
    root = str(root)
    out = {}
    groups = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(dirnames + filenames):
            p = os.path.join(dirpath, name)
            rel = os.path.relpath(p, root)
            st = os.lstat(p)
            kind = stat.S_IFMT(st.st_mode)
            sha = _sha256(p) if stat.S_ISREG(st.st_mode) else None
            link = os.readlink(p) if stat.S_ISLNK(st.st_mode) else None
            group = None
            if stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
                group = groups.setdefault((st.st_dev, st.st_ino), rel)
            mt = st.st_mtime_ns if mtimes and not stat.S_ISDIR(st.st_mode) and not stat.S_ISLNK(st.st_mode) else None
            out[rel] = (kind, stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid,
                        st.st_size if not stat.S_ISDIR(st.st_mode) else None,
                        mt, sha, link, _xattrs(p), st.st_rdev if kind in (stat.S_IFCHR, stat.S_IFBLK) else None,
                        group)
    members = {}
    for v in out.values():
        if v[-1] is not None:
            members[v[-1]] = members.get(v[-1], 0) + 1
    return {k: v if v[-1] is None or members[v[-1]] > 1 else v[:-1] + (None,) for k, v in out.items()}


def make_full_tree(root, owner=(1234, 5678), xattrs=True):
    """Every file type ckptd must keep: files, dirs, symlinks, hardlinks, a fifo,
    xattrs, odd modes and owners, a sparse file, nesting. owner None: keep the
    caller's (a user namespace maps no other id); xattrs False: where the
    filesystem has no user.* attributes."""
    root = pathlib.Path(root)
    (root / "dir/sub/deeper").mkdir(parents=True, exist_ok=True)
    (root / "empty-dir").mkdir(exist_ok=True)
    (root / "file.txt").write_text("hello\n")
    (root / "dir/data.bin").write_bytes(os.urandom(200_000))
    (root / "dir/sub/deeper/note").write_text("deep\n")
    (root / "exec.sh").write_text("#!/bin/sh\necho hi\n")
    os.chmod(root / "exec.sh", 0o755)
    (root / "secret").write_text("s\n")
    os.chmod(root / "secret", 0o600)
    (root / "setgid-dir").mkdir(exist_ok=True)
    os.chmod(root / "setgid-dir", 0o2775)
    if owner:
        os.chown(root / "secret", *owner)
    os.symlink("file.txt", root / "link-rel")
    os.symlink("/nonexistent/target", root / "link-dangling")
    os.link(root / "file.txt", root / "dir/hardlink.txt")
    os.mkfifo(root / "fifo")
    if xattrs:
        os.setxattr(root / "file.txt", "user.color", b"blue")
        os.setxattr(root / "dir", "user.kind", b"directory")
    with open(root / "sparse.img", "wb") as f:
        f.seek(8 << 20)
        f.write(b"end")
    os.utime(root / "dir/sub/deeper/note", ns=(1_600_000_000_000_000_000, 1_600_000_000_000_000_000))
    return root


def make_acl_tree(root):
    """setfacl's ACLs: a directory with an access and a default ACL, and a
    directory, a fifo and a file made in it, which inherit ACLs from it."""
    shared = pathlib.Path(root) / "shared"
    shared.mkdir()
    subprocess.run(["setfacl", "-m", "u:1234:rwx", "-m", "d:g:555:rx", str(shared)], check=True)
    (shared / "sub").mkdir()
    os.mkfifo(shared / "fifo")
    (shared / "f").write_text("f")
    return shared


def assert_same_tree(a, b):
    """a and b are tree_state() dicts; give a readable difference."""
    if a == b:
        return
    only_a = sorted(set(a) - set(b))
    only_b = sorted(set(b) - set(a))
    changed = sorted(k for k in set(a) & set(b) if a[k] != b[k])
    lines = []
    if only_a:
        lines.append(f"missing: {only_a[:20]}")
    if only_b:
        lines.append(f"extra: {only_b[:20]}")
    for k in changed[:20]:
        lines.append(f"changed {k}: {a[k]} != {b[k]}")
    raise AssertionError("trees differ:\n" + "\n".join(lines))


def idempotency_files(d, n, timeout=10):
    """The daemon d's Idempotency-Key files once there are n: each is written
    just after its answer was sent, through a temp file; what is there at
    the timeout otherwise."""
    deadline = time.monotonic() + timeout
    while True:
        files = list((d.state_dir / "idempotency").iterdir())
        if len(files) == n and all(f.name.endswith(".json") for f in files) or time.monotonic() > deadline:
            return files
        time.sleep(0.01)
