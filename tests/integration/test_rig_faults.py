"""Restores whose services do not behave, under a real systemd (the rig):

- a unit bound to a managed one (BindsTo=) goes down with it: reported in
  stopped_services and started again;
- a unit that ignores SIGTERM and survives ckptd's SIGKILL (its process is
  stuck in the kernel: the test pins it in a frozen cgroup v1 freezer on the
  host, where SIGKILL cannot end it, as a process in uninterruptible sleep)
  fails the restore: ok false, the roots not swapped, the other units started
  again;
- a unit that fails to start after the restore: ok false with its reason,
  which `ckpt restore` prints too;
- a unit whose ExecStop= fails ends `failed`: not in stopped_services but in
  failed_services with its Result, started again after the swap, ok false;
  when it also leaves a process in its cgroup, nothing is swapped;
- the journal has a line per freeze, stop and start, with its duration.

One container for the module; the tests run in file order."""
import json
import os
import pathlib
import sys
import time

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "rig"))
from samples import active, api, main_pid, wait_ignoring_sigterm, web_get, write_in  # noqa: E402
import samples  # noqa: E402

FREEZER = "/sys/fs/cgroup/freezer"


@pytest.fixture(scope="module")
def rig():
    with samples.sample_rig(service_timeout_secs=2) as r:
        r.systemctl("start", "ckptd.socket", "ckptd.service")
        r.systemctl("start", "web.service", "worker.service", "bound.service")
        yield r
        r.systemctl("kill", "--signal=KILL", "stubborn.service", check=False)


def host_pid(rig, pid):
    """The host's pid of a process the container knows as pid."""
    ns = os.readlink(f"/proc/{rig.pid}/ns/pid")
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            if os.readlink(f"/proc/{d}/ns/pid") != ns:
                continue
            for line in open(f"/proc/{d}/status"):
                if line.startswith("NSpid:") and line.split()[-1] == str(pid):
                    return int(d)
        except OSError:
            continue
    raise AssertionError(f"no host pid for container pid {pid}")


def wait_for(what, cond, timeout=20):
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.1)


def restore(rig, cp):
    r = api(rig, "POST", f"/v1/checkpoints/{cp}/restore", json={})
    assert r.status_code == 200, r.text
    return r.json()


def test_checkpoint(rig):
    cp = api(rig, "POST", "/v1/checkpoints", json={"name": "base"})
    assert cp.status_code == 201, cp.text
    rig.base = cp.json()["checkpoint_id"]
    assert sorted(cp.json()["frozen_services"]) == ["web.service", "worker.service"]


def test_unit_bound_to_a_managed_unit_is_reported_and_started_again(rig):
    write_in(rig, "/srv/app/www/index.html", "changed\n")
    before = main_pid(rig, "bound.service")
    rep = restore(rig, rig.base)
    assert rep["ok"] is True, rep
    assert sorted(rep["stopped_services"]) == ["bound.service", "web.service", "worker.service"], rep
    assert sorted(rep["started_services"]) == ["bound.service", "web.service", "worker.service"], rep
    assert rep["failed_services"] == [] and rep["failures"] == {}, rep
    assert active(rig, "bound.service") == "active"
    assert main_pid(rig, "bound.service") not in (0, before)
    assert active(rig, "bystander.service") == "inactive"  # never started, never touched
    assert web_get(rig, "/index.html").text == "v1\n"


