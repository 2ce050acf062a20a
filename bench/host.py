"""Host mode handoff bench (bench/run.py --cases host): two ckptd --mode host
instances on one machine share a volume (a temp dir); a sandbox is handed
back and forth by attaching through the instance that does not run it.
Handoff = attach -> SANDBOX_RUNNING on the other instance. In the same run,
raw runsc: `runsc checkpoint` + `runsc restore` of the same sandbox (its
bundle copied) with no ckptd in between. Overhead = handoff - raw, medians,
for volume locks and etcd locks (a real etcd from etcd-server)."""
import json
import os
import pathlib
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import requests

TOP = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TOP / "examples" / "host"))
from sandbox_client import Sandbox, SandboxError  # noqa: E402

TARGETS_MS = {"volume": 1000, "etcd": 300}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url, post=None):
    deadline = time.time() + 20
    while time.time() < deadline:
        try:
            r = requests.post(url, json=post, timeout=1) if post else requests.get(url, timeout=1)
            if r.ok:
                return
        except requests.RequestException:
            pass
        time.sleep(0.05)
    raise RuntimeError(url + " did not answer")


def start_etcd(work):
    port, peer = free_port(), free_port()
    url, purl = "http://127.0.0.1:%d" % port, "http://127.0.0.1:%d" % peer
    p = subprocess.Popen(["etcd", "--data-dir", str(work / "etcd"), "--listen-client-urls", url,
                          "--advertise-client-urls", url, "--listen-peer-urls", purl,
                          "--initial-advertise-peer-urls", purl, "--initial-cluster", "default=" + purl],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_http(url + "/v3/kv/range", {"key": "AA=="})
    return p, url


def start_instance(ckptd, work, name, volume, cfg):
    port = free_port()
    (work / ("cfg-" + name)).write_text(json.dumps(cfg))
    env = dict(os.environ, SANDBOX_CHECKPOINT_BUCKET="bench", SANDBOX_CHECKPOINT_MOUNT_PATH=str(volume))
    p = subprocess.Popen([ckptd, "--mode", "host", "--listen", "127.0.0.1:%d" % port, "--state-dir",
                          str(work / ("state-" + name)), "--instance-id", name, "--config",
                          str(work / ("cfg-" + name))], env=env, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    wait_http("http://127.0.0.1:%d/v1/health" % port)
    return p, "ws://127.0.0.1:%d" % port


def handoffs(ckptd, work, backend, runs, etcd_url):
    volume = work / ("volume-" + backend)
    volume.mkdir()
    cfg = {"lock_ttl_secs": 10, "lock_renew_secs": 2}
    if backend == "etcd":
        cfg.update(lock_backend="etcd", etcd_endpoints=[etcd_url])
    procs, urls = [], []
    try:
        for name in ("A", "B"):
            p, u = start_instance(ckptd, work, name + backend, volume, cfg)
            procs.append(p)
            urls.append(u)
        sb = Sandbox.create(urls[0], enable_checkpoint=True)
        sb.run("python", "x = list(range(100000))")
        sid = sb.sandbox_id
        bundle = work / ("state-A" + backend) / "sandboxes" / ("A" + backend) / "bundles" / sid
        raw = raw_runsc(work, bundle, backend, runs)
        sb.close()
        time.sleep(1)  # the owner's detach runs after the close: attach only once it is done
        times = []
        for i in range(runs + 1):
            sb, t0 = attach_when_free(urls[(i + 1) % 2], sid)   # the other instance hands it over
            ms = (time.time() - t0) * 1000
            if i:  # the first restore also warms caches
                times.append(ms)
            sb.run("python", "len(x)")
            sb.close()
            time.sleep(1)  # as above: a handoff is refused while a client is attached (SANDBOX_IN_USE)
        return times, raw
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            p.wait(60)


def attach_when_free(url, sid, patience=30):
    """Attach, retrying while the last client's detach is still running on
    the owner (SANDBOX_IN_USE, answered at once): a handoff is timed from the
    attempt that was let in, as an SDK's retry loop would see it."""
    deadline = time.time() + patience
    while True:
        t0 = time.time()
        try:
            return Sandbox.attach(url, sid), t0
        except SandboxError as e:
            if e.status != "SANDBOX_IN_USE" or time.time() > deadline:
                raise
            time.sleep(0.2)


def raw_runsc(work, bundle, tag, runs):
    """runsc checkpoint + runsc restore (ms) of a copy of the sandbox's bundle."""
    root, mine, out = work / ("raw-root-" + tag), work / ("raw-bundle-" + tag), []
    mine.mkdir()
    shutil.copy(bundle / "config.json", mine / "config.json")
    rs = ["runsc", "--root", str(root), "--overlay", "--network=none"]
    cid = "raw-%s-0" % tag
    subprocess.run(rs + ["run", "-detach", "-bundle", str(mine), cid], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.5)
        for i in range(runs):
            img, nxt = work / ("raw-img-%s-%d" % (tag, i)), "raw-%s-%d" % (tag, i + 1)
            t0 = time.time()
            subprocess.run(rs + ["checkpoint", "--image-path=%s" % img, cid], check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            # a new id: no `runsc delete` in the way, as in ckptd's handoff
            subprocess.run(rs + ["restore", "--image-path=%s" % img, "-detach", "-bundle", str(mine), nxt],
                           check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            out.append((time.time() - t0) * 1000)
            subprocess.run(rs + ["delete", "-force", cid], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            shutil.rmtree(img, ignore_errors=True)
            cid = nxt
    finally:
        subprocess.run(rs + ["delete", "-force", cid], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return out


def bench_host(ckptd, runs):
    work = pathlib.Path(tempfile.mkdtemp(prefix="ckptd-bench-host-", dir="/tmp"))
    etcd, url = start_etcd(work)
    res = {}
    try:
        for backend in ("volume", "etcd"):
            times, raw = handoffs(ckptd, work, backend, runs, url)
            res[backend] = {"handoff": statistics.median(times), "handoff_max": max(times),
                            "raw": statistics.median(raw), "n": len(times)}
    finally:
        etcd.terminate()
        etcd.wait(10)
        shutil.rmtree(work, ignore_errors=True)
    return res


def host_table(res):
    lines = ["Host mode handoff (two instances on this machine, a ~1 MB Python list in the sandbox): "
             "attach -> SANDBOX_RUNNING on the other instance, medians in ms; raw = `runsc checkpoint` + "
             "`runsc restore` of the same sandbox in the same run.", "",
             "| locks | handoff (max) | raw runsc | overhead (target) | runs |", "| --- | --- | --- | --- | --- |"]
    for b, r in res.items():
        over = r["handoff"] - r["raw"]
        lines.append(f"| {b} | {r['handoff']:.0f} ({r['handoff_max']:.0f}) | {r['raw']:.0f} | "
                     f"{over:.0f} (target ≤ {TARGETS_MS[b]}) {'ok' if over <= TARGETS_MS[b] else 'MISSED'} "
                     f"| {r['n']} |")
    return "\n".join(lines) + "\n"
