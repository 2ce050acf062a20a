"""Push and pull against a real registry: Debian's docker-registry
(distribution 2.8) on a loopback port with htpasswd auth, or token auth
served by a small token server here. Two ckptd daemons with separate state
dirs and roots stand for two machines. skopeo and umoci read what ckptd
pushed, and make an image ckptd pulls. Hostile and broken images are made
here with tarfile and pushed with plain HTTP calls."""
import base64
import gzip
import hashlib
import io
import json
import os
import pathlib
import shutil
import socket
import subprocess
import tarfile
import threading
import time

import pytest
import requests

from conftest import assert_same_tree, free_port, make_acl_tree, make_full_tree, mounts_under, tree_state

USER, PASSWORD = "ckptuser", "s3cret-pw"


class Registry:
    def __init__(self, base, auth="htpasswd", token_realm=None, cert=None, tls=None):
        self.base = pathlib.Path(base)
        self.base.mkdir(parents=True, exist_ok=True)
        self.data = self.base / "data"
        self.port = free_port()
        self.host = f"127.0.0.1:{self.port}"
        self.url = f"http://{self.host}"
        cfg = ["version: 0.1", "log:", "  level: warn", "storage:", "  filesystem:",
               f"    rootdirectory: {self.data}", "  delete:", "    enabled: true",
               "http:", f"  addr: {self.host}"]
        if tls:
            cfg += ["  tls:", f"    certificate: {tls[0]}", f"    key: {tls[1]}"]
            self.url = f"https://{self.host}"
        if auth == "htpasswd":
            pw = subprocess.run(["htpasswd", "-Bbn", USER, PASSWORD], capture_output=True,
                                check=True, text=True).stdout
            (self.base / "htpasswd").write_text(pw)
            cfg += ["auth:", "  htpasswd:", "    realm: test", f"    path: {self.base / 'htpasswd'}"]
        elif auth == "token":
            cfg += ["auth:", "  token:", f"    realm: {token_realm}", "    service: test-registry",
                    "    issuer: test-issuer", f"    rootcertbundle: {cert}"]
        (self.base / "config.yml").write_text("\n".join(cfg) + "\n")
        self.start()

    def start(self):
        self.log = open(self.base / "registry.log", "ab")
        self.proc = subprocess.Popen(["docker-registry", "serve", str(self.base / "config.yml")],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("docker-registry did not start")

    def blobs(self):
        d = self.data / "docker/registry/v2/blobs/sha256"
        return {p.name for p in d.glob("*/*")} if d.exists() else set()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)
        self.log.close()

    def kill(self):
        self.proc.kill()
        self.proc.wait(10)
        self.log.close()

    # raw protocol, for images ckptd did not make
    def put_blob(self, repo, data, auth=(USER, PASSWORD)):
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        r = requests.post(f"{self.url}/v2/{repo}/blobs/uploads/", auth=auth)
        assert r.status_code == 202, r.text
        loc = r.headers["Location"]
        loc = loc if loc.startswith("http") else self.url + loc
        sep = "&" if "?" in loc else "?"
        r = requests.put(f"{loc}{sep}digest={digest}", data=data, auth=auth,
                         headers={"Content-Type": "application/octet-stream"})
        assert r.status_code == 201, r.text
        return digest

    def put_manifest(self, repo, tag, body, media_type, auth=(USER, PASSWORD)):
        data = json.dumps(body).encode()
        r = requests.put(f"{self.url}/v2/{repo}/manifests/{tag}", data=data, auth=auth,
                         headers={"Content-Type": media_type})
        assert r.status_code == 201, r.text
        return "sha256:" + hashlib.sha256(data).hexdigest()


@pytest.fixture
def registry(tmp_path):
    regs = []

    def make(**kw):
        r = Registry(tmp_path / f"reg{len(regs)}", **kw)
        regs.append(r)
        return r

    yield make
    for r in regs:
        r.stop()


def auth_file(path, hosts, user=USER, password=PASSWORD):
    tok = base64.b64encode(f"{user}:{password}".encode()).decode()
    path.write_text(json.dumps({"auths": {h: {"auth": tok} for h in hosts}}))
    return str(path)


def reg_config(tmp_path, reg, **extra):
    cfg = {"registry_insecure": [reg.host],
           "registry_auth_file": auth_file(tmp_path / f"auth-{reg.port}.json", [reg.host])}
    cfg.update(extra)
    return cfg


def push(d, cid, ref, expect=200, **body):
    r = d.request("POST", f"/v1/checkpoints/{cid}/push", json={"ref": ref, **body})
    assert r.status_code == expect, r.text
    return r.json()


def pull(d, ref, expect=201, **body):
    r = d.request("POST", "/v1/checkpoints/pull", json={"ref": ref, **body})
    assert r.status_code == expect, r.text
    return r.json()


def xfer_empty(d):
    x = d.state_dir / "xfer"
    return not x.exists() or not any(x.iterdir())


def ten_changes(root):
    for i in range(6):
        (root / f"change-{i}.txt").write_text(f"change {i}\n")
    (root / "file.txt").write_text("edited again\n")
    os.unlink(root / "exec.sh")
    shutil.rmtree(root / "dir/sub-renamed")
    os.chmod(root / "setgid-dir", 0o2755)


@pytest.mark.parametrize("backend", ["tar", "overlay"])
def test_push_pull_two_machines(daemon_factory, registry, tmp_path, backend):
    reg = registry()
    # An overlay create after a tracked one is a delta layer stacked on the
    # previous layers: that is what makes the first checkpoint an ancestor of
    # the second. "auto" tracks uppers from 2,000 entries; this tree is small.
    track = {"track_changes": "always"} if backend == "overlay" else {}
    a = daemon_factory(backend=backend, start=False, config=reg_config(tmp_path, reg, **track))
    b = daemon_factory(backend=backend, config=reg_config(tmp_path, reg))
    make_full_tree(a.roots[0])
    (a.roots[0] / "big.bin").write_bytes(os.urandom(3 << 20))
    a.start()
    root = a.roots[0]
    (root / "file.txt").write_text("changed\n")
    (root / "dir/new").mkdir()
    (root / "dir/new/f").write_bytes(os.urandom(70_000))
    os.unlink(root / "secret")
    os.rename(root / "dir/sub", root / "dir/sub-renamed")  # a redirect on overlay
    want = tree_state(root)
    cp = a.create("first")
    ref = f"{reg.host}/team/app"
    out = push(a, cp["checkpoint_id"], ref)
    assert out["ref"] == f"{ref}:first"  # the tag defaults to the name
    assert out["digest"].startswith("sha256:")
    assert len(out["layers"]) == 2 and all(l["uploaded"] for l in out["layers"])
    assert out["reused_bytes"] == 0
    assert out["uploaded_bytes"] > 3 << 20  # the base holds the incompressible 3 MiB
    blobs1 = reg.blobs()
    assert {l["digest"][7:] for l in out["layers"]} <= blobs1

    # the second machine, whose root lives at another path
    p = pull(b, out["ref"], roots={str(a.roots[0]): str(b.roots[0])})
    assert p["pull_of"] == {"ref": out["ref"], "digest": out["digest"],
                            "roots": {str(a.roots[0]): str(b.roots[0])}}
    assert "2 of 2 layers applied over nothing" in b.log()
    assert p["name"] == "first"
    b.restore(p["checkpoint_id"])
    assert_same_tree(want, tree_state(b.roots[0]))
    assert xfer_empty(a) and xfer_empty(b)

    # ten changes: only the new checkpoint's own layer (and config) go up
    ten_changes(root)
    want2 = tree_state(root)
    cp2 = a.create("second")
    out2 = push(a, cp2["checkpoint_id"], ref)
    base = out["layers"][0]
    # base, first's layer (first is an ancestor of second), second's own
    assert [l["digest"] for l in out2["layers"][:2]] == [l["digest"] for l in out["layers"]]
    assert [l["uploaded"] for l in out2["layers"]] == [False, False, True]
    assert out2["reused_bytes"] >= base["size"] + out["layers"][1]["size"]
    # what went up: the ten changes and the small config, not the 3 MiB base
    own = out2["layers"][2]["size"]
    assert own < 20_000 and own <= out2["uploaded_bytes"] < own + 4096, out2
    assert base["size"] > 3 << 20
    new = reg.blobs() - blobs1
    # the layer, the config and the manifest (the registry keeps manifests as blobs too)
    assert out2["layers"][2]["digest"][7:] in new and out2["digest"][7:] in new and len(new) == 3

    p2 = pull(b, out2["ref"], roots={str(a.roots[0]): str(b.roots[0])})
    # the first two layers are held (the first pull's tree, linked): neither
    # fetched nor applied again; the new layer alone comes and goes over it
    assert (f"1 of 3 layers applied over checkpoint {p['checkpoint_id']}, "
            f"{out2['layers'][2]['size']} bytes fetched") in b.log()
    b.restore(p2["checkpoint_id"])
    assert_same_tree(want2, tree_state(b.roots[0]))
    b.restore(p["checkpoint_id"])
    assert_same_tree(want, tree_state(b.roots[0]))


