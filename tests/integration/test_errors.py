"""Error kinds decide the status, not errno: a failure deep in the filesystem
is a 500 with its errno in the detail, never a 401 or a 400."""
import json
import os

from conftest import Daemon


def internal(r):
    assert r.status_code == 500, r.text
    assert r.headers["Content-Type"].startswith("application/problem+json")
    body = r.json()
    assert body["code"] == "internal" and body["status"] == 500, body
    return body


class NoDacDaemon(Daemon):
    """ckptd without CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH, so that a file
    of mode 000 gives it a real EACCES although it runs as root."""

    def argv(self):
        drop = "-dac_override,-dac_read_search"
        return ["setpriv", "--inh-caps", drop, "--bounding-set", drop] + super().argv()


def test_filesystem_eacces_is_500_not_401(tmp_path):
    d = NoDacDaemon(tmp_path / "d", backend="tar")
    try:
        d.start()
        secret = d.roots[0] / "secret"
        secret.write_text("no reading\n")
        secret.chmod(0)
        (d.roots[0] / "plain.txt").write_text("fine\n")
        body = internal(d.request("POST", "/v1/checkpoints", json={"name": "denied"}))
        assert "Permission denied" in body["detail"], body
        assert "EACCES" in d.log() or "Permission denied" in d.log()
        assert d.list() == []  # no half checkpoint is listed
        secret.chmod(0o644)  # the same daemon works once the file is readable
        d.create("allowed")
    finally:
        d.cleanup()


def test_checkpoint_for_other_roots_is_500_not_400(daemon_factory):
    d = daemon_factory(backend="tar")
    (d.roots[0] / "a.txt").write_text("one\n")
    cid = d.create("one")["checkpoint_id"]
    meta = d.state_dir / "tar" / cid / "meta.json"
    m = json.loads(meta.read_text())
    m["roots"] = ["/somewhere/else"]
    meta.write_text(json.dumps(m))
    body = internal(d.request("POST", f"/v1/checkpoints/{cid}/restore", json={}))
    assert "other roots" in body["detail"], body
    assert (d.roots[0] / "a.txt").read_text() == "one\n"
    assert os.path.exists(meta)


def test_overlay_restore_of_missing_layers_is_404(daemon_factory):
    """The overlay backend reports "not_found" when no layers are recorded for
    a checkpoint the catalog still lists: the client gets 404 not_found (it
    got 500 internal while a code from below the engine was dropped)."""
    d = daemon_factory(backend="overlay")
    (d.roots[0] / "a.txt").write_text("one\n")
    cid = d.create("one")["checkpoint_id"]
    (d.roots[0] / "a.txt").write_text("two\n")
    d.stop()
    (d.state_dir / "overlay" / "c" / f"{cid}.json").unlink()
    rec_path = d.state_dir / "catalog" / f"{cid}.json"
    rec = json.loads(rec_path.read_text())
    rec["_backend"] = {}  # no layers to fall back on either
    rec_path.write_text(json.dumps(rec))
    d.start()
    r = d.request("POST", f"/v1/checkpoints/{cid}/restore", json={})
    assert r.status_code == 404, r.text
    body = r.json()
    assert body["code"] == "not_found" and body["status"] == 404, body
    assert cid in body["detail"], body
    assert (d.roots[0] / "a.txt").read_text() == "two\n"  # nothing was swapped
    assert [c["checkpoint_id"] for c in d.list()] == [cid]
