"""Write the seed corpus of fuzz_import (tests/fuzz/corpus/import): real
exports of small checkpoints taken by ckptd on the tar and overlay backends,
each as exported (pax + zstd) and decompressed (plain pax, which import also
reads and which lets the fuzzer's mutations reach the entries).
    /usr/bin/python3 tests/fuzz/import_seeds.py   (as root, after make; needs zstd)"""
import os
import pathlib
import subprocess
import sys
import tempfile

TOP = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(TOP / "tests/integration"))
from conftest import Daemon, unmount_all  # noqa: E402

OUT = TOP / "tests/fuzz/corpus/import"


def fill(root):
    (root / "a.txt").write_text("hello\n")
    (root / "empty").write_bytes(b"")
    (root / "sub/deeper").mkdir(parents=True)
    (root / "sub/deeper/data.bin").write_bytes(bytes(range(256)) * 4)
    os.symlink("../a.txt", root / "sub/rel-link")
    os.symlink("/etc/hostname", root / "abs-link")
    os.link(root / "a.txt", root / "sub/hard")
    os.mkfifo(root / "fifo")
    os.chmod(root / "sub/deeper/data.bin", 0o640)
    os.setxattr(root / "a.txt", "user.note", b"kept")


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir="/dev/shm") as tmp:
        for backend in ("tar", "overlay"):
            d = Daemon(pathlib.Path(tmp) / backend, backend=backend)
            try:
                fill(d.roots[0])
                d.start()
                cp = d.create("seed")
                r = d.request("GET", f"/v1/checkpoints/{cp['checkpoint_id']}/export")
                assert r.status_code == 200, r.text
                (OUT / f"{backend}.tar.zst").write_bytes(r.content)
                raw = subprocess.run(["zstd", "-dc"], input=r.content, capture_output=True, check=True).stdout
                (OUT / f"{backend}.tar").write_bytes(raw)
            finally:
                d.cleanup()
                unmount_all(d.base)
    for p in sorted(OUT.iterdir()):
        print(p, p.stat().st_size)


if __name__ == "__main__":
    main()