def test_untracked_overlay_layer_holds_all_since_the_base(daemon_factory, registry, tmp_path):
    """Without tracking an overlay create copies the whole upper: the second
    checkpoint has no ancestor, and its layer holds the first one's changes
    too. The image is still exact."""
    reg = registry()
    a = daemon_factory(backend="overlay", config=reg_config(tmp_path, reg, track_changes="never"))
    (a.roots[0] / "one").write_bytes(os.urandom(100_000))
    a.create("one")
    (a.roots[0] / "two").write_text("two\n")
    want = tree_state(a.roots[0])
    cp2 = a.create("two")
    out = push(a, cp2["checkpoint_id"], f"{reg.host}/untracked/img")
    assert len(out["layers"]) == 2 and out["layers"][1]["size"] > 100_000
    p = pull(a, out["ref"])
    a.restore(p["checkpoint_id"])
    assert_same_tree(want, tree_state(a.roots[0]))


def test_next_pull_links_the_tree_below_the_last_layer(daemon_factory, registry, tmp_path):
    """Untracked, the next checkpoint's image is the base and one layer of all
    it changed: no checkpoint pulled before holds a prefix of it, but the tree
    a pull keeps below its image's last layer does. The next pull links that
    tree and applies one layer; its blobs and tree go with its checkpoints."""
    reg = registry()
    a = daemon_factory(backend="overlay", start=False, config=reg_config(tmp_path, reg, track_changes="never"))
    b = daemon_factory(backend="overlay", config=reg_config(tmp_path, reg))
    make_full_tree(a.roots[0])
    (a.roots[0] / "big.bin").write_bytes(os.urandom(1 << 20))
    a.start()
    (a.roots[0] / "one").write_text("one\n")
    os.rename(a.roots[0] / "dir/sub", a.roots[0] / "dir/sub-renamed")
    out1 = push(a, a.create("one")["checkpoint_id"], f"{reg.host}/next/img")
    ten_changes(a.roots[0])
    want2 = tree_state(a.roots[0])
    out2 = push(a, a.create("two")["checkpoint_id"], f"{reg.host}/next/img")
    assert out2["layers"][0]["digest"] == out1["layers"][0]["digest"] and len(out2["layers"]) == 2
    roots = {str(a.roots[0]): str(b.roots[0])}
    p1 = pull(b, out1["ref"], roots=roots)
    assert "2 of 2 layers applied over nothing" in b.log()
    trees = b.state_dir / "oci/trees"
    assert len(os.listdir(trees)) == 1
    p2 = pull(b, out2["ref"], roots=roots)
    assert "1 of 2 layers applied over kept tree" in b.log()
    b.restore(p2["checkpoint_id"])
    assert_same_tree(want2, tree_state(b.roots[0]))
    # the files the layer left alone are the kept tree's, linked
    tree = next(trees.iterdir()) / "0"
    assert os.stat(tree / "big.bin").st_nlink >= 3  # the tree, and both checkpoints' layers

    b.delete(p1["checkpoint_id"])
    b.delete(p2["checkpoint_id"])
    deadline = time.monotonic() + 60
    while True:
        # counted before the look: a trim between the two is then waited
        # for no more (it logs after it removed)
        runs = b.log().count("registry cache: removed")
        if not (os.listdir(trees) or os.listdir(b.state_dir / "oci/blobs")):
            break
        assert time.monotonic() < deadline, b.log()[-2000:]
        b.wait_log("registry cache: removed", runs + 1)
    assert os.listdir(trees) == [] and os.listdir(b.state_dir / "oci/blobs") == []


def test_pull_applies_every_layer_when_its_start_cannot_be_linked(daemon_factory, registry, tmp_path):
    """The start a pull chose may be gone when it links it (a checkpoint
    deleted meanwhile; here, a kept tree with a root missing): the pull then
    fetches and applies every layer, and the result is exact."""
    reg = registry()
    a = daemon_factory(backend="overlay", config=reg_config(tmp_path, reg, track_changes="never"))
    b = daemon_factory(backend="overlay", config=reg_config(tmp_path, reg))
    (a.roots[0] / "one").write_text("one\n")
    out1 = push(a, a.create("one")["checkpoint_id"], f"{reg.host}/fall/back")
    (a.roots[0] / "two").write_text("two\n")
    want = tree_state(a.roots[0])
    out2 = push(a, a.create("two")["checkpoint_id"], f"{reg.host}/fall/back")
    roots = {str(a.roots[0]): str(b.roots[0])}
    pull(b, out1["ref"], roots=roots)
    tree = next((b.state_dir / "oci/trees").iterdir())
    shutil.rmtree(tree / "0")
    p2 = pull(b, out2["ref"], roots=roots)
    assert f"cannot start from kept tree {tree.name}" in b.log()
    assert "2 of 2 layers applied over nothing" in b.log().split(f"cannot start from kept tree {tree.name}")[1]
    b.restore(p2["checkpoint_id"])
    assert_same_tree(want, tree_state(b.roots[0]))
    assert xfer_empty(b)


def test_oci_cache_trimmed_and_counted(daemon_factory, registry, tmp_path):
    """A deleted checkpoint's layers, keys and config leave the cache, the
    base's stay; what the cache holds counts toward max_state_bytes; leftovers
    no checkpoint needs go at start."""
    reg = registry()
    a = daemon_factory(backend="overlay", start=False,
                       config=reg_config(tmp_path, reg, max_state_bytes=4 << 20))
    (a.roots[0] / "big.bin").write_bytes(os.urandom(2 << 20))
    a.start()
    (a.roots[0] / "x").write_bytes(os.urandom(1_000_000))
    cp = a.create("one")
    out = push(a, cp["checkpoint_id"], f"{reg.host}/trim/img")
    blobs, keys = a.state_dir / "oci/blobs", a.state_dir / "oci/keys"
    base, own = (l["digest"][7:] for l in out["layers"])
    assert {base, own} <= set(os.listdir(blobs)) and len(os.listdir(blobs)) == 3  # and the config
    # the cache's 3 MB of layers, 1 MB of checkpoint, 2.2 MB in the next: over 4 MiB;
    # without the cache 3.2 MB would fit
    (a.roots[0] / "y").write_bytes(os.urandom(1_200_000))
    r = a.request("POST", "/v1/checkpoints", json={"name": "over"})
    assert r.status_code == 507 and "registry cache" in r.json()["detail"], r.text

    runs = a.log().count("registry cache: removed")
    a.delete(cp["checkpoint_id"])
    a.wait_log("registry cache: removed", runs + 1)
    assert os.listdir(blobs) == [base]  # the base's layer serves the next push
    assert [k for k in os.listdir(keys) if cp["checkpoint_id"] in k] == []
    os.unlink(a.roots[0] / "x")
    a.create("fits")  # the 2 MiB base layer and 1.2 MB

    a.stop()
    (blobs / ("ab" * 32)).write_bytes(b"left by nobody")
    (blobs / ".cfg.tmp.0123abcd").write_bytes(b"a killed write")
    (a.state_dir / "oci/trees" / ("cd" * 32)).mkdir()
    a.start()
    assert os.listdir(blobs) == [base] and os.listdir(a.state_dir / "oci/trees") == []


