#!/usr/bin/python3
"""What a stranger's flood of connections that never speak costs a running job.

Usage: tests/bench/bench_silent_flood.py [BUILD [STEPS [apsd flags...]]]
e.g. `bench_silent_flood.py build 6000` (defaults) and
`bench_silent_flood.py build 6000 --max_silent_closes 32` (admission on).

Seconds for STEPS all-reduces of a 2-rank job (1 Mi fp32 as e4m3) with apsd's
default settings, without and with a stranger's flood of connections that close
without a word (100 at a time, from 127.0.0.2), alternating. Prints the daemon's
listener_resets and parked_bytes."""
import json
import multiprocessing as mp
import os
import random
import subprocess
import sys
import threading
import time

import numpy as np
import zmq

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [os.path.join(ROOT, "worker/python")]
BUILD = os.path.abspath(sys.argv[1]) if len(sys.argv) > 1 else os.path.join(ROOT, "build")
os.environ.setdefault("APS_LIBRARY", os.path.join(BUILD, "worker/libaps.so.0"))
import aps  # noqa: E402

STEPS = int(sys.argv[2]) if len(sys.argv) > 2 else 300
EXTRA = sys.argv[3:]
PORT = random.randint(30000, 40000)
EP = f"tcp://127.0.0.1:{PORT}"
STATS = f"/tmp/bench_silent_flood_stats{PORT}.sock"

def worker(rank, job):
    x = np.ones(1 << 20, dtype=np.float32)
    with aps.Client(EP, rank, 2, job=job, format="e4m3", timeout_ms=60000) as c:
        for _ in range(STEPS):
            c.allreduce("w", x)

def flood(stop):
    n = 0
    while not stop.is_set():
        ctx = zmq.Context()
        socks = []
        for _ in range(100):
            s = ctx.socket(zmq.DEALER); s.setsockopt(zmq.LINGER, 0)
            s.setsockopt(zmq.ROUTING_ID, b"\x81" + os.urandom(15))
            s.connect(EP.replace("tcp://", "tcp://127.0.0.2:0;")); socks.append(s)
        time.sleep(0.2)
        for s in socks: s.close()
        ctx.term()
        n += 100
    print(f"  flood: {n} silent connections", flush=True)

def stats():
    out = subprocess.run([f"{BUILD}/worker/apsctl", "--stats", STATS, "stats", "--json"],
                         capture_output=True, text=True).stdout
    return json.loads(out)

d = subprocess.Popen([f"{BUILD}/server/apsd", "--listen", EP, "--stats", STATS,
                      "--log_level", "warn", *EXTRA], stderr=open("/tmp/bench_silent_flood_apsd.log", "w"))
time.sleep(0.5)
try:
    for i, flood_on in enumerate((False, True, False, True)):
        stop = threading.Event()
        t = threading.Thread(target=flood, args=(stop,))
        before = stats()
        t0 = time.monotonic()
        if flood_on: t.start()
        ps = [mp.Process(target=worker, args=(r, f"run{i}")) for r in range(2)]
        for p in ps: p.start()
        for p in ps: p.join()
        took = time.monotonic() - t0
        stop.set()
        if flood_on: t.join()
        after = stats()
        cnt = lambda s, k: s.get("counters", s).get(k, s.get(k, 0)) if isinstance(s, dict) else 0
        print(f"flood={flood_on} {STEPS} steps {took:.1f} s ({STEPS/took:.1f}/s) exit={[p.exitcode for p in ps]} "
              f"resets+={cnt(after,'listener_resets')-cnt(before,'listener_resets')} "
              f"parked_bytes={cnt(after,'parked_bytes')}", flush=True)
finally:
    d.terminate(); d.wait()
