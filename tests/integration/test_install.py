"""`make install`, the man pages and `make run`, as a newcomer and a packager meet them."""
import json
import os
import re
import signal
import socket
import subprocess
import time

import pytest
import requests

from conftest import CKPT, CKPTD, TOP, free_port, mounts_under


def make(*args, **kw):
    return subprocess.run(["make", "-s", "-C", str(TOP), *args], capture_output=True, text=True, **kw)


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    dest = tmp_path_factory.mktemp("dest")
    r = make("install", f"DESTDIR={dest}", "PREFIX=/usr")
    assert r.returncode == 0, r.stderr
    return dest


def test_install_puts_every_file_in_place(installed):
    for rel in ["usr/bin/ckptd", "usr/bin/ckpt", "usr/lib/systemd/system/ckptd.service",
                "usr/lib/systemd/system/ckptd.socket", "usr/share/ckptd/openapi.yaml",
                "usr/share/man/man8/ckptd.8", "usr/share/man/man1/ckpt.1", "usr/share/man/man5/ckptd.json.5",
                "etc/ckptd/ckptd.json"]:
        assert (installed / rel).is_file(), rel
    unit = (installed / "usr/lib/systemd/system/ckptd.service").read_text()
    assert "@" not in re.sub(r"SystemCallFilter=.*", "", unit), "a template variable was left in the unit"
    assert "ExecStart=/usr/bin/ckptd --config /etc/ckptd/ckptd.json" in unit
    assert "Documentation=man:ckptd(8) man:ckptd.json(5) file:///usr/share/ckptd/openapi.yaml" in unit
    # The config the unit needs is there, and ckptd accepts its shape.
    cfg = json.loads((installed / "etc/ckptd/ckptd.json").read_text())
    assert cfg["state_dir"] == "/var/lib/ckptd" and cfg["roots"]


def test_install_never_overwrites_the_users_config(installed):
    conf = installed / "etc/ckptd/ckptd.json"
    conf.write_text('{"roots": ["/mine"]}\n')
    r = make("install", f"DESTDIR={installed}", "PREFIX=/usr")
    assert r.returncode == 0, r.stderr
    assert conf.read_text() == '{"roots": ["/mine"]}\n'


def test_documentation_follows_prefix(tmp_path):
    r = make("install", f"DESTDIR={tmp_path}", "PREFIX=/opt/ckptd")
    assert r.returncode == 0, r.stderr
    unit = (tmp_path / "opt/ckptd/lib/systemd/system/ckptd.service").read_text()
    assert "file:///opt/ckptd/share/ckptd/openapi.yaml" in unit
    assert "ExecStart=/opt/ckptd/bin/ckptd" in unit
    assert (tmp_path / "opt/ckptd/share/man/man8/ckptd.8").is_file()


def man_text(installed, rel):
    r = subprocess.run(["man", "-l", str(installed / rel)], capture_output=True, text=True,
                       env={"MANWIDTH": "200", "PATH": "/usr/bin:/bin", "MAN_KEEP_FORMATTING": "0"})
    assert r.returncode == 0, r.stderr
    return re.sub(r".\x08", "", r.stdout)


def test_man_pages_cover_every_option_command_and_key(installed):
    ckptd8 = man_text(installed, "usr/share/man/man8/ckptd.8")
    for opt in set(re.findall(r"^\s+(--[a-z-]+)", subprocess.run([CKPTD, "--help"], capture_output=True,
                                                                   text=True).stdout, re.M)):
        assert opt in ckptd8, f"ckptd(8) does not describe {opt}"
    ckpt1 = man_text(installed, "usr/share/man/man1/ckpt.1")
    usage = subprocess.run([CKPT, "--help"], capture_output=True, text=True).stdout
    commands = re.findall(r"^  ([a-z]+) ", usage.split("Commands:")[1].split("Options:")[0], re.M)
    assert commands
    for cmd in commands:
        assert re.search(rf"^\s+{cmd}\b", ckpt1, re.M), f"ckpt(1) does not describe '{cmd}'"
    conf5 = man_text(installed, "usr/share/man/man5/ckptd.json.5")
    documented = set()
    for doc in [TOP / "docs/configuration.md", TOP / "docs/host-mode.md"]:
        documented |= set(re.findall(r"^\| `([a-z_]+)` \|", doc.read_text(), re.M))
    assert "roots" in documented
    for key in documented:
        assert re.search(rf"^\s+{key}\b", conf5, re.M), f"ckptd.json(5) does not describe '{key}'"


