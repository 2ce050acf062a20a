"""Processes that use a root before ckptd mounts over it: found by device and
inode (their cwd reads the same path as the mount), named in health and in
`ckpt status` as unmanaged users. No systemd here: the rig tests the units."""
import subprocess
import sys
import time

from conftest import CKPT
from test_overlay import overlay_daemon


def wait_users(d, cond, timeout=60):
    """health's unmanaged_users (pid -> entry) once cond holds of them: health
    rescans the processes when its cache expires, a few seconds."""
    deadline = time.monotonic() + timeout
    while True:
        users = {u["pid"]: u for u in d.health()["unmanaged_users"]}
        if cond(users):
            return users
        assert time.monotonic() < deadline, users
        time.sleep(0.2)


def test_process_started_before_ckptd_is_reported(daemon_factory):
    d = daemon_factory(backend="overlay", start=False)
    root = d.roots[0]
    (root / "sub").mkdir()
    (root / "sub" / "held.txt").write_text("before\n")
    # cwd on a directory below the root, one file open: after the mount both
    # paths read like the overlay's, but they are the hidden directory.
    p = subprocess.Popen([sys.executable, "-c",
                          "import sys,time; f=open('held.txt'); print('up', flush=True); time.sleep(120)"],
                         cwd=root / "sub", stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "up"
        d.start()
        h = d.health()
        users = {u["pid"]: u for u in h["unmanaged_users"]}
        assert p.pid in users, h
        assert users[p.pid]["hidden"] is True
        assert users[p.pid]["command"].startswith("python")
        out = subprocess.run([CKPT, "--url", d.url, "status"], capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        assert f"process {p.pid} (" in out.stdout and "hidden under the mount" in out.stdout
        # The same path, through the mount, is another directory: a process
        # started now is inside the managed root, not on the hidden one.
        q = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], cwd=root / "sub")
        try:
            users = wait_users(d, lambda users: q.pid in users)  # once health's cache expires
            assert users[q.pid]["hidden"] is False
            assert users[p.pid]["hidden"] is True
        finally:
            q.kill()
            q.wait()
    finally:
        p.kill()
        p.wait()
    wait_users(d, lambda users: p.pid not in users)


def test_no_users_no_warning(daemon_factory):
    d = overlay_daemon(daemon_factory, tree=False)
    h = d.health()
    assert h["unmanaged_users"] == []
    assert "adoption" in h and h["adoption"]["mounted"] == [str(d.roots[0])]
    assert h["adoption"]["restarted_units"] == []
