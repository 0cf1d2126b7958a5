"""The real apsd under a pretend service manager: NOTIFY_SOCKET points at a
datagram socket this test listens on, WATCHDOG_USEC=2000000. READY=1 once
the endpoint is bound, STATUS= lines, WATCHDOG=1 every second (half the
period), STOPPING=1 on SIGTERM, and SIGHUP (systemctl reload) applying a new
log_level from the config file without dropping connected workers.

Every test skips with "main.c not wired yet" when apsd sends no READY=1
within 3 s, so that this file can be committed before server/notify.c is
called from main.c.
"""

import os
import re
import signal
import socket
import statistics
import subprocess
import threading
import time

import pytest

from sd_helpers import APSD, WORKER, NotifyListener, free_port

WATCHDOG_USEC = 2_000_000
READY_TIMEOUT = 3.0
unwired = []  # set once a daemon sent no READY=1: the other tests skip at once


class NotifiedDaemon:
    """apsd started with --config FILE (log_level from the file, so that a
    reload can change it) and NOTIFY_SOCKET; the listener tries a TCP connect
    to the endpoint the moment READY=1 arrives."""

    def __init__(self, tmp, abstract=False):
        self.tmp = tmp
        self.port = free_port()
        self.endpoint = f"tcp://127.0.0.1:{self.port}"
        self.conf = tmp / "apsd.conf"
        self.write_conf("info")
        self.notify = NotifyListener(tmp, abstract)
        self.connect_at_ready = None
        self.notify.on_message = self._on_message
        env = dict(os.environ, NOTIFY_SOCKET=self.notify.name, WATCHDOG_USEC=str(WATCHDOG_USEC))
        env.pop("WATCHDOG_PID", None)
        env.pop("RUNTIME_DIRECTORY", None)
        self.log_path = tmp / "apsd.log"
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen([str(APSD), "--config", str(self.conf)], env=env,
                                         stdout=log, stderr=log)
        self.ready = self.notify.wait_for("READY", "1", timeout=READY_TIMEOUT)

    def write_conf(self, log_level, extra=""):
        keys = subprocess.run([str(APSD), "--help"], capture_output=True, text=True).stdout
        stats = f"stats = {self.tmp}/stats.sock\n" if "--stats" in keys else ""
        self.conf.write_text(f"[apsd]\nlisten = {self.endpoint}\nlog_level = {log_level}\n"
                             f"{stats}{extra}")

    def _on_message(self, fields):
        if fields.get("READY") == "1" and self.connect_at_ready is None:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                self.connect_at_ready = True
            except OSError:
                self.connect_at_ready = False

    def log(self):
        return self.log_path.read_text()

    def wait_for_log(self, pattern, timeout=10):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            m = re.search(pattern, self.log(), re.M)
            if m:
                return m
            assert self.proc.poll() is None, f"apsd exited {self.proc.returncode}: {self.log()}"
            time.sleep(0.02)
        raise TimeoutError(f"apsd never logged {pattern!r}: {self.log()}")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.notify.close()
        return self.proc.returncode


@pytest.fixture(params=["path"])
def daemon(request, tmp_path):
    if unwired:
        pytest.skip("main.c not wired yet")
    d = NotifiedDaemon(tmp_path, abstract=request.param == "abstract")
    if d.ready is None:
        running = d.proc.poll() is None
        d.stop()
        if running:
            unwired.append(True)
            pytest.skip("main.c not wired yet")
        pytest.fail(f"apsd exited {d.proc.returncode} before READY=1: {d.log()}")
    yield d
    code = d.stop()
    assert code == 0, f"apsd exited {code}: {d.log()[-3000:]}"


def run_worker(endpoint, rank=0, world=1, sizes=(7,), **opts):
    args = [str(WORKER), "--endpoint", endpoint, "--rank", str(rank), "--world", str(world),
            "--sizes", ",".join(str(s) for s in sizes)]
    for key, value in opts.items():
        args += ["--" + key.replace("_", "-"), str(value)]
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(proc, timeout=60):
    out, _ = proc.communicate(timeout=timeout)
    return proc.returncode, out


@pytest.mark.parametrize("daemon", ["path", "abstract"], indirect=True)
def test_ready_comes_once_the_endpoint_is_bound(daemon):
    _, _, pid, _, raw = daemon.ready
    assert pid == daemon.proc.pid, "systemd takes READY=1 from the main process only"
    assert daemon.connect_at_ready is True, "READY=1 came before the endpoint accepted"
    assert "READY=1" in raw.split("\n")
    code, out = finish(run_worker(daemon.endpoint, steps=1))
    assert code == 0 and "done rank=0" in out, out
    assert len(daemon.notify.times_of("READY", "1")) == 1