def test_same_checkpoint_same_digest(daemon_factory, registry, tmp_path):
    """Layers are made again from scratch (cache removed): the bytes, and so
    the manifest digest, are the same. The base is made, then asked for: the
    registry holds it. A checkpoint's layer this daemon does not know it made
    is sent while it is made, without asking first: it goes up again
    (docs/registry.md says why)."""
    reg = registry()
    a = daemon_factory(backend="overlay", start=False, config=reg_config(tmp_path, reg))
    make_full_tree(a.roots[0])
    a.start()
    (a.roots[0] / "x").write_text("x\n")
    cp = a.create("same")
    ref = f"{reg.host}/det/one"
    d1 = push(a, cp["checkpoint_id"], ref)["digest"]
    shutil.rmtree(a.state_dir / "oci")
    d2 = push(a, cp["checkpoint_id"], ref + ":again")
    assert d2["digest"] == d1
    assert [layer["uploaded"] for layer in d2["layers"]] == [False] + [True] * (len(d2["layers"]) - 1), d2
    assert d2["uploaded_bytes"] == sum(layer["size"] for layer in d2["layers"][1:]), d2
    d3 = push(a, cp["checkpoint_id"], ref + ":third")
    assert d3["digest"] == d1 and d3["uploaded_bytes"] == 0  # made now: HEAD finds every blob


def test_skopeo_and_umoci_read_it(daemon_factory, registry, tmp_path):
    reg = registry()
    a = daemon_factory(backend="overlay", start=False,
                       config=reg_config(tmp_path, reg, registry_compression="gzip"))
    make_full_tree(a.roots[0])
    (a.roots[0] / "gone.txt").write_text("will be deleted\n")
    (a.roots[0] / "olddir").mkdir()
    (a.roots[0] / "olddir/inner").write_text("inner\n")
    a.start()
    os.unlink(a.roots[0] / "gone.txt")
    shutil.rmtree(a.roots[0] / "olddir")
    (a.roots[0] / "olddir").write_text("now a file\n")
    want = tree_state(a.roots[0], mtimes=False)
    cp = a.create("for-tools")
    out = push(a, cp["checkpoint_id"], f"{reg.host}/tools/img")
    creds = ["--creds", f"{USER}:{PASSWORD}"]
    info = json.loads(subprocess.run(["skopeo", "inspect", "--tls-verify=false", *creds,
                                      f"docker://{out['ref']}"], capture_output=True, text=True,
                                     check=True).stdout)
    assert info["Layers"] == [l["digest"] for l in out["layers"]]
    assert info["Os"] == "linux" and info["Architecture"] == "amd64"
    raw = json.loads(subprocess.run(["skopeo", "inspect", "--raw", "--tls-verify=false", *creds,
                                     f"docker://{out['ref']}"], capture_output=True, text=True,
                                    check=True).stdout)
    ann = raw["annotations"]
    assert ann["io.ckptd.checkpoint_id"] == cp["checkpoint_id"] and ann["io.ckptd.name"] == "for-tools"
    assert json.loads(ann["io.ckptd.roots"]) == [str(a.roots[0])]
    assert all(l["mediaType"].endswith("tar+gzip") for l in raw["layers"])
    layout = tmp_path / "layout"
    subprocess.run(["skopeo", "copy", "--src-tls-verify=false", "--src-creds", f"{USER}:{PASSWORD}",
                    f"docker://{out['ref']}", f"oci:{layout}:img"], check=True, capture_output=True)
    bundle = tmp_path / "bundle"
    subprocess.run(["umoci", "unpack", "--rootless", "--image", f"{layout}:img", str(bundle)],
                   check=True, capture_output=True)
    got = tree_state(bundle / "rootfs" / str(a.roots[0]).lstrip("/"), mtimes=False)
    assert "gone.txt" not in got and "olddir/inner" not in got  # whiteouts applied
    # umoci --rootless cannot give away files or make fifos: compare what it keeps
    def kept(t):
        return {k: (v[0], v[1] & 0o777, v[4], v[6], v[7]) for k, v in t.items() if k != "fifo"}
    assert_same_tree(kept(want), kept(got))


def test_pull_an_image_other_tools_made(daemon_factory, registry, tmp_path):
    reg = registry()
    b = daemon_factory(backend="overlay", config=reg_config(tmp_path, reg))
    layout = tmp_path / "layout"
    subprocess.run(["umoci", "init", "--layout", str(layout)], check=True)
    subprocess.run(["umoci", "new", "--image", f"{layout}:t"], check=True)
    bundle = tmp_path / "bundle"
    subprocess.run(["umoci", "unpack", "--rootless", "--image", f"{layout}:t", str(bundle)], check=True,
                   capture_output=True)
    src = bundle / "rootfs" / str(b.roots[0]).lstrip("/")
    src.mkdir(parents=True)
    (src / "hello.txt").write_text("from umoci\n")
    (src / "sub").mkdir()
    (src / "sub/data").write_bytes(os.urandom(50_000))
    os.symlink("hello.txt", src / "link")
    want = tree_state(src, mtimes=False)
    subprocess.run(["umoci", "repack", "--image", f"{layout}:t", str(bundle)], check=True,
                   capture_output=True)
    ref = f"{reg.host}/made/elsewhere:t"
    subprocess.run(["skopeo", "copy", "--dest-tls-verify=false", "--dest-creds", f"{USER}:{PASSWORD}",
                    f"oci:{layout}:t", f"docker://{ref}"], check=True, capture_output=True)
    p = pull(b, ref)
    assert p["name"] == "pulled" and p["pull_of"]["ref"] == ref
    b.restore(p["checkpoint_id"])
    got = tree_state(b.roots[0], mtimes=False)
    strip = lambda t: {k: (v[0], v[4], v[6], v[7]) for k, v in t.items()}
    assert_same_tree(strip(want), strip(got))


def test_base_false_needs_the_same_base(daemon_factory, registry, tmp_path):
    reg = registry()
    seed = make_full_tree(tmp_path / "seed")
    a = daemon_factory(backend="overlay", start=False, config=reg_config(tmp_path, reg))
    b = daemon_factory(backend="overlay", start=False, config=reg_config(tmp_path, reg),
                       roots=[tmp_path / "d1" / "b-root"])  # inside d1: cleaned up with it
    c = daemon_factory(backend="overlay", start=False, config=reg_config(tmp_path, reg))
    for d in (a, b):
        subprocess.run(["cp", "-a", f"{seed}/.", str(d.roots[0])], check=True)
    (c.roots[0] / "other").write_text("another base\n")
    for d in (a, b, c):
        d.start()
    (a.roots[0] / "added").write_text("on top\n")
    want = tree_state(a.roots[0])
    cp = a.create("thin")
    out = push(a, cp["checkpoint_id"], f"{reg.host}/thin/img", base=False)
    assert len(out["layers"]) == 1
    # the base identity covers the tree, not the path: b's root sits elsewhere
    p = pull(b, out["ref"], roots={str(a.roots[0]): str(b.roots[0])})
    b.restore(p["checkpoint_id"])
    assert_same_tree(want, tree_state(b.roots[0]))
    before = c.list()
    r = c.request("POST", "/v1/checkpoints/pull",
                  json={"ref": out["ref"], "roots": {str(a.roots[0]): str(c.roots[0])}})
    assert r.status_code == 409 and r.json()["code"] == "base_mismatch", r.text
    assert c.list() == before and xfer_empty(c)


# ---- failures: each answers a problem with a code and changes nothing ----

@pytest.fixture
def one(daemon_factory, registry, tmp_path):
    reg = registry()
    d = daemon_factory(backend="tar", config=reg_config(tmp_path, reg, max_import_bytes=2_000_000))
    (d.roots[0] / "f").write_text("f\n")
    cp = d.create("c")
    return reg, d, cp


def refused(d, method, path, body, status, code):
    before = d.list()
    r = d.request(method, path, json=body)
    assert r.status_code == status, r.text
    p = r.json()
    assert p["code"] == code and p["status"] == status, p
    assert r.headers["Content-Type"].startswith("application/problem+json")
    assert d.list() == before and xfer_empty(d)
    return p


def test_unreachable_registry(one):
    reg, d, cp = one
    port = free_port()
    refused(d, "POST", f"/v1/checkpoints/{cp['checkpoint_id']}/push", {"ref": f"127.0.0.1:{port}/x/y"},
            502, "registry_unreachable")
    refused(d, "POST", "/v1/checkpoints/pull", {"ref": f"127.0.0.1:{port}/x/y:t"}, 502,
            "registry_unreachable")


