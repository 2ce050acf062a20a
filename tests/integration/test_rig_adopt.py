"""Units already running when ckptd first mounts a root (issue 11 item 2),
under a real systemd (tests/rig): they are stopped, the root is mounted, they
are started again on it, so checkpoints capture their writes and restores
change what they see. A unit ordered After=/Requires=ckptd.service (the
drop-in of docs/operations.md) starts only once the root is mounted."""
import pathlib
import sys
import time

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "rig"))
from samples import active, api, main_pid, web_get, write_in  # noqa: E402
import samples  # noqa: E402

LATE = """[Unit]
Description=rig unit ordered after ckptd by the drop-in of docs/operations.md
[Service]
WorkingDirectory=/srv/app
ExecStart=/usr/bin/python3 -c 'import time; time.sleep(1e6)'
"""
DROP_IN = """[Unit]
After=ckptd.service
Requires=ckptd.service
"""


@pytest.fixture(scope="module")
def rig():
    r = samples.sample_rig()
    r.units["late.service"] = LATE
    r.units["late.service.d/ckptd.conf"] = DROP_IN
    with r:
        yield r


def dev_of(rig, path):
    return rig.sh("stat", "-L", "-c", "%d", path).stdout.strip()


def hidden_log(rig):
    """worker.log in the directory ckptd mounted over (its read-only bind)."""
    out = rig.sh("sh", "-c", "cat /var/lib/ckptd/overlay/r/*/base/worker.log").stdout
    return out.count("\n")


