"""The whole sandbox as a root (docs/whole-root.md) where ckptd runs without
systemd: under gVisor (`runsc --network=none do`), as root without
CAP_SYS_ADMIN (`capsh --drop=cap_sys_admin`), the sandboxes of DESIGN.md,
and as root with it, where fanotify tracks what changed (on an ext4 root
of its own: fanotify does not mark an overlay).

Safety: ckptd's "/" here is never this machine's root. Each test mounts a
private copy-on-write root: an overlay whose lower layer is the rig's
cached Debian rootfs (read-only) and whose upper is a temp dir. runsc runs
with -root on it (and its own overlay in memory on top); capsh runs in a
mount namespace of its own, chrooted into it. A driver script inside starts
ckptd on "/", checkpoints, pip-installs a local wheel into /usr/local,
restores, and prints what it saw as JSON."""
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "rig"))
import rig as rigmod  # noqa: E402
from test_rig_whole import wheel_bytes  # noqa: E402

TOP = pathlib.Path(__file__).resolve().parents[2]
BUILD = pathlib.Path(os.environ.get("BUILD", "build"))
if not BUILD.is_absolute():
    BUILD = TOP / BUILD
WHEEL = "ckptd_wr_demo-1.0-py3-none-any.whl"

DRIVE_PY = r'''
import http.client, json, os, socket, subprocess, sys, time

SOCK = "/tmp/wr-ckptd.sock"

class Conn(http.client.HTTPConnection):
    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(SOCK)

def call(method, path, body=None, timeout=900):
    c = Conn("localhost", timeout=timeout)
    c.request(method, path, body=json.dumps(body) if body is not None else None,
              headers={"Content-Type": "application/json"} if body is not None else {})
    r = c.getresponse()
    return r.status, json.loads(r.read() or b"null")

def pip_list():
    out = subprocess.run([sys.executable, "-m", "pip", "list", "--format=json", "--disable-pip-version-check"],
                         capture_output=True, text=True, check=True, cwd="/").stdout
    return sorted([p["name"], p["version"]] for p in json.loads(out))

def importable():
    return subprocess.run([sys.executable, "-c", "import ckptd_wr_demo"], cwd="/").returncode == 0

log = open("/tmp/wr-ckptd.log", "w")
# a sanitizer build: LSan's scan at exit needs ptrace, which gVisor lacks
env = dict(os.environ, ASAN_OPTIONS="detect_leaks=0", UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1")
d = subprocess.Popen(["/wr/ckptd", "--root", "/", "--state-dir", "/var/lib/ckptd", "--listen", "unix:" + SOCK],
                     stdout=log, stderr=subprocess.STDOUT, env=env)
out = {}
try:
    deadline = time.monotonic() + 600
    while True:
        try:
            st, h = call("GET", "/v1/health", timeout=10)
            if st == 200 and h.get("status") == "ok":
                break
        except OSError:
            pass
        if time.monotonic() > deadline or d.poll() is not None:
            raise SystemExit("ckptd never became healthy: " + open("/tmp/wr-ckptd.log").read()[-2000:])
        time.sleep(0.2)
    out["health"] = h
    out["before"] = pip_list()
    st, cp = call("POST", "/v1/checkpoints", {"name": "before-pip"})
    out["create"] = [st, cp]
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-index", "--break-system-packages",
                    "--disable-pip-version-check", "/wr/WHEEL"], check=True, cwd="/",
                   stdout=subprocess.DEVNULL)
    out["during"] = pip_list()
    out["importable_during"] = importable()
    out["tracked_before"] = call("GET", "/v1/health")[1].get("root_details", [{}])[0].get("tracked", 0)
    st, rs = call("POST", "/v1/checkpoints/%s/restore" % cp["checkpoint_id"], {})
    out["restore"] = [st, rs]
    out["tracked_after"] = call("GET", "/v1/health")[1].get("root_details", [{}])[0].get("tracked", 0)
    out["after"] = pip_list()
    out["importable_after"] = importable()
    out["dist_left"] = os.path.exists("/usr/local/lib/python3.11/dist-packages/ckptd_wr_demo")
finally:
    d.terminate()
    d.wait(60)
    out["ckptd_log_tail"] = open("/tmp/wr-ckptd.log").read()[-3000:]
print("WR-RESULT " + json.dumps(out))
'''.replace("WHEEL", WHEEL)


def copy_sanitizer_runtime(root):
    """A ckptd built with SANITIZE= needs libasan/libubsan, which the rootfs
    lacks: the host's (same Debian), as the rig does."""
    out = subprocess.run(["ldd", str(BUILD / "ckptd")], capture_output=True, text=True).stdout
    for ln in out.splitlines():
        if "=>" in ln and any(k in ln for k in ("libasan", "libubsan", "liblsan")):
            lib = pathlib.Path(ln.split("=>")[1].split()[0])
            shutil.copy2(os.path.realpath(lib), root / "usr/lib" / lib.parent.name / lib.name)


