"""Checkpoint lifecycle against the real daemon (tar backend): TTLs and the
sweeper, 410 / force / if_expired "fresh", limits, running out of space,
async create and the progress of creates and restores."""
import contextlib
import datetime
import os
import pathlib
import subprocess
import threading
import time

import pytest

from conftest import assert_same_tree, make_full_tree, tree_state

FAR = {"cleanup_interval_secs": 3600}  # the sweeper stays out of the way


def ms(stamp):
    return datetime.datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S.%fZ").replace(
        tzinfo=datetime.timezone.utc).timestamp() * 1000


def wait_until_expired(rec):
    """Expiry is wall-clock: wait for the moment itself, then a little more."""
    delay = ms(rec["expires_at"]) / 1000 - time.time() + 0.05
    if delay > 0:
        time.sleep(delay)


def state_files(d):
    """Every path in the state dir with its size and mtime (what 'changes nothing' means)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(d.state_dir):
        for n in dirnames + filenames:
            p = os.path.join(dirpath, n)
            st = os.lstat(p)
            out[os.path.relpath(p, d.state_dir)] = (st.st_size, st.st_mtime_ns)
    out.pop("lock", None)
    return out


def traces(d, cid):
    """Paths below the state dir that name a checkpoint id."""
    return [str(p) for p in pathlib.Path(d.state_dir).rglob("*") if cid in p.name]


def start_async(d, name):
    """POST an async create; returns the 202 record (state creating)."""
    r = d.request("POST", "/v1/checkpoints", json={"name": name, "async": True})
    assert r.status_code == 202, r.text
    rec = r.json()
    assert rec["status"] == "creating", rec
    return rec


def problem(r, status, code):
    assert r.status_code == status, r.text
    assert r.headers["Content-Type"].startswith("application/problem+json")
    assert r.json()["code"] == code, r.text
    return r.json()


def test_ttl_fields_and_last_used(daemon_factory):
    d = daemon_factory(backend="tar", config={"default_ttl_secs": 7200, **FAR})
    root = d.roots[0]
    (root / "a").write_text("1")

    dflt = d.create("default")
    assert dflt["ttl_secs"] == 7200
    assert ms(dflt["expires_at"]) - ms(dflt["created_at"]) == 7200 * 1000
    assert abs(ms(dflt["created_at"]) / 1000 - time.time()) < 30
    assert dflt["last_used_at"] is None

    never = d.create("never", ttl_secs=0)
    assert never["expires_at"] is None
    short = d.create("short", ttl_secs=60)
    assert ms(short["expires_at"]) - ms(short["created_at"]) == 60 * 1000

    before = time.time()
    rep = d.restore(dflt["checkpoint_id"])
    assert rep["restored_from_checkpoint"] is True and rep["ttl_expired"] is False
    used = d.get(dflt["checkpoint_id"])["last_used_at"]
    assert used is not None and ms(used) / 1000 >= before - 1
    assert d.get(never["checkpoint_id"])["last_used_at"] is None
    # survives a restart
    d.stop()
    d.start()
    assert d.get(dflt["checkpoint_id"])["last_used_at"] == used
    assert d.get(never["checkpoint_id"])["expires_at"] is None


def test_sweeper_removes_expired(daemon_factory):
    d = daemon_factory(backend="tar", config={"cleanup_interval_secs": 1})
    (d.roots[0] / "f").write_text("x")
    old = d.create("old", ttl_secs=1)
    keep = d.create("keep", ttl_secs=0)
    assert traces(d, old["checkpoint_id"])

    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if d.request("GET", f"/v1/checkpoints/{old['checkpoint_id']}").status_code == 404:
            break
        time.sleep(0.1)
    else:
        raise AssertionError("the sweeper did not remove the expired checkpoint:\n" + d.log())
    assert [c["checkpoint_id"] for c in d.list()] == [keep["checkpoint_id"]]
    # data and record went, as with DELETE; but "keep" is incremental and
    # reads f from old's archive, so that archive stays aside in tar/.keep/
    left = traces(d, old["checkpoint_id"])
    assert left and all("/tar/.keep/" in t for t in left), left
    assert d.request("DELETE", f"/v1/checkpoints/{keep['checkpoint_id']}").status_code in (200, 204)
    assert traces(d, old["checkpoint_id"]) == []  # nothing reads it any more
    m = d.request("GET", "/metrics").text
    assert 'ckptd_operations_total{op="sweep",result="success"} 1' in m


@pytest.mark.parametrize("backend", ["tar", "overlay"])
def test_expired_restore_410_force_fresh(daemon_factory, backend):
    d = daemon_factory(backend=backend, start=False, config=FAR)
    root = d.roots[0]
    (root / "base.txt").write_text("as adopted\n")
    d.start()
    base = tree_state(root)

    (root / "v1.txt").write_text("version 1\n")
    (root / "base.txt").write_text("changed in v1\n")
    v1_tree = tree_state(root)
    rec = d.create("v1", ttl_secs=1)
    cid = rec["checkpoint_id"]
    (root / "v2.txt").write_text("version 2\n")
    v2_tree = tree_state(root)
    wait_until_expired(rec)

    state_before = state_files(d)
    for body in ({}, {"if_expired": "fail"}, {"force": False}):
        r = d.request("POST", f"/v1/checkpoints/{cid}/restore", json=body)
        p = problem(r, 410, "checkpoint_expired")
        assert p["status"] == 410
    assert_same_tree(v2_tree, tree_state(root))
    assert state_files(d) == state_before  # not even last_used_at
    assert d.get(cid)["last_used_at"] is None

    rep = d.restore(cid, if_expired="fresh")
    assert rep["ok"] is True
    assert rep["restored_from_checkpoint"] is False and rep["ttl_expired"] is True
    assert_same_tree(base, tree_state(root))
    assert d.get(cid)["last_used_at"] is None  # the checkpoint itself was not used

    rep = d.restore(cid, force=True)
    assert rep["ok"] is True
    assert rep["restored_from_checkpoint"] is True and rep["ttl_expired"] is True
    assert_same_tree(v1_tree, tree_state(root))
    assert d.get(cid)["last_used_at"] is not None


def test_max_checkpoints(daemon_factory):
    d = daemon_factory(backend="tar", config={"max_checkpoints": 2, **FAR})
    a = d.create("a")
    d.create("b")
    r = d.request("POST", "/v1/checkpoints", json={"name": "c"})
    problem(r, 403, "checkpoint_limit")
    assert len(d.list()) == 2
    d.delete(a["checkpoint_id"])
    d.create("c")


def test_max_state_bytes(daemon_factory):
    d = daemon_factory(backend="tar", config={"max_state_bytes": 1, **FAR})
    (d.roots[0] / "data").write_bytes(os.urandom(100_000))
    before = state_files(d)
    r = d.request("POST", "/v1/checkpoints", json={"name": "too-big"})
    problem(r, 507, "insufficient_storage")
    assert d.list() == []
    assert set(state_files(d)) == set(before)  # no trace of the half-made checkpoint


@contextlib.contextmanager
def tmpfs(path, size):
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def test_out_of_space_during_create(daemon_factory):
    d = daemon_factory(backend="tar", start=False, config=FAR)
    root = d.roots[0]
    (root / "small").write_text("small\n")
    with tmpfs(d.state_dir, "2m"):
        d.start()  # the base (the root as adopted) is small and fits
        ok = d.create("fits")
        (root / "big.bin").write_bytes(os.urandom(6 << 20))  # incompressible, > 2 MB
        live = tree_state(root)
        before = state_files(d)

        r = d.request("POST", "/v1/checkpoints", json={"name": "too-big"})
        problem(r, 507, "insufficient_storage")
        assert_same_tree(live, tree_state(root))
        assert [c["checkpoint_id"] for c in d.list()] == [ok["checkpoint_id"]]
        assert set(state_files(d)) == set(before), "a trace of the failed create is left"
        st = os.statvfs(d.state_dir)
        assert st.f_bavail * st.f_frsize > 1 << 20  # its partial data was freed

        # the same create in the background ends as "failed" with the reason
        cid = start_async(d, "too-big-async")["checkpoint_id"]
        deadline = time.monotonic() + 30
        while d.get(cid)["status"] == "creating" and time.monotonic() < deadline:
            time.sleep(0.02)
        rec = d.get(cid)
        assert rec["status"] == "failed", rec
        assert rec["error"]["code"] == "insufficient_storage"
        assert 'ckptd_checkpoints{state="failed"} 1' in d.request("GET", "/metrics").text
        assert set(state_files(d)) == set(before)
        d.delete(cid)
        assert_same_tree(live, tree_state(root))

        # the daemon still works: smaller trees fit again, restores run
        (root / "big.bin").unlink()
        (root / "after").write_text("after\n")
        d.create("fits-again")
        d.restore(ok["checkpoint_id"])
        assert (root / "small").read_text() == "small\n" and not (root / "after").exists()
        d.stop()


def fill_tree(root, total, files):
    chunk = os.urandom(1 << 20)
    per = total // files
    for i in range(files):
        sub = root / f"d{i % 10}"
        sub.mkdir(exist_ok=True)
        with open(sub / f"f{i}", "wb") as f:
            left = per
            while left > 0:
                f.write(chunk[: min(left, len(chunk))])
                left -= len(chunk)


def poll_progress(d, cid, stop, seen):
    while not stop.is_set():
        r = d.request("GET", f"/v1/checkpoints/{cid}", timeout=10)
        if r.status_code == 200:
            rec = r.json()
            seen.append((rec["status"], rec.get("progress")))
        time.sleep(0.01)


def wait_created(d, cid, seen, period=0.01):
    """Poll an async create until it leaves "creating", noting (status,
    progress) in seen; returns the last record."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        rec = d.get(cid)
        seen.append((rec["status"], rec.get("progress")))
        if rec["status"] != "creating":
            break
        time.sleep(period)
    return rec


