"""Idempotency-Key on the mutating POSTs, against the real daemon: a repeat
answers the first result, a repeat while it runs is a 409, another body under
the same key a 422, and the keys survive a restart and a kill -9."""
import json
import os
import subprocess
import threading
import time

import pytest
import requests
from conftest import idempotency_files

CREATE = "/v1/checkpoints"


def post(d, path, key, body, timeout=120):
    headers = {"Idempotency-Key": key} if key is not None else {}
    return d.request("POST", path, json=body, headers=headers, timeout=timeout)


def big_tree(root, n_files=40, size=4 << 20):
    """Enough data that a tar create takes a noticeable moment."""
    for i in range(n_files):
        (root / f"blob{i}.bin").write_bytes(os.urandom(size))


def wait_creating(d, timeout=10):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(c["status"] == "creating" for c in d.list()):
            return
        time.sleep(0.005)
    raise AssertionError("no create seen running")


def named(d, name):
    return [c for c in d.list() if c["name"] == name]


def test_same_key_same_body_one_checkpoint(daemon_factory):
    d = daemon_factory()
    (d.roots[0] / "a.txt").write_text("one\n")
    r1 = post(d, CREATE, "k-1", {"name": "once"})
    assert r1.status_code == 201, r1.text
    assert "Idempotent-Replayed" not in r1.headers
    (d.roots[0] / "a.txt").write_text("two\n")  # a second create would differ
    r2 = post(d, CREATE, "k-1", {"name": "once"})
    assert r2.status_code == 201, r2.text
    assert r2.json() == r1.json()
    assert r2.headers["Idempotent-Replayed"] == "true"
    assert len(named(d, "once")) == 1
    # without a key, or with another key, it is a new request
    assert post(d, CREATE, None, {"name": "once"}).status_code == 201
    assert post(d, CREATE, "k-2", {"name": "once"}).status_code == 201
    assert len(named(d, "once")) == 3

    # restore: the replay answers the first report and restores nothing
    cid = r1.json()["checkpoint_id"]
    path = f"/v1/checkpoints/{cid}/restore"
    a = post(d, path, "r-1", {})
    assert a.status_code == 200, a.text
    assert (d.roots[0] / "a.txt").read_text() == "one\n"
    (d.roots[0] / "a.txt").write_text("after\n")
    b = post(d, path, "r-1", {})
    assert b.status_code == 200 and b.json() == a.json()
    assert (d.roots[0] / "a.txt").read_text() == "after\n"


def test_different_body_or_path_is_422(daemon_factory):
    d = daemon_factory()
    assert post(d, CREATE, "k", {"name": "x"}).status_code == 201
    r = post(d, CREATE, "k", {"name": "y"})
    assert r.status_code == 422, r.text
    assert r.headers["Content-Type"].startswith("application/problem+json")
    assert r.json()["code"] == "idempotency_key_reused"
    cid = named(d, "x")[0]["checkpoint_id"]
    r = post(d, f"/v1/checkpoints/{cid}/restore", "k", {"name": "x"})
    assert r.status_code == 422 and r.json()["code"] == "idempotency_key_reused"
    assert named(d, "y") == []


@pytest.mark.parametrize("key", ["", "é-not-ascii", "tab\there", "x" * 256])
def test_bad_keys_are_400(daemon_factory, key):
    d = daemon_factory()
    r = d.request("POST", CREATE, json={"name": "bad"},
                  headers={"Idempotency-Key": key.encode("utf-8")})
    assert r.status_code == 400, r.text
    assert r.json()["code"] == "invalid_idempotency_key"
    assert d.list() == []
    assert post(d, CREATE, "x" * 255, {"name": "ok"}).status_code == 201


def test_errors_that_mean_try_again_are_not_kept(daemon_factory):
    d = daemon_factory()
    r = post(d, "/v1/checkpoints/cp_000000000000000000000000/restore", "nf", {})
    assert r.status_code == 404
    again = post(d, "/v1/checkpoints/cp_000000000000000000000000/restore", "nf", {})
    assert again.status_code == 404 and again.headers.get("Idempotent-Replayed") == "true"


