"""The sample units the rig tests run under ckptd: a web app serving files
from the managed root, a worker appending to a file in it, a unit that
cannot start after a restore, one that ignores SIGTERM, one bound to the web
app, and a bystander outside the root."""
import time

import requests

import rig as rigmod

WEB_PY = """\
import functools, http.server, os, socket, sys
# Keep one file of the root open for the whole life of the process.
held = open("/srv/app/www/index.html", "rb")
handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory="/srv/app/www")
server = http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), handler)
# Type=notify: started means serving, so a restore's report can be trusted.
addr = os.environ["NOTIFY_SOCKET"]
with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
    s.connect("\\0" + addr[1:] if addr[0] == "@" else addr)
    s.send(b"READY=1")
server.serve_forever()
"""

WORKER_PY = """\
import time
log = open("/srv/app/worker.log", "a")
while True:
    log.write("%f\\n" % time.time())
    log.flush()
    time.sleep(0.2)
"""

SLEEPER = "/usr/bin/python3 -c 'import time; time.sleep(1e6)'"


def units(web_port):
    return {
        # Found by the /proc scan: cwd and an open file under the root.
        "web.service": f"""[Unit]
Description=rig web app serving /srv/app/www
[Service]
Type=notify
WorkingDirectory=/srv/app/www
ExecStart=/usr/bin/python3 /usr/local/lib/ckptd-rig/web.py {web_port}
""",
        # Found by the /proc scan: an open file only (cwd is /).
        "worker.service": """[Unit]
Description=rig worker appending to /srv/app/worker.log
[Service]
ExecStart=/usr/bin/python3 /usr/local/lib/ckptd-rig/worker.py
""",
        # Configured; starts only while /srv/app/fragile.ok exists, which the
        # checkpoints it is restored to do not hold.
        "fragile.service": f"""[Unit]
Description=rig unit that cannot start after a restore
[Service]
WorkingDirectory=/srv/app
ExecStartPre=/usr/bin/test -e /srv/app/fragile.ok
ExecStart={SLEEPER}
""",
        # Ignores SIGTERM: a restore's stop times out and ckptd kills it.
        "stubborn.service": """[Unit]
Description=rig unit that ignores SIGTERM
[Service]
WorkingDirectory=/srv/app
ExecStart=/usr/bin/python3 -c 'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(1e6)'
TimeoutStopSec=300
""",
        # Uses nothing under the root, but is bound to web.service: systemd
        # stops it whenever web.service stops.
        "bound.service": f"""[Unit]
Description=rig unit bound to web.service
BindsTo=web.service
After=web.service
[Service]
ExecStart={SLEEPER}
""",
        # Uses nothing under the root: must never be touched.
        "bystander.service": f"""[Unit]
Description=rig unit outside the managed root
[Service]
ExecStart={SLEEPER}
""",
        # A short watchdog, so the test sees ckptd pet it several times.
        "ckptd.service.d/rig.conf": """[Service]
WatchdogSec=2s
""",
    }


def sample_rig(unified=True, service_timeout_secs=10, backend="overlay"):
    """A Rig (not yet booted) with ckptd managing /srv/app; .api and .web are
    the URLs of ckptd and of the web app."""
    api_port, web_port = rigmod.free_port(), rigmod.free_port()
    config = {
        "listen": [f"127.0.0.1:{api_port}"],
        "state_dir": "/var/lib/ckptd",
        "roots": ["/srv/app"],
        "backend": backend,
        "services": ["auto", "fragile.service"],
        "service_timeout_secs": service_timeout_secs,
    }
    files = {
        # The scripts live outside the managed root; the root holds the data.
        "/usr/local/lib/ckptd-rig/web.py": WEB_PY,
        "/usr/local/lib/ckptd-rig/worker.py": WORKER_PY,
        "/srv/app/www/index.html": "v1\n",
    }
    r = rigmod.Rig(ckptd_config=config, units=units(web_port), files=files, unified=unified)
    r.api = f"http://127.0.0.1:{api_port}"
    r.web = f"http://127.0.0.1:{web_port}"
    return r


def api(rig, method, path, **kw):
    kw.setdefault("timeout", 60)
    return requests.request(method, rig.api + path, **kw)


def main_pid(rig, unit):
    return int(rig.show(unit, "MainPID")["MainPID"])


def active(rig, unit):
    return rig.show(unit, "ActiveState")["ActiveState"]


def wait_ignoring_sigterm(rig, unit, timeout=20):
    """Until the unit's main process has set SIGTERM to ignored: right after
    `systemctl start` Python may still be starting, and dies of SIGTERM."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = rig.sh("cat", f"/proc/{main_pid(rig, unit)}/status", check=False).stdout
        ign = [line.split()[1] for line in status.splitlines() if line.startswith("SigIgn:")]
        if ign and int(ign[0], 16) & (1 << (15 - 1)):
            return
        time.sleep(0.05)
    raise AssertionError(f"{unit} never ignored SIGTERM")


def web_get(rig, path):
    return requests.get(rig.web + path, timeout=10)


def write_in(rig, path, text):
    """Write through the container's view, i.e. through ckptd's overlay."""
    rig.sh("tee", path, input=text)