def test_wrong_credentials(daemon_factory, registry, tmp_path):
    reg = registry()
    cfg = {"registry_insecure": [reg.host],
           "registry_auth_file": auth_file(tmp_path / "bad.json", [reg.host], password="wrong-pw")}
    d = daemon_factory(backend="tar", config=cfg)
    cp = d.create("c")
    p = refused(d, "POST", f"/v1/checkpoints/{cp['checkpoint_id']}/push", {"ref": f"{reg.host}/x/y"}, 502,
                "registry_unauthorized")
    assert "wrong-pw" not in p["detail"] and "wrong-pw" not in d.log()
    assert base64.b64encode(f"{USER}:wrong-pw".encode()).decode() not in d.log()


def test_no_credentials(daemon_factory, registry, tmp_path):
    reg = registry()
    d = daemon_factory(backend="tar", config={"registry_insecure": [reg.host],
                                              "registry_auth_file": str(tmp_path / "none.json")})
    refused(d, "POST", "/v1/checkpoints/pull", {"ref": f"{reg.host}/x/y:t"}, 502, "registry_unauthorized")


def test_unknown_tag_and_digest(one):
    reg, d, cp = one
    push(d, cp["checkpoint_id"], f"{reg.host}/known/repo")
    refused(d, "POST", "/v1/checkpoints/pull", {"ref": f"{reg.host}/known/repo:nosuchtag"}, 404,
            "manifest_unknown")
    refused(d, "POST", "/v1/checkpoints/pull", {"ref": f"{reg.host}/known/repo@sha256:" + "0" * 64}, 404,
            "manifest_unknown")


def test_bad_refs(one):
    reg, d, cp = one
    for ref in ["nohost", f"{reg.host}/UPPER/case", f"{reg.host}/r:bad tag", f"{reg.host}/r@sha256:12"]:
        refused(d, "POST", "/v1/checkpoints/pull", {"ref": ref}, 400, "invalid_ref")


