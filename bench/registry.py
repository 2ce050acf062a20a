#!/usr/bin/python3
"""Push and pull through a loopback docker-registry, against skopeo copy of
the same image, and the daemon's peak RSS growth while it pushes or pulls.

    make bench-registry [SIZES=100M,1G]

One ckptd (overlay) pushes a checkpoint of SIZE of random files, then the
next one after 10 changes; a second ckptd pulls both. The files are in the
first ckptd's base, whose layer is made, then asked for with HEAD. A third
ckptd gets its files after the base: their layer is a checkpoint's, sent
while it is made. skopeo copies the
same image from the registry to an OCI layout and from the layout to an
empty registry (so no blob is already there). Peak RSS growth is
VmHWM after the operation less VmRSS before it, with the peak reset
(clear_refs 5) first. CPU is user+sys seconds: the daemon's for its rows,
skopeo's for its own (the registry's is not counted in either). Prints a
markdown table, the ratios to skopeo and the load average: the machine may
be shared, so compare within one run. A pull's bytes are those its log
line says it fetched."""
import argparse
import base64
import json
import os
import pathlib
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import requests

TOP = pathlib.Path(__file__).resolve().parents[1]
CKPTD = str(TOP / os.environ.get("BUILD", "build") / "ckptd")
USER, PASSWORD = "bench", "bench-pw"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, timeout=30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {port}")


