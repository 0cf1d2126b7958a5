#!/usr/bin/python3
"""Training across two sites (issue 19), as root: 4 workers of the byte-level
language model (worker/examples/train_lm.py) in two sites of 2, each site on
its own fast network, both joined to apsd by a slow shaped link
(deploy/netcluster.py's Sites: 100 Mbit/s and 1 Gbit/s, full duplex, one per
site). Every row trains the same steps from the same seed:

- apsd every step, e4m3 with APS (DistributedOptimizer: every gradient, every step);
- DiLoCo through apsd (aps.torch.DiLoCo): AdamW alone on each worker, every H
  steps the pseudo-gradient up (e4m3, fp4 blocks) and the outer step on apsd;
- gloo every step, fp32 (train_lm.py --gloo: one flat bucket a step, ring),
  its ranks in the same site namespaces, so the ring crosses the slow links;
- "no sync": DiLoCo with H = the run's steps, one sync at the end: the
  compute alone, on this machine, in the same conditions.

Wall time of the run (rank 0, from the first step to the last, the held-out
loss measured at the start and the end only), bytes each worker sent, the
held-out loss at the end (short runs: this is the wall time's table; the
loss targets are docs/RESULTS.md's). The machine has 2 cores: compute shares
them with the kernel's shaping, so the "no sync" row is the floor of a row.

    /usr/bin/python3 tests/bench/bench_sites.py                 # ~10 min
    /usr/bin/python3 tests/bench/bench_sites.py --rates 100mbit --steps 60

Namespaces and processes are removed at the end, also on failure.
"""

import argparse
import json
import os
import pathlib
import socket
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT / "deploy"))
import netcluster  # noqa: E402

PYTHON = "/usr/bin/python3"
WORLD = 4
PORT = 5555
GLOO_PORT = 29511


def rows(steps):
    """(label, train_lm.py options)"""
    return [("apsd e4m3, every step", ["--format", "e4m3", "--scaling", "local"]),
            ("DiLoCo H=10, e4m3", ["--format", "e4m3", "--scaling", "local", "--diloco", "10"]),
            ("DiLoCo H=10, e4m3, overlap 5", ["--format", "e4m3", "--scaling", "local",
                                              "--diloco", "10", "--overlap", "5"]),
            ("DiLoCo H=10, fp4 block", ["--format", "fp4", "--scaling", "block",
                                        "--diloco", "10"]),
            ("DiLoCo H=50, e4m3", ["--format", "e4m3", "--scaling", "local", "--diloco", "50"]),
            ("gloo fp32, every step", ["--gloo", f"tcp://{netcluster.SITES_NET}.2:{GLOO_PORT}"]),
            (f"no sync (H={steps}, the compute alone)",
             ["--format", "e4m3", "--scaling", "local", "--diloco", str(steps)])]


def run_row(c, a, label, opts, out_dir, tag):
    """One training run in cluster c; returns rank 0's result dict."""
    gloo = "--gloo" in opts
    apsd = None
    if not gloo:
        stats = out_dir / f"{tag}.stats.sock"
        apsd = c.start(0, [str(a.build / "server/apsd"), "--listen",
                           f"tcp://{c.addr(0)}:{PORT}", "--insecure", "yes", "--stats",
                           str(stats), "--log_level", "warn"],
                       stdout=subprocess.DEVNULL, stderr=open(out_dir / f"{tag}.apsd.log", "w"))
        time.sleep(0.3)
    env = dict(os.environ, PYTHONPATH=str(ROOT / "worker/python"),
               APS_LIBRARY=str(a.build / "worker/libaps.so.0"), APS_WORLD_SIZE=str(WORLD),
               APS_ENDPOINT=f"tcp://{c.addr(0)}:{PORT}", OMP_NUM_THREADS="1",
               GLOO_SOCKET_IFNAME="eth0")
    out = out_dir / f"{tag}.json"
    procs = []
    for r in range(WORLD):
        argv = [PYTHON, str(ROOT / "worker/examples/train_lm.py"), "--steps", str(a.steps),
                "--eval-every", str(a.steps), "--eval-windows", "64", "--seed", "0",
                "--label", label, *opts]
        if r == 0:
            argv += ["--out", str(out)]
        procs.append(c.start(1 + r, argv, env=dict(env, APS_RANK=str(r)),
                             stdout=open(out_dir / f"{tag}.rank{r}.log", "w"),
                             stderr=subprocess.STDOUT))
    deadline = time.monotonic() + a.timeout
    for p in procs:
        p.wait(timeout=max(1, deadline - time.monotonic()))
    if apsd is not None:
        apsd.terminate()
        apsd.wait(timeout=10)
    codes = [p.returncode for p in procs]
    if any(codes):
        raise RuntimeError(f"{label}: ranks exited {codes}; logs in {out_dir}/{tag}.*")
    return json.loads(out.read_text())


def table(results):
    lines = ["| link per site | run, 4 workers, LM | wall s | s per step | MB sent per worker "
             "| held-out loss at the end |", "|---|---|--:|--:|--:|--:|"]
    for r in results:
        lines.append(f"| {r['rate']} | {r['label']} | {r['wall_s']:.1f} | "
                     f"{r['wall_s'] / r['steps']:.3f} | {r['bytes_total'] / 1e6:.2f} | "
                     f"{r['test_loss']:.4f} |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", type=pathlib.Path, default=ROOT / "build")
    ap.add_argument("--rates", default="100mbit,1gbit")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--timeout", type=float, default=600, help="seconds per run")
    ap.add_argument("--out", type=pathlib.Path, default=None)
    a = ap.parse_args(argv)
    if os.geteuid() != 0:
        raise SystemExit("bench_sites.py: needs root (ip netns, tc)")
    a.out = a.out or a.build / "bench" / "sites"
    a.out.mkdir(parents=True, exist_ok=True)
    print(f"# bench_sites: {socket.gethostname()}, {os.cpu_count()} cores, load "
          f"{os.getloadavg()[0]:.1f}, {a.steps} steps\n", flush=True)
    results = []
    for rate in a.rates.split(","):
        with netcluster.Sites((2, 2), rate) as c:
            for i, (label, opts) in enumerate(rows(a.steps)):
                r = run_row(c, a, label, opts, a.out, f"{rate}-{i}")
                r["rate"] = rate
                results.append(r)
                print(f"{rate} {label}: {r['wall_s']:.1f} s", flush=True)
                c.stop_procs()
    (a.out / "sites.json").write_text(json.dumps(results, indent=1))
    print("\n" + table(results) + f"\n\nload at the end {os.getloadavg()[0]:.1f}; "
          f"logs and sites.json in {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
