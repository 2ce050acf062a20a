"""What retry_loop.py and multi_step_rollback.py share: where the workspace is,
how a checkpoint or a restore is reported, and the optional hooks.

Output lines start with a fixed word so that scripts (and the tests) can read
them; the same lines come out of the TypeScript and shell examples:

    CHECKPOINT <id> name=<name> duration_ms=<n> size_bytes=<n>
    RESTORED <id> duration_ms=<n> ok=<true|false> stopped=[..] started=[..] failed=[..]
"""
import os
import subprocess
import sys

try:
    import ckptd  # noqa: F401  the package, once `pip install ./clients/python`
except ImportError:  # run from the checkout without installing it
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "clients", "python"))


def workspace_path(arg):
    """The managed root the example works in: the argument, else CKPTD_WORKSPACE."""
    path = arg or os.environ.get("CKPTD_WORKSPACE")
    if not path:
        sys.exit("usage: give the workspace (a directory ckptd manages) as an argument or in CKPTD_WORKSPACE")
    if not os.path.isdir(path):
        sys.exit("workspace %r is not a directory" % path)
    return os.path.abspath(path)


def _names(values):
    return "[" + ",".join(values or []) + "]"


def report_checkpoint(cp):
    print("CHECKPOINT %s name=%s duration_ms=%s size_bytes=%s"
          % (cp["checkpoint_id"], cp["name"], cp.get("duration_ms"), cp.get("size_bytes")), flush=True)
    run_hook("CKPTD_AFTER_CREATE_HOOK", cp["checkpoint_id"])


def report_restore(result):
    print("RESTORED %s duration_ms=%s ok=%s stopped=%s started=%s failed=%s" % (
        result["checkpoint_id"], result["restore_duration_ms"], str(result["ok"]).lower(),
        _names(result.get("stopped_services")), _names(result.get("started_services")),
        _names(result.get("failed_services"))), flush=True)
    run_hook("CKPTD_AFTER_RESTORE_HOOK", result["checkpoint_id"])


def run_hook(var, checkpoint_id):
    """Run the executable named by $var with the checkpoint id, if set: a way to
    look at the workspace at the moment a checkpoint is taken or restored."""
    hook = os.environ.get(var)
    if hook:
        subprocess.run([hook, checkpoint_id], check=True)
