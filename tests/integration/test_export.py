"""Export and import: round trips on both backends, the base check, the size
limit, memory while streaming, and hostile archives (each crafted here with
python's tarfile in pax format, compressed with the zstd CLI)."""
import io
import json
import os
import shutil
import subprocess
import tarfile
import time

import pytest

from conftest import assert_same_tree, make_full_tree, tree_state, mounts_under


def export(d, cid):
    r = d.request("GET", f"/v1/checkpoints/{cid}/export", stream=True)
    assert r.status_code == 200, r.text
    assert r.headers["Content-Type"] == "application/zstd"
    return b"".join(r.iter_content(1 << 16))


def import_(d, blob, expect=201):
    r = d.request("POST", "/v1/checkpoints/import", data=blob,
                  headers={"Content-Type": "application/zstd"})
    assert r.status_code == expect, r.text
    return r.json()


def untar(blob):
    raw = subprocess.run(["zstd", "-dc"], input=blob, capture_output=True, check=True).stdout
    return tarfile.open(fileobj=io.BytesIO(raw), mode="r:")


def copy_base(src, dst):
    subprocess.run(["cp", "-a", str(src) + "/.", str(dst)], check=True)


@pytest.mark.parametrize("backend", ["tar", "overlay"])
def test_round_trip(daemon_factory, tmp_path, backend):
    seed = make_full_tree(tmp_path / "seed")
    a = daemon_factory(backend=backend, start=False)
    b = daemon_factory(backend=backend, start=False)
    copy_base(seed, a.roots[0])
    copy_base(seed, b.roots[0])  # the same base on the second machine
    a.start()
    b.start()
    root = a.roots[0]
    (root / "file.txt").write_text("changed\n")
    (root / "dir/new").mkdir()
    (root / "dir/new/f").write_bytes(os.urandom(70_000))
    os.unlink(root / "secret")
    os.rename(root / "dir/sub", root / "dir/sub-renamed")
    want = tree_state(root)
    cp = a.create("to-move")
    blob = export(a, cp["checkpoint_id"])

    with untar(blob) as t:
        names = t.getnames()
        assert names[0] == "manifest.json"
        man = json.loads(t.extractfile("manifest.json").read())
    assert man["format"] == "ckptd-export" and man["version"] == 1
    assert man["checkpoint"]["checkpoint_id"] == cp["checkpoint_id"]
    files = {e["path"]: e for e in man["roots"][0]["entries"]}
    assert files["dir/new/f"]["size"] == 70_000 and len(files["dir/new/f"]["sha256"]) == 64
    assert "secret" not in files and "dir/sub-renamed/deeper/note" in files
    assert (man["base"] is not None) == (backend == "overlay")

    rec = import_(b, blob)
    assert rec["checkpoint_id"] != cp["checkpoint_id"]
    assert rec["import_of"] == cp["checkpoint_id"]
    assert rec["name"] == "to-move" and rec["status"] == "active"
    assert b.get(rec["checkpoint_id"])["import_of"] == cp["checkpoint_id"]
    (b.roots[0] / "junk").write_text("x")
    b.restore(rec["checkpoint_id"])
    assert_same_tree(want, tree_state(b.roots[0]))
    # nothing left behind in the state dir's transfer area
    assert not list((b.state_dir / "xfer").glob("*")) if (b.state_dir / "xfer").exists() else True
    # the imported checkpoint survives a restart and still restores
    b.stop()
    b.start()
    (b.roots[0] / "file.txt").write_text("again\n")
    b.restore(rec["checkpoint_id"])
    assert_same_tree(want, tree_state(b.roots[0]))


def test_overlay_base_mismatch(daemon_factory, tmp_path):
    a = daemon_factory(backend="overlay", start=False)
    b = daemon_factory(backend="overlay", start=False)
    (a.roots[0] / "os-release").write_text("one\n")
    (b.roots[0] / "os-release").write_text("two\n")
    a.start()
    b.start()
    (a.roots[0] / "f").write_text("x")
    cp = a.create("c")
    blob = export(a, cp["checkpoint_id"])
    r = b.request("POST", "/v1/checkpoints/import", data=blob)
    assert r.status_code == 409, r.text
    p = r.json()
    assert p["code"] == "base_mismatch"
    need = json.loads(untar(blob).extractfile("manifest.json").read())["base"]["identity"]
    assert need in p["detail"] and "same base" in p["detail"]
    assert b.list() == []


def test_tar_export_imports_on_overlay(daemon_factory, tmp_path):
    a = daemon_factory(backend="tar")
    b = daemon_factory(backend="overlay", start=False)
    (b.roots[0] / "base-only").write_text("hidden by the import\n")
    (b.roots[0] / "d").mkdir()
    (b.roots[0] / "d/base-file").write_text("also hidden\n")
    b.start()
    make_full_tree(a.roots[0])
    want = tree_state(a.roots[0])
    cp = a.create("from-tar")
    rec = import_(b, export(a, cp["checkpoint_id"]))
    b.restore(rec["checkpoint_id"])
    assert_same_tree(want, tree_state(b.roots[0]))


def test_import_size_limit(daemon_factory, tmp_path):
    d = daemon_factory(backend="tar", config={"max_import_bytes": 100_000})
    r = d.request("POST", "/v1/checkpoints/import", data=os.urandom(200_000))
    assert r.status_code == 413 and r.json()["code"] == "body_too_large"

    def gen():  # chunked: no Content-Length to refuse early
        for _ in range(4):
            yield os.urandom(50_000)
    r = d.request("POST", "/v1/checkpoints/import", data=gen())
    assert r.status_code == 413
    assert d.list() == []


def test_export_unknown_and_cli(daemon_factory, tmp_path):
    d = daemon_factory(backend="tar")
    r = d.request("GET", "/v1/checkpoints/cp_000000000000000000000000/export")
    assert r.status_code == 404