def test_concurrent_duplicate_is_409(daemon_factory):
    d = daemon_factory()
    big_tree(d.roots[0])
    first = {}

    def run():
        first["r"] = post(d, CREATE, "slow", {"name": "slow"})
        first["t"] = time.monotonic()

    t = threading.Thread(target=run)
    t.start()
    wait_creating(d)
    dup = post(d, CREATE, "slow", {"name": "slow"})
    dup_t = time.monotonic()
    t.join()
    assert dup.status_code == 409, dup.text
    assert dup.json()["code"] == "idempotency_in_progress"
    assert dup_t < first["t"], "the duplicate must have been answered while the first ran"
    assert first["r"].status_code == 201
    # once done, the repeat answers the first result
    r = post(d, CREATE, "slow", {"name": "slow"})
    assert r.status_code == 201 and r.json() == first["r"].json()
    assert len(named(d, "slow")) == 1


def test_a_repeat_right_after_the_answer_is_replayed(daemon_factory):
    """The answer goes out before its file is written (two barriers the
    client no longer waits for); a repeat sent the moment it arrives, on
    another connection, gets the same answer from memory, never a 409 nor a
    second checkpoint."""
    d = daemon_factory()
    (d.roots[0] / "a.txt").write_text("x\n")
    other = requests.Session()
    for i in range(30):
        key = f"quick-{i}"
        r1 = post(d, CREATE, key, {"name": f"q{i}"})
        assert r1.status_code == 201, r1.text
        r2 = other.post(d.url + CREATE, json={"name": f"q{i}"}, headers={"Idempotency-Key": key}, timeout=60)
        assert r2.status_code == 201, r2.text
        assert r2.json() == r1.json() and r2.headers["Idempotent-Replayed"] == "true"
    assert sum(1 for c in d.list() if c["name"].startswith("q")) == 30


def test_keys_survive_restart_and_are_kept_on_disk(daemon_factory):
    d = daemon_factory()
    r1 = post(d, CREATE, "restart-key", {"name": "r", "ttl_secs": 3600})
    assert r1.status_code == 201
    files = idempotency_files(d, 1)
    assert len(files) == 1 and files[0].name.endswith(".json")
    assert d.stop() == 0
    d.start()
    r2 = post(d, CREATE, "restart-key", {"name": "r", "ttl_secs": 3600})
    assert r2.status_code == 201 and r2.json() == r1.json()
    assert post(d, CREATE, "restart-key", {"name": "other"}).status_code == 422
    assert len(named(d, "r")) == 1


@pytest.mark.parametrize("what", ["create", "import"])
def test_an_answer_whose_key_file_was_never_written(daemon_factory, what):
    """The key's file is written after the answer: a daemon stopped in
    between (here: the file cannot be written, then kill -9) has the key in
    the new checkpoint's record all the same. A repeat is answered, from
    memory while the daemon runs and from the record after a restart: the
    create or import never runs twice, and another body under the key is
    still a 422."""
    d = daemon_factory()
    (d.roots[0] / "a.txt").write_text("x\n")
    if what == "create":
        path, body, other = CREATE, {"json": {"name": "nk"}}, {"json": {"name": "other"}}
    else:
        blob = d.request("GET", f"/v1/checkpoints/{d.create('exported')['checkpoint_id']}/export").content
        zstd = {"Content-Type": "application/zstd"}
        path, body, other = "/v1/checkpoints/import", {"data": blob, "headers": zstd}, {"data": blob[:-1] + b"!", "headers": zstd}

    def send(b):
        h = {**b.get("headers", {}), "Idempotency-Key": "never-kept"}
        return d.request("POST", path, **{**b, "headers": h}, timeout=120)

    idem = d.state_dir / "idempotency"
    subprocess.run(["chattr", "+i", str(idem)], check=True)  # no file can be made there, root or not
    try:
        r1 = send(body)
        assert r1.status_code == 201, r1.text
        r2 = send(body)
        assert r2.status_code == 201 and r2.headers.get("Idempotent-Replayed") == "true", r2.text
        assert r2.json() == r1.json()
        assert "kept in memory until ckptd stops" in d.log()
        assert "_idempotency" not in r1.json() and "_idempotency" not in d.get(r1.json()["checkpoint_id"])
        d.kill9()
    finally:
        subprocess.run(["chattr", "-i", str(idem)], check=True)
    assert list(idem.iterdir()) == []
    d.start()
    assert len(idempotency_files(d, 1, timeout=0)) == 1, "the start writes the key's file from the record"
    assert "written from the record" in d.log()
    r3 = send(body)
    assert r3.status_code == 201 and r3.headers.get("Idempotent-Replayed") == "true", r3.text
    assert r3.json()["checkpoint_id"] == r1.json()["checkpoint_id"]
    assert send(other).status_code == 422
    ids = {c["checkpoint_id"] for c in d.list()}
    assert r1.json()["checkpoint_id"] in ids and len(ids) == (1 if what == "create" else 2), ids


