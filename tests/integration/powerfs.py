"""A FUSE file system that loses what was not synced at a power cut
(Debian's python3-fusepy), to test what ckptd promises after power loss.

    powerfs.py BACKING MOUNTPOINT [--stats FILE]

It mirrors BACKING, as a disk's page cache would: every write is seen at
once. Beside it, it keeps what the disk holds, the durable state, in memory
(file contents in a blob dir beside BACKING):

- fsync (or fdatasync) of a file makes its data and its metadata (mode,
  owner, times) durable: not its name;
- fsync of a directory makes its entries durable (each names an inode; a
  file whose data never was synced comes back empty, a directory never
  synced comes back empty); a create, rename, link or unlink not followed
  by an fsync of each directory it changed is lost;
- what BACKING held at mount is durable.

mkdir(MOUNTPOINT/.powerfs-cut) is the power cut: BACKING is rebuilt from the
durable state, dropping every unsynced change, and the counts of what was
lost are added to --stats (JSON). Cut only once nothing uses the file system
(kill its users first). syncfs(2) never reaches a FUSE daemon: it is not
modelled (ckptd's tar backend syncs its state dir by fsync only).
Runs in the foreground until unmounted."""
import argparse
import errno
import json
import os
import shutil
import stat
import threading
import time

import fusepy
from fusefs import PassThrough

CUT = "/.powerfs-cut"


class Node:
    """One inode as the disk holds it."""

    def __init__(self, st, blob=None, target=None):
        self.kind = stat.S_IFMT(st.st_mode)
        self.mode, self.uid, self.gid = stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid
        self.times = (st.st_atime_ns, st.st_mtime_ns)
        self.blob, self.target = blob, target


