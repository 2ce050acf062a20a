"""ckptd in the sandboxes it is for, each reproduced on this machine: gVisor
(`runsc --network=none do`), a user namespace (`unshare -Urm` as an
unprivileged user) and root without CAP_SYS_ADMIN (`capsh`). The daemon runs
inside; envrun.py, inside too, drives it over that environment's loopback:
the exactness suite (every file type, renames of base directories, a restart)
and SIGKILLs during creates and restores, on the backend `auto` picks there
and on each other backend that starts there."""
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile

import pytest

from conftest import TOP

ENVRUN = str(TOP / "tests/integration/envrun.py")
NOBODY = 65534


def wrap(env, argv):
    if env == "gvisor":
        return ["runsc", "--network=none", "do"] + argv
    if env == "userns":
        return ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "unshare", "-Urm"] + argv
    assert env == "nocap"
    return ["capsh", "--drop=cap_sys_admin", "--", "-c", shlex.join(argv)]


@pytest.fixture
def envdir():
    # a user namespace's user must reach it: not under pytest's 0700 tmp dirs
    d = tempfile.mkdtemp(prefix="ckptd-env-", dir="/tmp")
    os.chown(d, NOBODY, NOBODY)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def run_in(env, mode, envdir, backend, *extra, timeout=600):
    argv = [sys.executable, ENVRUN, mode, "--dir", os.path.join(envdir, "w"), "--backend", backend, *extra]
    if env == "userns":
        argv += ["--owner-ids", "mapped"]  # only the user's own id is mapped
    p = subprocess.run(wrap(env, argv), capture_output=True, text=True, timeout=timeout)
    res = [line for line in p.stdout.splitlines() if line.startswith("RESULT ")]
    assert p.returncode == 0 and res, f"{env} {mode} {backend}: rc {p.returncode}\n{p.stdout}\n{p.stderr}"
    return json.loads(res[-1][len("RESULT "):])


# (environment, backend asked for, envrun options, backend that runs, overlay kind)
CASES = [
    ("gvisor", "auto", ["--tmpfs-state"], "overlay", "gvisor"),
    ("gvisor", "tar", ["--tmpfs-state"], "tar", None),
    ("gvisor", "auto", [], "tar", None),  # state on the sandbox's root: no whiteouts there
    ("userns", "auto", [], "tar", None),
    ("nocap", "auto", [], "tar", None),
]
IDS = ["gvisor-auto", "gvisor-tar", "gvisor-rootfs-auto", "userns-auto", "nocap-auto"]


def check_choice(out, backend, kind):
    assert out["backend"] == backend, out
    if kind:
        assert out["overlay"] == {"kind": kind, "redirect_dir": kind == "kernel", "userxattr": False}, out
    else:
        assert out["overlay"] is None, out
    assert out["root_details"], out
    for detail in out["root_details"]:  # one per root (the crash harness has two)
        assert detail["backend"] == backend and detail["backend_reason"] == out["backend_reason"], out


@pytest.mark.parametrize("env,backend,opts,runs,kind", CASES, ids=IDS)
def test_exact_in_environment(env, backend, opts, runs, kind, envdir):
    out = run_in(env, "exact", envdir, backend, *opts)
    check_choice(out, runs, kind)
    assert out["after_restart"] == runs
    assert out["checked"] == ["types", "renames", "restart", "fork"]
    assert out["xattrs"], "user.* xattrs work in each of these environments here"
    assert out["xattr_only"], "an xattr changed alone is checked in each environment"


@pytest.mark.parametrize("env,backend,opts,runs,kind", CASES, ids=IDS)
def test_sigkill_in_environment(env, backend, opts, runs, kind, envdir):
    out = run_in(env, "crash", envdir, backend, *opts, "--kills", "10", "--seed", "7")
    check_choice(out, runs, kind)
    assert sum(out["kills"].values()) >= 10 and set(out["kills"]) == {"create", "restore"}, out


def test_auto_says_why_not_overlay(envdir):
    """The reason names what each environment lacks."""
    out = run_in("gvisor", "start", envdir, "auto")
    assert "whiteout" in out["backend_reason"] and "tmpfs" in out["backend_reason"], out
    out = run_in("userns", "start", envdir, "auto")
    assert "redirect_dir=on" in out["backend_reason"] and "Invalid cross-device link" in out["backend_reason"], out
    out = run_in("nocap", "start", envdir, "auto")
    assert "Operation not permitted" in out["backend_reason"], out