def layer_tar(entries, compress=gzip.compress):
    """entries: (name, kind, extra) with kind file/dir/symlink/hardlink/chr."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as t:
        for name, kind, extra in entries:
            ti = tarfile.TarInfo(name)
            data = None
            if kind == "file":
                data = extra or b""
                ti.size = len(data)
            elif kind == "dir":
                ti.type, ti.mode = tarfile.DIRTYPE, 0o755
            elif kind == "symlink":
                ti.type, ti.linkname = tarfile.SYMTYPE, extra
            elif kind == "hardlink":
                ti.type, ti.linkname = tarfile.LNKTYPE, extra
            elif kind == "chr":
                ti.type, ti.devmajor, ti.devminor = tarfile.CHRTYPE, 1, 3
            t.addfile(ti, io.BytesIO(data) if data is not None else None)
    raw = buf.getvalue()
    return raw, compress(raw)


def put_image(reg, repo, tag, layers, media="application/vnd.oci.image.layer.v1.tar+gzip", config=None,
              annotations=None):
    """layers: [(raw tar, blob)]; pushes the blobs, a config and the manifest."""
    cfg = config or {"architecture": "amd64", "os": "linux",
                     "rootfs": {"type": "layers",
                                "diff_ids": ["sha256:" + hashlib.sha256(r).hexdigest() for r, _ in layers]}}
    cb = json.dumps(cfg).encode()
    man = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
           "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                      "digest": reg.put_blob(repo, cb), "size": len(cb)},
           "layers": [{"mediaType": media, "digest": reg.put_blob(repo, b), "size": len(b)} for _, b in layers]}
    if annotations:
        man["annotations"] = annotations
    return reg.put_manifest(repo, tag, man, man["mediaType"])


def rootp(d):
    return str(d.roots[0]).lstrip("/")


@pytest.mark.parametrize("case", ["absolute", "dotdot", "escaping-symlink", "device", "foreign-hardlink",
                                  "through-symlink", "long-whiteout"])
def test_hostile_layers(one, case):
    reg, d, cp = one
    r = rootp(d)
    layers = {
        "absolute": [[(f"/{r}/x", "file", b"x")]],
        "dotdot": [[(f"{r}/../../../../etc/evil", "file", b"x")]],
        "escaping-symlink": [[(f"{r}/up", "symlink", "../../../../../etc")]],
        "device": [[(f"{r}/null", "chr", None)]],
        "foreign-hardlink": [[(f"{r}/pw", "hardlink", "etc/passwd")]],
        # a symlink in one layer, then a path through it in the next
        "through-symlink": [[(f"{r}/d", "symlink", "/etc")], [(f"{r}/d/.wh.passwd", "file", b"")]],
        # a whiteout past PATH_MAX, which a cut would have made name a prefix of it
        "long-whiteout": [[(f"{r}/keep/f", "file", b"x"), (f"{r}/keep{'/d' * 2100}/.wh.x", "file", b"")]],
    }[case]
    built = [layer_tar(l) for l in layers]
    put_image(reg, "hostile/img", case, built)
    p = refused(d, "POST", "/v1/checkpoints/pull", {"ref": f"{reg.host}/hostile/img:{case}"}, 400,
                "invalid_layer" if case != "foreign-hardlink" else "invalid_layer")
    assert "refused layer" in p["detail"]
    assert os.path.exists("/etc/passwd")


def test_digest_mismatch(one):
    reg, d, cp = one
    r = rootp(d)
    raw, blob = layer_tar([(f"{r}/a", "file", b"a" * 1000)])
    put_image(reg, "bad/digest", "t", [(raw, blob)])
    digest = hashlib.sha256(blob).hexdigest()
    data = reg.data / f"docker/registry/v2/blobs/sha256/{digest[:2]}/{digest}/data"
    forged = bytearray(data.read_bytes())
    forged[-5] ^= 0xFF
    data.write_bytes(bytes(forged))
    refused(d, "POST", "/v1/checkpoints/pull", {"ref": f"{reg.host}/bad/digest:t"}, 502, "digest_mismatch")
    assert digest not in os.listdir(d.state_dir / "oci/blobs")


@pytest.mark.parametrize("wrong", ["digest", "size"])
def test_blob_fails_its_checks_at_its_end(one, wrong):
    """A forged byte in the data of an uncompressed layer, or a manifest size
    10 bytes over what the registry holds: the tar itself is valid, so only
    the blob's checks at its end find it. Nothing stays: no checkpoint, no
    temp file, no blob."""
    reg, d, cp = one
    r = rootp(d)
    data = os.urandom(1_500_000)  # many of the feed's blocks
    raw, _ = layer_tar([(f"{r}/big", "file", data), (f"{r}/small", "file", b"s")], compress=lambda b: b)
    media = "application/vnd.oci.image.layer.v1.tar"
    digest = put_image(reg, "bad/late", wrong, [(raw, raw)], media=media)
    blob = hashlib.sha256(raw).hexdigest()
    if wrong == "digest":
        f = reg.data / f"docker/registry/v2/blobs/sha256/{blob[:2]}/{blob}/data"
        forged = bytearray(f.read_bytes())
        forged[len(forged) // 2] ^= 0xFF  # in big's data: the tar stays valid
        f.write_bytes(bytes(forged))
    else:
        man = requests.get(f"{reg.url}/v2/bad/late/manifests/{digest}", auth=(USER, PASSWORD),
                           headers={"Accept": "application/vnd.oci.image.manifest.v1+json"}).json()
        man["layers"][0]["size"] += 10
        reg.put_manifest("bad/late", wrong, man, man["mediaType"])
    refused(d, "POST", "/v1/checkpoints/pull", {"ref": f"{reg.host}/bad/late:{wrong}"}, 502, f"{wrong}_mismatch")
    assert blob not in os.listdir(d.state_dir / "oci/blobs")
    assert not (d.roots[0] / "big").exists()


class DroppingRegistry:
    """A registry of one image, served from memory, that cuts the first GET
    of one blob after half its bytes: the connection drops mid-layer."""

    def __init__(self, repo, tag, blobs, manifest, cut):
        import http.server
        self.gets = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def do_GET(self):
                outer.gets.append(self.path)
                if self.path == f"/v2/{repo}/manifests/{tag}":
                    body, ctype = manifest, "application/vnd.oci.image.manifest.v1+json"
                elif self.path.startswith(f"/v2/{repo}/blobs/") and self.path.rsplit("/", 1)[1] in blobs:
                    body, ctype = blobs[self.path.rsplit("/", 1)[1]], "application/octet-stream"
                else:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.path.endswith(cut) and outer.gets.count(self.path) == 1:
                    self.wfile.write(body[:len(body) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    return
                self.wfile.write(body)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.host = f"127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


def test_connection_dropped_mid_layer_then_retry(daemon_factory, tmp_path):
    """The registry closes the connection halfway through a layer: the pull
    fails as unreachable and leaves nothing; the retry completes."""
    d = daemon_factory(backend="tar", start=False)
    r = str(d.roots[0]).lstrip("/")
    files = {f"f{i}": os.urandom(300_000) for i in range(8)}
    raw, blob = layer_tar([(f"{r}/{k}", "file", v) for k, v in files.items()])
    cfg = json.dumps({"architecture": "amd64", "os": "linux",
                      "rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(raw).hexdigest()]}}).encode()
    dg = {b: "sha256:" + hashlib.sha256(b).hexdigest() for b in (cfg, blob)}
    man = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                      "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": dg[cfg],
                                 "size": len(cfg)},
                      "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": dg[blob],
                                  "size": len(blob)}]}).encode()
    fake = DroppingRegistry("drop/img", "t", {dg[cfg]: cfg, dg[blob]: blob}, man, dg[blob])
    try:
        d.config = {"registry_insecure": [fake.host]}
        d.start()
        ref = f"{fake.host}/drop/img:t"
        p = refused(d, "POST", "/v1/checkpoints/pull", {"ref": ref}, 502, "registry_unreachable")
        assert "registry" in p["detail"]
        assert fake.gets.count(f"/v2/drop/img/blobs/{dg[blob]}") == 1
        assert dg[blob][7:] not in os.listdir(d.state_dir / "oci/blobs")
        p = pull(d, ref)
        assert fake.gets.count(f"/v2/drop/img/blobs/{dg[blob]}") == 2
        d.restore(p["checkpoint_id"])
        assert {k: (d.roots[0] / k).read_bytes() for k in files} == files
    finally:
        fake.stop()


def test_size_mismatch(one):
    reg, d, cp = one
    r = rootp(d)
    raw, blob = layer_tar([(f"{r}/a", "file", b"a" * 1000)])
    cb = json.dumps({"architecture": "amd64", "os": "linux", "rootfs": {"type": "layers", "diff_ids": []}}).encode()
    man = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
           "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                      "digest": reg.put_blob("bad/size", cb), "size": len(cb)},
           "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                       "digest": reg.put_blob("bad/size", blob), "size": len(blob) - 10}]}
    reg.put_manifest("bad/size", "t", man, man["mediaType"])
    refused(d, "POST", "/v1/checkpoints/pull", {"ref": f"{reg.host}/bad/size:t"}, 502, "size_mismatch")


def test_unsupported_media_type(one):
    reg, d, cp = one
    r = rootp(d)
    put_image(reg, "bad/media", "t", [layer_tar([(f"{r}/a", "file", b"a")])],
              media="application/vnd.example.weird")
    p = refused(d, "POST", "/v1/checkpoints/pull", {"ref": f"{reg.host}/bad/media:t"}, 400, "unsupported_image")
    assert "application/vnd.example.weird" in p["detail"]


def test_index_without_linux_amd64(one):
    reg, d, cp = one
    r = rootp(d)
    md = put_image(reg, "bad/index", "arm", [layer_tar([(f"{r}/a", "file", b"a")])])
    size = len(requests.get(f"{reg.url}/v2/bad/index/manifests/arm", auth=(USER, PASSWORD),
                            headers={"Accept": "application/vnd.oci.image.manifest.v1+json"}).content)
    index = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
             "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": md,
                            "size": size, "platform": {"os": "linux", "architecture": "arm64"}}]}
    reg.put_manifest("bad/index", "multi", index, index["mediaType"])
    p = refused(d, "POST", "/v1/checkpoints/pull", {"ref": f"{reg.host}/bad/index:multi"}, 400,
                "unsupported_image")
    assert "linux/amd64" in p["detail"]
    # with an amd64 entry the index is followed
    index["manifests"].append(dict(index["manifests"][0], platform={"os": "linux", "architecture": "amd64"}))
    reg.put_manifest("bad/index", "multi2", index, index["mediaType"])
    pull(d, f"{reg.host}/bad/index:multi2")


def test_layer_over_the_import_limit(one):
    reg, d, cp = one  # max_import_bytes 2,000,000
    r = rootp(d)
    raw, blob = layer_tar([(f"{r}/big", "file", b"\0" * 3_000_000)])  # compresses small
    put_image(reg, "big/img", "t", [(raw, blob)])
    refused(d, "POST", "/v1/checkpoints/pull", {"ref": f"{reg.host}/big/img:t"}, 403, "too_large")


def test_unmapped_root(one):
    reg, d, cp = one
    put_image(reg, "un/mapped", "t", [layer_tar([("srv/other/a", "file", b"a")])],
              annotations={"io.ckptd.roots": json.dumps(["/srv/other"])})
    p = refused(d, "POST", "/v1/checkpoints/pull", {"ref": f"{reg.host}/un/mapped:t"}, 409, "root_unmapped")
    assert "/srv/other" in p["detail"]
    ref = f"{reg.host}/un/mapped:t"
    for bad in (["/srv/other"], "/srv/other", {"srv/other": str(d.roots[0])}, {"/srv/other": 7}):
        p = refused(d, "POST", "/v1/checkpoints/pull", {"ref": ref, "roots": bad}, 400, "invalid_field")
        assert "roots" in p["detail"]
    p = pull(d, ref, roots={"/srv/other": str(d.roots[0])})
    d.restore(p["checkpoint_id"])
    assert (d.roots[0] / "a").read_text() == "a"


# ---- token auth ----

def test_bearer_token_flow(daemon_factory, registry, tmp_path):
    from token_server import TokenServer
    ts = TokenServer(tmp_path / "token", USER, PASSWORD)
    try:
        reg = registry(auth="token", token_realm=ts.realm, cert=ts.cert)
        a = daemon_factory(backend="tar", config=reg_config(tmp_path, reg))
        (a.roots[0] / "t").write_text("token\n")
        cp = a.create("tok")
        out = push(a, cp["checkpoint_id"], f"{reg.host}/tok/img")
        p = pull(a, out["ref"])
        assert p["pull_of"]["digest"] == out["digest"]
        assert ts.issued >= 1
        bad = daemon_factory(backend="tar", config={
            "registry_insecure": [reg.host],
            "registry_auth_file": auth_file(tmp_path / "badtok.json", [reg.host], password="nope")})
        refused(bad, "POST", "/v1/checkpoints/pull", {"ref": out["ref"]}, 502, "registry_unauthorized")
    finally:
        ts.stop()


# ---- kill -9 in the middle, then retry ----

def slow_tree(root, mb=48):
    for i in range(mb // 8):
        (root / f"chunk{i}").write_bytes(os.urandom(8 << 20))


def wait_for(pred, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.01)
    return False


def quietly(d, path, body):
    """A request the test cuts by killing the daemon."""
    try:
        d.request("POST", path, json=body, timeout=120)
    except requests.ConnectionError:
        pass


@pytest.mark.parametrize("backend", ["tar", "overlay"])
def test_kill9_during_push_then_retry(daemon_factory, registry, tmp_path, backend):
    """On overlay the push has views mounted below xfer/ when it is killed."""
    reg = registry()
    a = daemon_factory(backend=backend, start=False, config=reg_config(tmp_path, reg))
    slow_tree(a.roots[0])
    a.start()
    (a.roots[0] / "x").write_text("x\n")
    cp = a.create("kill")
    ref = f"{reg.host}/kill/push"
    t = threading.Thread(target=quietly, args=(a, f"/v1/checkpoints/{cp['checkpoint_id']}/push", {"ref": ref}),
                         daemon=True)
    t.start()
    # in the middle: the layer is being written under xfer/
    assert wait_for(lambda: (a.state_dir / "xfer").exists() and any(
        f.stat().st_size > (4 << 20) for f in (a.state_dir / "xfer").rglob("*") if f.is_file()))
    a.kill9()
    t.join(30)
    a.start()
    assert xfer_empty(a) and not mounts_under(a.state_dir / "xfer")
    r = requests.get(f"{reg.url}/v2/kill/push/tags/list", auth=(USER, PASSWORD))
    assert r.status_code == 404 or not r.json().get("tags")
    out = push(a, cp["checkpoint_id"], ref)
    pull(a, out["ref"])


class CutProxy:
    """A TCP proxy to a registry that cuts the first connection carrying more
    than `after` bytes towards it (the client gets a reset), then passes all."""

    def __init__(self, port, after):
        self.target, self.after, self.cut = port, after, False
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.host = f"127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self):
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self.carry, args=(c,), daemon=True).start()

    @staticmethod
    def pump(src, dst):
        try:
            while b := src.recv(1 << 16):
                dst.sendall(b)
        except OSError:
            pass

    def carry(self, c):
        u = socket.create_connection(("127.0.0.1", self.target))
        threading.Thread(target=self.pump, args=(u, c), daemon=True).start()
        n = 0
        try:
            while b := c.recv(1 << 16):
                n += len(b)
                if not self.cut and n > self.after:
                    self.cut = True
                    c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                    break
                u.sendall(b)
        except OSError:
            pass
        for x in (c, u):
            try:
                x.shutdown(socket.SHUT_RDWR)  # a FIN the registry sees, though pump still reads u
            except OSError:
                pass
            x.close()

    def close(self):
        self.sock.close()


def uploads(reg, repo, least=1 << 20):
    """The registry's upload sessions of repo that hold `least` bytes or more."""
    d = reg.data / "docker/registry/v2/repositories" / repo / "_uploads"
    try:
        return [f for f in d.rglob("data") if f.stat().st_size >= least]
    except OSError:  # a session the registry removed while we looked
        return uploads(reg, repo, least)