def test_an_async_create_keeps_its_key_in_its_record(daemon_factory):
    d = daemon_factory()
    r = post(d, CREATE, "async-key", {"name": "as", "async": True})
    assert r.status_code == 202, r.text
    cid = r.json()["checkpoint_id"]
    deadline = time.monotonic() + 60
    while d.get(cid)["status"] != "active" and time.monotonic() < deadline:
        time.sleep(0.05)
    rec = json.loads((d.state_dir / "catalog" / f"{cid}.json").read_text())
    assert rec["_idempotency"]["status"] == 202 and rec["_idempotency"]["key"] == "async-key"


def test_kill9_then_retry(daemon_factory):
    """A create killed midway left no answer: the retry with the same key runs
    it again and there is exactly one usable checkpoint; a create that had
    answered is answered again after the kill."""
    d = daemon_factory()
    done = post(d, CREATE, "before-kill", {"name": "done"})
    assert done.status_code == 201
    big_tree(d.roots[0])
    res = {}

    def run():
        try:
            res["r"] = post(d, CREATE, "killed", {"name": "k"})
        except Exception as e:  # the connection dies with the daemon
            res["e"] = e

    t = threading.Thread(target=run)
    t.start()
    wait_creating(d)
    d.kill9()
    t.join()
    assert "e" in res, "the create should have been cut off by the kill"
    d.start()
    r = post(d, CREATE, "killed", {"name": "k"})
    assert r.status_code == 201, r.text
    again = post(d, CREATE, "killed", {"name": "k"})
    assert again.json() == r.json()
    ks = named(d, "k")
    assert [c["checkpoint_id"] for c in ks if c["status"] == "active"] == [r.json()["checkpoint_id"]]
    assert post(d, CREATE, "before-kill", {"name": "done"}).json() == done.json()


def test_keys_expire_after_24h_and_the_sweeper_removes_them(daemon_factory):
    d = daemon_factory(config={"cleanup_interval_secs": 1})
    assert post(d, CREATE, "old", {"name": "a"}).status_code == 201
    assert post(d, CREATE, "young", {"name": "b"}).status_code == 201
    files = {p.read_text(): p for p in idempotency_files(d, 2)}
    old = next(p for t, p in files.items() if '"key":"old"' in t)
    young = next(p for t, p in files.items() if '"key":"young"' in t)
    day = 24 * 3600
    os.utime(old, (time.time() - day - 60,) * 2)
    os.utime(young, (time.time() - day + 600,) * 2)  # 23 h 50 min: still kept
    deadline = time.monotonic() + 10
    while old.exists():
        assert time.monotonic() < deadline, "the sweeper did not remove the expired key"
        time.sleep(0.1)
    assert young.exists()
    r = post(d, CREATE, "young", {"name": "b"})
    assert r.status_code == 201 and r.headers.get("Idempotent-Replayed") == "true"
    # the expired key is free again: another body is a new request, not a 422
    r = post(d, CREATE, "old", {"name": "c"})
    assert r.status_code == 201 and "Idempotent-Replayed" not in r.headers


def import_post(d, key, blob):
    return d.request("POST", "/v1/checkpoints/import", data=blob,
                     headers={"Idempotency-Key": key, "Content-Type": "application/zstd"})


