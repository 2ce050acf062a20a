"""The systemd rig: boot a real systemd in systemd-nspawn from the cached
Debian rootfs (tests/rig/rootfs.sh), with ckptd installed by `make install`,
and run commands inside it.

    with Rig(ckptd_config={...}) as rig:
        rig.sh("systemctl", "start", "ckptd.service")

The container shares the host network, so a ckptd inside that listens on
127.0.0.1:PORT answers the host's tests directly. Its rootfs is an overlay
whose lower layer is the cached rootfs; /srv and /var/lib/ckptd are bind
mounts of host directories, because overlayfs (ckptd's backend) refuses an
overlayfs upper dir.
"""
import json
import os
import pathlib
import re
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
TOP = HERE.parents[1]
IN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class RigError(RuntimeError):
    pass


# What ASan and UBSan print (LSan is off in the rig: see _install_sanitizer_runtime).
SANITIZER_REPORT = re.compile(r"ERROR: AddressSanitizer|AddressSanitizer:DEADLYSIGNAL|ERROR: LeakSanitizer"
                              r"|: runtime error: |SUMMARY: UndefinedBehaviorSanitizer")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def build_rootfs():
    """The cached rootfs, built on first use (about a minute, then instant)."""
    out = subprocess.run([str(HERE / "rootfs.sh"), "--path"], check=True, capture_output=True, text=True)
    return pathlib.Path(out.stdout.strip().splitlines()[-1])


def cgroup_roots():
    """Writable cgroup hierarchies nspawn places the container under.

    PID 1 here may not be systemd, so nspawn would put its payload cgroup at
    the hierarchy's top, shared by every rig booted at once: each rig gets a
    cgroup of its own in each hierarchy instead."""
    found = []
    for d in ("/sys/fs/cgroup/systemd", "/sys/fs/cgroup/unified", "/sys/fs/cgroup"):
        if os.path.exists(os.path.join(d, "cgroup.procs")) and os.access(d, os.W_OK):
            found.append(d)
    return found


def rmdir_tree(path, timeout=5):
    """Remove a cgroup directory tree (only rmdir works there), deepest first;
    killed processes leave their cgroup a moment after they are reaped."""
    deadline = time.monotonic() + timeout
    while os.path.exists(path):
        for dirpath, _dirs, _files in sorted(os.walk(path), key=lambda t: -t[0].count("/")):
            try:
                os.rmdir(dirpath)
            except OSError:
                pass
        if time.monotonic() > deadline:
            return
        if os.path.exists(path):
            time.sleep(0.05)


