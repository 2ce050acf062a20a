#!/usr/bin/python3
"""The environment case of `make bench` (run.py --cases env): ckptd where it
runs, each sandbox reproduced here, with the backend `auto` picks there:
the host, gVisor (`runsc --network=none do`, state dir on a tmpfs of the
sandbox), a user namespace (`unshare -Urm` as nobody) and root without
CAP_SYS_ADMIN (`capsh --drop=cap_sys_admin`). run.py calls env_case() and
env_table(); this file, run inside an environment, measures it:

    envbench.py --dir D --files N --mb M --runs R [--tmpfs-state]

- create after 10 changes against a full create (every file changed); each
  create is sent right after its changes (an idle gap would add a VM's
  vCPU wake-up, 2.5-5 ms here, to its wall time);
- restore after 10 changes against `rsync -a --delete` from a pristine copy
  onto a copy with the same 10 changes, here;
- the restore's wall time (overlay's target: 20 ms);
- beside each create after 10 changes, the same create through the Python
  SDK (clients/python), as an agent calls it: a new connection and an
  Idempotency-Key each time, whose answer ckptd makes durable too. No
  target: it shows what a key costs.
Prints one line `RESULT {json}`: medians in ms, the backend and why."""
import argparse
import json
import os
import pathlib
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))


def rsync_figure(work, src, n_files, runs):
    from run import timed, touch_10  # run.py imports this file: not at the top
    pristine, copy = work / "pristine", work / "copy"
    subprocess.run(["cp", "-a", str(src), str(pristine)], check=True)
    subprocess.run(["cp", "-a", str(src), str(copy)], check=True)
    out = []
    for i in range(runs):
        touch_10(copy, n_files, f"r{i}", off=i % 7)
        out.append(timed(["rsync", "-a", "--delete", f"{pristine}/", f"{copy}/"]))
    return statistics.median(out)


def sdk_client(url):
    """clients/python's Client, from this checkout."""
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "clients" / "python"))
    import ckptd
    return ckptd.Client(url)


def fold_figure(d, src, n_files):
    """Overlay: the create after 16 deltas, which folds them into one over
    the full layer (a full layer before 2026-11-29: a link for each file).
    Creates after 10 changes until 16 deltas stand, then that one's wall
    time; None where the root makes no deltas (tar, untracked)."""
    from run import touch_10

    def deltas():
        roots = d.s.get(d.url + "/v1/health", timeout=10).json().get("overlay_roots") or [{}]
        return roots[0].get("deltas", 0)
    k = 0
    while 0 < deltas() < 16 and k < 20:
        touch_10(src, n_files, f"f{k}", off=4 + k % 7)
        d.create(f"to-fold-{k}")
        k += 1
    if deltas() != 16:
        return None
    touch_10(src, n_files, "fold", off=5)
    return d.create("fold")[1]


def daemon_figures(work, src, n_files, runs):
    from run import Daemon, rewrite_all, touch_10
    d = Daemon("auto", src, work / "state")
    try:
        rewrite_all(src, n_files)
        full, full_wall = d.create("full")
        touch_10(src, n_files, "c")
        c10, c10_wall = d.create("ten")
        creates, sdk, restores = [], [], []
        client = sdk_client(d.url)
        for i in range(runs):  # each over the previous one
            touch_10(src, n_files, f"x{i}", off=1 + i % 7)
            # sent right after the changes, with no idle gap: on a VM a gap
            # adds 2.5-5 ms of wall for the vCPU to wake (docs/overlay-create.md,
            # "Measured")
            creates.append(d.create(f"ten-{i}")[1])
            # the same through the Python SDK, as an agent calls it: a new
            # connection and an Idempotency-Key each time (whose answer ckptd
            # makes durable too); no target, shown beside
            touch_10(src, n_files, f"s{i}", off=3 + i % 7)
            t0 = time.perf_counter()
            client.checkpoint.create(f"sdk-{i}")
            sdk.append((time.perf_counter() - t0) * 1000)
        fold = fold_figure(d, src, n_files)
        for i in range(runs):
            touch_10(src, n_files, f"y{i}", off=2 + i % 7)
            restores.append(d.restore(c10["checkpoint_id"])[1])
        h = d.s.get(d.url + "/v1/health", timeout=10).json()  # tracking is armed by now
        return {"backend": h["backend"], "backend_reason": h["backend_reason"], "overlay": h.get("overlay"),
                "root_details": h.get("root_details"),
                "create_full": full_wall, "create10_first": c10_wall, "create10": statistics.median(creates),
                "create10_sdk": statistics.median(sdk), "restore10": statistics.median(restores),
                "create10_fold": fold}
    finally:
        d.stop()


NOBODY = 65534
ENVS = ["host", "gvisor", "userns", "nocap"]
TARGETS = {"restore_ratio": 0.25, "create_ratio": 0.10, "overlay_restore_ms": 20}


def wrap(env, argv):
    if env == "gvisor":
        return ["runsc", "--network=none", "do"] + argv + ["--tmpfs-state"]
    if env == "userns":
        return ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "unshare", "-Urm"] + argv
    if env == "nocap":
        return ["capsh", "--drop=cap_sys_admin", "--", "-c", shlex.join(argv)]
    return argv


