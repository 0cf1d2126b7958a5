#!/usr/bin/python3
"""What max_held_bytes costs an honest job when it is spent.

Usage: tests/bench/bench_held.py [BUILD [STEPS [RUNS]]]   (defaults: build 30 3)

A 4-rank job (tests/integration/itest_worker) of one tensor, 1M and 16M
elements in e4m3, rank 0 on time or up to 20 ms late at every step, with
apsd's default max_held_bytes (a quarter of max_total_bytes: nothing is
declined) and with max_held_bytes = 1 byte (every push that comes before a
lower rank's is declined and asked for again: what a job sees while a
stranger's job holds the whole budget). Prints seconds for STEPS steps per
run, and the daemon's pushes_declined and asked_again."""
import os
import socket
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [os.path.join(ROOT, "tests/integration")]
BUILD = os.path.abspath(sys.argv[1]) if len(sys.argv) > 1 else os.path.join(ROOT, "build")
STEPS = int(sys.argv[2]) if len(sys.argv) > 2 else 30
RUNS = int(sys.argv[3]) if len(sys.argv) > 3 else 3
WORKER = os.path.join(BUILD, "tests/integration/itest_worker")
APSD = os.path.join(BUILD, "server/apsd")

from conftest import ask  # noqa: E402


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(held, late_ms, size, world=4):
    port = free_port()
    endpoint, stats = f"tcp://127.0.0.1:{port}", f"/tmp/bench_held_{port}.sock"
    args = [APSD, "--listen", endpoint, "--log_level", "warn", "--stats", stats]
    if held:
        args += ["--max_held_bytes", held]
    daemon = subprocess.Popen(args, stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.3)
        start = time.monotonic()
        workers = [subprocess.Popen([WORKER, "--endpoint", endpoint, "--rank", str(r),
                                     "--world", str(world), "--sizes", str(size),
                                     "--steps", str(STEPS), "--unchecked", "1",
                                     "--jitter-ms", str(late_ms if r == 0 else 0)],
                                    stdout=subprocess.PIPE, text=True)
                   for r in range(world)]
        for w in workers:
            out = w.communicate()[0]
            assert w.returncode == 0, out[-2000:]
        seconds = time.monotonic() - start
        c = ask(stats, "stats")["counters"]
        return seconds, c["pushes_declined"], c["asked_again"]
    finally:
        daemon.terminate()
        daemon.wait()


def main():
    print(f"{STEPS} steps of a 4-rank job, e4m3, rank 0 up to LATE ms late; seconds per run")
    for size in (1 << 20, 16 << 20):
        for late_ms in (0, 20):
            for held in (None, "1"):
                runs = [run(held, late_ms, size) for _ in range(RUNS)]
                print(f"elements={size} late={late_ms} max_held_bytes={held or 'default'}: "
                      + " ".join(f"{s:.2f}" for s, _, _ in runs)
                      + f"  declined/asked {runs[-1][1]}/{runs[-1][2]}", flush=True)


if __name__ == "__main__":
    main()
