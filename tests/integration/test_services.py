"""The services step on a machine whose PID 1 is not systemd (this one): it is
skipped, and health, create and restore say so instead of pretending."""
import os

import pytest


def pid1_is_systemd():
    return os.path.isdir("/run/systemd/system")


def test_services_unavailable_without_systemd(daemon_factory):
    if pid1_is_systemd():
        pytest.skip("systemd is PID 1 here: the unavailable path cannot be shown")
    d = daemon_factory(backend="tar")
    h = d.health()
    assert h["services"] == "unavailable", h
    assert "PID 1" in h["services_reason"], h
    (d.roots[0] / "a.txt").write_text("one")
    cp = d.create("before")
    assert cp["frozen_services"] == [], cp
    (d.roots[0] / "a.txt").write_text("two")
    rep = d.restore(cp["checkpoint_id"])
    assert rep["services"] == "unavailable", rep
    assert "PID 1" in rep["services_reason"], rep
    assert rep["ok"] is True, rep
    assert rep["stopped_services"] == rep["started_services"] == rep["failed_services"] == [], rep
    assert rep["failures"] == {}, rep
    assert (d.roots[0] / "a.txt").read_text() == "one"