def check_progress(seen, total_files):
    moving = [p for _, p in seen if p]
    assert moving, f"no progress seen in {len(seen)} polls"
    for p in moving:
        assert set(p) == {"bytes_done", "bytes_total", "files_done", "files_total"}
        assert 0 <= p["bytes_done"] <= p["bytes_total"] or p["bytes_total"] == 0
        assert p["files_done"] <= p["files_total"] or p["files_total"] == 0
    assert max(p["files_total"] for p in moving) >= total_files
    assert any(0 < p["bytes_done"] < p["bytes_total"] for p in moving), moving[:5]


def test_async_create_and_progress(daemon_factory):
    d = daemon_factory(backend="tar", config=FAR)
    root = d.roots[0]
    fill_tree(root, 200 << 20, 200)
    tree = tree_state(root)

    cid = start_async(d, "big")["checkpoint_id"]
    seen, stop = [], threading.Event()
    rec = wait_created(d, cid, seen)
    assert rec["status"] == "active", rec
    assert seen[0][0] == "creating"
    check_progress(seen, 200)
    assert rec["size_bytes"] > 0

    # a restore that must rewrite every file reports progress too
    for p in root.rglob("f*"):
        p.write_bytes(b"x")
    seen.clear()
    t = threading.Thread(target=poll_progress, args=(d, cid, stop, seen))
    t.start()
    try:
        rep = d.restore(cid)
    finally:
        stop.set()
        t.join()
    assert rep["ok"] is True
    assert_same_tree(tree, tree_state(root))
    check_progress(seen, 200)


