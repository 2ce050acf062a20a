"""The whole sandbox as a root (docs/whole-root.md), under a real systemd:
ckptd in the rig manages "/" with the tar backend. The rig's root is an
overlay whose lower layer is the cached rootfs, so every restore writes into
that overlay's upper only: never into this machine's own root.

One container for the module; the tests run in file order and build on each
other's state, as a user would drive it: an apt-get install rolled back, an
apt-get remove rolled back, pip installs rolled back, a library upgrade
rolled back under the service that maps it, and ckptd's own binary."""
import base64
import hashlib
import io
import json
import pathlib
import sys
import threading
import time
import zipfile

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "rig"))
import rig as rigmod  # noqa: E402
from samples import active, api, main_pid  # noqa: E402

DEBS = "/var/cache/ckptd-rig/debs"
LIB = "/usr/local/lib/ckptd-rig/libdemo.so.1"
LIB_V1 = "/usr/lib/x86_64-linux-gnu/libzstd.so.1"
LIB_V2 = "/usr/lib/x86_64-linux-gnu/libjansson.so.4"
SLOW = 900  # seconds: a create of the whole rootfs on a loaded machine
JOURNAL = "/var/lib/ckptd/services.json"

LIBUSER_PY = f"""\
import ctypes, time
ctypes.CDLL("{LIB}")  # mapped for the life of the process
time.sleep(1e6)
"""

UNITS = {
    "libuser.service": """[Unit]
Description=rig unit mapping a library under /usr/local
[Service]
ExecStart=/usr/bin/python3 /usr/local/lib/ckptd-rig/libuser.py
""",
    "bystander.service": """[Unit]
Description=rig unit that uses nothing a restore changes
[Service]
ExecStart=/usr/bin/python3 -c 'import time; time.sleep(1e6)'
""",
}

# Units that must keep their process through every restore here.
KEEP = ("bystander.service", "dbus.service", "systemd-journald.service", "systemd-logind.service")


@pytest.fixture(scope="module")
def rig():
    port = rigmod.free_port()
    config = {
        "listen": [f"127.0.0.1:{port}"],
        "state_dir": "/var/lib/ckptd",
        "roots": ["/"],
        "backend": "tar",
        "service_timeout_secs": 30,
    }
    files = {"/usr/local/lib/ckptd-rig/libuser.py": LIBUSER_PY}
    with rigmod.Rig(ckptd_config=config, units=UNITS, files=files) as r:
        r.api = f"http://127.0.0.1:{port}"
        r.sh("cp", LIB_V1, LIB)
        r.systemctl("start", "ckptd.service", "bystander.service", "libuser.service")
        yield r


def sh(rig, cmd, check=True, timeout=300):
    return rig.sh("env", "DEBIAN_FRONTEND=noninteractive", "sh", "-c", cmd, check=check, timeout=timeout)


def checkpoint(rig, name):
    r = api(rig, "POST", "/v1/checkpoints", json={"name": name}, timeout=SLOW)
    assert r.status_code == 201, r.text
    return r.json()["checkpoint_id"]


def restore(rig, cid):
    r = api(rig, "POST", f"/v1/checkpoints/{cid}/restore", json={}, timeout=SLOW)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["ok"] is True, out
    return out


def pids(rig):
    return {u: main_pid(rig, u) for u in KEEP}


def exists(rig, path):
    return rig.sh("test", "-e", path, check=False).returncode == 0


def test_health_lists_what_is_excluded_and_why(rig):
    h = api(rig, "GET", "/v1/health").json()
    assert h["roots"] == ["/"] and h["backend"] == "tar", h
    assert h["restart_due"] is False, h
    why = {e["path"]: e["reason"] for e in h["excluded"]}
    assert why["/var/lib/ckptd"] == "state dir", why
    assert why["/tmp"] in ("temporary files", "mount point (tmpfs)"), why
    for p in ("/proc", "/sys", "/dev", "/srv"):
        assert why.get(p, "").startswith("mount point ("), (p, why)
    assert not any(p.startswith("/proc/") for p in why), "a mount below an excluded one is listed"


