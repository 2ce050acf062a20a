#!/usr/bin/env python3
"""Retry loop: checkpoint once, then up to 3 attempts of a flaky job,
restoring the workspace to the checkpoint between failed attempts.

    CKPTD_URL=http://127.0.0.1:7070 python3 retry_loop.py /path/to/workspace

The SDK version of this loop:

    cp = sandbox.checkpoint.create({name: 'before-attempt'})
    for attempt in 0..2: run job; if ok break; if attempt < 2 restore(cp)

Environment: CKPTD_URL / CKPTD_SOCKET / CKPTD_TOKEN (the client),
CKPTD_WORKSPACE (if no argument), CKPTD_ATTEMPT_FILE (the job's attempt
counter; a fresh temp file if unset), FLAKY_FAILURES (how many attempts fail,
default 2), CKPTD_AFTER_CREATE_HOOK / CKPTD_AFTER_RESTORE_HOOK (see
example_util.py). Exit status 0 when an attempt succeeded, 1 when all failed.
"""
import argparse
import os
import subprocess
import sys
import tempfile

from example_util import report_checkpoint, report_restore, workspace_path  # noqa: I001 (sets the path)
from ckptd import Client, CkptdError

ATTEMPTS = 3
FLAKY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "flaky_script.py")


def attempt_file(workspace):
    path = os.environ.get("CKPTD_ATTEMPT_FILE")
    if not path:
        fd, path = tempfile.mkstemp(prefix="ckptd-attempts-")
        os.close(fd)
    path = os.path.realpath(path)
    if path.startswith(os.path.realpath(workspace) + os.sep):
        sys.exit("the attempt counter must live outside the workspace, or a restore rewinds it")
    with open(path, "w") as f:
        f.write("0\n")
    return path


def retry(sandbox, workspace, counter):
    cp = sandbox.checkpoint.create("before-attempt")
    report_checkpoint(cp)
    env = dict(os.environ, FLAKY_COUNTER=counter)
    ok = False
    try:
        for attempt in range(ATTEMPTS):
            rc = subprocess.run([sys.executable, FLAKY], cwd=workspace, env=env).returncode
            ok = rc == 0
            print("ATTEMPT %d %s" % (attempt + 1, "ok" if ok else "failed exit=%d" % rc), flush=True)
            if ok:
                break
            if attempt < ATTEMPTS - 1:
                # Back to the same starting point before trying again.
                report_restore(sandbox.checkpoint.restore(cp["checkpoint_id"]))
    finally:
        sandbox.checkpoint.delete(cp["checkpoint_id"])
    print("DONE ok" if ok else "GAVE UP after %d attempts" % ATTEMPTS, flush=True)
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("workspace", nargs="?", help="directory managed by ckptd (default $CKPTD_WORKSPACE)")
    args = ap.parse_args()
    workspace = workspace_path(args.workspace)
    counter = attempt_file(workspace)
    try:
        return 0 if retry(Client(), workspace, counter) else 1
    except CkptdError as e:
        print("ckptd error: %s" % e, file=sys.stderr)
        return 2
    finally:
        if not os.environ.get("CKPTD_ATTEMPT_FILE"):
            os.unlink(counter)


if __name__ == "__main__":
    sys.exit(main())