@pytest.mark.parametrize("env,why", [
    ("gvisor", "the state dir must be on a filesystem of the sandbox's own, such as a tmpfs"),
    ("userns", "renaming a directory of the base then fails"),
    ("nocap", "overlayfs refused a test mount"),
])
def test_overlay_asked_where_it_cannot_keep_its_promises_refuses(env, why, envdir):
    out = run_in(env, "start", envdir, "overlay")
    assert "cannot start: overlay backend unusable here" in out["error"] and why in out["error"], out


def test_host_auto_picks_the_kernel_overlay(daemon_factory):
    d = daemon_factory(backend="auto")
    h = d.health()
    assert h["backend"] == "overlay" and "renamed base directory" in h["backend_reason"], h
    assert h["overlay"] == {"kind": "kernel", "redirect_dir": True, "userxattr": False}, h
    (root,) = h["root_details"]  # one view per root: backend, overlay and tracking
    assert {k: root[k] for k in ("path", "backend", "backend_reason", "overlay")} == {
        "path": str(d.roots[0]), "backend": "overlay", "backend_reason": h["backend_reason"],
        "overlay": h["overlay"]}, h
    assert root["tracking"] in ("fanotify", "inotify", "none") and root["tracking_reason"], h
    assert "tracking_roots" not in h, h


def test_ckpt_status_prints_backend_reason_and_overlay(daemon_factory):
    from conftest import CKPT
    d = daemon_factory(backend="auto")
    out = subprocess.run([CKPT, "--url", d.url, "status"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert f"Backend:        {d.roots[0]}: overlay (auto: overlayfs mounts here" in out.stdout, out.stdout
    assert "Overlay:        kernel overlay, redirect_dir on, userxattr off" in out.stdout, out.stdout


def test_fuse_overlayfs_refuses_renames_of_lower_directories(tmp_path):
    """Why a user namespace runs tar and not fuse-overlayfs (docs/environments.md):
    fuse-overlayfs (Debian's 1.10) gives EXDEV on rename(2) of any directory of a
    lower, as the kernel's userxattr overlay does. If this fails, fuse-overlayfs
    learned it: measure it again (bench/fuseovl.py)."""
    for n in ("base/dir", "u", "w", "m"):
        (tmp_path / n).mkdir(parents=True)
    (tmp_path / "base/dir/f").write_text("x")
    m = tmp_path / "m"
    subprocess.run(["fuse-overlayfs", "-o", f"lowerdir={tmp_path / 'base'},upperdir={tmp_path / 'u'},"
                    f"workdir={tmp_path / 'w'}", str(m)], check=True, capture_output=True)
    try:
        with pytest.raises(OSError) as e:
            os.rename(m / "dir", m / "dir-moved")
        assert e.value.errno == 18  # EXDEV
        assert (m / "dir/f").read_text() == "x"
    finally:
        subprocess.run(["umount", str(m)], check=True)


def test_overlay_suites_pass_under_gvisor():
    """The kernel overlay's own tests (renames through layer generations and
    flattening, restarts, kills, mappings, busy mounts), its delta tests (with
    inotify tracking there), forks and diffs, run
    inside runsc do on gVisor's overlay. Their temp dir there is a tmpfs of
    the sandbox, so state dirs take the overlay backend. CKPTD_TEST_ENV tells the rename
    tests that a plain directory here is one of gVisor's overlay."""
    files = ["tests/integration/test_overlay.py", "tests/integration/test_overlay_delta.py",
             "tests/integration/test_fork.py", "tests/integration/test_diff.py"]
    # The tmpfs goes on a directory of its own, not on /tmp: the checkout
    # itself may live under /tmp, and a tmpfs there would hide it.
    tmp = "/var/tmp/ckptd-gvisor-tmpfs"
    inner = (f"mkdir -p {tmp} && mount -t tmpfs tmpfs {tmp} && cd {shlex.quote(str(TOP))} && "
             f"TMPDIR={tmp} CKPTD_TEST_ENV=gvisor "
             f"{sys.executable} -m pytest -q -p no:cacheprovider --basetemp={tmp}/pt -rs " + " ".join(files))
    p = subprocess.run(wrap("gvisor", ["/bin/sh", "-c", inner]), capture_output=True, text=True, timeout=1200)
    tail = p.stdout[-3000:] + p.stderr[-2000:]
    assert p.returncode == 0, tail
    assert " passed" in p.stdout and "skipped" not in p.stdout and "failed" not in p.stdout, tail
