"""ckptd killed mid-operation under a real systemd (the rig), observed from
outside, not from ckptd's own report:

- killed during a restore while the units are stopped (one of them,
  slowstop.service, takes 3 s to stop): systemd restarts ckptd
  (Restart=on-failure, as shipped), and every unit it had stopped runs again;
  the interrupted restore is in the journal and in
  ckptd_interrupted_operations_total{op="restore"};
- killed during creates until one kill lands while the units are frozen:
  systemd's FreezerState says "frozen" and the worker's log stops growing
  until ckptd is back; then FreezerState is "running", the log grows, and the
  interrupted create is logged and counted.

One container for the module; the tests run in file order."""
import os
import pathlib
import random
import signal
import re
import sys
import threading
import time

import pytest
import requests

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "rig"))
from samples import active, api, main_pid  # noqa: E402
import samples  # noqa: E402

SLOWSTOP = """[Unit]
Description=rig unit using /srv/app whose stop takes 3 s
[Service]
WorkingDirectory=/srv/app
ExecStart=/usr/bin/python3 -c 'import time; time.sleep(1e6)'
ExecStop=/bin/sleep 3
"""
UNITS = ("web.service", "worker.service", "slowstop.service")
JOURNAL = "/var/lib/ckptd/services.json"


@pytest.fixture(scope="module")
def rig():
    with samples.sample_rig() as r:
        r.sh("tee", "/etc/systemd/system/slowstop.service", input=SLOWSTOP)
        r.systemctl("daemon-reload")
        r.systemctl("start", "ckptd.socket", "ckptd.service")
        r.systemctl("start", *UNITS)
        yield r


def wait_for(what, cond, timeout=30):
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.05)


def healthy(rig):
    try:
        return api(rig, "GET", "/v1/health", timeout=2).status_code == 200
    except requests.RequestException:
        return False


def interrupted(rig, op):
    try:
        text = api(rig, "GET", "/metrics").text
    except requests.RequestException as e:
        pytest.fail(f"/metrics: {e}\n{rig.journal('ckptd.service', lines=60)}")
    m = re.search(rf'^ckptd_interrupted_operations_total{{op="{op}"}} (\d+)$', text, re.M)
    assert m, "no ckptd_interrupted_operations_total"
    return int(m.group(1))


def worker_lines(rig):
    return int(rig.sh("wc", "-l", "/srv/app/worker.log").stdout.split()[0])


def freezer(rig, unit):
    return rig.show(unit, "FreezerState")["FreezerState"]


def kill_ckptd(rig):
    pid = main_pid(rig, "ckptd.service")
    assert pid, "ckptd is not running"
    rig.sh("kill", "-9", str(pid))
    return pid


def host_pid(rig, pid):
    """The host's pid of the process the container knows as pid."""
    ns = os.readlink(f"/proc/{rig.pid}/ns/pid")
    for d in os.listdir("/proc"):
        try:
            if d.isdigit() and os.readlink(f"/proc/{d}/ns/pid") == ns:
                for line in open(f"/proc/{d}/status"):
                    if line.startswith("NSpid:") and line.split()[-1] == str(pid):
                        return int(d)
        except OSError:
            continue
    raise AssertionError(f"no host pid for container pid {pid}")


def in_thread(fn):
    out = {}

    def go():
        try:
            out["r"] = fn()
        except requests.RequestException as e:
            out["e"] = e
    t = threading.Thread(target=go)
    t.start()
    return t, out