def test_apt_get_install_is_rolled_back(rig):
    rig.clean = checkpoint(rig, "clean")
    before = pids(rig)
    lib_pid = main_pid(rig, "libuser.service")
    sh(rig, f"apt-get install -y --no-install-recommends {DEBS}/*.deb")
    assert active(rig, "cron.service") == "active"
    assert rig.systemctl("is-enabled", "cron.service").stdout.strip() == "enabled"
    assert exists(rig, "/usr/sbin/cron")

    out = restore(rig, rig.clean)
    assert "cron.service" in out["stopped_services"], out
    assert "cron.service" not in out["started_services"], out
    assert out["failed_services"] == [], out
    assert not exists(rig, "/usr/sbin/cron")
    assert not exists(rig, "/lib/systemd/system/cron.service")
    assert sh(rig, "dpkg -s cron", check=False).returncode != 0
    audit = sh(rig, "dpkg --audit")
    assert audit.stdout.strip() == "", audit.stdout
    assert active(rig, "cron.service") == "inactive"
    assert rig.show("cron.service", "LoadState")["LoadState"] == "not-found"
    # nothing else went down: the same processes run
    assert pids(rig) == before
    assert main_pid(rig, "libuser.service") == lib_pid
    for u in KEEP:
        assert u not in out["stopped_services"], out


def test_apt_get_remove_is_rolled_back(rig):
    sh(rig, f"apt-get install -y --no-install-recommends {DEBS}/*.deb")
    assert active(rig, "cron.service") == "active"
    with_cron = checkpoint(rig, "with-cron")
    before = pids(rig)
    sh(rig, "apt-get remove -y cron")
    assert not exists(rig, "/usr/sbin/cron")
    assert active(rig, "cron.service") != "active"

    out = restore(rig, with_cron)
    assert exists(rig, "/usr/sbin/cron")
    assert "cron.service" in out["started_services"], out
    assert sh(rig, "dpkg -s cron").stdout.count("Status: install ok installed") == 1
    verify = sh(rig, "dpkg --verify cron", check=False)
    assert verify.returncode == 0 and verify.stdout.strip() == "", verify.stdout
    assert sh(rig, "dpkg --audit").stdout.strip() == ""
    assert active(rig, "cron.service") == "active"
    assert pids(rig) == before
    # back to the clean state for the next tests
    out = restore(rig, rig.clean)
    assert not exists(rig, "/usr/sbin/cron")


def wheel_bytes(name, version):
    """A minimal pure-Python wheel (PEP 427), built here: no network, no build tools."""
    dist = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": f"VERSION = {version!r}\n",
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: ckptd-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for path, text in files.items():
        data = text.encode()
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append(f"{dist}/RECORD,,")
    files[f"{dist}/RECORD"] = "\n".join(record) + "\n"
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for path, text in files.items():
            z.writestr(path, text)
    return buf.getvalue()


def pip_list(rig, pip):
    out = sh(rig, f"{pip} list --format=json --disable-pip-version-check").stdout
    return sorted((p["name"], p["version"]) for p in json.loads(out))


def test_pip_install_is_rolled_back(rig):
    whl = "ckptd_wr_demo-1.0-py3-none-any.whl"
    (rig.srv / whl).write_bytes(wheel_bytes("ckptd_wr_demo", "1.0"))
    sh(rig, "python3 -m venv /opt/wr-venv")
    venv_before = pip_list(rig, "/opt/wr-venv/bin/pip")
    sys_before = pip_list(rig, "python3 -m pip")
    cid = checkpoint(rig, "before-pip")

    sh(rig, f"/opt/wr-venv/bin/pip install --no-index --disable-pip-version-check /srv/{whl}")
    sh(rig, f"python3 -m pip install --no-index --break-system-packages --disable-pip-version-check /srv/{whl}")
    assert ("ckptd_wr_demo", "1.0") in pip_list(rig, "/opt/wr-venv/bin/pip")
    assert ("ckptd_wr_demo", "1.0") in pip_list(rig, "python3 -m pip")
    assert sh(rig, "cd / && python3 -c 'import ckptd_wr_demo'", check=False).returncode == 0

    restore(rig, cid)
    assert pip_list(rig, "/opt/wr-venv/bin/pip") == venv_before
    assert pip_list(rig, "python3 -m pip") == sys_before
    assert sh(rig, "cd / && python3 -c 'import ckptd_wr_demo'", check=False).returncode != 0
    assert not exists(rig, "/usr/local/lib/python3.11/dist-packages/ckptd_wr_demo")