class PowerFS(PassThrough):
    def __init__(self, root, stats_file):
        super().__init__(root, no_link=False, no_rename_over=False, freeze_file=None)
        self.blobs = root.rstrip("/") + ".blobs"
        self.stats_file = stats_file
        self.mutex = threading.RLock()
        self.stats = {"cuts": 0, "fsyncs": 0, "dir_fsyncs": 0, "lost_entries": 0, "reverted_files": 0,
                      "emptied_files": 0, "came_back": 0}
        self.gen = 0
        # Inodes are named by an id of ours: the backing file system reuses
        # the number of an unlinked inode, which the disk may still hold.
        self.ids = {}  # backing st_ino -> id
        self.nodes = {}  # id -> Node (data and metadata made durable)
        self.dirs = {}  # dir id -> {name: (id, Node of the entry: kind, mode, owner; no data)}
        self.durable_all()

    # ---- the durable state ----
    def new_id(self, p):
        """An inode was made at p: a new id, whatever number it reuses."""
        self.gen += 1
        self.ids[os.lstat(p).st_ino] = self.gen

    def id_of(self, st):
        if st.st_ino not in self.ids:
            self.gen += 1
            self.ids[st.st_ino] = self.gen
        return self.ids[st.st_ino]

    def node_now(self, p, fd=None):
        """Make the inode at p (or open as fd) durable: its data and metadata."""
        st = os.lstat(p) if fd is None else os.fstat(fd)
        blob = target = None
        if stat.S_ISREG(st.st_mode):
            self.gen += 1
            blob = os.path.join(self.blobs, f"{self.gen}")
            if fd is None:
                shutil.copyfile(p, blob)
            else:
                with open(blob, "wb") as out:
                    off = 0
                    while chunk := os.pread(fd, 1 << 20, off):
                        out.write(chunk)
                        off += len(chunk)
            old = self.nodes.get(self.id_of(st))
            if old and old.blob:
                os.unlink(old.blob)
        elif stat.S_ISLNK(st.st_mode):
            target = os.readlink(p)
        self.nodes[self.id_of(st)] = Node(st, blob, target)

    def entries_now(self, p):
        """Make the entries of directory p durable (not the data they name)."""
        ents = {}
        for name in os.listdir(p):
            st = os.lstat(os.path.join(p, name))
            target = os.readlink(os.path.join(p, name)) if stat.S_ISLNK(st.st_mode) else None
            ents[name] = (self.id_of(st), Node(st, target=target))
        self.dirs[self.id_of(os.lstat(p))] = ents

    def durable_all(self):
        shutil.rmtree(self.blobs, ignore_errors=True)
        os.makedirs(self.blobs)
        self.nodes, self.dirs, self.ids = {}, {}, {}
        for top, dirs, files in os.walk(self.root):
            self.node_now(top)
            self.entries_now(top)
            for n in files:
                self.node_now(os.path.join(top, n))

    def tree(self):
        out = {}
        for top, dirs, files in os.walk(self.root):
            for n in dirs + files:
                p = os.path.join(top, n)
                st = os.lstat(p)
                out[os.path.relpath(p, self.root)] = (stat.S_IFMT(st.st_mode), st.st_size)
        return out

    def rebuild(self, path, dino, made):
        for name, (ino, ent) in sorted(self.dirs.get(dino, {}).items()):
            p = os.path.join(path, name)
            node = self.nodes.get(ino, ent)  # an entry whose inode was never synced: empty
            if ino in made and ent.kind != stat.S_IFDIR:
                os.link(made[ino], p)
                continue
            made[ino] = p
            if ent.kind == stat.S_IFDIR:
                os.mkdir(p)
                self.rebuild(p, ino, made)
            elif ent.kind == stat.S_IFLNK:
                os.symlink(ent.target, p)
                continue
            elif ent.kind == stat.S_IFREG:
                if node.blob:
                    shutil.copyfile(node.blob, p)
                else:
                    open(p, "wb").close()
                    self.stats["emptied_files"] += 1
            else:
                os.mknod(p, ent.kind | node.mode)
            os.chown(p, node.uid, node.gid)
            os.chmod(p, node.mode)
            os.utime(p, ns=node.times)

    def cut(self):
        """Power cut: BACKING becomes what the disk holds."""
        time.sleep(0.1)  # requests the kernel had sent before the kill end first
        with self.mutex:
            before = self.tree()
            rino = self.id_of(os.lstat(self.root))
            for n in os.listdir(self.root):
                p = os.path.join(self.root, n)
                if os.path.isdir(p) and not os.path.islink(p):
                    shutil.rmtree(p)
                else:
                    os.unlink(p)
            self.rebuild(self.root, rino, {})
            after = self.tree()
            self.stats["cuts"] += 1
            self.stats["lost_entries"] += len(set(before) - set(after))
            self.stats["came_back"] += len(set(after) - set(before))
            self.stats["reverted_files"] += sum(1 for k in set(before) & set(after) if before[k] != after[k])
            self.durable_all()  # new inode numbers; everything now is on disk
            self.save_stats()

    def save_stats(self):
        if self.stats_file:
            with open(self.stats_file + ".tmp", "w") as f:
                json.dump(self.stats, f)
            os.rename(self.stats_file + ".tmp", self.stats_file)

    # ---- the operations (one at a time: the cut must see a still tree) ----
    def __call__(self, op, path, *args):
        if op == "mkdir" and path == CUT:
            self.cut()  # takes the lock after a grace for requests in flight
            raise fusepy.FuseOSError(errno.EEXIST)
        with self.mutex:
            return super().__call__(op, path, *args)

    # What the pass-through does not: new inodes get an id, creates can be read
    def create(self, path, mode, fi=None):
        fd = os.open(self._p(path), os.O_RDWR | os.O_CREAT | os.O_EXCL, mode)
        self.new_id(self._p(path))
        return fd

    def mkdir(self, path, mode):
        super().mkdir(path, mode)
        self.new_id(self._p(path))

    def mknod(self, path, mode, dev):
        os.mknod(self._p(path), mode, dev)
        self.new_id(self._p(path))

    def symlink(self, target, source):
        super().symlink(target, source)
        self.new_id(self._p(target))

    def fsync(self, path, datasync, fh):
        self.stats["fsyncs"] += 1
        self.node_now(None, fd=fh)  # by the handle: its name may be gone

    def fsyncdir(self, path, datasync, fh):
        self.stats["dir_fsyncs"] += 1
        p = self._p(path)
        self.node_now(p)
        self.entries_now(p)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("backing")
    ap.add_argument("mountpoint")
    ap.add_argument("--stats")
    a = ap.parse_args()
    # No kernel caching of names or attributes: after a cut, what the kernel
    # shows must be what the disk kept. direct_io: no page cache either.
    fusepy.FUSE(PowerFS(os.path.abspath(a.backing), a.stats), a.mountpoint, foreground=True, nothreads=False,
                default_permissions=True, entry_timeout=0, attr_timeout=0, negative_timeout=0, direct_io=True)


if __name__ == "__main__":
    main()
