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


# ---- hostile archives ----------------------------------------------------

def zstd(raw):
    return subprocess.run(["zstd", "-q", "-c"], input=raw, capture_output=True, check=True).stdout


class Crafted:
    """A pax archive laid out as export lays it out, which a test then spoils."""

    def __init__(self, d):
        self.d = d
        self.entries = []  # (TarInfo, data or None)
        self.manifest_entries = [{"path": ".", "type": "dir"}]
        self.add_dir("roots/0", manifest=False)

    def add_dir(self, name, manifest=True):
        ti = tarfile.TarInfo(name)
        ti.type, ti.mode = tarfile.DIRTYPE, 0o755
        self.entries.append((ti, None))
        if manifest:
            self.manifest_entries.append({"path": name[len("roots/0/"):], "type": "dir", "mode": 0o755})

    def add_file(self, name, data, manifest=True, size=None, digest=None):
        ti = tarfile.TarInfo(name)
        ti.size, ti.mode = len(data), 0o644
        self.entries.append((ti, data))
        if manifest:
            self.manifest_entries.append({
                "path": name[len("roots/0/"):], "type": "file", "mode": 0o644,
                "size": len(data) if size is None else size,
                "sha256": digest or __import__("hashlib").sha256(data).hexdigest()})

    def add(self, ti, manifest_entry=None):
        self.entries.append((ti, None))
        if manifest_entry:
            self.manifest_entries.append(manifest_entry)

    def manifest(self):
        return {"format": "ckptd-export", "version": 1, "backend": "tar",
                "checkpoint": {"checkpoint_id": "cp_0123456789abcdef01234567", "name": "crafted",
                               "labels": {}},
                "base": None,
                "roots": [{"path": str(self.d.roots[0]), "entries": self.manifest_entries}]}

    def blob(self, compress=True):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as t:
            m = json.dumps(self.manifest()).encode()
            ti = tarfile.TarInfo("manifest.json")
            ti.size = len(m)
            t.addfile(ti, io.BytesIO(m))
            for ti, data in self.entries:
                t.addfile(ti, io.BytesIO(data) if data is not None else None)
        return zstd(buf.getvalue()) if compress else buf.getvalue()


@pytest.fixture
def victim(daemon_factory, tmp_path):
    d = daemon_factory(backend="tar")
    (d.roots[0] / "keep").write_text("live\n")
    yield d
    # whatever the archive tried, nothing outside the temp dir was written and the temp dir is gone
    assert not (tmp_path / "escaped").exists()
    assert not (d.base / "escaped").exists()
    assert not (d.state_dir / "escaped").exists()
    assert not list((d.state_dir / "xfer").iterdir()) if (d.state_dir / "xfer").exists() else True
    assert d.list() == []
    assert (d.roots[0] / "keep").read_text() == "live\n" and sorted(os.listdir(d.roots[0])) == ["keep"]


def refused(d, blob, words):
    r = d.request("POST", "/v1/checkpoints/import", data=blob)
    assert r.status_code == 400, r.text
    assert r.json()["code"] == "invalid_archive", r.text
    assert words in r.json()["detail"], r.text


def test_valid_crafted_archive_imports(daemon_factory):
    """The crafting itself is right: unspoiled, it imports (so each refusal
    below is for the one thing spoiled)."""
    d = daemon_factory(backend="tar")
    c = Crafted(d)
    c.add_dir("roots/0/sub")
    c.add_file("roots/0/sub/f", b"hello")
    ti = tarfile.TarInfo("roots/0/ln")
    ti.type, ti.linkname = tarfile.SYMTYPE, "sub/f"
    c.add(ti, {"path": "ln", "type": "symlink", "link": "sub/f", "mode": 0o777})
    rec = import_(d, c.blob())
    d.restore(rec["checkpoint_id"])
    assert (d.roots[0] / "sub/f").read_bytes() == b"hello"
    assert os.readlink(d.roots[0] / "ln") == "sub/f"


def test_absolute_path(victim, tmp_path):
    c = Crafted(victim)
    c.add_file(str(tmp_path / "escaped"), b"x", manifest=False)
    refused(victim, c.blob(), "not below roots/")