def mapped_inode(rig, pid, path, timeout=30):
    """The inode pid maps path from, and whether the kernel marks it deleted;
    waits for the mapping (a Type=simple unit is started once forked)."""
    deadline = time.monotonic() + timeout
    while True:
        for line in rig.sh("cat", f"/proc/{pid}/maps").stdout.splitlines():
            f = line.split(None, 5)
            if len(f) == 6 and f[5].startswith(path):
                return int(f[4]), f[5].endswith("(deleted)")
        if time.monotonic() > deadline:
            raise AssertionError(f"pid {pid} does not map {path}")
        time.sleep(0.05)


def test_library_upgrade_rolled_back_restarts_the_unit_that_maps_it(rig):
    cid = checkpoint(rig, "lib-v1")
    v1 = rig.sh("sha256sum", LIB).stdout.split()[0]
    # An upgrade as dpkg makes it (a new file renamed over the old), and
    # the restart its package would ask for: the unit maps the new one.
    rig.sh("sh", "-c", f"cp {LIB_V2} {LIB}.dpkg-new && mv {LIB}.dpkg-new {LIB}")
    rig.systemctl("restart", "libuser.service")
    pid = main_pid(rig, "libuser.service")
    assert mapped_inode(rig, pid, LIB)[1] is False
    before = pids(rig)

    out = restore(rig, cid)
    assert "libuser.service" in out["stopped_services"], out
    assert "libuser.service" in out["started_services"], out
    assert rig.sh("sha256sum", LIB).stdout.split()[0] == v1
    new = main_pid(rig, "libuser.service")
    assert new != pid
    ino, deleted = mapped_inode(rig, new, LIB)
    assert not deleted
    assert ino == int(rig.sh("stat", "-c", "%i", LIB).stdout)
    assert pids(rig) == before


def test_a_restore_that_replaces_ckptd_itself_says_a_restart_is_due(rig):
    cid = checkpoint(rig, "ckptd-as-is")
    # A new ckptd binary (the same bytes, a new inode), running.
    rig.sh("sh", "-c", "cp /usr/bin/ckptd /usr/bin/ckptd.new && mv /usr/bin/ckptd.new /usr/bin/ckptd")
    rig.systemctl("restart", "ckptd.service")
    out = restore(rig, cid)
    assert not any(u.startswith("ckptd") for u in out["stopped_services"]), out
    assert active(rig, "ckptd.service") == "active"
    h = api(rig, "GET", "/v1/health").json()
    assert h["restart_due"] is True, h
    assert "ckptd" in h["restart_due_reason"]


def test_capabilities_modes_owners_and_times_come_back(rig):
    tool = "/usr/local/bin/wr-tool"
    rig.sh("sh", "-c", f"cp /usr/bin/true {tool} && chown 1:2 {tool} && chmod 0750 {tool} && "
           f"setcap cap_net_bind_service+ep {tool} && touch -m -d '2020-01-02 03:04:05' {tool}")
    want = rig.sh("stat", "-c", "%a %u %g %Y %s", tool).stdout
    cid = checkpoint(rig, "caps")
    rig.sh("sh", "-c", f"echo changed > {tool} && chmod 0755 {tool} && chown 0:0 {tool}")
    assert "cap_net_bind_service" not in rig.sh("getcap", tool).stdout
    restore(rig, cid)
    assert rig.sh("stat", "-c", "%a %u %g %Y %s", tool).stdout == want
    assert "cap_net_bind_service=ep" in rig.sh("getcap", tool).stdout


def test_a_program_holding_a_replaced_file_keeps_its_inode(rig):
    """The restore renames the checkpoint's file over the live one, as dpkg
    does: a process that has the live one open keeps reading what it had
    (a rewrite in place would change the bytes under it)."""
    path = "/usr/local/share/wr-held.txt"
    rig.sh("sh", "-c", f"mkdir -p /usr/local/share && echo v1 > {path}")
    cid = checkpoint(rig, "held-v1")
    rig.sh("sh", "-c", f"echo v2 > {path}.new && mv {path}.new {path}")
    # A scope is never stopped: its process lives through the restore.
    rig.sh("sh", "-c", "systemd-run --scope --unit=wr-held.scope /usr/bin/python3 -c "
           f"\"import time; f = open('{path}'); time.sleep(1e6)\" </dev/null >/dev/null 2>&1 &")
    deadline = time.monotonic() + 20
    pid = None
    while pid is None and time.monotonic() < deadline:
        procs = rig.sh("cat", "/sys/fs/cgroup/system.slice/wr-held.scope/cgroup.procs", check=False).stdout.split()
        for p in procs:
            fds = rig.sh("sh", "-c", f"ls -l /proc/{p}/fd", check=False).stdout
            if path in fds:
                pid = p
        time.sleep(0.05)
    assert pid, "the holder never opened the file"
    held_ino = int(rig.sh("stat", "-c", "%i", path).stdout)
    restore(rig, cid)
    assert rig.sh("cat", path).stdout == "v1\n"
    assert int(rig.sh("stat", "-c", "%i", path).stdout) != held_ino
    fd_target = rig.sh("sh", "-c", f"for f in /proc/{pid}/fd/*; do readlink $f; done").stdout
    assert f"{path} (deleted)" in fd_target, fd_target
    assert rig.sh("sh", "-c", f"cat /proc/{pid}/fd/3").stdout == "v2\n"
    rig.sh("systemctl", "stop", "wr-held.scope", check=False)