class Rig:
    def __init__(self, ckptd_config=None, units=None, files=None, build=None, boot_timeout=60, unified=True):
        """units: {name or drop-in path under /etc/systemd/system: text};
        files: {absolute path in the container: text}, written before boot;
        unified: cgroup v2 inside (False: the legacy v1 hierarchies)."""
        self.unified = unified
        self.name = "ckptd-rig-" + secrets.token_hex(4)
        self.ckptd_config = ckptd_config or {}
        self.units = units or {}
        self.files = files or {}
        self.build = build or os.environ.get("BUILD", "build")
        self.boot_timeout = boot_timeout
        self.dir = None
        self.proc = None
        self.pid = None
        self.cgroups = []
        self.stop_timeout = 30  # seconds for an orderly poweroff, then SIGKILL

    # -- setup ---------------------------------------------------------------
    def __enter__(self):
        try:
            self.start()
        except BaseException:
            self._teardown()  # the boot's error is the one to see
            raise
        return self

    def __exit__(self, *exc):
        self.close()

    def start(self):
        lower = build_rootfs()
        self.dir = pathlib.Path(tempfile.mkdtemp(prefix="ckptd-rig."))
        for sub in ("upper", "work", "root", "srv", "state"):
            (self.dir / sub).mkdir()
        subprocess.run(["mount", "-t", "overlay", "overlay", "-o",
                        f"lowerdir={lower},upperdir={self.dir}/upper,workdir={self.dir}/work",
                        str(self.root)], check=True)
        self.install()
        self.boot()

    @property
    def root(self):
        return self.dir / "root"

    @property
    def srv(self):
        """The host side of the container's /srv."""
        return self.dir / "srv"

    def install(self):
        subprocess.run(["make", "-s", "-C", str(TOP), "install", f"DESTDIR={self.root}", "PREFIX=/usr",
                        f"BUILD={self.build}"], check=True, stdout=subprocess.DEVNULL)
        san = self._install_sanitizer_runtime()
        etc = self.root / "etc/ckptd"
        etc.mkdir(parents=True, exist_ok=True)
        (etc / "ckptd.json").write_text(json.dumps(self.ckptd_config, indent=2))
        files = {f"/etc/systemd/system/{name}": text for name, text in self.units.items()}
        files.update(self.files)
        files.update(san)
        for name, text in files.items():
            # /srv is a bind mount of a host directory, the rest is the overlay.
            rel = name.lstrip("/")
            path = self.srv / rel[4:] if rel.startswith("srv/") else self.root / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)

    def _install_sanitizer_runtime(self):
        """A ckptd built with SANITIZE= needs libasan/libubsan, which the minimal
        rootfs lacks: copy the host's (same Debian). LSan's scan at exit stops
        the threads with ptrace, which the unit's system call filter refuses:
        it is turned off there (the tests outside the rig keep it)."""
        ckptd = TOP / self.build / "ckptd" if not os.path.isabs(self.build) else pathlib.Path(self.build) / "ckptd"
        out = subprocess.run(["ldd", str(ckptd)], capture_output=True, text=True).stdout
        libs = [ln.split("=>")[1].split()[0] for ln in out.splitlines()
                if "=>" in ln and any(k in ln for k in ("libasan", "libubsan", "liblsan"))]
        for lib in libs:
            # Under usr/: the rootfs's /lib is a symlink to usr/lib.
            dst = self.root / "usr/lib" / pathlib.Path(lib).parent.name / pathlib.Path(lib).name
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(os.path.realpath(lib), dst)
        if not libs:
            return {}
        return {"/etc/systemd/system/ckptd.service.d/sanitize.conf": (
            "[Service]\n"
            "Environment=ASAN_OPTIONS=detect_leaks=0\n"
            "Environment=UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1\n")}

    def _enter_cgroups(self):
        # Runs in the child between fork and exec: only plain file writes.
        for d in self.cgroups:
            with open(os.path.join(d, "cgroup.procs"), "w") as f:
                f.write("0")

    def boot(self):
        for top in cgroup_roots():
            d = os.path.join(top, self.name)
            os.makedirs(d, exist_ok=True)
            self.cgroups.append(d)
        env = dict(os.environ)
        # A unified cgroup hierarchy inside gives systemd the cgroup v2
        # freezer (FreezeUnit) even on a host with hybrid v1 mounts.
        env["SYSTEMD_NSPAWN_UNIFIED_HIERARCHY"] = "1" if self.unified else "0"
        argv = ["systemd-nspawn", "-D", str(self.root), "-b", "--register=no", "--keep-unit",
                f"--machine={self.name}", "--console=read-only",
                f"--bind={self.srv}:/srv", f"--bind={self.dir}/state:/var/lib/ckptd"]
        self.log = open(self.dir / "nspawn.log", "wb")
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT,
                                     env=env, preexec_fn=self._enter_cgroups)
        deadline = time.monotonic() + self.boot_timeout
        self.pid = self._find_init(deadline)
        self._wait_running(deadline)

    def _find_init(self, deadline):
        """The container's systemd: nspawn's child, not nspawn (which stays in
        the host's namespaces)."""
        children = f"/proc/{self.proc.pid}/task/{self.proc.pid}/children"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RigError(f"systemd-nspawn exited with {self.proc.returncode}:\n{self.boot_log()}")
            try:
                for pid in open(children).read().split():
                    if open(f"/proc/{pid}/comm").read().strip() == "systemd":
                        return int(pid)
            except OSError:
                pass
            time.sleep(0.05)
        raise RigError(f"no systemd in the container after {self.boot_timeout}s:\n{self.boot_log()}")

    def _wait_running(self, deadline):
        """Until the manager answers, then `is-system-running --wait`, which
        blocks until boot is done."""
        state = ""
        while time.monotonic() < deadline:
            left = max(1, deadline - time.monotonic())
            r = self.sh("systemctl", "is-system-running", "--wait", check=False, timeout=left)
            state = r.stdout.strip()
            if state in ("running", "degraded"):
                return state
            # "offline": systemctl could not reach the manager yet.
            if state in ("maintenance", "stopping") or self.proc.poll() is not None:
                break
            time.sleep(0.1)
        failed = self.sh("systemctl", "--failed", "--no-legend", check=False).stdout
        raise RigError(f"container not running (state {state!r}); failed units:\n{failed}\n{self.boot_log()}")

    def boot_log(self):
        try:
            return (self.dir / "nspawn.log").read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    # -- use -----------------------------------------------------------------
    def sh(self, *argv, check=True, timeout=60, input=None):
        """Run argv inside the container (all its namespaces)."""
        cmd = ["nsenter", "-t", str(self.pid), "-a", "--"] + list(argv)
        env = {"PATH": IN_PATH, "LANG": "C.UTF-8", "SYSTEMD_PAGER": "", "SYSTEMD_COLORS": "0"}
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, input=input)
        if check and r.returncode != 0:
            raise RigError(f"{argv} exited {r.returncode}:\nstdout: {r.stdout}\nstderr: {r.stderr}")
        return r

    def systemctl(self, *args, check=True, timeout=60):
        return self.sh("systemctl", *args, check=check, timeout=timeout)

    def show(self, unit, *props):
        """Unit properties as a dict."""
        out = self.systemctl("show", unit, "-p", ",".join(props)).stdout
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def journal(self, unit, lines=200):
        return self.sh("journalctl", "--no-pager", "-u", unit, "-n", str(lines), check=False).stdout

    # -- teardown ------------------------------------------------------------
    def sanitizer_reports(self):
        """ckptd stopped (what it reports at exit is logged then), and the
        lines of its journal where a sanitizer reported."""
        self.sh("systemctl", "stop", "ckptd.socket", "ckptd.service", check=False, timeout=120)
        text = self.sh("journalctl", "--no-pager", "-o", "cat", "-u", "ckptd.service", check=False).stdout
        return [ln for ln in text.splitlines() if SANITIZER_REPORT.search(ln)]

    def close(self):
        """Power off and remove the rig; a sanitizer report in ckptd's journal
        then fails the tests that used it (after everything is removed)."""
        found = []
        if self.proc and self.proc.poll() is None and self.pid:
            try:
                found = self.sanitizer_reports()
            except (RigError, subprocess.SubprocessError) as e:
                found = [f"cannot read ckptd's journal: {e}"]
        self._teardown()
        if found:
            raise RigError("sanitizer report in ckptd's journal:\n" + "\n".join(found[:40]))

    def _teardown(self):
        if self.proc and self.proc.poll() is None:
            # nspawn turns SIGTERM into an orderly poweroff of the container.
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=self.stop_timeout)
            except subprocess.TimeoutExpired:
                # Killing nspawn alone would orphan the container: kill its
                # init, which takes every process of its pid namespace along.
                if self.pid:
                    try:
                        os.kill(self.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                self.proc.kill()
                self.proc.wait()
        if self.proc:
            self.log.close()
        for d in self.cgroups:
            rmdir_tree(d)
        if self.dir:
            subprocess.run(["umount", "-R", "-l", str(self.root)], stderr=subprocess.DEVNULL)
            shutil.rmtree(self.dir, ignore_errors=True)
        self.proc = None
        self.dir = None


def main():
    """Boot a rig with ckptd installed and wait: for looking around by hand."""
    import argparse
    p = argparse.ArgumentParser(description=main.__doc__)
    p.add_argument("--port", type=int, default=0, help="ckptd's TCP port on loopback (default: a free one)")
    p.add_argument("--v1", action="store_true", help="legacy cgroup v1 hierarchies inside")
    a = p.parse_args()
    a.port = a.port or free_port()
    cfg = {"listen": [f"127.0.0.1:{a.port}"], "roots": ["/srv/app"], "backend": "overlay", "services": "auto"}
    with Rig(ckptd_config=cfg, files={"/srv/app/README": "managed by ckptd\n"}, unified=not a.v1) as r:
        if r.systemctl("start", "ckptd.socket", "ckptd.service", check=False).returncode:
            print(r.journal("ckptd.service", 30))
        print(f"rig {r.name} is up; ckptd on http://127.0.0.1:{a.port}\n"
              f"  a shell inside: nsenter -t {r.pid} -a /bin/bash\n"
              "press Enter to power it off", flush=True)
        try:
            input()
        except EOFError:
            pass


if __name__ == "__main__":
    main()
