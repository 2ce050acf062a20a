"""ckptd under a real systemd on the legacy cgroup v1 hierarchies, where
systemd cannot freeze units: a create still succeeds and says so honestly
(no frozen_services, a reason per unit), and restores still stop and start,
killing a unit that ignores SIGTERM after service_timeout_secs. This rig uses
the tar backend, so the services step is shown with both backends."""
import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "rig"))
from samples import active, api, main_pid, wait_ignoring_sigterm, web_get, write_in  # noqa: E402
import samples  # noqa: E402


@pytest.fixture(scope="module")
def rig():
    with samples.sample_rig(unified=False, service_timeout_secs=2, backend="tar") as r:
        r.systemctl("start", "ckptd.socket", "ckptd.service")
        r.systemctl("start", "web.service", "worker.service")
        yield r
        # It would hold up the container's poweroff for its TimeoutStopSec.
        r.systemctl("kill", "--signal=KILL", "stubborn.service", check=False)


def test_v1_container_has_no_unified_hierarchy(rig):
    fstype = rig.sh("stat", "-f", "-c", "%T", "/sys/fs/cgroup").stdout.strip()
    assert fstype == "tmpfs", "expected legacy cgroup v1 mounts"


def test_create_reports_units_it_could_not_freeze(rig):
    r = api(rig, "POST", "/v1/checkpoints", json={"name": "v1"})
    assert r.status_code == 201, r.text
    cp = r.json()
    assert cp["frozen_services"] == [], cp
    rec = api(rig, "GET", f"/v1/checkpoints/{cp['checkpoint_id']}").json()
    failures = rec.get("freeze_failures") or cp.get("freeze_failures")
    assert failures is not None, cp
    assert sorted(failures) == ["web.service", "worker.service"], failures
    assert all("not frozen" in why for why in failures.values()), failures
    rig.v1 = cp["checkpoint_id"]


def test_restore_works_without_freezer(rig):
    write_in(rig, "/srv/app/www/index.html", "changed\n")
    before = main_pid(rig, "web.service")
    rep = api(rig, "POST", f"/v1/checkpoints/{rig.v1}/restore", json={}).json()
    assert rep["ok"] is True, rep
    assert sorted(rep["stopped_services"]) == ["web.service", "worker.service"], rep
    assert sorted(rep["started_services"]) == ["web.service", "worker.service"], rep
    assert active(rig, "web.service") == "active"
    assert main_pid(rig, "web.service") != before
    assert web_get(rig, "/index.html").text == "v1\n"


def test_unit_ignoring_sigterm_is_killed_after_the_timeout(rig):
    rig.systemctl("start", "stubborn.service")
    wait_ignoring_sigterm(rig, "stubborn.service")
    before = main_pid(rig, "stubborn.service")
    rep = api(rig, "POST", f"/v1/checkpoints/{rig.v1}/restore", json={}).json()
    assert rep["ok"] is True, rep
    assert sorted(rep["stopped_services"]) == ["stubborn.service", "web.service", "worker.service"], rep
    assert "stubborn.service" in rep["started_services"], rep
    # service_timeout_secs is 2, systemd's own TimeoutStopSec 300: only
    # ckptd's SIGKILL can have ended it this soon.
    assert 2000 <= rep["phases"]["stop_ms"] < 300_000, rep
    assert main_pid(rig, "stubborn.service") != before