# A package as dpkg leaves one on disk: its unit file, its daemon, its
# config, and the .list that names them (bookworm's lists say /lib for what
# merged /usr keeps under /usr/lib). The daemon reads its config once at
# start and closes it: no scan of /proc can tell that it uses it.
WRPKG_D = """\
import os, time
with open("/etc/wrpkg/wrpkg.conf") as f:
    conf = f.read()
with open("/run/wrpkg.seen.tmp", "w") as f:
    f.write(f"{os.getpid()}:{conf}")
os.rename("/run/wrpkg.seen.tmp", "/run/wrpkg.seen")
time.sleep(1e6)
"""
WRPKG_UNIT = """[Unit]
Description=rig unit of a package, reading its config once at start
[Service]
ExecStart=/usr/bin/python3 /usr/lib/wrpkg/wrpkgd.py
ExecStop=/bin/sleep 3
"""
WRPKG_LIST = "".join(f"{p}\n" for p in (
    "/.", "/etc", "/etc/wrpkg", "/etc/wrpkg/wrpkg.conf", "/lib", "/lib/systemd", "/lib/systemd/system",
    "/lib/systemd/system/wrpkg.service", "/usr", "/usr/lib", "/usr/lib/wrpkg", "/usr/lib/wrpkg/wrpkgd.py"))
IDLE_UNIT = "[Unit]\nDescription=idle {}\n[Service]\nExecStart=/bin/true\n"


def put(rig, path, text):
    rig.sh("sh", "-c", f"mkdir -p $(dirname {path}) && cat > {path}.new && mv {path}.new {path}", input=text)


def wrpkg_seen(rig, not_pid=None, timeout=30):
    """(pid, config) the running wrpkg daemon read at its start."""
    deadline = time.monotonic() + timeout
    while True:
        text = rig.sh("cat", "/run/wrpkg.seen", check=False).stdout
        pid = main_pid(rig, "wrpkg.service")
        if ":" in text and text.split(":", 1)[0] == str(pid) and pid not in (0, not_pid):
            return pid, text.split(":", 1)[1]
        if time.monotonic() > deadline:
            raise AssertionError(f"wrpkg never said what it read (seen {text!r}, MainPID {pid})")
        time.sleep(0.05)


@pytest.fixture(scope="module")
def wrpkg(rig):
    put(rig, "/usr/lib/systemd/system/wrpkg.service", WRPKG_UNIT)
    put(rig, "/usr/lib/wrpkg/wrpkgd.py", WRPKG_D)
    put(rig, "/etc/wrpkg/wrpkg.conf", "v1\n")
    put(rig, "/var/lib/dpkg/info/wrpkg.list", WRPKG_LIST)
    put(rig, "/var/lib/dpkg/info/wrpkg.conffiles", "/etc/wrpkg/wrpkg.conf\n")
    put(rig, "/etc/systemd/system/wr-idle.service", IDLE_UNIT.format("v1"))
    rig.systemctl("daemon-reload")
    rig.systemctl("start", "wrpkg.service")
    assert wrpkg_seen(rig)[1] == "v1\n"
    return rig


