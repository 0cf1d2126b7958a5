#!/usr/bin/python3
"""A job of many small tensors: W ranks (threads of one process, each its own
aps.Client) step N tensors of 4 floats with allreduce_many through a real apsd,
once with each libaps given (--lib, in the order given, repeated --runs times),
against the same apsd build. Per run: the wall time of each step after the
first (which registers every tensor), the process's CPU time (user + system,
every rank together), and apsd's counters that say whether a rank was dropped
(slow_readers, reconnects). Before 2026-12-08 every call in flight sent a
HEARTBEAT each second and each reply walked the list of calls: with 20000
tensors that was 40 % of a rank's CPU and ranks were dropped as slow readers.

    /usr/bin/python3 tests/bench/bench_many_tensors.py --build build \\
        --lib OLD/worker/libaps.so.0 --lib build/worker/libaps.so.0 [--tensors 20000]

Each run is a child process (a library is loaded once per process).
"""

import argparse
import json
import os
import pathlib
import resource
import subprocess
import sys
import tempfile
import threading
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "tests" / "integration")]

from conftest import ask, free_port  # noqa: E402


def child(args):
    """One run: this process's libaps is APS_LIBRARY."""
    import numpy as np

    import aps
    names = [f"layer{i:05d}.w" for i in range(args.tensors)]
    times, wrong, errors = {}, 0, []

    def rank(r):
        nonlocal wrong
        try:
            with aps.Client(args.endpoint, r, args.world, job="many", format="fp32",
                            timeout_ms=30000) as c:
                for s in range(args.steps + 1):
                    xs = [np.full(4, r + 1.0, np.float32) for _ in names]
                    t0 = time.monotonic()
                    c.allreduce_many_async(list(zip(names, xs))).wait()
                    times.setdefault(r, []).append(time.monotonic() - t0)
                    wrong += sum(not np.all(x == (args.world + 1) / 2) for x in xs)
        except Exception as e:  # a timeout is a result here
            errors.append(f"rank {r}: {e}"[:200])

    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    ts = [threading.Thread(target=rank, args=(r,)) for r in range(args.world)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = cpu1.ru_utime - cpu0.ru_utime + cpu1.ru_stime - cpu0.ru_stime
    print(json.dumps({"steps_s": [max(times[r][s] for r in times) for s in
                                  range(1, min(len(v) for v in times.values()))]
                      if times else [], "cpu_s": cpu, "wrong": wrong, "errors": errors}))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--build", default="build", help="apsd from BUILD/server/apsd")
    p.add_argument("--lib", action="append", help="a libaps.so.0 to run (repeatable)")
    p.add_argument("--tensors", type=int, default=20000)
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--steps", type=int, default=2, help="steps after the first")
    p.add_argument("--runs", type=int, default=2)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--endpoint", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return child(args)
    libs = args.lib or [str(ROOT / args.build / "worker" / "libaps.so.0")]
    print(f"{args.world} ranks, {args.tensors} tensors of 4 floats, {args.steps} timed steps")
    print("| libaps | run | step s (slowest rank) | CPU s (all ranks) | slow_readers | reconnects "
          "| wrong | errors |\n|---|--:|---|--:|--:|--:|--:|---|")
    for run in range(args.runs):
        for lib in libs:
            with tempfile.TemporaryDirectory() as tmp:
                stats = os.path.join(tmp, "stats.sock")
                endpoint = f"tcp://127.0.0.1:{free_port()}"
                apsd = subprocess.Popen([str(ROOT / args.build / "server" / "apsd"), "--listen",
                                         endpoint, "--stats", stats, "--log_level", "warn"],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                try:
                    deadline = time.monotonic() + 10
                    while not os.path.exists(stats) and time.monotonic() < deadline:
                        time.sleep(0.05)
                    env = {**os.environ, "APS_LIBRARY": lib,
                           "PYTHONPATH": str(ROOT / "worker" / "python")}
                    out = subprocess.run(
                        [sys.executable, __file__, "--child", "--endpoint", endpoint,
                         "--tensors", str(args.tensors), "--world", str(args.world),
                         "--steps", str(args.steps)],
                        env=env, capture_output=True, text=True, timeout=600)
                    res = json.loads(out.stdout.strip().splitlines()[-1])
                    c = ask(stats, "stats")["counters"]
                finally:
                    apsd.terminate()
                    apsd.wait(10)
            steps = ", ".join(f"{s:.2f}" for s in res["steps_s"])
            print(f"| {lib} | {run + 1} | {steps} | {res['cpu_s']:.1f} | {c['slow_readers']} "
                  f"| {c['reconnects']} | {res['wrong']} | {'; '.join(res['errors']) or '-'} |")


if __name__ == "__main__":
    main()
