"""build/ckpt against a real ckptd, over TCP and over its unix socket: output
forms, --json fidelity, exit statuses, tokens, and the progress bar that only
a terminal gets."""
import fcntl
import json
import os
import re
import select
import struct
import subprocess
import termios
import time

import pytest

from conftest import CKPT, idempotency_files

BAR = re.compile(r"\[[#>.]{10,30}\]\s+\d+%")


def run(args, env=None, **kw):
    """ckpt with a clean environment (no CKPTD_* from the caller)."""
    e = {k: v for k, v in os.environ.items() if not k.startswith("CKPTD_")}
    e.update(env or {})
    return subprocess.run([CKPT, *args], env=e, capture_output=True, text=True, timeout=120, **kw)


def ckpt(d, *args, env=None):
    return run(["--url", d.url, *args], env=env)


def ok(p):
    assert p.returncode == 0, f"exit {p.returncode}\nstdout: {p.stdout}\nstderr: {p.stderr}"
    return p


def run_pty(args, cols=120):
    """ckpt with stdout on a pseudo-terminal; returns (exit status, raw output)."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, cols, 0, 0))
    e = {k: v for k, v in os.environ.items() if not k.startswith("CKPTD_")}
    p = subprocess.Popen([CKPT, *args], stdout=slave, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, env=e)
    os.close(slave)
    out = b""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        r, _, _ = select.select([master], [], [], 1)
        if not r:
            continue
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        out += chunk
    os.close(master)
    p.wait(30)
    p.stderr.close()
    return p.returncode, out.decode(errors="replace")


@pytest.fixture
def d(daemon_factory):
    d = daemon_factory(config={"cleanup_interval_secs": 3600})
    (d.roots[0] / "hello.txt").write_text("hello\n")
    return d


def test_version_help_and_usage_errors(d):
    assert ok(run(["--version"])).stdout.strip() == f"ckpt {d.health()['version']}"
    h = ok(run(["--help"])).stdout
    for word in ("create", "list", "show", "delete", "restore", "health", "--socket", "--token-file", "--json"):
        assert word in h
    for args in ([], ["frobnicate"], ["create"], ["show"], ["list", "extra"], ["create", "n", "--ttl", "soon"],
                 ["create", "n", "--label", "novalue"], ["list", "--force"], ["restore", "x", "--if-expired", "x"],
                 ["--url", d.url, "--socket", "/x", "health"], ["--no-such-option", "list"]):
        p = run(args)
        assert p.returncode == 2, (args, p.stdout, p.stderr)
        assert p.stderr.startswith(("ckpt:", CKPT)) and p.stdout == ""


def test_create_list_show_delete_human(d):
    p = ok(ckpt(d, "create", "first"))
    m = re.match(r"Created (cp_[0-9a-f]{24}) \"first\" \(", p.stdout)
    assert m, p.stdout
    cid = m.group(1)
    assert d.get(cid)["status"] == "active"
    ok(ckpt(d, "create", "second name", "--ttl", "0"))
    lines = ok(ckpt(d, "list")).stdout.splitlines()
    header = lines[0].split()
    assert header == ["ID", "NAME", "STATUS", "CREATED", "EXPIRES", "SIZE"]
    assert len(lines) == 3
    # Columns line up: every cell starts where its header does.
    starts = [lines[0].index(h) for h in ("ID", "NAME", "STATUS", "CREATED", "EXPIRES", "SIZE")]
    for row in lines[1:]:
        for s in starts[1:]:
            assert row[s - 2:s] == "  " and row[s] != " ", (row, s)
    assert lines[1][starts[1]:].startswith("second name")  # newest first
    assert "never" in lines[1] and "active" in lines[2] and cid in lines[2]
    assert re.search(r"\d+(\.\d)? (B|KiB|MiB)$", lines[2])
    only = ok(ckpt(d, "list", "--name", "first")).stdout.splitlines()
    assert len(only) == 2 and cid in only[1]
    show = ok(ckpt(d, "show", cid)).stdout
    assert f"ID:             {cid}" in show and "Name:           first" in show and "Status:         active" in show
    assert ok(ckpt(d, "show", "first")).stdout == show  # a name means its newest checkpoint
    assert ok(ckpt(d, "delete", cid)).stdout.strip() == f"Deleted {cid}"
    assert [c["name"] for c in d.list()] == ["second name"]


def test_json_output_is_the_api_verbatim(d):
    created = json.loads(ok(ckpt(d, "--json", "create", "j", "--ttl", "600", "--label", "a=1", "--label", "b=x=y")).stdout)
    cid = created["checkpoint_id"]
    api = d.get(cid)
    assert created == api
    assert created["labels"] == {"a": "1", "b": "x=y"} and created["expires_at"] is not None
    assert json.loads(ok(ckpt(d, "show", cid, "--json")).stdout) == d.get(cid)
    assert json.loads(ok(ckpt(d, "--json", "list")).stdout) == {"checkpoints": d.list()}
    h = json.loads(ok(ckpt(d, "--json", "health")).stdout)
    assert h.keys() == d.health().keys() and h["status"] == "ok"
    (d.roots[0] / "hello.txt").write_text("changed\n")
    rep = json.loads(ok(ckpt(d, "--json", "restore", cid)).stdout)
    assert rep["ok"] is True and rep["checkpoint_id"] == cid
    assert (d.roots[0] / "hello.txt").read_text() == "hello\n"
    assert set(rep) >= {"restore_duration_ms", "started_services", "stopped_services", "failed_services",
                        "restored_from_checkpoint", "ttl_expired"}
    p = ok(ckpt(d, "--json", "delete", cid))
    assert p.stdout == ""
    bg = json.loads(ok(ckpt(d, "--json", "create", "bg", "--async")).stdout)
    assert bg["status"] == "creating"


def test_restore_human_and_name_escaping(d):
    name = "odd/name? with %20 & spaces"
    cid = json.loads(ok(ckpt(d, "--json", "create", name)).stdout)["checkpoint_id"]
    assert json.loads(ok(ckpt(d, "--json", "show", name)).stdout)["checkpoint_id"] == cid
    (d.roots[0] / "new.txt").write_text("x")
    out = ok(ckpt(d, "restore", name)).stdout
    assert re.match(rf"Restored {cid} in \d+ ms\n", out), out
    for label in ("Stopped:", "Started:", "Failed:", "Services:"):
        assert label in out
    assert not (d.roots[0] / "new.txt").exists()


def test_errors_carry_the_servers_detail(d):
    api = d.request("GET", "/v1/checkpoints/cp_0123456789abcdef01234567").json()
    for cmd in ("show", "delete", "restore"):
        p = ckpt(d, cmd, "cp_0123456789abcdef01234567")
        assert p.returncode == 1, (cmd, p.stdout, p.stderr)
        assert api["detail"] in p.stderr and "not_found" in p.stderr and "404" in p.stderr
        assert p.stdout == ""
    p = ckpt(d, "--json", "show", "cp_0123456789abcdef01234567")
    assert p.returncode == 1 and json.loads(p.stdout) == api
    p = ckpt(d, "create", "x" * 129)
    assert p.returncode == 1 and "invalid_field" in p.stderr and "400" in p.stderr
    assert d.list() == []


def test_connection_failures_exit_3(d, tmp_path):
    port = d.port
    d.stop()
    p = run(["--url", f"http://127.0.0.1:{port}", "list"])
    assert p.returncode == 3 and "cannot reach ckptd" in p.stderr
    p = run(["--socket", str(tmp_path / "nothing.sock"), "health"])
    assert p.returncode == 3 and "nothing.sock" in p.stderr


def test_unix_socket(daemon_factory, tmp_path):
    sock = tmp_path / "ckptd.sock"
    d = daemon_factory(extra_args=["--listen", f"unix:{sock}"])
    (d.roots[0] / "f").write_text("1")
    cid = json.loads(ok(run(["--socket", str(sock), "--json", "create", "over-unix"])).stdout)["checkpoint_id"]
    assert d.get(cid)["name"] == "over-unix"
    assert cid in ok(run(["list"], env={"CKPTD_SOCKET": str(sock)})).stdout
    assert cid in ok(run(["--url", f"unix:{sock}", "show", cid])).stdout
    (d.roots[0] / "f").write_text("2")
    ok(run(["--socket", str(sock), "restore", cid]))
    assert (d.roots[0] / "f").read_text() == "1"
    ok(run(["--socket", str(sock), "delete", cid]))
    assert d.list() == []
    p = run(["--socket", str(sock), "show", cid])
    assert p.returncode == 1 and "not_found" in p.stderr


def test_url_from_environment(d):
    assert "Status:         ok" in ok(run(["health"], env={"CKPTD_URL": d.url + "/"})).stdout


def test_token_handling(daemon_factory, tmp_path):
    d = daemon_factory(token="t0ken-value")
    p = ckpt(d, "list")
    assert p.returncode == 1 and "unauthorized" in p.stderr and "401" in p.stderr
    tf = tmp_path / "tok"
    tf.write_text("t0ken-value\n")
    ok(ckpt(d, "--token-file", str(tf), "create", "with-token"))
    assert "with-token" in ok(ckpt(d, "list", env={"CKPTD_TOKEN": "t0ken-value"})).stdout
    tf.write_text("wrong")
    assert ckpt(d, "--token-file", str(tf), "list").returncode == 1
    # The file wins over the environment.
    assert ckpt(d, "--token-file", str(tf), "list", env={"CKPTD_TOKEN": "t0ken-value"}).returncode == 1
    tf.write_text("\n")
    assert ckpt(d, "--token-file", str(tf), "list").returncode == 2
    assert ckpt(d, "--token-file", str(tmp_path / "missing"), "list").returncode == 2
    assert ok(ckpt(d, "health")).stdout  # health needs no token


def test_progress_bar_only_on_a_terminal(d):
    blob = os.urandom(128 << 10)
    for i in range(400):
        (d.roots[0] / f"f{i:03}").write_bytes(blob[i:] + blob[:i])
    rc, out = run_pty(["--url", d.url, "create", "on-tty"])
    assert rc == 0, out
    assert BAR.search(out) and "100%" in out and "creating \"on-tty\"" in out, out
    assert re.search(r"Created cp_[0-9a-f]{24} \"on-tty\"", out), out
    rec = d.list(name="on-tty")[0]
    assert rec["status"] == "active"
    if rec["duration_ms"] >= 400:
        # Polled every 100 ms: the daemon's progress numbers must have shown.
        assert re.search(r"\d+/\d+ files", out), out
    # Piped: one plain line, no bar, no carriage returns.
    p = ok(ckpt(d, "create", "piped"))
    assert "\r" not in p.stdout and not BAR.search(p.stdout) and len(p.stdout.splitlines()) == 1
    # --json on a terminal: plain JSON, no bar.
    rc, out = run_pty(["--url", d.url, "--json", "create", "json-tty"])
    assert rc == 0 and not BAR.search(out)
    assert json.loads(out)["name"] == "json-tty" and json.loads(out)["status"] == "active"


def test_restore_spinner_only_on_a_terminal(d):
    cid = d.create("r")["checkpoint_id"]
    rc, out = run_pty(["--url", d.url, "restore", cid])
    assert rc == 0, out
    assert f"restoring {cid}" in out and "\r" in out, out
    assert re.search(rf"Restored {cid} in \d+ ms", out)
    p = ok(ckpt(d, "restore", cid))
    assert "restoring" not in p.stdout and "\r" not in p.stdout


def test_restore_verify(d):
    cid = d.create("v")["checkpoint_id"]
    out = ok(ckpt(d, "restore", cid, "--verify")).stdout
    assert re.search(r"Verified: +yes \(\d+ ms\)", out), out
    # falsify the recorded content hash of hello.txt: the file no longer matches it
    man = d.state_dir / "tar" / cid / "r0.manifest"
    lines = man.read_text().splitlines()
    i = next(i for i, l in enumerate(lines) if "\thello.txt\t" in l)
    lines[i] = re.sub(r"\b[0-9a-f]{64}\b", "0" * 64, lines[i])  # the sha256 field, wherever v3 puts it
    assert lines[i] != man.read_text().splitlines()[i]
    man.write_text("\n".join(lines) + "\n")
    p = ckpt(d, "restore", cid, "--verify")
    assert p.returncode == 1 and "reported failures" in p.stderr, p.stderr
    assert "NO, the roots differ" in p.stdout and f"content: {d.roots[0] / 'hello.txt'}" in p.stdout, p.stdout


def test_restore_expired(d):
    cid = d.create("short", ttl_secs=1)["checkpoint_id"]
    time.sleep(1.2)
    p = ckpt(d, "restore", cid)
    assert p.returncode == 1 and "checkpoint_expired" in p.stderr and "410" in p.stderr
    out = ok(ckpt(d, "restore", cid, "--if-expired", "fresh")).stdout
    assert "reset to their base" in out
    ok(ckpt(d, "restore", cid, "--force"))


def test_failed_async_create_on_a_terminal(daemon_factory):
    """The state dir on a 1 MiB tmpfs: the create runs out of space in the
    background, the bar stops and the daemon's reason reaches stderr."""
    d = daemon_factory(start=False)
    d.state_dir.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(d.state_dir)], check=True)
    d.start()
    (d.roots[0] / "big.bin").write_bytes(os.urandom(4 << 20))
    master, slave = os.openpty()
    e = {k: v for k, v in os.environ.items() if not k.startswith("CKPTD_")}
    p = subprocess.run([CKPT, "--url", d.url, "create", "no-room"], stdout=slave, stderr=subprocess.PIPE,
                       env=e, timeout=60, text=True)
    os.close(slave)
    os.close(master)
    assert p.returncode == 1, p.stderr
    assert 'ended in state "failed"' in p.stderr and "(insufficient_storage)" in p.stderr, p.stderr
    assert (d.roots[0] / "big.bin").stat().st_size == 4 << 20
    piped = ckpt(d, "create", "no-room-piped")
    assert piped.returncode == 1 and "insufficient_storage" in piped.stderr, piped.stderr


