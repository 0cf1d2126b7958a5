#!/usr/bin/python3
"""What a stranger's idle connections cost an honest job.

Usage: tests/bench/bench_idle_conns.py [BUILD [N [SECONDS]]]   (defaults: build 3000 5)

A one-rank job pushes a 16-element fp32 tensor step after step (peers.py, one
call in flight: every step is a round trip through apsd's event loop). Its
steps a second and apsd's CPU per step are measured alone, then beside N
connections from 127.0.0.1 (never turned away) that complete their ZMTP
handshake and send nothing ("silent"), then beside N that each send one HELLO
apsd refuses (protocol 1.1: each leaves a session until its connection
closes). Before 2026-12-07 each message walked a list of every session, and
each tick made seven system calls a connection: the job lost 30 % of its
steps to silent connections and 74 % to refused HELLOs (docs/BENCHMARKS.md).
Needs N + 100 descriptors (the soft limit is raised to the hard one)."""
import os
import resource
import socket
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.path.abspath(sys.argv[1]) if len(sys.argv) > 1 else os.path.join(ROOT, "build")
sys.path[:0] = [os.path.join(ROOT, "tests/integration"), os.path.join(ROOT, "worker/python")]
os.environ.setdefault("APS_LIBRARY", os.path.join(ROOT, "build/worker/libaps.so.0"))
N = int(sys.argv[2]) if len(sys.argv) > 2 else 3000
SECONDS = float(sys.argv[3]) if len(sys.argv) > 3 else 5
APSD = os.path.join(BUILD, "server/apsd")

from peers import (FLAG_ALIVE, HEARTBEAT, HELLO, PUSH, REGISTER, REGISTERED,  # noqa: E402
                   RESULT, WELCOME, Peer, crc32c, envelope, zmtp_frame)
from test_attacks import raw_zmtp  # noqa: E402


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid):
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


class Honest:
    """Rank 0 of a one-rank job, one push in flight."""

    def __init__(self, endpoint):
        self.p = Peer(endpoint)
        assert self.p.hello("honest", 0, 1, version_minor=10)["type"] == WELCOME
        self.p.send(type=REGISTER, job="honest", rank=0, world_size=1, tensor_name="t",
                    total_count=16, format="fp32", version_minor=10)
        assert self.p.recv_type(REGISTERED) is not None
        self.data = np.ones(16, np.float32).tobytes()
        self.crc = crc32c(self.data)
        self.step = 0

    def alive(self):
        self.p.send(type=HEARTBEAT, job="honest", rank=0, world_size=1, flags=FLAG_ALIVE,
                    version_minor=10)
        while self.p.recv(0) is not None:
            pass

    def rate(self, pid):
        n, t0, c0 = 0, time.monotonic(), cpu_seconds(pid)
        while time.monotonic() - t0 < SECONDS:
            self.p.send(self.data, type=PUSH, job="honest", rank=0, world_size=1, tensor_id=0,
                        step=self.step, chunk_offset=0, chunk_count=16, total_count=16,
                        format="fp32", payload_crc32c=self.crc, version_minor=10)
            assert self.p.recv_type(RESULT, 5000) is not None
            self.step += 1
            n += 1
            if n % 200 == 0:
                self.alive()
        seconds = time.monotonic() - t0
        return n / seconds, (cpu_seconds(pid) - c0) / n * 1e6


def strangers(endpoint, n, hello, honest):
    conns = []
    for i in range(n):
        s = raw_zmtp(endpoint)
        if hello:
            s.sendall(zmtp_frame(envelope(type=HELLO, job=f"x{i}", rank=0, world_size=1,
                                          version_minor=1)))
        conns.append(s)
        if i % 200 == 0:  # the honest rank keeps alive meanwhile, as libaps does
            honest.alive()
    time.sleep(1)
    honest.alive()
    return conns


def main():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    port = free_port()
    endpoint = f"tcp://127.0.0.1:{port}"
    daemon = subprocess.Popen([APSD, "--listen", endpoint, "--log_level", "warn",
                               "--join_timeout_ms", "600000"], stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.3)
        honest = Honest(endpoint)
        print(f"{BUILD}: {N} connections from 127.0.0.1, {SECONDS:g} s a row")
        base, cpu = honest.rate(daemon.pid)
        print(f"  alone                  {base:7.0f} steps/s  apsd {cpu:4.0f} us/step")
        for hello in (False, True):
            conns = strangers(endpoint, N, hello, honest)
            rate, cpu = honest.rate(daemon.pid)
            what = "each a refused HELLO" if hello else "silent"
            print(f"  beside {N} {what:21s}{rate:7.0f} steps/s  apsd {cpu:4.0f} us/step"
                  f"  ({100 * (1 - rate / base):3.0f} % fewer)")
            for s in conns:
                s.close()
            time.sleep(2)
            honest.alive()
    finally:
        daemon.terminate()
        daemon.wait()


if __name__ == "__main__":
    main()