def registry(base):
    base.mkdir(parents=True)
    port = free_port()
    pw = subprocess.run(["htpasswd", "-Bbn", USER, PASSWORD], capture_output=True, text=True, check=True).stdout
    (base / "htpasswd").write_text(pw)
    (base / "config.yml").write_text(
        f"version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: {base}/data\n"
        f"http:\n  addr: 127.0.0.1:{port}\nauth:\n  htpasswd:\n    realm: bench\n    path: {base}/htpasswd\n")
    p = subprocess.Popen(["docker-registry", "serve", str(base / "config.yml")], stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    wait_port(port)
    return p, f"127.0.0.1:{port}"


class Daemon:
    def __init__(self, base, hosts):
        self.base = base
        self.root = base / "root"
        self.root.mkdir(parents=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        tok = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
        (base / "auth.json").write_text(json.dumps({"auths": {h: {"auth": tok} for h in hosts}}))
        (base / "config.json").write_text(json.dumps({"registry_insecure": hosts,
                                                      "registry_auth_file": str(base / "auth.json"),
                                                      "max_checkpoints": 1000}))

    def start(self):
        self.proc = subprocess.Popen([CKPTD, "--listen", f"127.0.0.1:{self.port}", "--state-dir",
                                      str(self.base / "state"), "--root", str(self.root), "--backend", "overlay",
                                      "--unmount-on-exit", "--config", str(self.base / "config.json")],
                                     stdout=open(self.base / "log", "wb"), stderr=subprocess.STDOUT)
        wait_port(self.port)
        while requests.get(self.url + "/v1/health").json().get("status") == "preparing":
            time.sleep(0.05)

    def post(self, path, body, expect):
        r = requests.post(self.url + path, json=body, timeout=3600)
        assert r.status_code == expect, r.text
        return r.json()

    def status(self, key):
        for line in open(f"/proc/{self.proc.pid}/status"):
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
        return 0

    def cpu(self):
        """user+sys seconds the daemon used so far."""
        fields = open(f"/proc/{self.proc.pid}/stat").read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def fetched(self):
        """The bytes the last pull fetched, as its log line says."""
        return int(re.findall(r"(\d+) bytes fetched", (self.base / "log").read_text())[-1])

    def measured(self, path, body, expect):
        """(answer, seconds, peak RSS growth in bytes, CPU seconds)."""
        with open(f"/proc/{self.proc.pid}/clear_refs", "w") as f:
            f.write("5")
        before, cpu = self.status("VmRSS"), self.cpu()
        t0 = time.monotonic()
        out = self.post(path, body, expect)
        return out, time.monotonic() - t0, self.status("VmHWM") - before, self.cpu() - cpu

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(120)


def fill(root, size):
    n = max(1, size // (1 << 20))
    for i in range(n):
        (root / f"f{i:05}").write_bytes(os.urandom(min(size, 1 << 20)))


def ten_changes(root):
    for i in range(10):
        (root / f"f{i:05}").write_bytes(os.urandom(4096))


def timed(argv):
    """(seconds, CPU seconds of the command)."""
    r0, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.monotonic()
    subprocess.run(argv, check=True, capture_output=True)
    t, r1 = time.monotonic() - t0, resource.getrusage(resource.RUSAGE_CHILDREN)
    return t, r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime


def mib(b):
    return f"{b / (1 << 20):.1f} MiB" if abs(b) >= 1 << 20 else f"{b / 1024:.0f} KiB"


def one(size_name, size, work):
    reg_p, host = registry(work / "reg")
    reg2_p, host2 = registry(work / "reg2")
    reg3_p, host3 = registry(work / "reg3")  # skopeo's: empty, whatever ckptd sent to host2
    a, b = Daemon(work / "a", [host, host2]), Daemon(work / "b", [host, host2])
    c = Daemon(work / "c", [host, host2])  # its files come after the base: a checkpoint's layer
    rows = []
    try:
        fill(a.root, size)
        os.sync()  # time the push, not the writeback of the files just written
        a.start()
        b.start()
        c1 = a.post("/v1/checkpoints", {"name": "one"}, 201)["checkpoint_id"]
        load0 = os.getloadavg()[0]
        p1, t, rss, cpu = a.measured(f"/v1/checkpoints/{c1}/push", {"ref": f"{host}/bench/img"}, 200)
        rows.append(("ckptd push, whole", t, cpu, p1["uploaded_bytes"], rss))
        # the layers are in the cache now: an empty registry times the upload alone
        p0, t, rss, cpu = a.measured(f"/v1/checkpoints/{c1}/push", {"ref": f"{host2}/bench/cached"}, 200)
        rows.append(("ckptd push, whole, layers already made", t, cpu, p0["uploaded_bytes"], rss))
        roots = {str(a.root): str(b.root)}
        _, t, rss, cpu = b.measured("/v1/checkpoints/pull", {"ref": p1["ref"], "roots": roots}, 201)
        rows.append(("ckptd pull, whole", t, cpu, b.fetched(), rss))
        ten_changes(a.root)
        c2 = a.post("/v1/checkpoints", {"name": "two"}, 201)["checkpoint_id"]
        p2, t, rss, cpu = a.measured(f"/v1/checkpoints/{c2}/push", {"ref": f"{host}/bench/img"}, 200)
        rows.append(("ckptd push, next after 10 changes", t, cpu, p2["uploaded_bytes"], rss))
        _, t, rss, cpu = b.measured("/v1/checkpoints/pull", {"ref": p2["ref"], "roots": roots}, 201)
        rows.append(("ckptd pull, next after 10 changes", t, cpu, b.fetched(), rss))
        c.start()
        fill(c.root, size)
        c3 = c.post("/v1/checkpoints", {"name": "three"}, 201)["checkpoint_id"]
        os.sync()
        p3, t, rss, cpu = c.measured(f"/v1/checkpoints/{c3}/push", {"ref": f"{host2}/bench/streamed"}, 200)
        rows.append(("ckptd push, whole, in a checkpoint's layer (sent while made)", t, cpu, p3["uploaded_bytes"],
                     rss))
        creds = f"{USER}:{PASSWORD}"
        layout = work / "layout"
        t, cpu = timed(["skopeo", "copy", "--src-tls-verify=false", "--src-creds", creds, f"docker://{p1['ref']}",
                        f"oci:{layout}:one"])
        rows.append(("skopeo copy registry -> OCI layout, whole", t, cpu, p1["uploaded_bytes"], None))
        t, cpu = timed(["skopeo", "copy", "--dest-tls-verify=false", "--dest-creds", creds, f"oci:{layout}:one",
                        f"docker://{host3}/bench/skopeo:one"])
        rows.append(("skopeo copy OCI layout -> empty registry, whole", t, cpu, p1["uploaded_bytes"], None))
        load1 = os.getloadavg()[0]
    finally:
        for d in (a, b, c):
            if getattr(d, "proc", None):
                d.stop()
        for p in (reg_p, reg2_p, reg3_p):
            p.terminate()
            p.wait(30)
    print(f"\n### {size_name}\n")
    print("| operation | time | CPU user+sys | bytes moved | daemon peak RSS growth |")
    print("| --- | --- | --- | --- | --- |")
    for name, t, cpu, moved, rss in rows:
        print(f"| {name} | {t:.2f} s | {cpu:.2f} s | {mib(moved)} | {mib(rss) if rss is not None else '-'} |")
    by = {name: t for name, t, *_ in rows}
    skopeo_push = by["skopeo copy OCI layout -> empty registry, whole"]
    push_x = by["ckptd push, whole"] / skopeo_push
    stream_x = by["ckptd push, whole, in a checkpoint's layer (sent while made)"] / skopeo_push
    pull_x = by["ckptd pull, whole"] / by["skopeo copy registry -> OCI layout, whole"]
    print(f"\nckptd / skopeo: push {push_x:.2f}x (base layer), {stream_x:.2f}x (checkpoint's layer), "
          f"pull {pull_x:.2f}x (goal: 1.2x or less); "
          f"load average {load0:.1f} before, {load1:.1f} after, on {os.cpu_count()} CPUs")
    sys.stdout.flush()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="100M,1G")
    args = ap.parse_args()
    for s in args.sizes.split(","):
        size = int(s[:-1]) << (20 if s.endswith("M") else 30)
        work = pathlib.Path(tempfile.mkdtemp(prefix="ckptd-bench-reg-"))
        try:
            one(s, size, work)
        finally:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