def test_push_streams_a_layer_while_it_is_made(daemon_factory, registry, tmp_path):
    """A checkpoint's layer this daemon never made goes up while it is made:
    the registry holds bytes of it before the layer is in the cache. What arrives has the
    digest the manifest names, the cache holds the same bytes, and a second
    push sends nothing. The record's progress only grows, done within total."""
    reg = registry()
    a = daemon_factory(backend="tar", config=reg_config(tmp_path, reg))
    slow_tree(a.roots[0])  # after the base: the checkpoint's layer is the large one
    cid = a.create("stream")["checkpoint_id"]
    ref = f"{reg.host}/stream/img"
    keys = a.state_dir / "oci" / "keys"
    r = a.request("POST", f"/v1/checkpoints/{cid}/push", json={"ref": ref, "async": True})
    assert r.status_code == 202, r.text
    overlapped, samples = False, []
    while True:
        made = keys.exists() and any(k.name.startswith("d-") for k in keys.iterdir())
        overlapped |= not made and bool(uploads(reg, "stream/img"))
        rec = a.get(cid)
        if rec["push"]["status"] != "pushing":
            break
        if "progress" in rec:
            samples.append((rec["progress"]["bytes_done"], rec["progress"]["bytes_total"]))
        time.sleep(0.005)
    assert rec["push"]["status"] == "done", rec
    assert overlapped, "no upload bytes reached the registry before the layer was made"
    done, total = [d for d, _ in samples], [t for _, t in samples]
    assert samples and all(d <= t for d, t in samples), samples
    assert done == sorted(done) and total == sorted(total), samples
    out = push(a, cid, ref)
    assert out["digest"] == rec["push"]["digest"] and out["uploaded_bytes"] == 0, out
    man = requests.get(f"{reg.url}/v2/stream/img/manifests/{out['digest']}", auth=(USER, PASSWORD),
                       headers={"Accept": "application/vnd.oci.image.manifest.v1+json"}).json()
    assert [l["digest"] for l in man["layers"]] == [l["digest"] for l in out["layers"]]
    for layer in man["layers"]:
        blob = requests.get(f"{reg.url}/v2/stream/img/blobs/{layer['digest']}", auth=(USER, PASSWORD)).content
        assert "sha256:" + hashlib.sha256(blob).hexdigest() == layer["digest"] and len(blob) == layer["size"]
        assert (a.state_dir / "oci/blobs" / layer["digest"][7:]).read_bytes() == blob
    assert not uploads(reg, "stream/img", 1) and xfer_empty(a)


@pytest.mark.parametrize("how", ["cut", "stopped"])
def test_registry_lost_mid_streamed_push_then_retry(daemon_factory, registry, tmp_path, how):
    """The connection cut (a proxy resets it) or the registry stopped while a
    layer goes up as it is made: the push answers 502 registry_unreachable,
    leaves nothing in xfer/, and the registry no blob and no tag. A retry
    pushes the same image."""
    reg = registry()
    proxy = CutProxy(reg.port, 2 << 20) if how == "cut" else None
    host = proxy.host if proxy else reg.host
    a = daemon_factory(backend="tar",
                       config=reg_config(tmp_path, reg, registry_insecure=[reg.host, host],
                                         registry_auth_file=auth_file(tmp_path / "auth-both.json",
                                                                      [reg.host, host])))
    slow_tree(a.roots[0])  # in the checkpoint's layer, which is streamed
    cid = a.create("lost")["checkpoint_id"]
    got = {}
    t = threading.Thread(target=lambda: got.update(r=a.request("POST", f"/v1/checkpoints/{cid}/push",
                                                               json={"ref": f"{host}/lost/img"}, timeout=120)),
                         daemon=True)
    t.start()
    if how == "stopped":
        assert wait_for(lambda: bool(uploads(reg, "lost/img")) or not t.is_alive())
        reg.kill()
    t.join(120)
    r = got["r"]
    assert r.status_code == 502 and r.json()["code"] == "registry_unreachable", r.text
    assert xfer_empty(a)
    if how == "stopped":
        reg.start()
    # no blob but the small base was committed: a cut session is the
    # registry's to purge (its state token no longer matches the bytes it
    # holds, so it refuses a DELETE)
    blobs = (reg.data / "docker/registry/v2/blobs/sha256").glob("*/*/data")
    assert all(b.stat().st_size < (1 << 20) for b in blobs)
    tags = requests.get(f"{reg.url}/v2/lost/img/tags/list", auth=(USER, PASSWORD))
    assert tags.status_code == 404 or not tags.json().get("tags")
    out = push(a, cid, f"{host}/lost/img")
    assert out["layers"][-1]["uploaded"] and out["layers"][-1]["size"] > (40 << 20), out
    b = daemon_factory(backend="tar", config=reg_config(tmp_path, reg))
    p = pull(b, f"{reg.host}/lost/img:lost", roots={str(a.roots[0]): str(b.roots[0])})
    assert p["pull_of"]["digest"] == out["digest"]
    b.restore(p["checkpoint_id"])
    assert_same_tree(tree_state(a.roots[0]), tree_state(b.roots[0]))
    if proxy:
        proxy.close()


def test_layer_writer_fails_mid_streamed_push_then_retry(daemon_factory, registry, tmp_path):
    """The state dir fills up while a checkpoint's layer is made and sent:
    the writer fails with ENOSPC after the sender has sent part of it. The
    push answers 507, never 200; the registry keeps no tag, no large blob
    and no upload session; xfer/ is empty. With room again, a retry pushes
    an image that pulls to the same tree."""
    reg = registry()
    # overlay: its views are mounts, so the layer file is the only thing written
    a = daemon_factory(backend="overlay", start=False, config=reg_config(tmp_path, reg))
    a.state_dir.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=160m,mode=0700", "tmpfs", str(a.state_dir)], check=True)
    a.start()
    slow_tree(a.roots[0])  # in the checkpoint's layer, which is streamed
    cid = a.create("full")["checkpoint_id"]
    st = os.statvfs(a.state_dir)
    filler = a.state_dir / "filler"
    with open(filler, "wb") as f:  # leave room for a quarter of the layer
        for _ in range((st.f_bavail * st.f_frsize - (12 << 20)) >> 20):
            f.write(b"\xff" * (1 << 20))
    r = a.request("POST", f"/v1/checkpoints/{cid}/push", json={"ref": f"{reg.host}/full/img"})
    assert r.status_code == 507 and r.json()["code"] == "insufficient_storage", r.text
    assert "layer" in r.json()["detail"], r.text
    assert xfer_empty(a)
    tags = requests.get(f"{reg.url}/v2/full/img/tags/list", auth=(USER, PASSWORD))
    assert tags.status_code == 404 or not tags.json().get("tags")
    blobs = (reg.data / "docker/registry/v2/blobs/sha256").glob("*/*/data")
    assert all(b.stat().st_size < (1 << 20) for b in blobs)
    assert not uploads(reg, "full/img", 1), "the session of the layer that was not made is left"
    filler.unlink()
    out = push(a, cid, f"{reg.host}/full/img")
    assert out["layers"][-1]["uploaded"] and out["layers"][-1]["size"] > (40 << 20), out
    b = daemon_factory(backend="overlay", config=reg_config(tmp_path, reg))
    p = pull(b, out["ref"], roots={str(a.roots[0]): str(b.roots[0])})
    b.restore(p["checkpoint_id"])
    assert_same_tree(tree_state(a.roots[0]), tree_state(b.roots[0]))


