"""Fixtures that start the real apsd and real worker processes.

APS_BUILD names the build directory whose binaries are used (default build/;
tests/run-tests.sh also runs this suite against build-asan/).
"""

import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
BUILD = ROOT / os.environ.get("APS_BUILD", "build")
APSD = BUILD / "server" / "apsd"
WORKER = BUILD / "tests" / "integration" / "itest_worker"
# AddressSanitizer keeps freed memory in its quarantine: RSS says nothing there.
SANITIZED = "asan" in BUILD.name

sys.path.insert(0, str(ROOT / "worker" / "python"))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ask(path, command, timeout=5):
    """The JSON answer of the stats socket at path to one command."""
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(timeout)
        s.connect(str(path))
        s.sendall(command.encode() + b"\n")
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    return json.loads(data)


class Daemon:
    """One apsd process; its log is a file read back by the tests."""

    count = 0

    def __init__(self, tmp, transport="tcp", extra=(), endpoint=None):
        Daemon.count += 1
        name = f"apsd{Daemon.count}"
        if endpoint is not None:
            self.endpoint = endpoint
        elif transport == "tcp":
            self.endpoint = f"tcp://127.0.0.1:{free_port()}"
        else:
            self.endpoint = f"ipc://{tmp}/{name}.sock"
        self.log_path = pathlib.Path(tmp) / f"{name}.log"
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen([str(APSD), "--listen", self.endpoint, "--log_level",
                                      "debug", *extra], stdout=self.log, stderr=self.log)
        self.wait_for_log("listening endpoint=")  # not the insecure warning before the bind

    def wait_for_log(self, text, timeout=10):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if text in self.log_path.read_text():
                return
            if self.proc.poll() is not None:
                raise RuntimeError(f"apsd exited {self.proc.returncode}: "
                                   + self.log_path.read_text())
            time.sleep(0.02)
        raise TimeoutError(f"apsd never logged {text!r}: " + self.log_path.read_text())

    def wait_for_stall(self, missing, job="default", timeout=20):
        """Waits until a round of job waits for exactly the ranks missing (the
        others have pushed and wait); returns that stall."""
        deadline = time.monotonic() + timeout
        while True:
            for j in self.ask("jobs")["jobs"]:
                for stall in j["stalls"] if j["name"] == job else ():
                    if stall["missing"] == list(missing):
                        return stall
            if time.monotonic() > deadline:
                raise TimeoutError(f"no round of job {job} ever waited for ranks {missing}: "
                                   + json.dumps(self.ask("jobs")))
            if self.proc.poll() is not None:
                raise RuntimeError(f"apsd exited {self.proc.returncode}: "
                                   + self.log_path.read_text())
            time.sleep(0.02)

    def stats_path(self):
        for line in self.log_path.read_text().splitlines():
            if "listening" in line and "stats=" in line:
                return line.split("stats=")[1].split()[0]
        raise AssertionError("no stats path in the log")

    def counter(self, name):
        """One of the daemon's counters, read from its stats socket."""
        return ask(self.stats_path(), "stats")["counters"][name]

    def ask(self, command):
        """The stats socket's JSON answer to command."""
        return ask(self.stats_path(), command)

    def stop(self, timeout=10):
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=timeout)
        self.log.close()
        return self.proc.returncode


@pytest.fixture
def daemon_factory():
    started = []
    with tempfile.TemporaryDirectory(prefix="apsd-test-") as tmp:
        def make(transport="tcp", extra=(), endpoint=None):
            d = Daemon(tmp, transport, extra, endpoint)
            started.append(d)
            return d
        yield make
        for d in started:
            code = d.stop()
            assert code == 0, f"apsd exited {code}: " + d.log_path.read_text()[-2000:]


@pytest.fixture
def daemon(daemon_factory):
    return daemon_factory()


def start_worker(endpoint, rank, world, sizes, env=None, **opts):
    args = [str(WORKER), "--endpoint", endpoint, "--rank", str(rank), "--world", str(world),
            "--sizes", ",".join(str(s) for s in sizes)]
    for key, value in opts.items():
        args += ["--" + key.strip("_").replace("_", "-"), str(value)]
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=None if env is None else {**os.environ, **env})


def run_workers(endpoint, world, sizes, timeout=120, _wait=True, **opts):
    """Runs ranks 0..world-1 to the end; returns [(exit code, output)] by rank. With
    _wait=False it returns at once a function that waits and returns them."""
    procs = [start_worker(endpoint, r, world, sizes, **opts) for r in range(world)]
    if not _wait:
        return lambda: collect(procs, timeout)
    return collect(procs, timeout)


def collect(procs, timeout):
    results = []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            out, _ = p.communicate()
            out += "\n(killed: timed out)"
        results.append((p.returncode, out))
    return results


def kill_rank_2_while_the_others_wait(daemon):
    """Ranks 0 and 1 of a 3-rank job push and wait; rank 2 (asleep) is killed.
    Asserts that both fail naming rank 2 as lost; returns their outputs and the
    seconds from the kill until both had ended."""
    procs = [start_worker(daemon.endpoint, r, 3, [4097], steps=1,
                          sleep_ms=(30000 if r == 2 else 0), timeout_ms=20000)
             for r in range(3)]
    daemon.wait_for_log("hello job=default rank=2")
    daemon.wait_for_stall([2])  # ranks 0 and 1 have pushed and wait for rank 2
    start = time.monotonic()
    procs[2].send_signal(signal.SIGKILL)
    outs = []
    for p in procs[:2]:
        out, _ = p.communicate(timeout=10)
        assert p.returncode == 3, out
        assert "APS_EPEERLOST" in out and "rank 2" in out, out
        outs.append(out)
    waited = time.monotonic() - start
    procs[2].wait()
    return outs, waited