def run_on_terminal(args, answer=None, interrupt_on=None):
    """ckpt with stdin, stdout and stderr on one pseudo-terminal, as a person runs it.
    answer: a line typed once ckpt asks; interrupt_on: Ctrl-C once ckpt printed this
    (not after a time: a slow start, the sanitized build's, would take it before ckpt
    is under way)."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    e = {k: v for k, v in os.environ.items() if not k.startswith("CKPTD_")}
    p = subprocess.Popen([CKPT, *args], stdin=slave, stdout=slave, stderr=slave, env=e, start_new_session=True)
    os.close(slave)
    out, t0, sent = b"", time.monotonic(), False
    while time.monotonic() - t0 < 60:
        if interrupt_on is not None and not sent and interrupt_on in out:
            p.send_signal(2)
            sent = True
        r, _, _ = select.select([master], [], [], 0.1)
        if not r:
            if p.poll() is not None:
                break
            continue
        try:
            chunk = os.read(master, 65536)
        except OSError:
            break
        if not chunk:
            break
        out += chunk
        if answer is not None and b"[y/N]" in out:
            os.write(master, answer.encode() + b"\n")
            answer = None
    os.close(master)
    return p.wait(30), out.decode(errors="replace")


def test_did_you_mean_help_and_version_commands(d):
    p = run(["creat", "x"])
    assert p.returncode == 2 and 'did you mean "create"?' in p.stderr
    p = run(["lsit"])
    assert p.returncode == 2 and 'did you mean "list"?' in p.stderr
    p = run(["frobnicate"])
    assert p.returncode == 2 and "did you mean" not in p.stderr
    assert "Usage: ckpt restore" in ok(run(["help", "restore"])).stdout
    assert ok(run(["restore", "--help"])).stdout == ok(run(["help", "restore"])).stdout
    assert ok(run(["help"])).stdout == ok(run(["--help"])).stdout
    assert ok(run(["version"])).stdout == ok(run(["--version"])).stdout
    # Unknown options and missing values: the same "ckpt: ... Try" style as other usage errors.
    for args, text in ((["list", "--bogus"], "unknown option --bogus"), (["-x", "list"], "unknown option -x"),
                       (["create", "n", "--ttl"], "option --ttl needs a value")):
        p = run(args)
        assert p.returncode == 2 and p.stderr == f"ckpt: {text}\nTry 'ckpt --help'.\n", p.stderr


def test_messages_in_ckptds_words(daemon_factory, tmp_path):
    p = run(["--socket", "/nonexistent", "list"])
    assert p.returncode == 3 and "no socket at /nonexistent" in p.stderr and "port 80" not in p.stderr
    d = daemon_factory(token="t0ken-value")
    p = ckpt(d, "list")
    assert p.returncode == 1 and "hint: ckptd wants a token: pass --token-file FILE or set CKPTD_TOKEN" in p.stderr
    p = ckpt(d, "list", env={"CKPTD_TOKEN": "wrong"})
    assert p.returncode == 1 and "the token ckpt sent was refused" in p.stderr


def test_empty_list_quiet_ids_and_delete_by_name(d):
    assert ok(ckpt(d, "list")).stdout == "No checkpoints.\n"
    assert ok(ckpt(d, "list", "-q")).stdout == ""
    cid = ok(ckpt(d, "create", "q1", "-q")).stdout.strip()
    assert re.fullmatch(r"cp_[0-9a-f]{24}", cid)
    cid2 = ok(ckpt(d, "create", "q2", "--quiet")).stdout.strip()
    assert ok(ckpt(d, "list", "-q")).stdout.split() == [cid2, cid]
    # A name given to delete: the output names the checkpoint by its id, as docs/cli.md says.
    assert ok(ckpt(d, "delete", "q1")).stdout == f"Deleted {cid}\n"
    assert ok(ckpt(d, "delete", "q2", "-q")).stdout == f"{cid2}\n"


def test_restore_asks_on_a_terminal_and_dry_run_changes_nothing(d):
    cid = d.create("before")["checkpoint_id"]
    (d.roots[0] / "hello.txt").write_text("changed\n")
    rc, out = run_on_terminal(["--url", d.url, "restore", cid], answer="n")
    assert rc == 1 and "Restore? [y/N]" in out and "not restored" in out, out
    assert (d.roots[0] / "hello.txt").read_text() == "changed\n"
    p = ok(ckpt(d, "restore", cid, "--dry-run"))
    assert f"Restore would roll every managed root back to {cid} \"before\"" in p.stdout
    assert f"\nM {d.roots[0]}/hello.txt\n" in p.stdout, p.stdout  # the diff it would undo
    # and the units it would stop: none run here (test_rig.py has real ones)
    assert p.stdout.endswith("Units the restore would stop, then start again:\n  none\n"), p.stdout
    diff = d.request("GET", f"/v1/checkpoints/{cid}/diff").json()
    assert diff["services"] == [] and isinstance(diff["services_available"], bool), diff
    assert (d.roots[0] / "hello.txt").read_text() == "changed\n"
    rc, out = run_on_terminal(["--url", d.url, "restore", "--dry-run", cid])
    assert rc == 0 and "[y/N]" not in out and (d.roots[0] / "hello.txt").read_text() == "changed\n"
    rc, out = run_on_terminal(["--url", d.url, "restore", cid], answer="y")
    assert rc == 0 and f"Restored {cid}" in out, out
    assert (d.roots[0] / "hello.txt").read_text() == "hello\n"
    (d.roots[0] / "hello.txt").write_text("again\n")
    rc, out = run_on_terminal(["--url", d.url, "restore", cid, "--yes"])
    assert rc == 0 and "[y/N]" not in out and (d.roots[0] / "hello.txt").read_text() == "hello\n"


def test_ctrl_c_during_create_says_it_goes_on(d):
    blob = os.urandom(1 << 20)
    for i in range(300):
        (d.roots[0] / f"f{i:03}").write_bytes(blob[i:] + blob[:i])
    # the bar's label: ckptd took the create (202) and ckpt follows it
    rc, out = run_on_terminal(["--url", d.url, "create", "interrupted"], interrupt_on=b'creating "interrupted"')
    assert rc == 130, out
    assert "interrupted; ckptd goes on creating cp_" in out, out
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        recs = d.list(name="interrupted")
        if recs and recs[0]["status"] == "active":
            break
        time.sleep(0.2)
    assert recs and recs[0]["status"] == "active", "the create did not go on after Ctrl-C"


def test_posts_carry_an_idempotency_key(d):
    """Each run of ckpt sends one key with its POSTs, so a retry after an unknown
    outcome cannot do the work twice: ckptd records one answer per key."""
    idem = d.state_dir / "idempotency"
    cid = ok(ckpt(d, "create", "keyed", "-q")).stdout.strip()
    assert len(idempotency_files(d, 1)) == 1
    ok(ckpt(d, "restore", cid, "--yes"))
    assert len(idempotency_files(d, 2)) == 2
    ok(ckpt(d, "list"))  # a GET carries none
    time.sleep(0.2)
    assert len(list(idem.glob("*.json"))) == 2