def test_absolute_path_inside_roots(victim, tmp_path):
    c = Crafted(victim)
    c.add_file("roots/0/" + str(tmp_path / "escaped"), b"x", manifest=False)
    refused(victim, c.blob(), "'..' path")


def test_dotdot(victim):
    c = Crafted(victim)
    c.add_file("roots/0/../../escaped", b"x", manifest=False)
    refused(victim, c.blob(), "'..' path")


def test_path_past_path_max(victim):
    c = Crafted(victim)
    c.add_file("roots/0/" + "d/" * 2048 + "f", b"x")
    refused(victim, c.blob(), "has a path of 4097 bytes: a root takes them shorter than 4096")
    c = Crafted(victim)  # only the archive's entry is long: the manifest does not list it
    c.add_file("roots/0/" + "d/" * 2048 + "f", b"x", manifest=False)
    refused(victim, c.blob(), "has a path of 4097 bytes: a root takes them shorter than 4096")


def test_symlink_that_escapes(victim):
    c = Crafted(victim)
    ti = tarfile.TarInfo("roots/0/ln")
    ti.type, ti.linkname = tarfile.SYMTYPE, "../../../../.."
    c.add(ti, {"path": "ln", "type": "symlink", "link": "../../../../..", "mode": 0o777})
    c.add_file("roots/0/ln/escaped", b"x")
    refused(victim, c.blob(), "points outside its root")


def test_write_through_symlink(victim):
    """Even a symlink that stays inside cannot be written through."""
    c = Crafted(victim)
    c.add_dir("roots/0/d")
    ti = tarfile.TarInfo("roots/0/ln")
    ti.type, ti.linkname = tarfile.SYMTYPE, "d"
    c.add(ti, {"path": "ln", "type": "symlink", "link": "d", "mode": 0o777})
    c.add_file("roots/0/ln/escaped", b"x")
    refused(victim, c.blob(), "cannot extract")


def test_hardlink_that_leaves(victim, tmp_path):
    target = tmp_path / "outside"
    target.write_text("secret\n")
    c = Crafted(victim)
    ti = tarfile.TarInfo("roots/0/h")
    ti.type, ti.linkname = tarfile.LNKTYPE, str(target)
    c.add(ti, {"path": "h", "type": "hardlink", "link": str(target), "mode": 0o644})
    refused(victim, c.blob(), "not below roots/")
    c = Crafted(victim)
    ti = tarfile.TarInfo("roots/0/h")
    ti.type, ti.linkname = tarfile.LNKTYPE, "roots/0/../../../outside"
    c.add(ti, {"path": "h", "type": "hardlink", "link": "x", "mode": 0o644})
    refused(victim, c.blob(), "'..' path")
    assert target.stat().st_nlink == 1


def test_hardlink_unlike_its_manifest_line(victim):
    """A hard link whose manifest line names another target, or none (as a
    fuzzed archive had it: the key spoiled), is refused like a symlink that
    differs: what the manifest announces is what comes."""
    for line in ({"link": "b"}, {"`ink": "a"}):
        c = Crafted(victim)
        c.add_file("roots/0/a", b"one")
        c.add_file("roots/0/b", b"two")
        ti = tarfile.TarInfo("roots/0/h")
        ti.type, ti.linkname = tarfile.LNKTYPE, "roots/0/a"
        c.add(ti, {"path": "h", "type": "hardlink", "mode": 0o644, **line})
        refused(victim, c.blob(), "hard link 'roots/0/h' differs from the manifest")
    c = Crafted(victim)  # and with the right line it imports
    c.add_file("roots/0/a", b"one")
    ti = tarfile.TarInfo("roots/0/h")
    ti.type, ti.linkname = tarfile.LNKTYPE, "roots/0/a"
    c.add(ti, {"path": "h", "type": "hardlink", "mode": 0o644, "link": "a"})
    rec = import_(victim, c.blob())
    victim.delete(rec["checkpoint_id"])  # the fixture expects no checkpoint left


def test_device_node(victim):
    c = Crafted(victim)
    ti = tarfile.TarInfo("roots/0/null")
    ti.type, ti.devmajor, ti.devminor = tarfile.CHRTYPE, 1, 3
    c.add(ti, {"path": "null", "type": "file", "size": 0, "sha256": "0" * 64})
    refused(victim, c.blob(), "device node")


