"""api/openapi.yaml against the running daemon.

Every documented (path, method, status) is provoked here and the answer is
checked against the documented schema (required members present, no member the
spec does not list). Statuses that cannot be provoked from outside are listed in
UNPROVOKABLE with the reason. The route table is checked both ways: each spec
path answers 405 to a method it does not have with an Allow header naming
exactly the spec's methods, and paths the spec does not have answer 404. Any
drift between the spec and the code makes a test here fail."""
import errno
import json
import os
import pathlib
import re
import shutil
import subprocess
import time

import pytest
import yaml

from conftest import TOP

SPEC = yaml.safe_load((TOP / "api" / "openapi.yaml").read_text())
HTTP_METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")
FAKE_ID = "cp_000000000000000000000000"


def deref(node):
    while isinstance(node, dict) and "$ref" in node:
        ref = node["$ref"]
        assert ref.startswith("#/"), ref
        node = SPEC
        for part in ref[2:].split("/"):
            node = node[part]
    return node


def spec_operations(mode="sandbox"):
    """(path, method) of every operation served in a mode."""
    out = []
    for path, item in SPEC["paths"].items():
        if item.get("x-mode", "sandbox") != mode:
            continue
        out += [(path, m) for m in HTTP_METHODS if m in item]
    return out


def spec_statuses(mode="sandbox"):
    return [(p, m, int(s)) for p, m in spec_operations(mode)
            for s in SPEC["paths"][p][m]["responses"]]


# ---- a small JSON Schema (2020-12 subset) validator: what the spec uses ----

TYPES = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
}


def validate(value, schema, where="$"):
    """A list of the ways value breaks schema (empty: it conforms)."""
    schema = deref(schema)
    if "oneOf" in schema:
        ok = [s for s in schema["oneOf"] if not validate(value, s, where)]
        return [] if len(ok) == 1 else [f"{where}: matches {len(ok)} of oneOf"]
    errs = []
    types = schema.get("type")
    if types is not None:
        types = types if isinstance(types, list) else [types]
        if not any(TYPES[t](value) for t in types):
            return [f"{where}: {value!r} is not of type {types}"]
    if "enum" in schema and value not in schema["enum"]:
        errs.append(f"{where}: {value!r} not in {schema['enum']}")
    if isinstance(value, str):
        if "pattern" in schema and not re.search(schema["pattern"], value):
            errs.append(f"{where}: {value!r} does not match {schema['pattern']}")
        if len(value) < schema.get("minLength", 0) or len(value) > schema.get("maxLength", 1 << 30):
            errs.append(f"{where}: length of {value!r} out of bounds")
    if TYPES["number"](value) and "minimum" in schema and value < schema["minimum"]:
        errs.append(f"{where}: {value} < {schema['minimum']}")
    if isinstance(value, list) and "items" in schema:
        for i, v in enumerate(value):
            errs += validate(v, schema["items"], f"{where}[{i}]")
    if isinstance(value, dict):
        errs += validate_object(value, schema, where)
    return errs


def validate_object(value, schema, where):
    errs = [f"{where}: required member '{k}' missing" for k in schema.get("required", []) if k not in value]
    props = schema.get("properties", {})
    extra = schema.get("additionalProperties", True)
    for k, v in value.items():
        if k in props:
            errs += validate(v, props[k], f"{where}.{k}")
        elif extra is False:
            errs.append(f"{where}: member '{k}' is not in the spec")
        elif isinstance(extra, dict):
            errs += validate(v, extra, f"{where}.{k}")
    return errs


def check_response(resp, path, method):
    """The answer is documented for this operation and its body fits the schema."""
    op = SPEC["paths"][path][method]
    code = str(resp.status_code)
    assert code in op["responses"], \
        f"{method.upper()} {path} answered {code}, which the spec does not list: {resp.text[:300]}"
    doc = deref(op["responses"][code])
    content = doc.get("content")
    if not content:
        assert resp.content == b"", f"{code} has no documented body but got {resp.text[:200]}"
        return resp
    ctype = resp.headers.get("Content-Type", "").split(";")[0].strip()
    assert ctype in content, f"{method.upper()} {path} {code}: content type {ctype!r} not in {list(content)}"
    if ctype.endswith("json"):
        body = resp.json()
        errs = validate(body, content[ctype]["schema"])
        assert not errs, f"{method.upper()} {path} {code} does not fit the spec:\n" + "\n".join(errs)
        if resp.status_code >= 400:
            assert body["status"] == resp.status_code
    return resp


# ---- how to provoke each documented status ----

CP = "/v1/checkpoints"
ONE = "/v1/checkpoints/{id}"
RESTORE = "/v1/checkpoints/{id}/restore"
FORK = "/v1/checkpoints/{id}/fork"
DIFF = "/v1/checkpoints/{id}/diff"
FORKS = "/v1/forks"
ONE_FORK = "/v1/forks/{id}"
RELEASE = "/v1/roots/release"
TEXT = {"Content-Type": "text/plain"}
BIG = b'{"name": "' + b"x" * (2 << 20) + b'"}'


def seeded(daemon_factory, **kw):
    """A daemon over a root with a little content; sweeps far apart so a
    1-second TTL stays visible as expired instead of being swept."""
    kw.setdefault("config", {"cleanup_interval_secs": 3600})
    d = daemon_factory(**kw)
    (d.roots[0] / "a.txt").write_text("alpha\n" * 100)
    return d


def token_daemon(daemon_factory):
    d = seeded(daemon_factory, token="s3cret-token")
    d.session.headers.pop("Authorization")
    return d


