"""A pass-through FUSE file system for host-mode tests (Debian's python3-fusepy):
it mirrors a backing directory and can behave like a troublesome shared volume.

    fusefs.py BACKING MOUNTPOINT [--allow-other] [--no-link] [--no-rename-over] [--freeze-file PATH]
              [--fault-file PATH]

--no-link       link() fails with EPERM, as on a bucket mount
--no-rename-over  rename() onto an existing file fails with EPERM
--freeze-file   while PATH exists every operation blocks (a stalled network
                volume); removing PATH lets them go on
--fault-file    while PATH exists, it holds JSON {"ops": ["write", "fsync", "flush", "read"],
                "match": "substring of the path", "after_bytes": N}: those operations
                on matching paths fail with EIO once N more bytes were written to
                matching paths (a disk going bad); removing PATH heals it
--allow-other   mount with allow_other (other users, such as runsc's sandbox,
                may read the files)
Runs in the foreground until unmounted (fusermount -u / umount)."""
import argparse
import errno
import json
import os
import threading
import time

import fusepy


class PassThrough(fusepy.Operations):
    use_ns = True  # times in nanoseconds both ways: float seconds lose precision
    # futimens() with one time UTIME_OMIT (ckptd's tar restore sets only the
    # mtime) reaches utimens only with this flag; libfuse 2 drops it otherwise
    flag_utime_omit_ok = 1
    def __init__(self, root, no_link, no_rename_over, freeze_file, fault_file=None):
        self.root = root
        self.no_link = no_link
        self.no_rename_over = no_rename_over
        self.freeze_file = freeze_file
        self.fault_file = fault_file
        self.fault_lock = threading.Lock()
        self.fault_spec, self.fault_bytes = None, 0

    def _fault(self, op, path, nbytes=0):
        """Raise EIO when the fault file arms op on path (see --fault-file)."""
        if not self.fault_file:
            return
        try:
            with open(self.fault_file) as f:
                spec = f.read()
        except FileNotFoundError:
            spec = None
        with self.fault_lock:
            if spec != self.fault_spec:  # armed anew: count from zero
                self.fault_spec, self.fault_bytes = spec, 0
            if spec is None:
                return
            rule = json.loads(spec)
            if rule.get("match", "") not in path:
                return
            if op in rule.get("ops", []) and self.fault_bytes >= rule.get("after_bytes", 0):
                raise fusepy.FuseOSError(errno.EIO)
            self.fault_bytes += nbytes

    def __call__(self, op, path, *args):
        while self.freeze_file and os.path.exists(self.freeze_file):
            time.sleep(0.05)
        try:
            return super().__call__(op, path, *args)
        except OSError as e:
            raise fusepy.FuseOSError(e.errno or errno.EIO)

    def _p(self, path):
        return os.path.join(self.root, path.lstrip("/"))

    def access(self, path, mode):
        if not os.access(self._p(path), mode):
            raise fusepy.FuseOSError(errno.EACCES)

    def chmod(self, path, mode):
        os.chmod(self._p(path), mode)

    def chown(self, path, uid, gid):
        os.chown(self._p(path), uid, gid)

    def create(self, path, mode, fi=None):
        return os.open(self._p(path), os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)

    def getattr(self, path, fh=None):
        st = os.lstat(self._p(path))
        out = {k: getattr(st, k) for k in ("st_gid", "st_mode", "st_nlink", "st_size", "st_uid")}
        out.update(st_atime=st.st_atime_ns, st_ctime=st.st_ctime_ns, st_mtime=st.st_mtime_ns)
        return out

    def readdir(self, path, fh):
        return [".", ".."] + os.listdir(self._p(path))

    def readlink(self, path):
        return os.readlink(self._p(path))

    def mkdir(self, path, mode):
        os.mkdir(self._p(path), mode)

    def rmdir(self, path):
        os.rmdir(self._p(path))

    def unlink(self, path):
        os.unlink(self._p(path))

    def symlink(self, target, source):
        os.symlink(source, self._p(target))

    def link(self, target, source):
        if self.no_link:
            raise fusepy.FuseOSError(errno.EPERM)
        os.link(self._p(source), self._p(target))

    def rename(self, old, new):
        if self.no_rename_over and os.path.lexists(self._p(new)):
            raise fusepy.FuseOSError(errno.EPERM)
        os.rename(self._p(old), self._p(new))

    def utimens(self, path, times=None):
        if not times:
            return os.utime(self._p(path))
        st, now = os.lstat(self._p(path)), time.time_ns()
        omit, now_ = (1 << 30) - 2, (1 << 30) - 1  # UTIME_OMIT, UTIME_NOW as tv_sec 0
        a, m = [old if t == omit else now if t == now_ else t
                for t, old in zip(times, (st.st_atime_ns, st.st_mtime_ns))]
        os.utime(self._p(path), ns=(a, m))

    def statfs(self, path):
        st = os.statvfs(self._p(path))
        return {k: getattr(st, k) for k in ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail",
                                             "f_ffree", "f_files", "f_flag", "f_frsize", "f_namemax")}

    def open(self, path, flags):
        return os.open(self._p(path), flags & ~os.O_CREAT)

    def read(self, path, size, offset, fh):
        self._fault("read", path)
        return os.pread(fh, size, offset)

    def write(self, path, data, offset, fh):
        self._fault("write", path, len(data))
        return os.pwrite(fh, data, offset)

    def truncate(self, path, length, fh=None):
        os.truncate(self._p(path), length)

    def flush(self, path, fh):
        self._fault("flush", path)
        return 0

    def release(self, path, fh):
        os.close(fh)

    def fsync(self, path, datasync, fh):
        self._fault("fsync", path)
        os.fsync(fh)

    def fsyncdir(self, path, datasync, fh):
        self._fault("fsync", path)
        return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("backing")
    ap.add_argument("mountpoint")
    ap.add_argument("--allow-other", action="store_true")
    ap.add_argument("--no-link", action="store_true")
    ap.add_argument("--no-rename-over", action="store_true")
    ap.add_argument("--freeze-file")
    ap.add_argument("--fault-file")
    a = ap.parse_args()
    opts = {"foreground": True, "nothreads": False, "default_permissions": True}
    if a.allow_other:
        opts["allow_other"] = True
    fusepy.FUSE(PassThrough(os.path.abspath(a.backing), a.no_link, a.no_rename_over, a.freeze_file,
                                  a.fault_file), a.mountpoint, **opts)


if __name__ == "__main__":
    main()