def test_killed_while_units_are_stopped_they_run_again(rig):
    cp = api(rig, "POST", "/v1/checkpoints", json={"name": "before-kill"})
    assert cp.status_code == 201, cp.text
    cid = cp.json()["checkpoint_id"]
    pids = {u: main_pid(rig, u) for u in UNITS}
    t, out = in_thread(lambda: api(rig, "POST", f"/v1/checkpoints/{cid}/restore", json={}))
    # Seen from outside: the quick units are down, slowstop is still stopping.
    wait_for("the restore to stop the units",
             lambda: active(rig, "web.service") == "inactive" and active(rig, "slowstop.service") == "deactivating")
    old = kill_ckptd(rig)
    t.join(60)
    assert "r" not in out, "the restore answered before the kill"
    assert rig.sh("test", "-e", JOURNAL, check=False).returncode == 0, "no record of the stopped units"
    # systemd restarts ckptd (Restart=on-failure); it starts the units again after READY
    wait_for("ckptd restarted", lambda: main_pid(rig, "ckptd.service") not in (0, old) and healthy(rig))
    rig.systemctl("reset-failed", "ckptd.service")
    for u in UNITS:
        wait_for(f"{u} running again", lambda: active(rig, u) == "active")
        assert main_pid(rig, u) != pids[u], f"{u} was never stopped"
    n = worker_lines(rig)
    wait_for("the worker writing again", lambda: worker_lines(rig) > n)
    assert interrupted(rig, "restore") == 1
    log = rig.journal("ckptd.service", lines=500)
    assert f'restore of "{cid}" was interrupted by a crash' in log, log[-2000:]
    wait_for("the record of the units to go", lambda: rig.sh("test", "-e", JOURNAL, check=False).returncode != 0)
    # ckptd works on: a restore now completes and reports the units
    try:
        r = api(rig, "POST", f"/v1/checkpoints/{cid}/restore", json={})
    except requests.RequestException as e:
        pytest.fail(f"restore: {e}\n{rig.journal('ckptd.service', lines=80)}")
    assert r.status_code == 200 and r.json()["ok"] is True, r.text
    assert sorted(r.json()["stopped_services"]) == sorted(UNITS)


def test_killed_while_units_are_frozen_they_are_thawed(rig):
    """Creates killed until one kill is seen to leave the units frozen: the
    kill comes from the host a random 0-15 ms after services.json (the record
    of the units about to be frozen) appears in the state dir; the seed is
    printed."""
    rig.systemctl("stop", "slowstop.service")  # only web and worker: a short create
    seed = random.randrange(1 << 30)
    print(f"rig crash: seed {seed}")
    rng = random.Random(seed)
    cp = api(rig, "POST", "/v1/checkpoints", json={"name": "first"})
    assert cp.status_code == 201 and sorted(cp.json()["frozen_services"]) == ["web.service", "worker.service"]
    record = rig.dir / "state" / "services.json"  # the container's /var/lib/ckptd, seen from the host
    hits = 0
    for attempt in range(30):
        old = main_pid(rig, "ckptd.service")
        pid = host_pid(rig, old)
        t, out = in_thread(lambda: api(rig, "POST", "/v1/checkpoints", json={"name": f"k{attempt}"}))
        deadline = time.monotonic() + 30
        while not record.exists() and t.is_alive() and time.monotonic() < deadline:
            time.sleep(0.0005)
        time.sleep(rng.uniform(0, 0.015))
        os.kill(pid, signal.SIGKILL)
        t.join(60)
        hit = rig.sh("test", "-e", JOURNAL, check=False).returncode == 0
        seen = False
        if hit and freezer(rig, "worker.service") == "frozen":
            # Seen from outside while ckptd is down: frozen, and no progress.
            n = worker_lines(rig)
            time.sleep(0.6)
            m = worker_lines(rig)
            if freezer(rig, "worker.service") == "frozen":  # frozen all along
                assert m == n, f"the worker wrote {m - n} lines while frozen"
                seen = True
        wait_for("ckptd restarted", lambda: main_pid(rig, "ckptd.service") not in (0, old) and healthy(rig))
        rig.systemctl("reset-failed", "ckptd.service")  # many restarts: keep clear of the start limit
        for u in ("web.service", "worker.service"):
            wait_for(f"{u} thawed", lambda: freezer(rig, u) == "running")
            assert active(rig, u) == "active"
        n = worker_lines(rig)
        wait_for("the worker writing again", lambda: worker_lines(rig) > n)
        # counted by the start that found it (metrics start at zero)
        assert interrupted(rig, "create") == (1 if hit else 0)
        hits += hit
        if seen:
            break
    else:
        pytest.fail(f"no kill of 30 was seen to leave the units frozen ({hits} hit the freeze; seed {seed})")
    print(f"rig crash: {attempt + 1} kills, {hits} in the freeze, the last one observed frozen from outside")
    assert "was interrupted by a crash" in rig.journal("ckptd.service", lines=500)
    assert rig.sh("test", "-e", JOURNAL, check=False).returncode != 0