def test_a_restore_of_a_package_config_restarts_that_unit_only(wrpkg):
    rig = wrpkg
    cid = checkpoint(rig, "wrpkg-v1")
    before = pids(rig)
    lib_pid = main_pid(rig, "libuser.service")
    pid, _ = wrpkg_seen(rig)
    rig.sh("sh", "-c", "echo v2 > /etc/wrpkg/wrpkg.conf")

    out = restore(rig, cid)
    assert "wrpkg.service" in out["stopped_services"], out
    assert "wrpkg.service" in out["started_services"], out
    assert out["failed_services"] == [], out
    assert rig.sh("cat", "/etc/wrpkg/wrpkg.conf").stdout == "v1\n"
    new, conf = wrpkg_seen(rig, not_pid=pid)
    assert new != pid and conf == "v1\n"
    # the units that own nothing the restore changed kept their processes
    assert pids(rig) == before
    assert main_pid(rig, "libuser.service") == lib_pid
    assert "libuser.service" not in out["stopped_services"], out


def test_a_restore_killed_mid_way_is_finished_at_start_with_its_services_step(wrpkg):
    """ckptd killed while it stops wrpkg around the swap (its ExecStop takes
    3 s), after the restore's intent is written: the next start finishes the
    restore and runs the services step it owed: daemon-reload (a unit file
    changed), the restart of the unit that maps a library the restore
    replaced, and the start of wrpkg on its restored config."""
    rig = wrpkg
    cid = checkpoint(rig, "before-kill")
    v1 = rig.sh("sha256sum", LIB).stdout.split()[0]
    rig.sh("sh", "-c", "echo v3 > /etc/wrpkg/wrpkg.conf")
    rig.sh("sh", "-c", f"cp {LIB_V2} {LIB}.dpkg-new && mv {LIB}.dpkg-new {LIB}")
    rig.systemctl("restart", "libuser.service")
    put(rig, "/etc/systemd/system/wr-idle.service", IDLE_UNIT.format("v2"))
    rig.systemctl("daemon-reload")
    lib_pid = main_pid(rig, "libuser.service")
    assert mapped_inode(rig, lib_pid, LIB)[1] is False
    wr_pid, _ = wrpkg_seen(rig)
    before = pids(rig)

    done = {}

    def go():
        try:
            done["r"] = api(rig, "POST", f"/v1/checkpoints/{cid}/restore", json={}, timeout=SLOW)
        except Exception as e:  # the kill cuts the connection
            done["e"] = e
    t = threading.Thread(target=go)
    t.start()
    deadline = time.monotonic() + SLOW
    while active(rig, "wrpkg.service") != "deactivating":
        assert t.is_alive() and time.monotonic() < deadline, f"wrpkg was never stopped: {done}"
        time.sleep(0.02)
    old = main_pid(rig, "ckptd.service")
    rig.sh("kill", "-9", str(old))
    t.join(60)
    assert "r" not in done, "the restore answered before the kill"
    assert rig.sh("test", "-e", JOURNAL, check=False).returncode == 0, "no record of what the restore owed"

    killed = time.monotonic()
    deadline = killed + SLOW
    while not (main_pid(rig, "ckptd.service") not in (0, old) and active(rig, "ckptd.service") == "active"):
        assert time.monotonic() < deadline, rig.journal("ckptd.service", lines=80)
        time.sleep(0.5)
    print(f"rig whole: ckptd ready {time.monotonic() - killed:.1f} s after the kill")
    deadline = time.monotonic() + 120
    while rig.sh("test", "-e", JOURNAL, check=False).returncode == 0:
        assert time.monotonic() < deadline, "the owed services step never finished"
        time.sleep(0.2)
    # the restore was finished
    assert rig.sh("cat", "/etc/wrpkg/wrpkg.conf").stdout == "v1\n"
    assert rig.sh("sha256sum", LIB).stdout.split()[0] == v1
    # and its services step ran: wrpkg on its restored config ...
    assert active(rig, "wrpkg.service") == "active"
    new, conf = wrpkg_seen(rig, not_pid=wr_pid)
    assert conf == "v1\n"
    # ... libuser restarted onto the restored library ...
    new_lib = main_pid(rig, "libuser.service")
    assert new_lib not in (0, lib_pid)
    ino, deleted = mapped_inode(rig, new_lib, LIB)
    assert not deleted and ino == int(rig.sh("stat", "-c", "%i", LIB).stdout)
    # ... and systemd reads the restored unit file
    idle = rig.show("wr-idle.service", "Description", "NeedDaemonReload")
    assert idle == {"Description": "idle v1", "NeedDaemonReload": "no"}, idle
    assert pids(rig) == before
    log = rig.journal("ckptd.service", lines=500)
    assert f'restore of "{cid}" was interrupted by a crash' in log, log[-2000:]
