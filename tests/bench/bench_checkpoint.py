#!/usr/bin/python3
"""What a large job's checkpoints cost apsd and the jobs beside it.

Usage: tests/bench/bench_checkpoint.py [BUILD [MIB]]   (defaults: build 384)

A one-rank optimize-mode job (Adam) of MIB of weights and state (a third each)
steps 3 times with checkpoint_steps = 1 while another one-rank job steps a
1024-element tensor as fast as it can; then the daemon restarts and the job
resumes from its checkpoint, again beside the other job. Printed: the longest
step of the other job during each, the 3 steps' and the resume's wall time,
and apsd's peak RSS (VmHWM) after the resume. Before 2026-12-07 the snapshot
was copied and the checkpoint read on the event loop (the other job waited the
whole copy or read), and the file was read whole into a buffer before it was
parsed (twice its size at the peak); docs/BENCHMARKS.md."""
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.path.abspath(sys.argv[1]) if len(sys.argv) > 1 else os.path.join(ROOT, "build")
sys.path[:0] = [os.path.join(ROOT, "worker/python")]
os.environ.setdefault("APS_LIBRARY", os.path.join(ROOT, "build/worker/libaps.so.0"))
MIB = int(sys.argv[2]) if len(sys.argv) > 2 else 384

import aps  # noqa: E402
from aps.daemon import free_endpoint, is_listening  # noqa: E402

ENDPOINT = None  # the running daemon's (a free port at each start)


DAEMONS = []


def start(ckdir):
    global ENDPOINT
    ENDPOINT = free_endpoint()
    log = open(os.path.join(ckdir, "..", "apsd.log"), "a")
    d = subprocess.Popen([os.path.join(BUILD, "server/apsd"), "--listen", ENDPOINT,
                          "--checkpoint_dir", ckdir,
                          "--checkpoint_steps", "1", "--reconnect_grace_ms", "0",
                          "--stats", os.path.join(ckdir, "..", "stats.sock")], stderr=log)
    DAEMONS.append(d)
    deadline = time.monotonic() + 10
    while not is_listening(ENDPOINT, 0.2):
        assert time.monotonic() < deadline and d.poll() is None, "apsd did not start"
    return d


def beside_another_job(work):
    """work() on a thread while another job steps; (work's seconds, longest step)."""
    other = aps.Client(ENDPOINT, 0, 1, job="other")
    x = np.ones(1024, np.float32)
    other.allreduce("x", x)
    spans, done = [], threading.Event()

    def timed():
        t0 = time.monotonic()
        try:
            work()
            spans.append(time.monotonic() - t0)
        finally:
            done.set()

    t = threading.Thread(target=timed)
    t.start()
    worst, last = 0.0, time.monotonic()
    while not done.is_set():
        other.allreduce("x", x)
        now = time.monotonic()
        worst, last = max(worst, now - last), now
    t.join()
    other.close()
    return spans[0], worst


def peak_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM")) / 1024


def main():
    top = tempfile.mkdtemp(prefix="bench-ckpt-")
    ckdir = os.path.join(top, "ck")
    os.mkdir(ckdir)
    n = MIB * (1 << 20) // 12  # weights and Adam's two state arrays
    try:
        d = start(ckdir)
        w = np.ones(n, np.float32)
        c = aps.Client(ENDPOINT, 0, 1, format="fp32", optimizer="adam",
                       job="big", timeout_ms=120000)
        c.broadcast("w", w)

        def steps():
            for _ in range(3):
                c.step("w", w, w, 0.1)

        took, worst = beside_another_job(steps)
        print(f"3 steps, a {MIB} MiB checkpoint each: {took:.2f} s; "
              f"the other job's longest step {worst * 1000:.0f} ms")
        c.close()
        d.terminate()
        assert d.wait(120) == 0
        d = start(ckdir)
        big = []

        def resume():
            big.append(aps.Client(ENDPOINT, 0, 1, format="fp32",
                                  optimizer="adam", job="big", timeout_ms=120000))

        took, worst = beside_another_job(resume)
        print(f"resume of {MIB} MiB: {took:.2f} s; the other job's longest step "
              f"{worst * 1000:.0f} ms; apsd's peak RSS {peak_mib(d.pid):.0f} MiB")
        big[0].close()
        d.terminate()
        d.wait(120)
    except Exception:
        with open(os.path.join(top, "apsd.log")) as f:
            print("".join(f.readlines()[-15:]), file=sys.stderr)
        raise
    finally:
        for d in DAEMONS:
            if d.poll() is None:
                d.kill()
                d.wait()
        shutil.rmtree(top, ignore_errors=True)


if __name__ == "__main__":
    main()