def test_unit_surviving_sigkill_fails_the_restore(rig):
    rig.systemctl("start", "stubborn.service")
    wait_ignoring_sigterm(rig, "stubborn.service")
    wait_for("stubborn's cwd in the root", lambda: rig.sh(
        "readlink", f"/proc/{main_pid(rig, 'stubborn.service')}/cwd").stdout.strip() == "/srv/app")
    write_in(rig, "/srv/app/www/index.html", "v2\n")
    pids = {u: main_pid(rig, u) for u in ("web.service", "worker.service", "bound.service")}
    used = api(rig, "GET", f"/v1/checkpoints/{rig.base}").json()["last_used_at"]
    stuck = host_pid(rig, main_pid(rig, "stubborn.service"))
    cg = f"{FREEZER}/{rig.name}-stuck"
    os.mkdir(cg)
    try:
        with open(f"{cg}/cgroup.procs", "w") as f:
            f.write(str(stuck))
        with open(f"{cg}/freezer.state", "w") as f:
            f.write("FROZEN")
        wait_for("the freezer", lambda: open(f"{cg}/freezer.state").read().strip() == "FROZEN")
        rep = restore(rig, rig.base)
        # Still there: SIGKILL cannot end a task frozen by the v1 freezer.
        assert os.path.exists(f"/proc/{stuck}")
        assert rep["ok"] is False and rep["swapped"] is False, rep
        assert rep["failed_services"] == ["stubborn.service"], rep
        assert "SIGKILL" in rep["failures"]["stubborn.service"], rep
        assert list(rep["failures"]) == ["stubborn.service"], rep
        # service_timeout_secs 2, then SIGKILL and a grace period: at least
        # the timeout, and ended by ckptd, not by systemd's TimeoutStopSec=300
        assert 2000 <= rep["phases"]["stop_ms"] < 300_000, rep
        assert sorted(rep["stopped_services"]) == ["bound.service", "web.service", "worker.service"], rep
        assert sorted(rep["started_services"]) == ["bound.service", "web.service", "worker.service"], rep
        for u, pid in pids.items():
            assert active(rig, u) == "active", u
            assert main_pid(rig, u) != pid, f"{u} was not restarted"
        # Nothing swapped: the change made after the checkpoint is still there.
        assert web_get(rig, "/index.html").text == "v2\n"
        assert api(rig, "GET", f"/v1/checkpoints/{rig.base}").json()["last_used_at"] == used
    finally:
        with open(f"{cg}/freezer.state", "w") as f:
            f.write("THAWED")
    # Thawed, it dies of the SIGKILL it had pending.
    wait_for("stubborn to end", lambda: active(rig, "stubborn.service") in ("inactive", "failed"))
    os.rmdir(cg)
    rep = restore(rig, rig.base)
    assert rep["ok"] is True and rep["swapped"] is True, rep
    assert web_get(rig, "/index.html").text == "v1\n"


def test_unit_that_fails_to_start_after_the_restore(rig):
    rig.sh("touch", "/srv/app/fragile.ok")
    rig.systemctl("start", "fragile.service")
    rep = restore(rig, rig.base)  # the checkpoint has no fragile.ok
    assert rep["ok"] is False and rep["swapped"] is True, rep
    assert "fragile.service" in rep["stopped_services"], rep
    assert "fragile.service" not in rep["started_services"], rep
    assert rep["failed_services"] == ["fragile.service"], rep
    why = rep["failures"]["fragile.service"]
    assert "'failed'" in why and "exit-code" in why, why
    assert active(rig, "fragile.service") == "failed"
    assert sorted(rep["started_services"]) == ["bound.service", "web.service", "worker.service"], rep


def test_cli_prints_each_failure_with_its_reason(rig):
    rig.sh("touch", "/srv/app/fragile.ok")
    rig.systemctl("start", "fragile.service")
    out = rig.sh("ckpt", "--url", rig.api, "restore", rig.base, check=False)
    assert out.returncode == 1, out
    assert out.stdout.startswith("Restore finished with failures:"), out.stdout
    assert "Failed:         fragile.service\n" in out.stdout, out.stdout
    assert "Failure:        fragile.service: start job ended 'failed'" in out.stdout, out.stdout


def test_journal_has_each_freeze_stop_and_start(rig):
    out = rig.sh("journalctl", "--no-pager", "-u", "ckptd.service", "-o", "cat").stdout
    for line in ('froze "web.service" in ', 'thawed "web.service" in ', 'stopped "web.service" in ',
                 'stopped "bound.service" (with a managed unit) in ', 'started "bound.service" in ',
                 '"stubborn.service" did not stop in time: SIGKILL', '"fragile.service" did not start'):
        assert line in out, f"no log line with {line!r}:\n{out[-3000:]}"
    # Each with the journal fields OPERATION, UNIT and DURATION_MS.
    sel = rig.sh("journalctl", "--no-pager", "-u", "ckptd.service", "-o", "json", "OPERATION=stop",
                 "UNIT=bound.service").stdout
    entries = [json.loads(line) for line in sel.splitlines() if line.strip()]
    assert entries and all(int(e["DURATION_MS"]) >= 0 for e in entries), sel[-2000:]
    for op in ("freeze", "thaw", "start"):
        sel = rig.sh("journalctl", "--no-pager", "-u", "ckptd.service", "-o", "json", f"OPERATION={op}",
                     "UNIT=web.service").stdout
        assert sel.strip(), f"no {op} entry for web.service"