def wait_adopted(rig, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r = api(rig, "GET", "/v1/health") if active(rig, "ckptd.service") == "active" else None
        if r is not None and r.status_code == 200 and "at" in r.json().get("adoption", {}):
            return r.json()
        time.sleep(0.2)
    raise AssertionError("no adoption in health:\n" + rig.journal("ckptd.service"))


def test_units_running_before_ckptd_are_restarted_on_the_mount(rig):
    rig.systemctl("start", "web.service", "worker.service", "bystander.service")
    assert web_get(rig, "/index.html").text == "v1\n"
    before = {u: main_pid(rig, u) for u in ("web.service", "worker.service", "bystander.service")}
    plain_dev = dev_of(rig, "/srv/app")
    assert dev_of(rig, f"/proc/{before['web.service']}/cwd") == plain_dev
    # The drop-in pulls ckptd in and orders late.service after its READY.
    rig.systemctl("start", "late.service")
    h = wait_adopted(rig)
    mounted_dev = dev_of(rig, "/srv/app")
    assert mounted_dev != plain_dev, "ckptd did not mount over /srv/app"
    a = h["adoption"]
    assert a["mounted"] == ["/srv/app"]
    assert sorted(a["stopped_units"]) == ["web.service", "worker.service"], a
    assert sorted(a["restarted_units"]) == ["web.service", "worker.service"], a
    assert a["failures"] == {}, a
    for u in ("web.service", "worker.service"):
        assert active(rig, u) == "active"
        pid = main_pid(rig, u)
        assert pid != before[u], f"{u} was not restarted"
    assert main_pid(rig, "bystander.service") == before["bystander.service"]
    # Restarted and late units work on the mounted root, not the hidden one.
    for u in ("web.service", "late.service"):
        assert dev_of(rig, f"/proc/{main_pid(rig, u)}/cwd") == mounted_dev, u
    late_start = int(rig.show("late.service", "ExecMainStartTimestampMonotonic")["ExecMainStartTimestampMonotonic"])
    ckptd_ready = int(rig.show("ckptd.service", "ActiveEnterTimestampMonotonic")["ActiveEnterTimestampMonotonic"])
    assert late_start >= ckptd_ready
    assert h["unmanaged_users"] == [], h["unmanaged_users"]


def log_lines(rig):
    return int(rig.sh("wc", "-l", "/srv/app/worker.log").stdout.split()[0])


def wait_log_grows(rig, n0, why, timeout=30):
    """The worker's log grows past n0 lines (it writes every few tenths of a
    second): waited for with a deadline, not slept on."""
    deadline = time.monotonic() + timeout
    while log_lines(rig) <= n0:
        assert time.monotonic() < deadline, why
        time.sleep(0.1)


def test_checkpoint_captures_the_restarted_units_writes(rig):
    hidden = hidden_log(rig)
    n0 = log_lines(rig)
    wait_log_grows(rig, n0, "the worker does not write into the mounted root")
    assert hidden_log(rig) == hidden, "the worker still writes to the hidden directory"
    cp = api(rig, "POST", "/v1/checkpoints", json={"name": "adopted"})
    assert cp.status_code == 201, cp.text
    cp = cp.json()
    assert cp["size_bytes"] > 0, cp
    rig.first = cp["checkpoint_id"]


def test_restore_changes_what_the_restarted_units_see(rig):
    write_in(rig, "/srv/app/www/index.html", "v2\n")
    rig.sh("sh", "-c", "echo AFTER-CHECKPOINT >> /srv/app/worker.log")
    assert web_get(rig, "/index.html").text == "v2\n"
    r = api(rig, "POST", f"/v1/checkpoints/{rig.first}/restore", json={})
    assert r.status_code == 200, r.text
    rep = r.json()
    assert rep["ok"] is True, rep
    assert sorted(rep["stopped_services"]) == ["late.service", "web.service", "worker.service"], rep
    assert web_get(rig, "/index.html").text == "v1\n"
    log = rig.sh("cat", "/srv/app/worker.log").stdout
    assert "AFTER-CHECKPOINT" not in log and log.count("\n") > 0


def test_release_restarts_the_units_on_the_plain_directory(rig):
    """Issue 11 item 3 under real systemd: the units using the root are stopped
    around the release and started again on the plain directory, which holds
    what they wrote through the mount."""
    write_in(rig, "/srv/app/www/index.html", "v3\n")
    r = api(rig, "POST", "/v1/roots/release", json={})
    assert r.status_code == 200, r.text
    rep = r.json()
    assert rep["released"] == ["/srv/app"], rep
    assert rep["checkpoints_kept"] is True and rep["dropped_checkpoints"] == [], rep
    assert sorted(rep["stopped_units"]) == ["late.service", "web.service", "worker.service"], rep
    assert sorted(rep["started_units"]) == sorted(rep["stopped_units"]), rep
    assert rig.sh("findmnt", "-n", "/srv/app", check=False).stdout.strip() == ""
    plain = dev_of(rig, "/srv/app")
    for u in ("web.service", "worker.service", "late.service"):
        assert active(rig, u) == "active", u
    for u in ("web.service", "late.service"):  # the worker only holds its log open: checked below
        assert dev_of(rig, f"/proc/{main_pid(rig, u)}/cwd") == plain, u
    assert web_get(rig, "/index.html").text == "v3\n"
    wait_log_grows(rig, log_lines(rig), "the worker stopped writing into the released root")
    assert api(rig, "GET", "/v1/health").json()["released_roots"] == ["/srv/app"]


def test_checkpoint_kept_by_the_release_restores_after_ckptd_restarts(rig):
    """The checkpoint from before the release lies on the directory the
    release replaced: after ckptd restarts (adopting the plain directory,
    units around it) it restores what the units saw then, not v3."""
    rig.systemctl("restart", "ckptd.service")
    wait_adopted(rig)
    assert rig.sh("findmnt", "-n", "/srv/app", check=False).stdout.strip() != ""
    assert web_get(rig, "/index.html").text == "v3\n"
    r = api(rig, "POST", f"/v1/checkpoints/{rig.first}/restore", json={})
    assert r.status_code == 200, r.text
    assert r.json()["ok"] is True, r.json()
    assert web_get(rig, "/index.html").text == "v1\n"
    log = rig.sh("cat", "/srv/app/worker.log").stdout
    assert "AFTER-CHECKPOINT" not in log