@pytest.fixture
def private_root():
    """A copy-on-write Debian root of its own: overlay(lower=cached rootfs)."""
    lower = rigmod.build_rootfs()
    d = pathlib.Path(tempfile.mkdtemp(prefix="ckptd-wr."))
    for sub in ("upper", "work", "root"):
        (d / sub).mkdir()
    root = d / "root"
    subprocess.run(["mount", "-t", "overlay", "overlay", "-o",
                    f"lowerdir={lower},upperdir={d}/upper,workdir={d}/work", str(root)], check=True)
    try:
        assert os.stat(root).st_dev != os.stat("/").st_dev, "the private root must not be this machine's /"
        populate(root)
        yield root
    finally:
        subprocess.run(["umount", "-l", str(root)], check=False)
        shutil.rmtree(d, ignore_errors=True)


def populate(root):
    wr = root / "wr"
    wr.mkdir()
    shutil.copy2(BUILD / "ckptd", wr / "ckptd")
    copy_sanitizer_runtime(root)
    (wr / "drive.py").write_text(DRIVE_PY)
    (wr / WHEEL).write_bytes(wheel_bytes("ckptd_wr_demo", "1.0"))


@pytest.fixture
def ext4_root():
    """A copy of the rig's Debian rootfs on an ext4 filesystem of its own
    (a loop device), as a sandbox's root is: fanotify marks a whole
    filesystem, and it does not mark an overlay."""
    lower = rigmod.build_rootfs()
    d = pathlib.Path(tempfile.mkdtemp(prefix="ckptd-wr-ext4."))
    fs = d / "fs"
    fs.mkdir()
    subprocess.run(["truncate", "-s", "2G", str(d / "fs.img")], check=True)
    subprocess.run(["mkfs.ext4", "-q", "-F", str(d / "fs.img")], check=True)
    subprocess.run(["mount", "-o", "loop", str(d / "fs.img"), str(fs)], check=True)
    try:
        root = fs / "root"
        subprocess.run(["cp", "-a", str(lower), str(root)], check=True)
        assert os.stat(root).st_dev != os.stat("/").st_dev, "the private root must not be this machine's /"
        populate(root)
        yield root
    finally:
        subprocess.run(["umount", "-l", str(fs)], check=False)
        shutil.rmtree(d, ignore_errors=True)


def result(proc):
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("WR-RESULT ")]
    assert lines, f"driver printed no result (rc {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return json.loads(lines[-1][len("WR-RESULT "):])


def check(out):
    log = out.get("ckptd_log_tail", "")
    assert out["health"]["roots"] == ["/"] and out["health"]["backend"] == "tar", out["health"]
    excluded = {e["path"] for e in out["health"]["excluded"]}
    assert {"/var/lib/ckptd", "/tmp", "/proc"} <= excluded, excluded
    assert out["create"][0] == 201, (out["create"], log)
    assert ["ckptd_wr_demo", "1.0"] in out["during"] and out["importable_during"]
    assert out["restore"][0] == 200 and out["restore"][1]["ok"] is True, (out["restore"], log)
    assert out["after"] == out["before"]
    assert not out["importable_after"]
    assert not out["dist_left"]


def test_whole_root_pip_rollback_under_gvisor(private_root):
    runsc = shutil.which("runsc")
    assert runsc, "runsc (Debian package runsc) is required"
    p = subprocess.run([runsc, "--network=none", "do", "-root", str(private_root), "-cwd", "/", "--",
                        "/usr/bin/python3", "/wr/drive.py"], capture_output=True, text=True, timeout=1800)
    out = result(p)
    check(out)
    assert out["health"]["services"] == "unavailable"


def test_whole_root_pip_rollback_without_cap_sys_admin(private_root):
    script = (f"mount --make-rprivate / && mount -t proc proc {private_root}/proc && "
              f"mount -t tmpfs tmpfs {private_root}/tmp && "
              f"exec capsh --drop=cap_sys_admin -- -c 'exec chroot {private_root} /usr/bin/python3 /wr/drive.py'")
    p = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, timeout=1800)
    out = result(p)
    check(out)
    assert "/tmp" in {e["path"] for e in out["health"]["excluded"]}


def test_whole_root_pip_rollback_with_fanotify(ext4_root):
    """With CAP_SYS_ADMIN, fanotify tells a create and a restore of "/"
    which directories changed, and only those are read. Every directory
    below "/" counts: the restore takes the install back."""
    script = (f"mount --make-rprivate / && mount -t proc proc {ext4_root}/proc && "
              f"mount -t tmpfs tmpfs {ext4_root}/tmp && "
              f"exec chroot {ext4_root} /usr/bin/python3 /wr/drive.py")
    p = subprocess.run(["unshare", "-m", "-p", "-f", "sh", "-c", script], capture_output=True, text=True,
                       timeout=1800)
    out = result(p)
    tracking = out["health"].get("root_details", [])
    assert [t.get("tracking") for t in tracking] == ["fanotify"], (tracking, out.get("ckptd_log_tail"))
    check(out)
    # the restore read only the directories that changed
    assert out["tracked_after"] == out["tracked_before"] + 1, out["ckptd_log_tail"]
