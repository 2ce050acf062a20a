"""ckptd under a real systemd (booted in systemd-nspawn by tests/rig/rig.py):
restores stop and start the units that use the managed root, creates freeze
them, a unit that cannot start again is reported, socket activation,
Type=notify readiness and the watchdog.

One container is booted for the whole module; the tests run in file order and
build on each other's state (a sequence, as a user would drive it)."""
import json
import pathlib
import sys
import time

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "rig"))
from samples import active, api, main_pid, web_get, write_in  # noqa: E402
import samples  # noqa: E402


@pytest.fixture(scope="module")
def rig():
    with samples.sample_rig() as r:
        yield r


def test_ready_only_after_listener_is_up(rig):
    rig.systemctl("start", "ckptd.socket")
    rig.systemctl("start", "ckptd.service")
    # Type=notify: `systemctl start` returned, so READY=1 was sent, so the
    # API must answer now, without any retry.
    h = api(rig, "GET", "/v1/health")
    assert h.status_code == 200, h.text
    h = h.json()
    assert h["services"] == "available", h
    assert h["backend"] == "overlay"
    p = rig.show("ckptd.service", "Type", "ActiveState", "SubState", "StatusText", "NotifyAccess",
                 "WatchdogUSec", "NRestarts")
    assert p["Type"] == "notify"
    assert (p["ActiveState"], p["SubState"]) == ("active", "running")
    assert p["NotifyAccess"] == "main"
    assert p["StatusText"], "ckptd sent no STATUS= line"
    assert p["WatchdogUSec"] == "2s"
    rig.systemctl("start", "web.service", "worker.service", "bystander.service")
    assert web_get(rig, "/index.html").text == "v1\n"
    # A scope (as a login session would be) using the root: never stopped.
    rig.sh("sh", "-c", "systemd-run --scope --unit=rig-user.scope /usr/bin/python3 -c "
           "\"import os, time; os.chdir('/srv/app'); time.sleep(1e6)\" </dev/null >/dev/null 2>&1 &")
    deadline = time.monotonic() + 10
    while active(rig, "rig-user.scope") != "active" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert active(rig, "rig-user.scope") == "active"
    pid = rig.sh("cat", "/sys/fs/cgroup/system.slice/rig-user.scope/cgroup.procs").stdout.split()[0]
    deadline = time.monotonic() + 10
    while rig.sh("readlink", f"/proc/{pid}/cwd").stdout.strip() != "/srv/app" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert rig.sh("readlink", f"/proc/{pid}/cwd").stdout.strip() == "/srv/app"


def test_create_freezes_the_managed_units(rig):
    cp = api(rig, "POST", "/v1/checkpoints", json={"name": "first"})
    assert cp.status_code == 201, cp.text
    cp = cp.json()
    rig.first = cp["checkpoint_id"]
    # The container runs the unified cgroup hierarchy, where systemd can freeze.
    assert sorted(cp["frozen_services"]) == ["web.service", "worker.service"], cp
    for u in ("web.service", "worker.service"):
        assert rig.show(u, "FreezerState")["FreezerState"] == "running", "left frozen"
    assert active(rig, "bystander.service") == "active"