BADSTOP = """[Unit]
Description=rig unit whose ExecStop= fails
[Service]
WorkingDirectory=/srv/app
ExecStart={sleeper}
ExecStop=/bin/false
{extra}
"""


def install_unit(rig, name, text):
    rig.sh("tee", f"/etc/systemd/system/{name}", input=text)
    rig.systemctl("daemon-reload")
    rig.systemctl("start", name)


def remove_unit(rig, name):
    rig.systemctl("kill", "--signal=KILL", name, check=False)
    wait_for(f"{name} to end", lambda: active(rig, name) in ("inactive", "failed"))
    rig.systemctl("reset-failed", name, check=False)
    rig.sh("rm", "-f", f"/etc/systemd/system/{name}")
    rig.systemctl("daemon-reload")


def test_unit_whose_stop_fails_is_reported_failed_and_started_again(rig):
    """ExecStop=/bin/false: systemd then kills the rest and the unit ends
    `failed` (Result exit-code). Its cgroup is empty, so the swap goes on;
    the unit is reset and started again, yet the restore is not ok."""
    rig.sh("rm", "-f", "/srv/app/fragile.ok")
    rig.systemctl("stop", "fragile.service", check=False)
    rig.systemctl("reset-failed", "fragile.service", check=False)
    install_unit(rig, "badstop.service", BADSTOP.format(sleeper=samples.SLEEPER, extra=""))
    try:
        before = main_pid(rig, "badstop.service")
        write_in(rig, "/srv/app/www/index.html", "v3\n")
        rep = restore(rig, rig.base)
        assert rep["ok"] is False and rep["swapped"] is True, rep
        assert "badstop.service" not in rep["stopped_services"], rep
        assert rep["failed_services"] == ["badstop.service"], rep
        why = rep["failures"]["badstop.service"]
        assert "stop failed" in why and "exit-code" in why, why
        assert list(rep["failures"]) == ["badstop.service"], rep
        assert "badstop.service" in rep["started_services"], rep
        assert active(rig, "badstop.service") == "active"
        assert main_pid(rig, "badstop.service") not in (0, before)
        assert sorted(rep["stopped_services"]) == ["bound.service", "web.service", "worker.service"], rep
        assert web_get(rig, "/index.html").text == "v1\n"  # swapped
        out = rig.sh("journalctl", "--no-pager", "-u", "ckptd.service", "-o", "cat").stdout
        assert '"badstop.service" went down uncleanly' in out, out[-3000:]
    finally:
        remove_unit(rig, "badstop.service")


def test_unit_whose_stop_fails_and_leaves_a_process_blocks_the_swap(rig):
    """KillMode=process: after the failed ExecStop= systemd ends only the main
    process, and a child (cwd outside the root, so no /proc scan sees it)
    stays in the unit's cgroup. ckptd must not swap under it."""
    child = "/bin/sh -c '(cd / && exec sleep 1000000) & exec sleep 1000000'"
    install_unit(rig, "badstop.service", BADSTOP.format(sleeper=child, extra="KillMode=process"))
    try:
        write_in(rig, "/srv/app/www/index.html", "v4\n")
        rep = restore(rig, rig.base)
        assert rep["ok"] is False and rep["swapped"] is False, rep
        assert rep["failed_services"] == ["badstop.service"], rep
        why = rep["failures"]["badstop.service"]
        assert "stop failed" in why and "left in its cgroup" in why, why
        assert "badstop.service" not in rep["started_services"], rep
        assert sorted(rep["started_services"]) == ["bound.service", "web.service", "worker.service"], rep
        assert web_get(rig, "/index.html").text == "v4\n"  # not swapped
    finally:
        remove_unit(rig, "badstop.service")
    rep = restore(rig, rig.base)
    assert rep["ok"] is True, rep