def test_import_same_key_same_archive_once_other_archive_422(daemon_factory):
    """The import body is spooled to a file, not held in memory: its digest is
    taken while it is read, so the key works for it as for JSON bodies."""
    a = daemon_factory()
    (a.roots[0] / "a.txt").write_text("one\n")
    one = a.create("one")["checkpoint_id"]
    (a.roots[0] / "a.txt").write_text("two\n")
    two = a.create("two")["checkpoint_id"]
    blob1 = a.request("GET", f"/v1/checkpoints/{one}/export").content
    blob2 = a.request("GET", f"/v1/checkpoints/{two}/export").content
    assert blob1 != blob2

    b = daemon_factory()
    r1 = import_post(b, "imp-1", blob1)
    assert r1.status_code == 201, r1.text
    assert "Idempotent-Replayed" not in r1.headers
    r2 = import_post(b, "imp-1", blob1)
    assert r2.status_code == 201, r2.text
    assert r2.headers["Idempotent-Replayed"] == "true"
    assert r2.json()["checkpoint_id"] == r1.json()["checkpoint_id"]
    assert len(b.list()) == 1
    r3 = import_post(b, "imp-1", blob2)
    assert r3.status_code == 422, r3.text
    assert r3.json()["code"] == "idempotency_key_reused"
    assert len(b.list()) == 1
    # the key is kept across a restart like the others
    b.stop()
    b.start()
    r4 = import_post(b, "imp-1", blob1)
    assert r4.status_code == 201 and r4.json()["checkpoint_id"] == r1.json()["checkpoint_id"]
    assert len(b.list()) == 1
    # another key imports again
    assert import_post(b, "imp-2", blob1).status_code == 201
    assert len(b.list()) == 2


def test_fork_same_key_once_other_body_422(daemon_factory, tmp_path):
    d = daemon_factory()
    (d.roots[0] / "a.txt").write_text("one\n")
    cid = d.create("base")["checkpoint_id"]
    f1, f2 = tmp_path / "f1", tmp_path / "f2"
    f1.mkdir()
    f2.mkdir()
    path = f"/v1/checkpoints/{cid}/fork"
    r1 = post(d, path, "fork-1", {"path": str(f1)})
    assert r1.status_code == 201, r1.text
    r2 = post(d, path, "fork-1", {"path": str(f1)})
    assert r2.status_code == 201 and r2.json() == r1.json(), r2.text
    assert r2.headers["Idempotent-Replayed"] == "true"
    r3 = post(d, path, "fork-1", {"path": str(f2)})
    assert r3.status_code == 422 and r3.json()["code"] == "idempotency_key_reused", r3.text
    forks = d.request("GET", "/v1/forks").json()["forks"]
    assert [f["fork_id"] for f in forks] == [r1.json()["fork_id"]]
    assert (f1 / "a.txt").read_text() == "one\n"
    assert not any(f2.iterdir())
    assert d.request("DELETE", f"/v1/forks/{r1.json()['fork_id']}").status_code == 204


def test_async_create_replay_answers_the_current_state(daemon_factory):
    """A retried async create learns what became of it: 202 with the progress
    while it runs, then 200 with the finished record; still one checkpoint."""
    d = daemon_factory()
    big_tree(d.roots[0])
    body = {"name": "bg", "async": True}
    first = post(d, CREATE, "a-1", body)
    assert first.status_code == 202, first.text
    # registered before the worker starts: no answer of a running create lacks it
    assert "progress" in first.json(), first.text
    cid = first.json()["checkpoint_id"]
    again = post(d, CREATE, "a-1", body)
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.json()["checkpoint_id"] == cid
    if again.status_code == 202:  # still creating: the record as it is now
        assert again.json()["status"] == "creating"
        assert "progress" in again.json(), again.text
    deadline = time.monotonic() + 60
    while d.get(cid)["status"] == "creating":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    done = post(d, CREATE, "a-1", body)
    assert done.status_code == 200, done.text
    assert done.json() == d.get(cid)
    assert done.json()["status"] == "active" and done.json()["size_bytes"] > 0
    assert len(named(d, "bg")) == 1
    # a checkpoint deleted since: the first answer again
    d.delete(cid)
    gone = post(d, CREATE, "a-1", body)
    assert gone.status_code == 202 and gone.json() == first.json()
    assert named(d, "bg") == []