def test_kill9_during_pull_then_retry(daemon_factory, registry, tmp_path):
    reg = registry()
    a = daemon_factory(backend="tar", start=False, config=reg_config(tmp_path, reg))
    slow_tree(a.roots[0])
    a.start()
    cp = a.create("src")
    out = push(a, cp["checkpoint_id"], f"{reg.host}/kill/pull")
    b = daemon_factory(backend="tar", config=reg_config(tmp_path, reg))
    body = {"ref": out["ref"], "roots": {str(a.roots[0]): str(b.roots[0])}}
    t = threading.Thread(target=quietly, args=(b, "/v1/checkpoints/pull", body), daemon=True)
    t.start()
    assert wait_for(lambda: (b.state_dir / "xfer").exists() and any(
        f.stat().st_size > (4 << 20) for f in (b.state_dir / "xfer").rglob("*") if f.is_file()))
    b.kill9()
    t.join(30)
    b.start()
    assert xfer_empty(b) and b.list() == []
    p = pull(b, body["ref"], roots=body["roots"])
    b.restore(p["checkpoint_id"])
    assert_same_tree(tree_state(a.roots[0]), tree_state(b.roots[0]))


# ---- the CLI and the clients ----

def test_cli_push_and_pull(daemon_factory, registry, tmp_path):
    from conftest import CKPT
    reg = registry()
    a = daemon_factory(backend="tar", config=reg_config(tmp_path, reg))
    (a.roots[0] / "f").write_text("cli\n")
    cp = a.create("by-cli")
    run = lambda *args: subprocess.run([CKPT, "--url", a.url, *args], capture_output=True, text=True, timeout=120)
    p = run("push", "by-cli", f"{reg.host}/cli/img")
    assert p.returncode == 0, p.stderr
    assert f"Pushed by-cli to {reg.host}/cli/img:by-cli" in p.stdout and "digest sha256:" in p.stdout
    p = run("--json", "push", cp["checkpoint_id"], f"{reg.host}/cli/img:again")
    assert p.returncode == 0 and json.loads(p.stdout)["uploaded_bytes"] < 2048, p.stdout + p.stderr
    p = run("--json", "pull", f"{reg.host}/cli/img:again")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["pull_of"]["ref"] == f"{reg.host}/cli/img:again"
    p = run("pull", f"{reg.host}/cli/img:missing")
    assert p.returncode == 1 and "manifest" in p.stderr


