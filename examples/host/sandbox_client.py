"""A small client for ckptd's host mode (WS /create, WS /attach/{id}).

Uses Debian's python3-websocket (websocket-client). Example:

    from sandbox_client import Sandbox
    sb = Sandbox.create("ws://127.0.0.1:7070", enable_checkpoint=True)
    print(sb.run("python", "x = 41\\nprint(x + 1)").stdout)   # 42
    sb.checkpoint()                       # closes with 1000
    sb2 = Sandbox.attach("ws://other-instance:7070", sb.sandbox_id)
    print(sb2.run("python", "print(x)").stdout)              # 41

Every event the server sent is kept in .events; .close_code holds the code
the server closed with (1000, 4000, 1011, ...).
"""
import json
import struct

import websocket


class SandboxError(Exception):
    """A terminal status (creation, restore, checkpoint errors, NOT_FOUND, IN_USE)."""

    def __init__(self, status, message, close_code):
        super().__init__("%s: %s (close %s)" % (status, message, close_code))
        self.status = status
        self.message = message
        self.close_code = close_code


class Result:
    def __init__(self):
        self.stdout = ""
        self.stderr = ""
        self.exit_code = None
        self.error = None       # status of a rejected execution
        self.message = None
        self.events = []


class Sandbox:
    TERMINAL = {"SANDBOX_NOT_FOUND", "SANDBOX_IN_USE", "SANDBOX_CREATION_ERROR",
                "SANDBOX_RESTORE_ERROR", "SANDBOX_CHECKPOINT_ERROR"}

    def __init__(self, ws):
        self.ws = ws
        self.sandbox_id = None
        self.events = []
        self.close_code = None
        self.statuses = []

    # -- connection ---------------------------------------------------------
    @classmethod
    def _connect(cls, url, timeout, headers):
        ws = websocket.create_connection(url, timeout=timeout, header=headers or [])
        return cls(ws)

    @classmethod
    def create(cls, base_url, idle_timeout=None, enable_checkpoint=False, timeout=60, headers=None):
        sb = cls._connect(base_url.rstrip("/") + "/create", timeout, headers)
        cfg = {"enable_checkpoint": bool(enable_checkpoint)}
        if idle_timeout is not None:
            cfg["idle_timeout"] = idle_timeout
        sb.ws.send(json.dumps(cfg))
        sb.wait_status("SANDBOX_RUNNING")
        return sb

    @classmethod
    def attach(cls, base_url, sandbox_id, timeout=120, headers=None):
        sb = cls._connect(base_url.rstrip("/") + "/attach/" + sandbox_id, timeout, headers)
        sb.sandbox_id = sandbox_id
        sb.wait_status("SANDBOX_RUNNING")
        return sb

    # -- events -------------------------------------------------------------
    def recv_event(self):
        """Next JSON event, or None once the server has closed (close_code set)."""
        while True:
            if self.close_code is not None:
                return None
            try:
                op, frame = self.ws.recv_data_frame(True)
            except websocket.WebSocketConnectionClosedException:
                self.close_code = self.close_code or 1006
                return None
            if op == websocket.ABNF.OPCODE_CLOSE:
                data = frame.data or b""
                self.close_code = struct.unpack(">H", data[:2])[0] if len(data) >= 2 else 1005
                try:
                    self.ws.send_close(self.close_code if self.close_code < 5000 else 1000)
                except Exception:
                    pass
                self.ws.shutdown()
                return None
            if op == websocket.ABNF.OPCODE_TEXT:
                ev = json.loads(frame.data.decode("utf-8"))
                self.events.append(ev)
                if ev.get("event") == "sandbox_id":
                    self.sandbox_id = ev["sandbox_id"]
                if ev.get("event") == "status_update":
                    self.statuses.append(ev["status"])
                return ev

    def _last_error(self):
        for ev in reversed(self.events):
            if ev.get("event") == "error":
                return ev.get("message")
        return None

    def wait_status(self, want):
        """Read events until status `want`; a terminal status raises SandboxError."""
        terminal = None
        while True:
            ev = self.recv_event()
            if ev is None:
                raise SandboxError(terminal or "CLOSED", self._last_error(), self.close_code)
            if ev.get("event") == "status_update":
                if ev["status"] == want:
                    return ev
                if ev["status"] in self.TERMINAL:
                    terminal = ev["status"]

    # -- requests -----------------------------------------------------------
    def send(self, obj):
        self.ws.send(json.dumps(obj))

    def run(self, language, code, on_output=None):
        """Execute code; stream output through on_output(stream, data); return a Result."""
        self.send({"language": language, "code": code})
        return self.collect(on_output)

    def collect(self, on_output=None):
        """Read one execution's events up to SANDBOX_EXECUTION_DONE (or its rejection)."""
        res = Result()
        while True:
            ev = self.recv_event()
            if ev is None:
                res.error = "CLOSED"
                return res
            res.events.append(ev)
            kind = ev.get("event")
            if kind in ("stdout", "stderr"):
                setattr(res, kind, getattr(res, kind) + ev["data"])
                if on_output:
                    on_output(kind, ev["data"])
            elif kind == "error":
                res.message = ev.get("message")
                if res.error:
                    return res
            elif kind == "status_update":
                st = ev["status"]
                if st == "SANDBOX_EXECUTION_DONE":
                    res.exit_code = ev.get("exit_code")
                    return res
                if st == "SANDBOX_EXECUTION_ERROR":
                    res.error = st

    def checkpoint(self):
        """Checkpoint the sandbox: returns on SANDBOX_CHECKPOINTED (the server closes with 1000)."""
        self.send({"action": "checkpoint"})
        self.wait_status("SANDBOX_CHECKPOINTED")
        while self.recv_event() is not None:
            pass
        return self.close_code

    def close(self):
        try:
            self.ws.close()
        except Exception:
            pass
