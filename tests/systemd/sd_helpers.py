"""Helpers of the systemd suite: the unit rendered with build-tree paths, and
a listener for the sd_notify protocol that plays the service manager. (Not a
conftest.py: tests/integration imports its own as "conftest", and the two
suites may run in one pytest session.)

APS_BUILD names the build directory whose binaries are used (default build/),
as in tests/integration.
"""

import os
import pathlib
import re
import shutil
import socket
import struct
import threading
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
BUILD = ROOT / os.environ.get("APS_BUILD", "build")
APSD = BUILD / "server" / "apsd"
WORKER = BUILD / "tests" / "integration" / "itest_worker"
APSCTL = BUILD / "worker" / "apsctl"
UNIT_TEMPLATE = ROOT / "deploy" / "apsd.service.in"
PLACEHOLDER = re.compile(r"@([A-Z_]+)@")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def render_unit(directory, sbindir=None, sysconfdir=None, drop=()):
    """Writes directory/apsd.service from the template as meson does, with
    build-tree paths: ExecStart runs build/server/apsd with deploy/apsd.conf
    copied to directory/etc/apsd/apsd.conf. Lines starting with a key in drop
    ("User=") are left out. Returns the path."""
    directory = pathlib.Path(directory)
    if sysconfdir is None:
        sysconfdir = directory / "etc"
        (sysconfdir / "apsd").mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / "deploy" / "apsd.conf", sysconfdir / "apsd" / "apsd.conf")
    values = {"SBINDIR": str(sbindir or APSD.parent), "SYSCONFDIR": str(sysconfdir)}
    text = PLACEHOLDER.sub(lambda m: values[m.group(1)], UNIT_TEMPLATE.read_text())
    lines = [l for l in text.splitlines() if not l.startswith(tuple(drop))]
    unit = directory / "apsd.service"
    unit.write_text("\n".join(lines) + "\n")
    return unit


class NotifyListener:
    """The service manager's end of NOTIFY_SOCKET: a datagram socket bound to
    a path or an abstract name, read by a thread that records every datagram
    with its arrival time (time.monotonic()) and its sender's pid."""

    def __init__(self, directory, abstract=False):
        if abstract:
            self.name = f"@apsd-test-notify-{os.getpid()}-{id(self)}"
            address = "\0" + self.name[1:]
        else:
            self.name = str(pathlib.Path(directory) / "notify.sock")
            address = self.name
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        self.sock.bind(address)
        self.sock.settimeout(0.05)
        self.messages = []  # (time, sender pid, {key: value}, raw text)
        self.on_message = None  # called in the reader thread, before recording
        self.lock = threading.Condition()
        self.running = True
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        creds = struct.calcsize("3i")
        while self.running:
            try:
                data, anc, _, _ = self.sock.recvmsg(4096, socket.CMSG_SPACE(creds))
            except socket.timeout:
                continue
            except OSError:
                return
            now = time.monotonic()
            pid = None
            for level, kind, value in anc:
                if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
                    pid = struct.unpack("3i", value[:creds])[0]
            text = data.decode(errors="replace")
            fields = dict(line.split("=", 1) for line in text.split("\n") if "=" in line)
            if self.on_message:
                self.on_message(fields)
            with self.lock:
                self.messages.append((now, pid, fields, text))
                self.lock.notify_all()

    def wait_for(self, key, value=None, timeout=5.0, after=0):
        """The first message at index >= after that sets key (to value, if
        given), as (index, time, pid, fields, raw); None after timeout seconds."""
        deadline = time.monotonic() + timeout
        with self.lock:
            while True:
                for i in range(after, len(self.messages)):
                    fields = self.messages[i][2]
                    if key in fields and (value is None or fields[key] == value):
                        return (i, *self.messages[i])
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self.lock.wait(left)

    def times_of(self, key, value):
        with self.lock:
            return [m[0] for m in self.messages if m[2].get(key) == value]

    def close(self):
        self.running = False
        self.thread.join()
        self.sock.close()