def expect_unauthorized(df, method, path, **kw):
    d = token_daemon(df)
    r = d.request(method, path.replace("{id}", FAKE_ID), **kw)
    wrong = d.request(method, path.replace("{id}", FAKE_ID), headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401, wrong.text
    assert r.headers.get("WWW-Authenticate", "").startswith("Bearer")
    return r


def bad_create_bodies(df):
    d = seeded(df)
    bad = ['{"name": ', '[]', '{}', '{"name": ""}', '{"name": 5}', '{"name": "' + "n" * 129 + '"}',
           '{"name": "a\\u0001b"}', '{"name": "a", "ttl_secs": "5"}', '{"name": "a", "ttl_secs": -1}',
           '{"name": "a", "labels": {"k": 1}}', '{"name": "a", "labels": []}',
           '{"name": "a", "async": "yes"}', '{"name": "a", "bogus": 1}']
    last = None
    for body in bad:
        last = d.request("POST", CP, data=body, headers={"Content-Type": "application/json"})
        assert last.status_code == 400, (body, last.text)
        check_response(last, CP, "post")
    assert d.list() == [], "a rejected create left a checkpoint"
    return last


def bad_restore(df):
    d = seeded(df)
    cid = d.create("c")["checkpoint_id"]
    for body in ['{"force": ', '{"force": "yes"}', '{"if_expired": "maybe"}', '{"bogus": true}', '[1]']:
        r = d.request("POST", f"{CP}/{cid}/restore", data=body, headers={"Content-Type": "application/json"})
        assert r.status_code == 400, (body, r.text)
        check_response(r, RESTORE, "post")
    return r


def limit_reached(df):
    d = seeded(df, config={"max_checkpoints": 1})
    d.create("first")
    r = d.request("POST", CP, json={"name": "second"})
    assert r.json().get("code") == "checkpoint_limit", r.text
    assert len(d.list()) == 1
    return r


def no_space(df):
    d = seeded(df, config={"max_state_bytes": 1})
    (d.roots[0] / "big.bin").write_bytes(os.urandom(64 << 10))
    r = d.request("POST", CP, json={"name": "too-big"})
    assert r.json().get("code") == "insufficient_storage", r.text
    assert d.list() == [], "a create refused for space left a checkpoint"
    return r


def state_immutable(df):
    """EPERM from the state dirs (chattr +i) is no errno the API maps: 500."""
    d = seeded(df)
    dirs = [str(p) for p in [d.state_dir, *d.state_dir.rglob("*")] if p.is_dir() and not p.is_symlink()]
    subprocess.run(["chattr", "+i", *dirs], check=True)
    try:
        r = d.request("POST", CP, json={"name": "cannot-write"})
    finally:
        subprocess.run(["chattr", "-i", *dirs], check=True)
    assert d.list() == []
    return r


def expired(df, body):
    d = seeded(df)
    cid = d.create("short", ttl_secs=1)["checkpoint_id"]
    time.sleep(1.2)
    r = d.request("POST", f"{CP}/{cid}/restore", json=body)
    if r.status_code == 410:
        assert r.json()["code"] == "checkpoint_expired", r.text
    return r


def while_creating(df, method, path):
    """An async create of a tree big enough to still be running when the
    second request arrives: restore and delete answer 409 at once."""
    d = seeded(df)
    for i in range(30):
        (d.roots[0] / f"big{i}").write_bytes(os.urandom(4 << 20))
    a = d.request("POST", CP, json={"name": "slow", "async": True})
    assert a.status_code == 202, a.text
    cid = a.json()["checkpoint_id"]
    r = d.request(method, path.replace("{id}", cid), json={} if method == "POST" else None)
    assert r.json().get("code") == "conflict", r.text
    assert d.get(cid)["status"] in ("creating", "active")
    return r


def async_replayed_done(df):
    """An async create replayed by its key once done: 200 and the record as it is now."""
    d = seeded(df)
    hdr = {"Idempotency-Key": "async"}
    first = d.request("POST", CP, json={"name": "bg", "async": True}, headers=hdr)
    assert first.status_code == 202, first.text
    cid = first.json()["checkpoint_id"]
    deadline = time.monotonic() + 30
    while d.get(cid)["status"] == "creating":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    r = d.request("POST", CP, json={"name": "bg", "async": True}, headers=hdr)
    assert r.json()["checkpoint_id"] == cid and r.json()["status"] == "active", r.text
    assert r.headers.get("Idempotent-Replayed") == "true"
    return r


def idem_running(df):
    """A repeat of a create whose first request still runs."""
    import threading
    d = seeded(df)
    for i in range(30):
        (d.roots[0] / f"big{i}").write_bytes(os.urandom(4 << 20))
    hdr = {"Idempotency-Key": "same"}
    t = threading.Thread(target=lambda: d.request("POST", CP, json={"name": "slow"}, headers=hdr))
    t.start()
    deadline = time.monotonic() + 10
    while not any(c["status"] == "creating" for c in d.list()):
        assert time.monotonic() < deadline
        time.sleep(0.005)
    r = d.request("POST", CP, json={"name": "slow"}, headers=hdr)
    t.join()
    return r


def idem_reused(df, path, first_body, second_body):
    """The same Idempotency-Key sent again with another body."""
    d = seeded(df)
    cid = d.create("c")["checkpoint_id"]
    hdr = {"Idempotency-Key": "k"}
    first = d.request("POST", path.replace("{id}", cid), json=first_body, headers=hdr)
    assert first.status_code < 300, first.text
    return d.request("POST", path.replace("{id}", cid), json=second_body, headers=hdr)


HANDSHAKE = {"Upgrade": "websocket", "Connection": "Upgrade", "Sec-WebSocket-Version": "13",
             "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="}


def host_daemon(df, token=None):
    d = df(extra_args=["--mode", "host"], token=token)
    if token:
        d.session.headers.pop("Authorization")
    return d


def ws_attach(df):
    """A real upgrade: raw socket, since requests cannot speak 101."""
    import socket
    d = host_daemon(df)
    with socket.create_connection(("127.0.0.1", d.port), timeout=10) as s:
        hdrs = "".join(f"{k}: {v}\r\n" for k, v in HANDSHAKE.items())
        s.sendall(f"GET /attach/no-such-sandbox HTTP/1.1\r\nHost: x\r\n{hdrs}\r\n".encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = s.recv(4096)
            assert chunk, head
            head += chunk
    lines = head.split(b"\r\n\r\n")[0].decode().split("\r\n")
    assert lines[0].startswith("HTTP/1.1 101"), lines
    fields = {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
    assert fields["sec-websocket-accept"] == "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="  # RFC 6455's example

    class Answer:  # what check_response needs
        status_code = 101
        headers = {}
        content = b""
        text = ""
    return Answer()


def release_twice(df):
    d = seeded(df)
    assert d.request("POST", RELEASE, json={}).status_code == 200
    return d.request("POST", RELEASE, json={"root": str(d.roots[0])})


def fork_in(df, pick, path=None, then=None):
    """Fork checkpoint pick(d, cid) into an empty dir beside the daemon's."""
    d = seeded(df)
    cid = d.create("c")["checkpoint_id"]
    target = d.base / "fork"
    target.mkdir()
    r = d.request("POST", FORK.replace("{id}", pick(d, cid)), json={"path": path or str(target)})
    return then(d) if then else r


def fork_key_reused(df):
    """The same Idempotency-Key sent again to fork into another dir: 422, and nothing mounted."""
    d = seeded(df)
    cid = d.create("c")["checkpoint_id"]
    (d.base / "fork1").mkdir()
    (d.base / "fork2").mkdir()
    hdr = {"Idempotency-Key": "k"}
    first = d.request("POST", FORK.replace("{id}", cid), json={"path": str(d.base / "fork1")}, headers=hdr)
    assert first.status_code == 201, first.text
    again = d.request("POST", FORK.replace("{id}", cid), json={"path": str(d.base / "fork1")}, headers=hdr)
    assert again.status_code == 201 and again.json() == first.json(), again.text
    assert again.headers.get("Idempotent-Replayed") == "true"
    r = d.request("POST", FORK.replace("{id}", cid), json={"path": str(d.base / "fork2")}, headers=hdr)
    assert len(d.request("GET", "/v1/forks").json()["forks"]) == 1
    return r


def fork_while_creating(df):
    d = seeded(df)
    for i in range(30):
        (d.roots[0] / f"big{i}").write_bytes(os.urandom(4 << 20))
    (d.base / "fork").mkdir()
    a = d.request("POST", CP, json={"name": "slow", "async": True})
    assert a.status_code == 202, a.text
    r = d.request("POST", FORK.replace("{id}", a.json()["checkpoint_id"]), json={"path": str(d.base / "fork")})
    assert r.json().get("code") == "conflict", r.text
    return r


def with_cp(df, method, path, **kw):
    d = seeded(df)
    cid = d.create("c")["checkpoint_id"]
    return d.request(method, path.replace("{id}", cid), **kw)


def full_state(df, forked=False):
    """A daemon whose state filesystem (a small tmpfs) is full after one
    checkpoint (and a fork of it); returns it and the checkpoint's id."""
    d = df(start=False, config={"cleanup_interval_secs": 3600})
    d.state_dir.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(d.state_dir)], check=True)
    d.start()
    (d.roots[0] / "a.txt").write_text("alpha\n")
    cid = d.create("c")["checkpoint_id"]
    if forked:
        (d.base / "fork").mkdir()
        r = d.request("POST", FORK.replace("{id}", cid), json={"path": str(d.base / "fork")})
        assert r.status_code == 201, r.text
    fd = os.open(d.state_dir / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            os.write(fd, b"\xff" * (1 << 16))
    except OSError as e:
        assert e.errno == errno.ENOSPC, e
    finally:
        os.close(fd)
    return d, cid


def fork_no_space(df):
    """The fork's record cannot be written: 507, and no fork is left."""
    d, cid = full_state(df)
    (d.base / "fork").mkdir()
    r = d.request("POST", FORK.replace("{id}", cid), json={"path": str(d.base / "fork")})
    assert r.json().get("code") == "insufficient_storage", r.text
    assert d.request("GET", FORKS).json()["forks"] == []
    return r


def fork_delete_no_space(df):
    """The fork's removal cannot be recorded: 507, and the fork stays whole."""
    d, cid = full_state(df, forked=True)
    fid = d.request("GET", FORKS).json()["forks"][0]["fork_id"]
    r = d.request("DELETE", f"{FORKS}/{fid}")
    assert r.json().get("code") == "insufficient_storage", r.text
    assert [f["fork_id"] for f in d.request("GET", FORKS).json()["forks"]] == [fid]
    return r


def export_no_space(df):
    """The export's view or manifest cannot be written: 507 before any byte."""
    d, cid = full_state(df)
    r = d.request("GET", EXPORT.replace("{id}", cid))
    assert r.json().get("code") == "insufficient_storage", r.text
    return r


def async_create(df):
    d = seeded(df)
    r = d.request("POST", CP, json={"name": "bg", "async": True})
    assert r.status_code == 202 and r.json()["status"] == "creating", r.text
    deadline = time.monotonic() + 30
    while d.get(r.json()["checkpoint_id"])["status"] == "creating":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    return r


EXPORT = "/v1/checkpoints/{id}/export"
IMPORT = "/v1/checkpoints/import"


def import_ok(df):
    d = seeded(df)
    cid = d.create("c")["checkpoint_id"]
    blob = d.request("GET", f"{CP}/{cid}/export").content
    return d.request("POST", IMPORT, data=blob)


def import_over_limit(df):
    d = seeded(df, config={"max_checkpoints": 1})
    cid = d.create("c")["checkpoint_id"]
    r = d.request("POST", IMPORT, data=d.request("GET", f"{CP}/{cid}/export").content)
    assert r.json().get("code") == "checkpoint_limit", r.text
    assert len(d.list()) == 1
    return r


def import_base_mismatch(df):
    a, b = df(backend="overlay", start=False), df(backend="overlay", start=False)
    (a.roots[0] / "base").write_text("one")
    (b.roots[0] / "base").write_text("two!")
    a.start(), b.start()
    cid = a.create("c")["checkpoint_id"]
    return b.request("POST", IMPORT, data=a.request("GET", f"{CP}/{cid}/export").content)


def import_key_reused(df):
    """The same Idempotency-Key with another archive: 422, and no second checkpoint."""
    d = seeded(df)
    cid = d.create("c")["checkpoint_id"]
    blob = d.request("GET", f"{CP}/{cid}/export").content
    hdr = {"Idempotency-Key": "k"}
    assert d.request("POST", IMPORT, data=blob, headers=hdr).status_code == 201
    (d.roots[0] / "other").write_text("other")
    cid2 = d.create("c2")["checkpoint_id"]
    r = d.request("POST", IMPORT, data=d.request("GET", f"{CP}/{cid2}/export").content, headers=hdr)
    assert len(d.list()) == 3
    return r


PUSH = "/v1/checkpoints/{id}/push"
PULL = "/v1/checkpoints/pull"
REGISTRIES = []


@pytest.fixture(scope="module", autouse=True)
def _stop_registries():
    yield
    while REGISTRIES:
        REGISTRIES.pop().stop()


def reg_daemon(df, **extra):
    """A daemon that may talk to a fresh docker-registry (test_registry.py)."""
    import tempfile
    from test_registry import Registry, reg_config
    reg = Registry(pathlib.Path(tempfile.mkdtemp(prefix="ckptd-reg-")))
    REGISTRIES.append(reg)
    d = seeded(df, config=reg_config(pathlib.Path(tempfile.mkdtemp(prefix="ckptd-auth-")), reg, **extra))
    return reg, d


def pushed(df, **extra):
    reg, d = reg_daemon(df, **extra)
    cid = d.create("c")["checkpoint_id"]
    r = d.request("POST", PUSH.replace("{id}", cid), json={"ref": f"{reg.host}/spec/img"})
    assert r.status_code == 200, r.text
    return reg, d, cid, r


def push_async(df):
    reg, d = reg_daemon(df)
    cid = d.create("c")["checkpoint_id"]
    r = d.request("POST", PUSH.replace("{id}", cid), json={"ref": f"{reg.host}/spec/bg", "async": True})
    assert r.status_code == 202 and r.json()["push"]["status"] == "pushing", r.text
    deadline = time.monotonic() + 60
    while d.get(cid)["push"]["status"] == "pushing":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    done = d.request("GET", f"{CP}/{cid}")
    check_response(done, ONE, "get")
    assert done.json()["push"]["status"] == "done", done.text
    return r


def push_while_creating(df):
    d = seeded(df)
    for i in range(30):
        (d.roots[0] / f"big{i}").write_bytes(os.urandom(4 << 20))
    a = d.request("POST", CP, json={"name": "slow", "async": True})
    assert a.status_code == 202, a.text
    r = d.request("POST", PUSH.replace("{id}", a.json()["checkpoint_id"]), json={"ref": "127.0.0.1:1/x/y"})
    assert r.json().get("code") == "conflict", r.text
    return r


def push_key_reused(df):
    reg, d = reg_daemon(df)
    cid = d.create("c")["checkpoint_id"]
    hdr = {"Idempotency-Key": "k"}
    first = d.request("POST", PUSH.replace("{id}", cid), json={"ref": f"{reg.host}/a/b"}, headers=hdr)
    assert first.status_code == 200, first.text
    return d.request("POST", PUSH.replace("{id}", cid), json={"ref": f"{reg.host}/a/c"}, headers=hdr)


def pull_key_reused(df):
    reg, d, cid, r = pushed(df)
    hdr = {"Idempotency-Key": "k"}
    first = d.request("POST", PULL, json={"ref": r.json()["ref"]}, headers=hdr)
    assert first.status_code == 201, first.text
    return d.request("POST", PULL, json={"ref": r.json()["ref"], "roots": {}}, headers=hdr)


def pull_unmapped(df):
    reg, d, cid, r = pushed(df)
    other = df(config=d.config)
    return other.request("POST", PULL, json={"ref": r.json()["ref"]})


def pull_too_large(df):
    reg, d = reg_daemon(df, max_import_bytes=100)
    (d.roots[0] / "big").write_bytes(os.urandom(10_000))
    cid = d.create("c")["checkpoint_id"]
    ref = d.request("POST", PUSH.replace("{id}", cid), json={"ref": f"{reg.host}/big/img"}).json()["ref"]
    return d.request("POST", PULL, json={"ref": ref})


def unreachable():
    from conftest import free_port
    return f"127.0.0.1:{free_port()}/x/y"


PROVOKE = {
    (CP, "post", 201): lambda df: seeded(df).request("POST", CP, json={"name": "n", "labels": {"k": "v"}}),
    (CP, "post", 200): async_replayed_done,
    (CP, "post", 202): async_create,
    (CP, "post", 400): bad_create_bodies,
    (CP, "post", 401): lambda df: expect_unauthorized(df, "POST", CP, json={"name": "n"}),
    (CP, "post", 403): limit_reached,
    (CP, "post", 409): idem_running,
    (CP, "post", 422): lambda df: idem_reused(df, CP, {"name": "a"}, {"name": "b"}),
    (CP, "post", 413): lambda df: seeded(df).request("POST", CP, data=BIG, headers={"Content-Type": "application/json"}),
    (CP, "post", 415): lambda df: seeded(df).request("POST", CP, data='{"name": "n"}', headers=TEXT),
    (CP, "post", 500): state_immutable,
    (CP, "post", 507): no_space,
    (CP, "get", 200): lambda df: with_cp(df, "GET", CP),
    (CP, "get", 400): lambda df: seeded(df).request("GET", CP, params={"name": "x" * 129}),
    (CP, "get", 401): lambda df: expect_unauthorized(df, "GET", CP),
    (ONE, "get", 200): lambda df: with_cp(df, "GET", ONE),
    (ONE, "get", 401): lambda df: expect_unauthorized(df, "GET", ONE),
    (ONE, "get", 404): lambda df: seeded(df).request("GET", f"{CP}/{FAKE_ID}"),
    (ONE, "delete", 204): lambda df: with_cp(df, "DELETE", ONE),
    (ONE, "delete", 401): lambda df: expect_unauthorized(df, "DELETE", ONE),
    (ONE, "delete", 404): lambda df: seeded(df).request("DELETE", f"{CP}/no-such-name"),
    (ONE, "delete", 409): lambda df: while_creating(df, "DELETE", ONE),
    (RESTORE, "post", 200): lambda df: with_cp(df, "POST", RESTORE, json={}),
    (RESTORE, "post", 400): bad_restore,
    (RESTORE, "post", 401): lambda df: expect_unauthorized(df, "POST", RESTORE, json={}),
    (RESTORE, "post", 404): lambda df: seeded(df).request("POST", f"{CP}/{FAKE_ID}/restore", json={}),
    (RESTORE, "post", 409): lambda df: while_creating(df, "POST", RESTORE),
    (RESTORE, "post", 410): lambda df: expired(df, {}),
    (RESTORE, "post", 422): lambda df: idem_reused(df, RESTORE, {}, {"force": True}),
    (RESTORE, "post", 413): lambda df: with_cp(df, "POST", RESTORE, data=BIG, headers={"Content-Type": "application/json"}),
    (RESTORE, "post", 415): lambda df: with_cp(df, "POST", RESTORE, data="{}", headers=TEXT),
    (FORK, "post", 201): lambda df: fork_in(df, lambda d, cid: cid),
    (FORK, "post", 507): fork_no_space,
    (FORK, "post", 400): lambda df: fork_in(df, lambda d, cid: cid, path="/nonexistent/dir"),
    (FORK, "post", 401): lambda df: expect_unauthorized(df, "POST", FORK, json={"path": "/tmp"}),
    (FORK, "post", 404): lambda df: fork_in(df, lambda d, cid: FAKE_ID),
    (FORK, "post", 409): fork_while_creating,
    (FORK, "post", 422): fork_key_reused,
    (FORK, "post", 413): lambda df: with_cp(df, "POST", FORK, data=BIG, headers={"Content-Type": "application/json"}),
    (FORK, "post", 415): lambda df: with_cp(df, "POST", FORK, data="{}", headers=TEXT),
    (RELEASE, "post", 200): lambda df: seeded(df).request("POST", RELEASE, json={}),
    (RELEASE, "post", 400): lambda df: seeded(df).request("POST", RELEASE, json={"drop_checkpoints": "yes"}),
    (RELEASE, "post", 401): lambda df: expect_unauthorized(df, "POST", RELEASE, json={}),
    (RELEASE, "post", 404): lambda df: seeded(df).request("POST", RELEASE, json={"root": "/not/a/root"}),
    (RELEASE, "post", 409): release_twice,
    (RELEASE, "post", 413): lambda df: seeded(df).request("POST", RELEASE, data=BIG,
                                                          headers={"Content-Type": "application/json"}),
    (RELEASE, "post", 415): lambda df: seeded(df).request("POST", RELEASE, data="{}", headers=TEXT),
    (DIFF, "get", 200): lambda df: with_cp(df, "GET", DIFF),
    (DIFF, "get", 400): lambda df: with_cp(df, "GET", DIFF, params={"limit": "0"}),
    (DIFF, "get", 401): lambda df: expect_unauthorized(df, "GET", DIFF),
    (DIFF, "get", 404): lambda df: seeded(df).request("GET", DIFF.replace("{id}", FAKE_ID)),
    (DIFF, "get", 409): lambda df: while_creating(df, "GET", DIFF),
    (FORKS, "get", 200): lambda df: fork_in(df, lambda d, cid: cid, then=lambda d: d.request("GET", FORKS)),
    (FORKS, "get", 401): lambda df: expect_unauthorized(df, "GET", FORKS),
    (ONE_FORK, "delete", 204): lambda df: fork_in(df, lambda d, cid: cid, then=lambda d: d.request(
        "DELETE", f"{FORKS}/{d.request('GET', FORKS).json()['forks'][0]['fork_id']}")),
    (ONE_FORK, "delete", 401): lambda df: expect_unauthorized(df, "DELETE", f"{FORKS}/fk_0"),
    (ONE_FORK, "delete", 404): lambda df: seeded(df).request("DELETE", f"{FORKS}/fk_000000000000000000000000"),
    (ONE_FORK, "delete", 507): fork_delete_no_space,
    (EXPORT, "get", 200): lambda df: with_cp(df, "GET", EXPORT),
    (EXPORT, "get", 507): export_no_space,
    (EXPORT, "get", 401): lambda df: expect_unauthorized(df, "GET", EXPORT),
    (EXPORT, "get", 404): lambda df: seeded(df).request("GET", f"{CP}/{FAKE_ID}/export"),
    (EXPORT, "get", 409): lambda df: while_creating(df, "GET", EXPORT),
    (IMPORT, "post", 201): import_ok,
    (IMPORT, "post", 400): lambda df: seeded(df).request("POST", IMPORT, data=b"not an archive"),
    (IMPORT, "post", 401): lambda df: expect_unauthorized(df, "POST", IMPORT, data=b"x"),
    (IMPORT, "post", 403): import_over_limit,
    (IMPORT, "post", 409): import_base_mismatch,
    (IMPORT, "post", 422): import_key_reused,
    (IMPORT, "post", 413): lambda df: seeded(df, config={"max_import_bytes": 1000}).request(
        "POST", IMPORT, data=b"x" * 2000),
    (PUSH, "post", 200): lambda df: pushed(df)[3],
    (PUSH, "post", 202): push_async,
    (PUSH, "post", 400): lambda df: with_cp(df, "POST", PUSH, json={"ref": "no/Such ref"}),
    (PUSH, "post", 401): lambda df: expect_unauthorized(df, "POST", PUSH, json={"ref": "127.0.0.1:1/x/y"}),
    (PUSH, "post", 404): lambda df: seeded(df).request("POST", fill(PUSH), json={"ref": "127.0.0.1:1/x/y"}),
    (PUSH, "post", 409): push_while_creating,
    (PUSH, "post", 413): lambda df: with_cp(df, "POST", PUSH, data=BIG, headers={"Content-Type": "application/json"}),
    (PUSH, "post", 415): lambda df: with_cp(df, "POST", PUSH, data="{}", headers=TEXT),
    (PUSH, "post", 422): push_key_reused,
    (PUSH, "post", 502): lambda df: with_cp(df, "POST", PUSH, json={"ref": unreachable()}),
    (PULL, "post", 201): lambda df: (lambda x: x[1].request("POST", PULL, json={"ref": x[3].json()["ref"]}))(pushed(df)),
    (PULL, "post", 400): lambda df: seeded(df).request("POST", PULL, json={"ref": "nohost"}),
    (PULL, "post", 401): lambda df: expect_unauthorized(df, "POST", PULL, json={"ref": "127.0.0.1:1/x/y"}),
    (PULL, "post", 403): pull_too_large,
    (PULL, "post", 404): lambda df: (lambda x: x[1].request("POST", PULL, json={"ref": x[0].host + "/spec/img:nope"}))(pushed(df)),
    (PULL, "post", 409): pull_unmapped,
    (PULL, "post", 413): lambda df: seeded(df).request("POST", PULL, data=BIG, headers={"Content-Type": "application/json"}),
    (PULL, "post", 415): lambda df: seeded(df).request("POST", PULL, data="{}", headers=TEXT),
    (PULL, "post", 422): pull_key_reused,
    (PULL, "post", 502): lambda df: seeded(df).request("POST", PULL, json={"ref": unreachable()}),
    ("/v1/health", "get", 200): lambda df: token_daemon(df).request("GET", "/v1/health"),
    ("/v1/health", "get", 400): lambda df: token_daemon(df).request("GET", "/v1/health?probe=%00"),
    ("/metrics", "get", 200): lambda df: seeded(df).request("GET", "/metrics"),
    ("/metrics", "get", 401): lambda df: expect_unauthorized(df, "GET", "/metrics"),
    # host mode
    ("/create", "get", 400): lambda df: host_daemon(df).request("GET", "/create"),
    ("/create", "get", 401): lambda df: host_daemon(df, "tok").request("GET", "/create", headers=HANDSHAKE),
    ("/attach/{sandbox_id}", "get", 101): ws_attach,
    ("/attach/{sandbox_id}", "get", 400): lambda df: host_daemon(df).request("GET", "/attach/sb-1"),
    ("/attach/{sandbox_id}", "get", 401): lambda df: host_daemon(df, "tok").request("GET", "/attach/sb-1", headers=HANDSHAKE),
    ("/attach/{sandbox_id}", "get", 404): lambda df: host_daemon(df).request("GET", "/attach/-bad!id", headers=HANDSHAKE),
}

def _other_method(path):
    """Any method a path does not have: 405 (each operation documents it)."""
    if SPEC["paths"][path].get("x-mode", "sandbox") == "host":
        return lambda df: host_daemon(df).request("PATCH", fill(path))
    return lambda df: seeded(df).request("PATCH", fill(path))


for _path, _method in spec_operations("sandbox") + spec_operations("host"):
    if "405" in SPEC["paths"][_path][_method]["responses"]:
        PROVOKE[(_path, _method, 405)] = _other_method(_path)

UNPROVOKABLE = {
    (CP, "get", 500): "listing reads memory only; no outside trigger makes it fail",
    (ONE, "get", 500): "a get reads memory only; no outside trigger makes it fail",
    (ONE, "delete", 500): "needs an I/O error while removing checkpoint data",
    (ONE, "delete", 507): "needs the backend's removal to run out of space (a full catalog is worked around)",
    (RESTORE, "post", 500): "needs an I/O error while swapping a root back",
    (RESTORE, "post", 507): "needs a root filesystem that fills up in the middle of a restore",
    (EXPORT, "get", 500): "needs an I/O error while reading the checkpoint",
    (IMPORT, "post", 500): "needs an I/O error while extracting",
    (IMPORT, "post", 507): "needs the state filesystem to fill up during an import",
    ("/metrics", "get", 500): "only when rendering runs out of memory",
    (PUSH, "post", 500): "needs an I/O error while writing a layer",
    (PULL, "post", 500): "needs an I/O error while applying a layer",
    (PULL, "post", 507): "needs the state filesystem to fill up during a pull",
    (FORK, "post", 500): "needs a mount or an extraction to fail on a valid empty dir",
    (DIFF, "get", 500): "needs an I/O error while reading layers or manifests",
    (FORKS, "get", 500): "listing reads memory only",
    (RELEASE, "post", 500): "needs an I/O error while copying the root or swapping the copy in",
    (RELEASE, "post", 507): "needs the root's filesystem to fill up while release copies the root",
    (ONE_FORK, "delete", 500): "needs an unmount to fail",
    ("/create", "get", 101): "starts a gVisor sandbox with runsc: covered by the host-mode tests",
    ("/create", "get", 500): "only when the session cannot be allocated",
    ("/attach/{sandbox_id}", "get", 500): "only when the session cannot be allocated",
}


def test_every_documented_status_is_covered():
    documented = set(spec_statuses("sandbox")) | set(spec_statuses("host"))
    covered = set(PROVOKE) | set(UNPROVOKABLE)
    assert not set(PROVOKE) & set(UNPROVOKABLE)
    assert documented - covered == set(), "documented statuses with no test: add them to PROVOKE"
    assert covered - documented == set(), "statuses the tests provoke but the spec does not document"


@pytest.mark.parametrize("path,method,status", sorted(PROVOKE), ids=lambda v: str(v))
def test_status(daemon_factory, path, method, status):
    r = PROVOKE[(path, method, status)](daemon_factory)
    assert r.status_code == status, f"wanted {status}, got {r.status_code}: {r.text[:300]}"
    check_response(r, path, method)
    if status >= 400:
        assert r.headers["Content-Type"].startswith("application/problem+json")


def test_host_health_fits_the_spec(daemon_factory):
    r = host_daemon(daemon_factory, "tok").request("GET", "/v1/health")
    assert r.status_code == 200 and r.json()["mode"] == "host"
    check_response(r, "/v1/health", "get")
    assert not validate(r.json(), SPEC["components"]["schemas"]["HostHealth"])


def test_overlay_forms_fit_the_spec(daemon_factory):
    """The overlay backend's health, records and restore report (with a
    process that keeps the root busy, so busy_processes shows)."""
    d = daemon_factory(backend="overlay", config={"cleanup_interval_secs": 3600})
    check_response(d.request("GET", "/v1/health"), "/v1/health", "get")
    assert "overlay_roots" in d.health()
    (d.roots[0] / "a").write_text("1")
    cid = check_response(d.request("POST", CP, json={"name": "o"}), CP, "post").json()["checkpoint_id"]
    check_response(d.request("GET", f"{CP}/{cid}"), ONE, "get")
    holder = subprocess.Popen(["sleep", "60"], cwd=str(d.roots[0]))
    try:
        r = check_response(d.request("POST", f"{CP}/{cid}/restore", json={}), RESTORE, "post")
    finally:
        holder.kill()
        holder.wait()
    assert any(p["pid"] == holder.pid for p in r.json().get("busy_processes", [])), r.text
    check_response(d.request("GET", CP), CP, "get")


def test_restore_if_expired_fresh_fits_the_spec(daemon_factory):
    r = expired(daemon_factory, {"if_expired": "fresh"})
    assert r.status_code == 200, r.text
    check_response(r, RESTORE, "post")
    assert r.json()["restored_from_checkpoint"] is False and r.json()["ttl_expired"] is True


def test_record_forms_fit_the_spec(daemon_factory):
    """The record as get, list, get-by-name and the async progress view show it."""
    d = seeded(daemon_factory)
    for i in range(200):
        (d.roots[0] / f"f{i}").write_bytes(os.urandom(4096))
    a = d.request("POST", CP, json={"name": "bg", "async": True, "ttl_secs": 0})
    check_response(a, CP, "post")
    cid = a.json()["checkpoint_id"]
    while True:
        g = check_response(d.request("GET", f"{CP}/{cid}"), ONE, "get").json()
        if g["status"] != "creating":
            break
        time.sleep(0.02)
    assert g["status"] == "active" and g["expires_at"] is None
    check_response(d.request("GET", f"{CP}/bg"), ONE, "get")
    lst = check_response(d.request("GET", CP, params={"name": "bg"}), CP, "get").json()
    assert [c["checkpoint_id"] for c in lst["checkpoints"]] == [cid]


def test_request_schemas_match_what_the_daemon_accepts(daemon_factory):
    """Every documented request member is accepted; an undocumented one is refused."""
    d = seeded(daemon_factory)
    create = deref(SPEC["components"]["schemas"]["CreateRequest"])
    assert set(create["properties"]) == {"name", "ttl_secs", "labels", "async"}
    body = {"name": "n" * create["properties"]["name"]["maxLength"], "ttl_secs": 0,
            "labels": {"k": "v"}, "async": False}
    r = d.request("POST", CP, json=body)
    assert r.status_code == 201, r.text
    assert r.json()["labels"] == {"k": "v"} and r.json()["name"] == body["name"]
    cid = r.json()["checkpoint_id"]
    restore = deref(SPEC["components"]["schemas"]["RestoreRequest"])
    assert set(restore["properties"]) == {"force", "if_expired", "verify"}
    for v in restore["properties"]["if_expired"]["enum"]:
        r = d.request("POST", f"{CP}/{cid}/restore", json={"force": False, "if_expired": v, "verify": True})
        assert r.status_code == 200, r.text
        assert r.json()["verified"] is True, r.text
    r = d.request("POST", f"{CP}/{cid}/restore", json={"verify": "yes"})
    assert r.status_code == 400, r.text
    r = d.request("POST", f"{CP}/{cid}/restore", data=b"")
    assert r.status_code == 200, "an empty restore body must count as {}: " + r.text


def fill(path):
    return path.replace("{id}", FAKE_ID).replace("{sandbox_id}", "sb-1")


@pytest.mark.parametrize("mode", ["sandbox", "host"])
def test_allow_header_names_exactly_the_spec_methods(daemon_factory, mode):
    d = seeded(daemon_factory) if mode == "sandbox" else host_daemon(daemon_factory)
    for path, item in SPEC["paths"].items():
        if item.get("x-mode", "sandbox") != mode and path != "/v1/health":
            continue
        want = {m.upper() for m in HTTP_METHODS if m in item}
        if "GET" in want:
            want.add("HEAD")  # the spec's conventions: HEAD wherever GET
        r = d.request("PATCH", fill(path))
        assert r.status_code == 405, f"PATCH {path}: {r.status_code} {r.text[:200]}"
        assert r.headers["Content-Type"].startswith("application/problem+json")
        assert r.json()["code"] == "method_not_allowed"
        assert not validate(r.json(), SPEC["components"]["schemas"]["Problem"])
        got = {m.strip() for m in r.headers["Allow"].split(",")}
        assert got == want, f"{path}: the daemon serves {sorted(got)}, the spec lists {sorted(want)}"


# Paths a ckptd might plausibly grow (export/import, fork, versions, probes).
CANDIDATES = [
    "/", "/v1", "/v1/", "/v2/checkpoints", "/v1/checkpoints/", "/v1/checkpoints/{id}/export",
    "/v1/checkpoints/import", "/v1/checkpoints/{id}/fork", "/v1/checkpoints/{id}/restore/x",
    "/v1/checkpoints/{id}/progress", "/v1/checkpoints/{id}/labels", "/v1/import", "/v1/export",
    "/v1/restore", "/v1/version", "/v1/config", "/v1/services", "/v1/metrics", "/v1/sandboxes",
    "/v1/sandboxes/{id}", "/v1/healthz", "/healthz", "/readyz", "/health", "/metrics/",
    "/v1/health/", "/create", "/attach/{id}", "/openapi.yaml", "/v1/openapi.yaml",
]


def template_match(path, mode="sandbox"):
    """The spec path a concrete path falls under ({x} is one non-empty segment)."""
    for tmpl, item in SPEC["paths"].items():
        if item.get("x-mode", "sandbox") == mode and \
                re.fullmatch(re.sub(r"\\\{[^}]+\\\}", "[^/]+", re.escape(tmpl)), path):
            return tmpl
    return None


@pytest.mark.parametrize("mode", ["sandbox", "host"])
def test_paths_outside_the_spec_are_not_served(daemon_factory, mode):
    d = seeded(daemon_factory) if mode == "sandbox" else host_daemon(daemon_factory)
    paths = CANDIDATES + [p for p, i in SPEC["paths"].items() if i.get("x-mode", "sandbox") != mode]
    for path in paths:
        if template_match(fill(path), mode) or (path == "/v1/health"):
            continue  # e.g. /v1/checkpoints/import is checkpoint "import"
        for method in ("PATCH", "GET"):
            r = d.request(method, fill(path))
            assert r.status_code == 404, \
                f"{method} {path} answered {r.status_code}: the daemon serves a path the spec lacks"
            assert r.headers["Content-Type"].startswith("application/problem+json")
            assert r.json()["code"] == "not_found"
            assert not validate(r.json(), SPEC["components"]["schemas"]["Problem"])


def test_spec_is_well_formed():
    assert SPEC["openapi"].startswith("3.1")
    assert SPEC["components"]["securitySchemes"]["bearer"] == {
        **SPEC["components"]["securitySchemes"]["bearer"], "type": "http", "scheme": "bearer"}
    assert SPEC["paths"]["/v1/health"]["get"]["security"] == []
    for path, method in spec_operations("sandbox") + spec_operations("host"):
        op = SPEC["paths"][path][method]
        assert op.get("operationId") and op.get("responses"), (path, method)
        for code, resp in op["responses"].items():
            resp = deref(resp)
            for ctype, media in resp.get("content", {}).items():
                deref(media["schema"])  # every $ref resolves
                if int(code) >= 400:
                    assert ctype == "application/problem+json", (path, method, code)
    problem = SPEC["components"]["schemas"]["Problem"]
    assert problem["required"] == ["type", "title", "status", "detail", "code"]


REDOCLY = TOP / "tools" / "node_modules" / ".bin" / "redocly"


def redocly_lint(spec, config):
    env = {**os.environ, "REDOCLY_TELEMETRY": "off", "REDOCLY_SUPPRESS_UPDATE_NOTICE": "true"}
    assert REDOCLY.exists(), "redocly is not installed: `make deps` runs npm ci in tools/"
    r = subprocess.run([str(REDOCLY), "lint", "--config", str(config), "--format=json", str(spec)],
                       capture_output=True, text=True, timeout=180, env=env)
    return json.loads(r.stdout)


def test_redocly_lint_has_no_warnings():
    """redocly's recommended rules, pinned in tools/package-lock.json; the
    two exceptions (WebSocket endpoints answer 101, never 2XX) are listed in
    api/.redocly.lint-ignore.yaml."""
    out = redocly_lint(TOP / "api" / "openapi.yaml", TOP / "api" / "redocly.yaml")
    assert out["totals"]["errors"] == 0 and out["totals"]["warnings"] == 0, out["problems"]
    assert out["totals"]["ignored"] == 2


def test_redocly_lint_is_strict(tmp_path):
    """Without the ignore file the same spec warns: the check above can fail."""
    for name in ("openapi.yaml", "redocly.yaml"):
        shutil.copy(TOP / "api" / name, tmp_path / name)
    out = redocly_lint(tmp_path / "openapi.yaml", tmp_path / "redocly.yaml")
    assert out["totals"]["warnings"] == 2, out
    assert {p["ruleId"] for p in out["problems"]} == {"operation-2xx-response"}