def test_status_is_one_line(daemon):
    found = daemon.notify.wait_for("STATUS", timeout=3)
    assert found is not None, daemon.notify.messages
    _, _, pid, fields, raw = found
    status = fields["STATUS"]
    assert pid == daemon.proc.pid
    assert status.strip() and status.isprintable() and len(status) <= 512, repr(status)
    assert raw.count("STATUS=") == 1


def test_watchdog_pings_at_half_the_period_under_load(daemon):
    """WatchdogSec=2s: a ping every second, and never 2 s without one, even
    while two ranks push 4 MB tensors through the loop."""
    ready_at = daemon.ready[1]
    ranks = [run_worker(daemon.endpoint, r, 2, sizes=(1_000_000,), steps=8, format="fp32")
             for r in range(2)]
    time.sleep(4.5)
    for r in ranks:
        code, out = finish(r, timeout=120)
        assert code == 0, out
    times = daemon.notify.times_of("WATCHDOG", "1")
    assert len(times) >= 3, daemon.notify.messages
    gaps = [b - a for a, b in zip([ready_at] + times, times)]
    assert max(gaps) < WATCHDOG_USEC / 1e6, gaps
    assert 0.8 <= statistics.median(gaps[1:]) <= 1.2, gaps


def test_stopping_on_sigterm(daemon):
    daemon.proc.send_signal(signal.SIGTERM)
    stopping = daemon.notify.wait_for("STOPPING", "1", timeout=5)
    assert stopping is not None, daemon.notify.messages
    assert stopping[2] == daemon.proc.pid
    assert daemon.proc.wait(timeout=10) == 0, daemon.log()
    assert daemon.notify.wait_for("READY", "1", after=stopping[0] + 1, timeout=0.2) is None


class LineReader:
    """Reads a worker's output in a thread, so that a test can wait for a line."""

    def __init__(self, proc):
        self.proc, self.lines, self.cond = proc, [], threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            with self.cond:
                self.lines.append(line)
                self.cond.notify_all()

    def wait_for(self, text, timeout=30):
        with self.cond:
            assert self.cond.wait_for(lambda: any(text in l for l in self.lines), timeout), \
                "".join(self.lines)

    def finish(self, timeout=60):
        self.proc.wait(timeout=timeout)
        time.sleep(0.1)
        with self.cond:
            return self.proc.returncode, "".join(self.lines)


def test_sighup_applies_log_level_without_dropping_workers(daemon):
    """Rank 0 waits inside step 2 for rank 1 (which sleeps) while the daemon
    reloads: both must finish every step, and the round that completes after
    the reload is logged at the new level, debug."""
    rank0 = LineReader(run_worker(daemon.endpoint, 0, 2, steps=3, timeout_ms=30000))
    rank1 = LineReader(run_worker(daemon.endpoint, 1, 2, steps=3, sleep_ms=3000,
                                  timeout_ms=30000))
    rank0.wait_for("ok step=1")
    daemon.write_conf("debug")
    before = len(daemon.notify.messages)
    daemon.proc.send_signal(signal.SIGHUP)
    reloaded = daemon.wait_for_log(r"^.*reloaded\b.*\blog_level=debug.*$")
    reloading = daemon.notify.wait_for("RELOADING", "1", after=before, timeout=3)
    assert reloading is not None and reloading[3].get("MONOTONIC_USEC", "").isdigit()
    assert daemon.notify.wait_for("READY", "1", after=reloading[0] + 1, timeout=3)
    for rank in (rank0, rank1):
        code, out = rank.finish()
        assert code == 0 and "done rank=" in out, out
    log = daemon.log()
    head, tail = log[:reloaded.start()], log[reloaded.end():]
    assert " debug " not in head, "a debug line before the reload, at log_level=info"
    last_round = re.search(r"round job=default tensor=layer0\.weight step=2\b", tail)
    assert last_round, log
    # how the workers leave after their barrier is not this test's business
    assert "rank lost" not in head + tail[:last_round.start()], log
    assert daemon.proc.poll() is None


def test_bad_config_on_reload_keeps_the_running_one(daemon):
    daemon.write_conf("info", extra="max_jobs = lots\n")
    line = daemon.conf.read_text().splitlines().index("max_jobs = lots") + 1
    daemon.proc.send_signal(signal.SIGHUP)
    daemon.wait_for_log(re.escape(f"{daemon.conf}:{line}: max_jobs"))
    time.sleep(0.2)
    assert daemon.proc.poll() is None, daemon.log()
    code, out = finish(run_worker(daemon.endpoint, steps=1))
    assert code == 0, out