def env_case(n_files, total, runs, log):
    """{env: figures or {"error"}} at one size."""
    out = {}
    for env in ENVS:
        work = tempfile.mkdtemp(prefix=f"ckptd-bench-env-{env}-", dir="/tmp")
        os.chown(work, NOBODY, NOBODY)
        argv = [sys.executable, str(pathlib.Path(__file__).resolve()), "--dir", f"{work}/w", "--files",
                str(n_files), "--mb", str(total >> 20), "--runs", str(runs)]
        log(f"[env] {env}: {n_files} files / {total >> 20} MB")
        try:
            p = subprocess.run(wrap(env, argv), capture_output=True, text=True, timeout=7200)
            res = [line for line in p.stdout.splitlines() if line.startswith("RESULT ")]
            out[env] = json.loads(res[-1][7:]) if res else {"error": (p.stderr or p.stdout)[-300:]}
        finally:
            subprocess.run(["bash", "-c", f"awk '$5 ~ \"^{work}/\" {{print $5}}' /proc/self/mountinfo | tac | "
                            "xargs -r -n1 umount -l"], check=False)
            shutil.rmtree(work, ignore_errors=True)
    return out


def _tracking(r):
    return (r.get("root_details") or [{}])[0]


def _why_create(r):
    """Why a create misses its target: how health says changes are tracked."""
    t = _tracking(r)
    if t.get("tracking") in (None, "none"):
        return "no change tracking here (%s): the create walks every file" % t.get("tracking_reason", "?")
    # profiled (nocap, 10k files): the /proc scan of every process, the
    # parent's manifest and the new one (a line per file), and the syncs
    return ("tracked with %s, yet the create scans /proc, reads and writes a manifest line per file "
            "and syncs its files" % t["tracking"])


def _why_restore(r):
    if r["backend"] == "tar":
        # profiled (nocap, 10k files, tracked): no walk of the tree; the
        # /proc scan, the changed directories read whole, decompressing the
        # frames that hold the changed files, and the syncs
        return ("tar (no overlay here): a fixed part (the /proc scan of every process, the changed "
                "directories read whole, the syncs) against rsync's 10 files")
    return "the overlay swap itself"


def _verdict(value, target, fmt, reason):
    ok = value <= target
    return f"{fmt(value)} ({'met' if ok else 'missed: ' + reason})"


def env_table(results):
    """results: {size label: {env: figures}} -> markdown."""
    lines = ["Where ckptd runs: the backend `auto` picks in each environment, medians of wall times in ms.",
             "Targets: restore after 10 changes ≤ 0.25x `rsync -a --delete` from a pristine copy there; create",
             "after 10 changes ≤ 10 % of a full create (every file changed); an overlay restore ≤ 20 ms.", "",
             "| size | environment | backend, tracking | restore after 10 changes / rsync / ratio | "
             "create after 10 changes / full create / ratio | the same create by the Python SDK | "
             "the create after 16 deltas (overlay: a fold) | overlay restore |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    why = {}  # each environment's backend_reason, below the table
    for size, envs in results.items():
        for env, r in envs.items():
            if "error" in r:
                lines.append(f"| {size} | {env} | - | failed: {r['error'].strip().splitlines()[-1][:150]} | | | | |")
                continue
            kind = f" ({r['overlay']['kind']})" if r.get("overlay") else ""
            kind += f", {_tracking(r)['tracking']}" if _tracking(r).get("tracking") else ""
            rr = r["restore10"] / r["rsync"]
            cr = r["create10"] / r["create_full"]
            restore = (f"{r['restore10']:.1f} / {r['rsync']:.0f} / "
                       + _verdict(rr, TARGETS["restore_ratio"], lambda x: f"{x:.2f}x", _why_restore(r)))
            create = (f"{r['create10']:.1f} / {r['create_full']:.0f} / "
                      + _verdict(cr, TARGETS["create_ratio"], lambda x: f"{100 * x:.1f} %", _why_create(r)))
            ovl = (_verdict(r["restore10"], TARGETS["overlay_restore_ms"], lambda x: f"{x:.1f}",
                            _why_restore(r)) if r["backend"] == "overlay" else "- (no overlay: tar)")
            sdk = f"{r['create10_sdk']:.1f} (a new connection and an Idempotency-Key each)" if "create10_sdk" in r else "-"
            fold = f"{r['create10_fold']:.1f}" if r.get("create10_fold") is not None else "- (no deltas here)"
            lines.append(f"| {size} | {env} | {r['backend']}{kind} | {restore} | {create} | {sdk} | {fold} | {ovl} |")
            why[env] = r["backend_reason"]
    lines += [""] + [f"- {env}: {reason}" for env, reason in why.items()]
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--files", type=int, required=True)
    ap.add_argument("--mb", type=int, required=True)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--tmpfs-state", action="store_true")
    a = ap.parse_args()
    work = pathlib.Path(a.dir)
    (work / "state").mkdir(parents=True, exist_ok=True)
    if a.tmpfs_state:  # gVisor's overlay makes whiteouts there: a tmpfs of the sandbox
        subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(work / "state")], check=True)
    from run import make_tree
    src = work / "tree"
    make_tree(src, a.files, a.mb << 20)
    res = {"rsync": rsync_figure(work, src, a.files, a.runs)}
    subprocess.run(["rm", "-rf", str(work / "pristine"), str(work / "copy")])
    res.update(daemon_figures(work, src, a.files, a.runs))
    print("RESULT " + json.dumps(res), flush=True)


if __name__ == "__main__":
    main()
