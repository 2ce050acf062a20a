"""A flaky job for retry_loop.py: it changes the workspace (the current
directory) and fails until its attempt number passes FLAKY_FAILURES (default 2).

Each attempt writes junk/attempt-<n>.bin and appends to notes.txt; a failing
attempt also deletes data.txt (the file the README asks you to create), so a
restore between attempts has real work to undo. The attempt that succeeds
leaves data.txt alone: nothing of yours is lost at the end. The attempt
counter lives in FLAKY_COUNTER, a file outside the workspace: a restore must
not rewind it.
"""
import os
import sys


def main():
    counter = os.environ["FLAKY_COUNTER"]
    failures = int(os.environ.get("FLAKY_FAILURES", "2"))
    with open(counter) as f:
        attempt = int(f.read().strip() or 0) + 1
    with open(counter, "w") as f:
        f.write("%d\n" % attempt)

    os.makedirs("junk", exist_ok=True)
    with open("junk/attempt-%d.bin" % attempt, "wb") as f:
        f.write(os.urandom(4096))
    with open("notes.txt", "a") as f:
        f.write("attempt %d was here\n" % attempt)
    if attempt <= failures:
        if os.path.exists("data.txt"):
            os.unlink("data.txt")  # the damage a restore must undo
        print("flaky: attempt %d failed (simulated)" % attempt, file=sys.stderr)
        return 1
    with open("result.txt", "w") as f:
        f.write("succeeded on attempt %d\n" % attempt)
    return 0


if __name__ == "__main__":
    sys.exit(main())