def test_delete_works_on_a_full_disk(daemon_factory):
    """Deleting is how a user frees space: it must work when the disk is full."""
    d = daemon_factory(backend="tar", start=False, config=FAR)
    (d.roots[0] / "f").write_bytes(os.urandom(300_000))
    with tmpfs(d.state_dir, "2m"):
        d.start()
        a = d.create("a")
        filler = d.state_dir / "filler"
        fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
        try:  # take every block that is left
            while os.write(fd, b"\1" * 4096) > 0:
                pass
        except OSError:
            pass
        finally:
            os.close(fd)
        d.delete(a["checkpoint_id"])
        assert d.list() == []
        assert traces(d, a["checkpoint_id"]) == []
        filler.unlink()
        d.stop()


def test_kill_during_async_create_leaves_nothing(daemon_factory):
    d = daemon_factory(backend="tar", config=FAR)
    root = d.roots[0]
    fill_tree(root, 200 << 20, 100)
    before = state_files(d)
    cid = start_async(d, "killed")["checkpoint_id"]
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # kill it while it is writing
        p = d.get(cid).get("progress")
        if p and p["bytes_done"] > 0:
            break
        time.sleep(0.005)
    assert d.get(cid)["status"] == "creating", "the create finished before the kill"
    d.kill9()
    d.start()
    assert d.list() == []
    assert traces(d, cid) == []
    assert set(state_files(d)) == set(before)
    d.create("after")  # and the next one works


def test_sigterm_finishes_async_create(daemon_factory):
    """A 202 is a promise: stopping the daemon lets the create finish."""
    d = daemon_factory(backend="tar", config=FAR)
    root = d.roots[0]
    fill_tree(root, 100 << 20, 50)
    tree = tree_state(root)
    cid = start_async(d, "promised")["checkpoint_id"]
    assert d.stop() == 0
    d.start()
    rec = d.get(cid)
    assert rec["status"] == "active" and rec["size_bytes"] > 0
    for p in root.rglob("f*"):
        p.unlink()
    d.restore(cid)
    assert_same_tree(tree, tree_state(root))


def test_a_start_whose_port_was_taken_moves_to_a_new_one(daemon_factory):
    """free_port's port can be taken before ckptd binds it (here by another
    ckptd, which answers health too): the test harness starts again on a new
    port, and talks to its own daemon, not to the one on the old port."""
    first = daemon_factory()
    second = daemon_factory(start=False)
    second.port, second.url = first.port, first.url
    second.start()
    assert second.port != first.port
    assert "Address already in use" in second.log()
    assert [d["path"] for d in second.health()["root_details"]] == [str(second.roots[0])]
    assert [d["path"] for d in first.health()["root_details"]] == [str(first.roots[0])]