def test_dry_run_lists_the_units_a_restore_would_stop_and_touches_none(rig):
    """The live diff carries the services plan, computed and not executed; the
    CLI's restore --dry-run prints it."""
    import subprocess
    from conftest import CKPT
    write_in(rig, "/srv/app/www/dry.txt", "changed\n")
    before = {u: main_pid(rig, u) for u in ("web.service", "worker.service")}
    r = api(rig, "GET", f"/v1/checkpoints/{rig.first}/diff")
    assert r.status_code == 200, r.text
    assert sorted(r.json()["services"]) == ["web.service", "worker.service"], r.json()
    assert r.json()["services_available"] is True
    p = subprocess.run([CKPT, "--url", rig.api, "restore", "--dry-run", rig.first],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    units = p.stdout.split("Units the restore would stop, then start again:\n")[1].split()
    assert sorted(units) == ["web.service", "worker.service"], p.stdout
    assert "/srv/app/www/dry.txt" in p.stdout
    for u in ("web.service", "worker.service"):  # nothing was stopped
        assert active(rig, u) == "active" and main_pid(rig, u) == before[u]
    # against another checkpoint nothing is restored: no plan
    other = api(rig, "GET", f"/v1/checkpoints/{rig.first}/diff", params={"against": rig.first}).json()
    assert "services" not in other
    rig.sh("rm", "/srv/app/www/dry.txt")


def test_restore_stops_starts_and_serves_restored_content(rig):
    write_in(rig, "/srv/app/www/index.html", "v2\n")
    write_in(rig, "/srv/app/www/new.txt", "added after the checkpoint\n")
    assert web_get(rig, "/index.html").text == "v2\n"
    before = {u: main_pid(rig, u) for u in ("web.service", "worker.service", "bystander.service")}
    r = api(rig, "POST", f"/v1/checkpoints/{rig.first}/restore", json={})
    assert r.status_code == 200, r.text
    rep = r.json()
    assert rep["ok"] is True, rep
    assert rep["services"] == "ok"
    assert sorted(rep["stopped_services"]) == ["web.service", "worker.service"], rep
    assert sorted(rep["started_services"]) == ["web.service", "worker.service"], rep
    assert rep["failed_services"] == [] and rep["failures"] == {}, rep
    assert set(rep["phases"]) == {"queue_ms", "stop_ms", "swap_ms", "start_ms"}
    assert rep["restore_duration_ms"] >= sum(rep["phases"].values()) - 2
    for u in ("web.service", "worker.service"):
        assert active(rig, u) == "active"
        pid = main_pid(rig, u)
        assert pid and pid != before[u], f"{u} was not restarted"
    assert main_pid(rig, "bystander.service") == before["bystander.service"]
    assert active(rig, "rig-user.scope") == "active"
    # The restarted web app sees the overlay ckptd mounted: the restored files.
    assert web_get(rig, "/index.html").text == "v1\n"
    assert web_get(rig, "/new.txt").status_code == 404


def test_overlay_mount_is_shared_with_the_units(rig):
    ckptd_ns = rig.sh("readlink", f"/proc/{main_pid(rig, 'ckptd.service')}/ns/mnt").stdout
    web_ns = rig.sh("readlink", f"/proc/{main_pid(rig, 'web.service')}/ns/mnt").stdout
    assert ckptd_ns == web_ns, "ckptd runs in a mount namespace of its own"
    fstype = rig.sh("findmnt", "-n", "-o", "FSTYPE", "/srv/app").stdout.split()
    assert fstype[-1] == "overlay"


def test_unit_that_cannot_start_again_is_failed(rig):
    cp = api(rig, "POST", "/v1/checkpoints", json={"name": "before-fragile"}).json()
    rig.sh("touch", "/srv/app/fragile.ok")
    rig.systemctl("start", "fragile.service")
    assert active(rig, "fragile.service") == "active"
    r = api(rig, "POST", f"/v1/checkpoints/{cp['checkpoint_id']}/restore", json={})
    assert r.status_code == 200, r.text
    rep = r.json()
    assert rep["ok"] is False, rep
    assert sorted(rep["stopped_services"]) == ["fragile.service", "web.service", "worker.service"], rep
    assert sorted(rep["started_services"]) == ["web.service", "worker.service"], rep
    assert rep["failed_services"] == ["fragile.service"], rep
    assert "failed" in rep["failures"]["fragile.service"], rep
    assert active(rig, "fragile.service") == "failed"
    assert web_get(rig, "/index.html").text == "v1\n"


def test_socket_activation(rig):
    rig.systemctl("stop", "ckptd.service")
    assert active(rig, "ckptd.service") == "inactive"
    assert active(rig, "ckptd.socket") == "active"
    out = rig.sh("curl", "-sS", "--max-time", "20", "--unix-socket", "/run/ckptd/ckptd.sock",
                 "http://ckptd/v1/health").stdout
    assert json.loads(out)["status"] == "ok"
    assert active(rig, "ckptd.service") == "active"
    # Started by the socket, it still serves its TCP listener and its state.
    names = [c["name"] for c in api(rig, "GET", "/v1/checkpoints").json()["checkpoints"]]
    assert sorted(names) == ["before-fragile", "first"]


def test_watchdog_is_petted(rig):
    first = rig.show("ckptd.service", "WatchdogTimestampMonotonic")["WatchdogTimestampMonotonic"]
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        now = rig.show("ckptd.service", "WatchdogTimestampMonotonic")["WatchdogTimestampMonotonic"]
        if now != first:
            break
        time.sleep(0.2)
    else:
        pytest.fail("no WATCHDOG=1 within 5 s (WatchdogSec=2s)")
    assert rig.show("ckptd.service", "NRestarts")["NRestarts"] == "0"


def test_journal_keeps_log_priorities(rig):
    out = rig.sh("journalctl", "--no-pager", "-u", "ckptd.service", "-o", "json").stdout
    entries = [json.loads(line) for line in out.splitlines() if line.strip()]
    ours = [e for e in entries if e.get("_PID") and e.get("SYSLOG_IDENTIFIER") == "ckptd"]
    assert ours, "no ckptd log lines in the journal"
    assert not any(str(e.get("MESSAGE", "")).startswith("<") for e in ours), "priority prefix not parsed"
    assert {e["PRIORITY"] for e in ours} & {"5", "4", "3"}, "every line at the default priority"
    # Operations carry structured fields that journalctl can select on.
    ops = {}
    for e in ours:
        if "OPERATION" in e:
            ops.setdefault(e["OPERATION"], []).append(e)
    assert {"create", "restore"} <= set(ops), sorted(ops)
    for e in ops["create"] + ops["restore"]:
        assert e["CHECKPOINT_ID"].startswith("cp_") and e["CHECKPOINT_ID"] in e["MESSAGE"]
    assert any(int(e.get("DURATION_MS", -1)) >= 0 for e in ops["restore"])
    sel = rig.sh("journalctl", "--no-pager", "-u", "ckptd.service", "-o", "json", "OPERATION=restore").stdout
    assert sel.strip() and all(json.loads(line)["OPERATION"] == "restore" for line in sel.splitlines())