def test_python_and_typescript_clients(daemon_factory, registry, tmp_path):
    import sys
    from conftest import TOP
    sys.path.insert(0, str(TOP / "clients" / "python"))
    import ckptd
    reg = registry()
    a = daemon_factory(backend="tar", config=reg_config(tmp_path, reg))
    (a.roots[0] / "f").write_text("clients\n")
    cp = a.create("cl")
    c = ckptd.Client(url=a.url)
    out = c.checkpoint.push(cp["checkpoint_id"], f"{reg.host}/py/img")
    assert out["ref"] == f"{reg.host}/py/img:cl"
    rec = c.checkpoint.pull(out["ref"])
    assert rec["pull_of"]["digest"] == out["digest"]
    with pytest.raises(ckptd.RegistryFailed) as e:
        c.checkpoint.pull(f"127.0.0.1:{free_port()}/x/y:t")
    assert e.value.code == "registry_unreachable"
    node = shutil.which("node") or shutil.which("nodejs")
    script = tmp_path / "flow.mjs"
    script.write_text(f"""
import {{ Client, RegistryFailed }} from {str(TOP / 'clients/typescript/src/index.js')!r}
const c = new Client({{ url: process.env.CKPTD_URL }})
const pushed = await c.checkpoint.push({cp['checkpoint_id']!r}, {reg.host + '/ts/img'!r})
const pulled = await c.checkpoint.pull(pushed.ref)
let code = null
try {{ await c.checkpoint.pull('127.0.0.1:9/x/y:t') }} catch (e) {{ code = [e instanceof RegistryFailed, e.code] }}
console.log(JSON.stringify({{ digest: pushed.digest, pulled: pulled.pull_of.digest, code }}))
""")
    p = subprocess.run([node, str(script)], env=dict(os.environ, CKPTD_URL=a.url), capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    got = json.loads(p.stdout)
    assert got["digest"] == got["pulled"] == out["digest"]  # the same checkpoint, the same digest
    assert got["code"] == [True, "registry_unreachable"]


def test_cross_repository_mount(daemon_factory, registry, tmp_path):
    reg = registry()
    a = daemon_factory(backend="tar", config=reg_config(tmp_path, reg))
    (a.roots[0] / "f").write_bytes(os.urandom(300_000))
    cp = a.create("m")
    first = push(a, cp["checkpoint_id"], f"{reg.host}/one/repo")
    assert first["uploaded_bytes"] > 300_000
    # the blobs are in the registry, but not linked to the second repository:
    # HEAD there says 404, and the mount from the first links them without a byte sent
    digest = first["layers"][1]["digest"]
    assert requests.head(f"{reg.url}/v2/two/repo/blobs/{digest}", auth=(USER, PASSWORD)).status_code == 404
    second = push(a, cp["checkpoint_id"], f"{reg.host}/two/repo")
    assert second["uploaded_bytes"] == 0 and second["reused_bytes"] == first["uploaded_bytes"]
    assert second["digest"] == first["digest"]
    assert requests.head(f"{reg.url}/v2/two/repo/blobs/{digest}", auth=(USER, PASSWORD)).status_code == 200


def test_async_push_shows_progress_and_outcome(daemon_factory, registry, tmp_path):
    reg = registry()
    a = daemon_factory(backend="tar", config=reg_config(tmp_path, reg))
    (a.roots[0] / "f").write_bytes(os.urandom(2 << 20))
    cp = a.create("bg")
    cid = cp["checkpoint_id"]
    r = a.request("POST", f"/v1/checkpoints/{cid}/push", json={"ref": f"{reg.host}/bg/img", "async": True})
    assert r.status_code == 202, r.text
    assert r.json()["push"] == {"ref": f"{reg.host}/bg/img", "status": "pushing"}
    assert wait_for(lambda: a.get(cid)["push"]["status"] != "pushing")
    rec = a.get(cid)
    assert rec["push"]["status"] == "done" and rec["push"]["digest"].startswith("sha256:"), rec
    assert rec["push"]["uploaded_bytes"] > 2 << 20 and "progress" not in rec
    sync = push(a, cid, f"{reg.host}/bg/img")
    assert sync["digest"] == rec["push"]["digest"]
    # a failure shows on the record too
    port = free_port()
    r = a.request("POST", f"/v1/checkpoints/{cid}/push", json={"ref": f"127.0.0.1:{port}/x/y", "async": True})
    assert r.status_code == 202, r.text
    assert wait_for(lambda: a.get(cid)["push"]["status"] != "pushing")
    failed = a.get(cid)["push"]
    assert failed["status"] == "failed" and failed["error"]["code"] == "registry_unreachable", failed


def test_async_push_outcome_survives_a_restart(daemon_factory, registry, tmp_path):
    """The outcome is on the record file: a restart shows it. A push a stop cut
    short (its record says "pushing") shows as failed, interrupted."""
    reg = registry()
    a = daemon_factory(backend="overlay", config=reg_config(tmp_path, reg))
    (a.roots[0] / "f").write_bytes(os.urandom(1 << 20))
    cid = a.create("bg")["checkpoint_id"]
    r = a.request("POST", f"/v1/checkpoints/{cid}/push", json={"ref": f"{reg.host}/bg/img", "async": True})
    assert r.status_code == 202, r.text
    assert wait_for(lambda: a.get(cid)["push"]["status"] != "pushing")
    done = a.get(cid)["push"]
    assert done["status"] == "done", done
    a.stop()
    a.start()
    assert a.get(cid)["push"] == done
    assert [c["push"] for c in a.list() if c["checkpoint_id"] == cid] == [done]

    a.stop()
    f = a.state_dir / "catalog" / f"{cid}.json"
    rec = json.loads(f.read_text())
    rec["push"] = {"ref": f"{reg.host}/bg/img:cut", "status": "pushing"}
    f.write_text(json.dumps(rec))
    a.start()
    cut = a.get(cid)["push"]
    assert cut["status"] == "failed" and cut["error"]["code"] == "interrupted", cut
    assert cut["ref"] == f"{reg.host}/bg/img:cut"
    assert json.loads(f.read_text())["push"] == cut  # written back, durable


def make_tls(base):
    """A CA and a server certificate for 127.0.0.1, signed by it."""
    import datetime
    import ipaddress
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID
    now = datetime.datetime.now(datetime.timezone.utc)
    def cert(subject, issuer, pub, key, ca, san=None):
        b = (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer).public_key(pub)
             .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
             .not_valid_after(now + datetime.timedelta(days=1))
             .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
        if san:
            b = b.add_extension(x509.SubjectAlternativeName(san), critical=False)
        return b.sign(key, hashes.SHA256())
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "ckptd test CA")])
    ca = cert(ca_name, ca_name, ca_key.public_key(), ca_key, True)
    key = ec.generate_private_key(ec.SECP256R1())
    srv = cert(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]), ca_name, key.public_key(),
               ca_key, False, [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
    base.mkdir(parents=True, exist_ok=True)
    pem = serialization.Encoding.PEM
    (base / "ca.pem").write_bytes(ca.public_bytes(pem))
    (base / "cert.pem").write_bytes(srv.public_bytes(pem))
    (base / "key.pem").write_bytes(key.private_bytes(pem, serialization.PrivateFormat.TraditionalOpenSSL,
                                                     serialization.NoEncryption()))
    return str(base / "ca.pem"), str(base / "cert.pem"), str(base / "key.pem")


def test_https_with_a_configured_ca(daemon_factory, registry, tmp_path):
    ca, cert, key = make_tls(tmp_path / "tls")
    reg = registry(tls=(cert, key))
    auth = auth_file(tmp_path / "tls-auth.json", [reg.host])
    # registry_insecure does not list it: HTTPS, checked against the configured CA
    a = daemon_factory(backend="tar", config={"registry_auth_file": auth, "registry_ca_file": ca})
    (a.roots[0] / "f").write_text("over tls\n")
    cp = a.create("tls")
    out = push(a, cp["checkpoint_id"], f"{reg.host}/tls/img")
    assert pull(a, out["ref"])["pull_of"]["digest"] == out["digest"]
    # without the CA (the system CAs do not know it) nothing is sent
    b = daemon_factory(backend="tar", config={"registry_auth_file": auth})
    cp = b.create("tls")
    p = refused(b, "POST", f"/v1/checkpoints/{cp['checkpoint_id']}/push", {"ref": f"{reg.host}/tls/img2"}, 502,
                "registry_unreachable")
    assert "SSL" in p["detail"] or "certificate" in p["detail"], p


def test_layers_apply_whiteouts_opaque_dirs_and_replacements(one):
    """An image in three layers, as other tools write them: a whiteout, an
    opaque directory, a file replacing a directory and back, a hard link."""
    reg, d, cp = one
    r = rootp(d)
    l1 = [(f"{r}", "dir", None), (f"{r}/keep", "file", b"keep"), (f"{r}/gone", "file", b"gone"),
          (f"{r}/op", "dir", None), (f"{r}/op/old1", "file", b"1"), (f"{r}/op/old2", "file", b"2"),
          (f"{r}/swap", "dir", None), (f"{r}/swap/inner", "file", b"i"), (f"{r}/f2d", "file", b"f")]
    l2 = [(f"{r}/.wh.gone", "file", b""), (f"{r}/op/.wh..wh..opq", "file", b""), (f"{r}/op/fresh", "file", b"new"),
          (f"{r}/swap", "file", b"now a file"), (f"{r}/f2d", "dir", None), (f"{r}/f2d/x", "file", b"x"),
          (f"{r}/hl", "hardlink", f"{r}/keep")]
    l3 = [(f"{r}/op/.wh.fresh", "file", b""), (f"{r}/op/fresher", "file", b"newer")]
    put_image(reg, "apply/img", "t", [layer_tar(l) for l in (l1, l2, l3)])
    p = pull(d, f"{reg.host}/apply/img:t")
    d.restore(p["checkpoint_id"])
    root = d.roots[0]
    got = sorted(str(x.relative_to(root)) for x in root.rglob("*"))
    assert got == ["f2d", "f2d/x", "hl", "keep", "op", "op/fresher", "swap"], got
    assert (root / "swap").read_text() == "now a file" and (root / "op/fresher").read_text() == "newer"
    assert os.stat(root / "hl").st_ino == os.stat(root / "keep").st_ino


def test_push_replayed_by_idempotency_key(one):
    reg, d, cp = one
    hdr = {"Idempotency-Key": "push-once"}
    path = f"/v1/checkpoints/{cp['checkpoint_id']}/push"
    first = d.request("POST", path, json={"ref": f"{reg.host}/idem/img"}, headers=hdr)
    assert first.status_code == 200, first.text
    again = d.request("POST", path, json={"ref": f"{reg.host}/idem/img"}, headers=hdr)
    assert again.status_code == 200 and again.headers.get("Idempotent-Replayed") == "true"
    assert again.json() == first.json()


def test_registry_dropped_mid_pull_then_retry(daemon_factory, registry, tmp_path):
    reg = registry()
    a = daemon_factory(backend="tar", start=False, config=reg_config(tmp_path, reg))
    slow_tree(a.roots[0])
    a.start()
    cp = a.create("src")
    out = push(a, cp["checkpoint_id"], f"{reg.host}/drop/pull")
    b = daemon_factory(backend="tar", config=reg_config(tmp_path, reg))
    body = {"ref": out["ref"], "roots": {str(a.roots[0]): str(b.roots[0])}}
    got = {}
    t = threading.Thread(target=lambda: got.update(r=b.request("POST", "/v1/checkpoints/pull", json=body)),
                         daemon=True)
    t.start()
    assert wait_for(lambda: (b.state_dir / "xfer").exists() and any(
        f.stat().st_size > (1 << 20) for f in (b.state_dir / "xfer").rglob("*") if f.is_file()))
    reg.kill()
    t.join(60)
    r = got["r"]
    assert r.status_code == 502 and r.json()["code"] in ("registry_unreachable", "size_mismatch"), r.text
    assert b.list() == [] and xfer_empty(b)
    reg.start()
    p = pull(b, body["ref"], roots=body["roots"])
    b.restore(p["checkpoint_id"])
    assert_same_tree(tree_state(a.roots[0]), tree_state(b.roots[0]))


def test_cli_push_bar_on_a_terminal(daemon_factory, registry, tmp_path):
    from test_cli import BAR, run_pty
    reg = registry()
    a = daemon_factory(backend="tar", config=reg_config(tmp_path, reg))
    slow_tree(a.roots[0], mb=32)
    cp = a.create("tty")
    rc, out = run_pty(["--url", a.url, "push", cp["checkpoint_id"], f"{reg.host}/tty/img"])
    assert rc == 0, out
    assert f"pushing {cp['checkpoint_id']}" in out and "\r" in out, out
    assert f"Pushed {cp['checkpoint_id']} to {reg.host}/tty/img:tty" in out, out
    # the record's progress (bytes of blobs handled, of their total) drew the bar
    assert BAR.search(out) and "100%" in out, out


@pytest.mark.parametrize("backend", ["tar", "overlay"])
def test_pull_keeps_setfacl_acls(daemon_factory, registry, tmp_path, backend):
    """ACLs from setfacl (a directory's access and default ACL, and what
    entries made in it inherited) come back exactly from a push and a pull:
    libarchive's disk writer sets none of them itself."""
    reg = registry()
    a = daemon_factory(backend=backend, config=reg_config(tmp_path, reg))
    b = daemon_factory(backend=backend, config=reg_config(tmp_path, reg))
    make_acl_tree(a.roots[0])
    want = tree_state(a.roots[0])
    out = push(a, a.create("acl")["checkpoint_id"], f"{reg.host}/acl/img")
    p = pull(b, out["ref"], roots={str(a.roots[0]): str(b.roots[0])})
    assert b.restore(p["checkpoint_id"])["ok"]
    assert_same_tree(want, tree_state(b.roots[0]))