def test_unit_exposure_does_not_grow(installed):
    unit = installed / "usr/lib/systemd/system/ckptd.service"
    r = subprocess.run(["systemd-analyze", "security", "--offline=true", str(unit)], capture_output=True, text=True)
    m = re.search(r"Overall exposure level for ckptd.service: ([0-9.]+)", r.stdout)
    assert m, r.stdout + r.stderr
    assert float(m.group(1)) <= 5.2, r.stdout  # 5.3 before ProtectHostname= and without CAP_LINUX_IMMUTABLE


def _make_run(tmp_path, port):
    p = subprocess.Popen(["make", "-s", "-C", str(TOP), "run", f"PORT={port}", f"WORKSPACE={tmp_path}/ws",
                          f"STATE={tmp_path}/state"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    line = p.stdout.readline()
    assert f"serving http://127.0.0.1:{port}" in line, line + p.stderr.read() if p.poll() else line
    return p


def test_make_run_prints_the_url_once_ckptd_answers(tmp_path):
    """...and Ctrl-C leaves the workspace holding what was written (released,
    a plain directory), and the next make run adopts it again."""
    port = free_port()
    p = _make_run(tmp_path, port)
    ws = tmp_path / "ws"
    try:
        url = f"http://127.0.0.1:{port}"
        assert requests.get(f"{url}/v1/health", timeout=5).status_code == 200
        (ws / "written.txt").write_text("kept after Ctrl-C\n")
        (ws / "sub").mkdir()
        os.link(ws / "written.txt", ws / "sub/link.txt")
        assert requests.post(f"{url}/v1/checkpoints", json={"name": "one"}, timeout=30).status_code == 201
    finally:
        os.killpg(p.pid, signal.SIGINT)  # what Ctrl-C does: the whole foreground group
        p.wait(timeout=60)
    out, err = p.stdout.read(), p.stderr.read()
    # ckptd stopped cleanly on Ctrl-C after the release: no mount, the contents there.
    assert "keeps what it held (released)" in out, out + err
    assert "stopping on signal" in err
    assert not mounts_under(ws)
    assert (ws / "written.txt").read_text() == "kept after Ctrl-C\n"
    assert os.stat(ws / "sub/link.txt").st_ino == os.stat(ws / "written.txt").st_ino
    port = free_port()
    p = _make_run(tmp_path, port)
    try:
        assert (ws / "written.txt").read_text() == "kept after Ctrl-C\n"
        h = requests.get(f"http://127.0.0.1:{port}/v1/health", timeout=5).json()
        assert h["released_roots"] == [] and h["roots"] == [str(ws)]
    finally:
        os.killpg(p.pid, signal.SIGINT)
        p.wait(timeout=60)
    assert (ws / "written.txt").read_text() == "kept after Ctrl-C\n"


def test_make_run_on_a_busy_port_says_so(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        # refused without waiting for anything: a run that waited would
        # outlast the timeout (a deadline, not a measured limit)
        r = make("run", f"PORT={port}", f"WORKSPACE={tmp_path}/ws", f"STATE={tmp_path}/state", timeout=60)
    assert r.returncode != 0
    assert f"port {port} is already in use" in r.stderr
    assert f"make run PORT={port + 1}" in r.stderr
    assert not (tmp_path / "ws").exists(), "a refused run created the workspace"
