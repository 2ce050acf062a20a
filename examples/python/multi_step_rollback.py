#!/usr/bin/env python3
"""Multi-step rollback: checkpoint before each step of a workflow; when a step
fails, restore the second-to-last checkpoint and stop.

    CKPTD_URL=http://127.0.0.1:7070 python3 multi_step_rollback.py /path/to/workspace

As in the SDK's example, the checkpoint restored on a failure at step k is the
one taken before step k-1: the step before the failure is rolled back too
(when step 1 fails there is no such checkpoint and nothing is restored).

Steps are small Python programs run in the workspace. Step --fail-step
(default 3, or CKPTD_FAIL_STEP; 0 = none) does its work, then damages the
tree and exits 1, as a half-finished step would. Exit status: 0 when every
step succeeded, 1 after a failed step. CKPTD_AFTER_CREATE_HOOK and
CKPTD_AFTER_RESTORE_HOOK work as in retry_loop.py.
"""
import argparse
import os
import subprocess
import sys

from example_util import report_checkpoint, report_restore, workspace_path  # noqa: I001 (sets the path)
from ckptd import Client, CkptdError

WORKFLOW = [
    ("prepare", "import os, json\n"
                "os.makedirs('app', exist_ok=True)\n"
                "json.dump({'stage': 'prepared', 'rows': 3}, open('app/config.json', 'w'))\n"),
    ("fetch", "import os\n"
              "os.makedirs('app/data', exist_ok=True)\n"
              "open('app/data/input.csv', 'w').write('id,value\\n1,10\\n2,20\\n3,30\\n')\n"),
    ("build", "import os, json\n"
              "rows = open('app/data/input.csv').read().splitlines()[1:]\n"
              "os.makedirs('app/build', exist_ok=True)\n"
              "open('app/build/total.txt', 'w').write(str(sum(int(r.split(',')[1]) for r in rows)))\n"
              "json.dump({'stage': 'built', 'rows': len(rows)}, open('app/config.json', 'w'))\n"),
    ("test", "total = int(open('app/build/total.txt').read())\n"
             "open('app/report.txt', 'w').write('total %d: %s\\n' % (total, 'pass' if total == 60 else 'FAIL'))\n"),
]

# Appended to the failing step: half-done work, then failure.
SABOTAGE = ("import os, shutil, sys\n"
            "open('app/partial.tmp', 'w').write('half written')\n"
            "shutil.rmtree('app/data', ignore_errors=True)\n"
            "os.unlink('app/config.json')\n"
            "sys.exit('step failed (simulated)')\n")


def run_workflow(sandbox, workspace, fail_step):
    checkpoints = []
    failed = False
    try:
        for k, (name, code) in enumerate(WORKFLOW, start=1):
            cp = sandbox.checkpoint.create("before-" + name)
            report_checkpoint(cp)
            checkpoints.append(cp["checkpoint_id"])
            if k == fail_step:
                code += SABOTAGE
            rc = subprocess.run([sys.executable, "-c", code], cwd=workspace).returncode
            if rc == 0:
                print("STEP %d %s ok" % (k, name), flush=True)
                continue
            print("STEP %d %s failed exit=%d" % (k, name, rc), flush=True)
            failed = True
            if len(checkpoints) >= 2:
                report_restore(sandbox.checkpoint.restore(checkpoints[-2]))
            else:
                print("NO-RESTORE no checkpoint before the previous step", flush=True)
            break
    finally:
        for cid in checkpoints:
            sandbox.checkpoint.delete(cid)
    print("GAVE UP" if failed else "DONE ok", flush=True)
    return not failed


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("workspace", nargs="?", help="directory managed by ckptd (default $CKPTD_WORKSPACE)")
    ap.add_argument("--fail-step", type=int, default=int(os.environ.get("CKPTD_FAIL_STEP", "3")),
                    help="1-based step that fails (0: none; default 3)")
    args = ap.parse_args()
    workspace = workspace_path(args.workspace)
    try:
        return 0 if run_workflow(Client(), workspace, args.fail_step) else 1
    except CkptdError as e:
        print("ckptd error: %s" % e, file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
