"""One rank of the elastic-job test (test_elastic.py), through aps.Client.

Every step all-reduces a tensor of 3000 fp32 values, all rank + 1, and prints
one JSON line: the step and the distinct values of the result (one when every
chunk had the same contributors). Barriers after steps listed in --barriers;
before the first of them it waits for --go (a file the test creates once the
rank that came back has joined). --rejoin: a rank that is back calls
barrier() first, as it must, then goes on from there.
"""

import argparse
import json
import os
import time

import numpy as np

import aps

ap = argparse.ArgumentParser()
ap.add_argument("--endpoint")
ap.add_argument("--rank", type=int)
ap.add_argument("--world", type=int)
ap.add_argument("--steps", type=int)
ap.add_argument("--barriers", default="")
ap.add_argument("--go", default="")
ap.add_argument("--sleep", type=float, default=0.05)
ap.add_argument("--rejoin", action="store_true")
args = ap.parse_args()
barriers = {int(b) for b in args.barriers.split(",") if b}

with aps.Client(args.endpoint, args.rank, args.world, format="fp32", job="elastic",
                timeout_ms=20000) as c:
    if args.rejoin:
        c.barrier()
        print(json.dumps({"barrier": "rejoined"}), flush=True)
    for step in range(1, args.steps + 1):
        x = np.full(3000, args.rank + 1, np.float32)
        c.allreduce("grad", x)
        print(json.dumps({"step": step, "values": sorted(set(x.tolist()))}), flush=True)
        if step in barriers:
            while args.go and not os.path.exists(args.go):
                time.sleep(0.01)
            c.barrier()
        time.sleep(args.sleep)
print(json.dumps({"done": args.rank}), flush=True)