def test_oversize_entry(victim):
    c = Crafted(victim)
    c.add_file("roots/0/big", b"y" * 100_000, size=10)
    refused(victim, c.blob(), "holds 100000 bytes, the manifest says 10")


def test_manifest_lies_about_size(victim):
    c = Crafted(victim)
    c.add_file("roots/0/small", b"y" * 10, size=100_000)
    refused(victim, c.blob(), "the manifest says 100000")


def test_wrong_digest(victim):
    c = Crafted(victim)
    c.add_file("roots/0/f", b"hello", digest="ab" * 32)
    refused(victim, c.blob(), "sha256")


def test_truncated_stream(victim):
    c = Crafted(victim)
    c.add_file("roots/0/f", os.urandom(300_000))
    blob = c.blob()
    refused(victim, blob[: len(blob) // 2], "truncated")
    raw = c.blob(compress=False)
    # a tar cut at an entry boundary: entries in the manifest are missing
    cut = raw[:1536]
    refused(victim, zstd(cut), "")


def test_duplicate_entry(victim):
    c = Crafted(victim)
    c.add_file("roots/0/f", b"one")
    c.add_file("roots/0/f", b"one", manifest=False)
    refused(victim, c.blob(), "appears twice")


def test_entry_not_in_manifest(victim):
    c = Crafted(victim)
    c.add_file("roots/0/extra", b"x", manifest=False)
    refused(victim, c.blob(), "not in the manifest")


def test_manifest_not_first_and_garbage(victim):
    refused(victim, zstd(b"\0" * 4096), "")
    refused(victim, b"garbage" * 100, "")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as t:
        ti = tarfile.TarInfo("roots/0/f")
        ti.size = 1
        t.addfile(ti, io.BytesIO(b"x"))
    refused(victim, zstd(buf.getvalue()), "first entry must be manifest.json")


def test_overlay_xattrs_are_dropped(daemon_factory):
    """trusted.overlay.* in an archive would steer the overlay layer (redirects
    into other paths): import drops them."""
    d = daemon_factory(backend="overlay")
    c = Crafted(d)
    c.add_dir("roots/0/dir")
    ti = c.entries[-1][0]
    ti.pax_headers = {"SCHILY.xattr.trusted.overlay.redirect": "/etc", "SCHILY.xattr.user.ok": "1"}
    rec = import_(d, c.blob())
    d.restore(rec["checkpoint_id"])
    assert os.listdir(d.roots[0] / "dir") == []
    assert os.getxattr(d.roots[0] / "dir", "user.ok") == b"1"


def _status_kb(pid, key):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


@pytest.mark.parametrize("backend", ["overlay", "tar"])
def test_export_memory_stays_flat(daemon_factory, backend):
    """300 MB through the export: the daemon's peak RSS grows by at most 32 MB
    (the whole file would be ten times that)."""
    d = daemon_factory(backend=backend, config={"cleanup_interval_secs": 3600})
    for i in range(3):
        with open(d.roots[0] / f"big{i}", "wb") as f:
            for _ in range(100):
                f.write(os.urandom(1 << 20))  # incompressible
    cid = d.create("big")["checkpoint_id"]
    pid = d.proc.pid
    with open(f"/proc/{pid}/clear_refs", "w") as f:
        f.write("5")  # reset the peak (VmHWM) to the current RSS
    before = _status_kb(pid, "VmRSS")
    total = 0
    with d.request("GET", f"/v1/checkpoints/{cid}/export", stream=True) as r:
        assert r.status_code == 200
        for piece in r.iter_content(1 << 16):
            total += len(piece)
    peak = _status_kb(pid, "VmHWM")
    grown_mb = (peak - before) / 1024
    print(f"\n{backend}: exported {total >> 20} MB, daemon RSS {before >> 10} MB -> peak {peak >> 10} MB "
          f"(+{grown_mb:.1f} MB)")
    assert total > 300 << 20  # random data does not compress
    assert grown_mb <= 32, f"RSS grew by {grown_mb:.1f} MB"
    if backend == "overlay":  # long enough for the client's bar, fed by the record's progress
        from test_cli import run_pty, BAR
        out = d.base / "big.tar.zst"
        rc, tty = run_pty(["--url", d.url, "export", cid, "-o", str(out)])
        assert rc == 0, tty
        assert BAR.search(tty) and "100%" in tty and f"exporting {cid}" in tty, tty
        assert out.stat().st_size > 300 << 20


# ---- the ckpt client --------------------------------------------------------

def test_cli_export_import(daemon_factory, tmp_path):
    import re
    from test_cli import run, run_pty, BAR
    a = daemon_factory(backend="tar")
    b = daemon_factory(backend="tar")
    make_full_tree(a.roots[0])
    for i in range(40):  # enough that the upload takes a few progress frames
        (a.roots[0] / f"blob{i}").write_bytes(os.urandom(1 << 20))
    want = tree_state(a.roots[0])
    cid = a.create("cli")["checkpoint_id"]
    out = tmp_path / "cp.tar.zst"
    p = run(["--url", a.url, "export", cid, "-o", str(out)])
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith(f"Exported {cid} to {out}") and "\r" not in p.stdout
    assert not (tmp_path / "cp.tar.zst.part").exists()
    with untar(out.read_bytes()) as t:
        assert t.getnames()[0] == "manifest.json"
    # on a terminal: a line with the bytes received, then the same summary
    rc, tty = run_pty(["--url", a.url, "export", cid, "-o", str(tmp_path / "tty.tar.zst")])
    assert rc == 0 and "exporting" in tty and "Exported" in tty, tty
    # import shows a bar on a terminal and prints the new record
    rc, tty = run_pty(["--url", b.url, "import", str(out)])
    assert rc == 0, tty
    assert BAR.search(tty) and "100%" in tty, tty
    new = re.search(r"ID:\s+(cp_[0-9a-f]{24})", tty).group(1)
    assert b.get(new)["import_of"] == cid
    b.restore(new)
    assert_same_tree(want, tree_state(b.roots[0]))
    # errors: unknown id (no file left), no -o, a damaged archive
    p = run(["--url", a.url, "export", "cp_000000000000000000000000", "-o", str(tmp_path / "x")])
    assert p.returncode == 1 and "not_found" in p.stderr
    assert not (tmp_path / "x").exists() and not (tmp_path / "x.part").exists()
    assert run(["--url", a.url, "export", cid]).returncode == 2
    (tmp_path / "bad").write_bytes(out.read_bytes()[:5000])
    p = run(["--url", b.url, "import", str(tmp_path / "bad")])
    assert p.returncode == 1 and "invalid_archive" in p.stderr


@pytest.mark.parametrize("backend", ["tar", "overlay"])
def test_older_checkpoint_of_a_chain_and_two_roots(daemon_factory, tmp_path, backend):
    """An overlay checkpoint below newer ones exports as it was (its own
    chain, whiteouts and redirects resolved), for each of two roots."""
    a = daemon_factory(backend=backend, n_roots=2, start=False)
    b = daemon_factory(backend=backend, n_roots=2, start=False)
    for d in (a, b):
        for i, r in enumerate(d.roots):
            (r / "base-file").write_text(f"base {i}\n")
            (r / "base-dir").mkdir()
            (r / "base-dir/inner").write_text("inner\n")
            os.utime(r / "base-file", ns=(10**18, 10**18))
            os.utime(r / "base-dir/inner", ns=(10**18, 10**18))
        d.start()
    r0, r1 = a.roots
    (r0 / "one").write_text("1\n")
    os.unlink(r1 / "base-file")
    want = [tree_state(r) for r in a.roots]
    first = a.create("first")["checkpoint_id"]
    os.rename(r0 / "base-dir", r0 / "moved")
    (r1 / "two").write_text("2\n")
    os.unlink(r0 / "one")
    a.create("second")
    (r0 / "live-only").write_text("x")
    rec = import_(b, export(a, first))
    b.restore(rec["checkpoint_id"])
    for w, r in zip(want, b.roots):
        assert_same_tree(w, tree_state(r))


def test_import_respects_max_checkpoints(daemon_factory):
    d = daemon_factory(backend="tar", config={"max_checkpoints": 1})
    (d.roots[0] / "f").write_text("x")
    blob = export(d, d.create("only")["checkpoint_id"])
    r = d.request("POST", "/v1/checkpoints/import", data=blob)
    assert r.status_code == 403 and r.json()["code"] == "checkpoint_limit", r.text
    assert len(d.list()) == 1
    assert not list((d.state_dir / "xfer").iterdir())


def test_client_gone_and_daemon_killed_mid_export(daemon_factory):
    """A client that hangs up mid-stream, and a daemon killed mid-stream, leave
    no view mounted and nothing in the transfer area (after the restart)."""
    import socket
    d = daemon_factory(backend="overlay")
    for i in range(4):
        (d.roots[0] / f"big{i}").write_bytes(os.urandom(16 << 20))
    cid = d.create("big")["checkpoint_id"]

    def start_export():
        s = socket.create_connection(("127.0.0.1", d.port))
        s.sendall(f"GET /v1/checkpoints/{cid}/export HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        s.recv(4096)  # headers and the first bytes: the writer is running
        return s

    s = start_export()
    assert any("xfer" in m for m in mounts_under(d.state_dir))
    s.close()
    deadline = time.monotonic() + 20
    while any("xfer" in m for m in mounts_under(d.state_dir)) or list((d.state_dir / "xfer").iterdir()):
        assert time.monotonic() < deadline, "the export's view outlived its client"
        time.sleep(0.1)
    s = start_export()
    d.kill9()
    s.close()
    d.start()
    assert not any("xfer" in m for m in mounts_under(d.state_dir))
    assert not (d.state_dir / "xfer").exists() or not list((d.state_dir / "xfer").iterdir())
    assert d.request("GET", f"/v1/checkpoints/{cid}/export").status_code == 200


def test_sparse_entry_is_refused(victim, tmp_path):
    """A pax sparse entry holds a 64 MiB file in a few KiB: extracted, it would
    write far more than max_import_bytes. Export never writes one; import
    refuses it (found while writing the import fuzz target)."""
    import hashlib
    src = tmp_path / "sparse"
    (src / "roots/0").mkdir(parents=True)
    size = 64 << 20
    with open(src / "roots/0/big", "wb") as f:  # a hole, then one byte
        f.seek(size - 1)
        f.write(b"x")
    entries = [{"path": ".", "type": "dir"},
               {"path": "big", "type": "file", "mode": 0o644, "size": size,
                "sha256": hashlib.sha256(bytes(size - 1) + b"x").hexdigest()}]
    manifest = {"format": "ckptd-export", "version": 1, "backend": "tar",
                "checkpoint": {"checkpoint_id": "cp_0123456789abcdef01234567", "name": "sparse", "labels": {}},
                "base": None, "roots": [{"path": str(victim.roots[0]), "entries": entries}]}
    (src / "manifest.json").write_text(json.dumps(manifest))
    raw = subprocess.run(["tar", "--format=pax", "--sparse", "--no-recursion", "-C", str(src), "-cf", "-",
                          "manifest.json", "roots/0", "roots/0/big"], capture_output=True, check=True).stdout
    assert len(raw) < 64 << 10
    assert b"GNU.sparse" in raw
    refused(victim, zstd(raw), "sparse")



def test_manifest_bigger_than_the_disk_is_refused_before_extraction(victim):
    """A decompression bomb: the manifest (to which every entry is held)
    declares 16 TiB; refused up front with 507, nothing written."""
    c = Crafted(victim)
    c.add_file("roots/0/big", b"x" * 4096, size=1 << 44)
    r = victim.request("POST", "/v1/checkpoints/import", data=c.blob())
    assert r.status_code == 507, r.text
    assert r.json()["code"] == "insufficient_storage" and "unpacks to" in r.json()["detail"], r.text


def test_export_of_the_base_leaves_it_mounted(daemon_factory, tmp_path):
    """A checkpoint with no layer is exported straight from the base bind.
    Closing that view must not detach the bind: with the default state dir
    (/var/lib/ckptd) it did, and restores then mounted over an empty base."""
    d = daemon_factory(backend="overlay", start=False)
    d.state_dir = d.base / "var/lib/ckptd"  # below base: cleanup unmounts what is there
    make_full_tree(d.roots[0])
    d.start()
    want = tree_state(d.roots[0])
    cid = d.create("untouched")["checkpoint_id"]
    assert export(d, cid)
    (d.roots[0] / "file.txt").write_text("changed\n")
    d.create("changed")
    d.restore(cid)
    assert_same_tree(want, tree_state(d.roots[0]))
