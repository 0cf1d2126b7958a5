#!/usr/bin/python3
"""Crossover size of compression (issue 6): from how many elements an e4m3
all-reduce (APS local scaling) is faster than an fp32 one, through the real
apsd and 4 Python workers (aps.Client), on loopback and on a 1 Gbit/s link.

For each size (64 ... 4Mi elements, powers of two) every rank repeats: a
barrier (untimed), then one timed blocking allreduce of a single tensor. A
rep's time is the slowest rank's; the figure is the median over the reps.
fp32 and e4m3 reps alternate, so that a change in background load hits both.
One job carries both formats: the client asks for e4m3 and a rule
("*.fp32=fp32") pins the fp32 tensors, the path a small tensor takes under
`policy = auto`.

Settings:
- loopback: apsd and the workers on tcp://127.0.0.1 in this network namespace.
- 1gbit: two network namespaces made here, one for apsd, one for the 4 workers,
  joined by a veth pair whose two ends are each shaped with
  `tc qdisc ... tbf rate 1gbit burst 4kb latency 50ms`: a full-duplex
  1 Gbit/s link, the daemon's link of a star where every worker has its own
  (4 pushes share the way in, 4 results the way out). The burst is small on
  purpose: a real link serializes every frame at line rate, while a bucket of
  256kb lets each exchange under that size through at memory speed, which
  hides the link at exactly the sizes where the crossover lies (--burst to
  compare). No delay is added (netem is not in every kernel; a veth round
  trip is ~20 us, a LAN switch adds ~50-100 us). With --link lo the 1gbit
  setting is instead one namespace whose loopback is shaped: both directions
  share one 1 Gbit/s (half duplex). The namespaces are deleted at the end, on
  failure and on SIGINT/SIGTERM, after every process started here has been
  stopped by its pid. Needs root (without it only loopback runs).

Every other process on the machine competes for the same cores (4 workers and
apsd share them): run it on a quiet machine. About 1 minute.

    ninja -C build && /usr/bin/python3 tests/bench/bench_crossover.py
    /usr/bin/python3 tests/bench/bench_crossover.py --settings loopback --max-size 65536

Tables go to stdout (Markdown), everything to build/bench/crossover.json.
"""

import argparse
import datetime
import json
import os
import pathlib
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve()
ROOT = HERE.parents[2]
PYTHON = "/usr/bin/python3"
WORLD = 4
FORMATS = ("fp32", "e4m3")
LINK_NET = "10.213.77"  # the veth pair's /24, inside the namespaces only


# ---------------------------------------------------------------- one worker


def worker_main(args):
    """One rank: for each size, warm-up reps, then alternate fp32 and e4m3 reps."""
    sys.path.insert(0, str(ROOT / "worker" / "python"))
    import numpy as np
    import aps

    rng = np.random.default_rng(1000 + args.rank)
    times = {}
    with aps.Client(args.endpoint, args.rank, WORLD, format="e4m3", scaling="local",
                    job="crossover", rules="*.fp32=fp32", timeout_ms=120000) as c:
        for n in args.sizes:
            src = (rng.standard_normal(n) * 1e-3).astype(np.float32)
            x = np.empty_like(src)
            reps = reps_for(n, args.reps)
            for fmt in FORMATS:  # registers both tensors and warms them up
                for _ in range(2):
                    np.copyto(x, src)
                    c.barrier()
                    c.allreduce(f"t{n}.{fmt}", x)
            for rep in range(reps):
                order = FORMATS if rep % 2 == 0 else FORMATS[::-1]
                for fmt in order:
                    np.copyto(x, src)
                    c.barrier()
                    t0 = time.perf_counter()
                    c.allreduce(f"t{n}.{fmt}", x)
                    times.setdefault(f"{n}.{fmt}", []).append(time.perf_counter() - t0)
    pathlib.Path(args.out).write_text(json.dumps(times))


def reps_for(n, base):
    """Fewer reps for large tensors: the same order of time per size."""
    return max(5, base if n <= 65536 else base * 65536 // n)


# ---------------------------------------------------------------- orchestration


class Run:
    """The processes and namespaces of one setting; undo() removes them all."""

    def __init__(self):
        self.procs = []
        self.netns = []

    def sh(self, *cmd):
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def add_netns(self, name):
        self.sh("ip", "netns", "add", name)
        self.netns.append(name)
        self.sh("ip", "-n", name, "link", "set", "lo", "up")

    def start(self, cmd, netns=None, **kw):
        if netns:
            cmd = ["ip", "netns", "exec", netns, *cmd]
        p = subprocess.Popen(cmd, start_new_session=True, **kw)
        self.procs.append(p)
        return p

    def undo(self):
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        deadline = time.monotonic() + 5
        for p in self.procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.procs = []
        for name in reversed(self.netns):
            subprocess.run(["ip", "netns", "del", name], stderr=subprocess.DEVNULL)
        self.netns = []


def tbf(run, netns, dev, burst):
    run.sh("ip", "netns", "exec", netns, "tc", "qdisc", "add", "dev", dev, "root", "tbf",
           "rate", "1gbit", "burst", burst, "latency", "50ms")


def setup(run, setting, link, burst, tag):
    """Namespaces of a setting: (daemon's netns, workers' netns, host, port)."""
    port = free_port()  # free here; the namespaces made below have no listener at all
    if setting == "loopback":
        return None, None, "127.0.0.1", port
    if link == "lo":
        ns = f"apsxo-{tag}"
        run.add_netns(ns)
        # Ethernet frames: tbf drops packets larger than its burst, and lo's are 64 KiB
        run.sh("ip", "-n", ns, "link", "set", "lo", "mtu", "1500")
        tbf(run, ns, "lo", burst)
        return ns, ns, "127.0.0.1", port
    srv, wrk = f"apsxo-{tag}-d", f"apsxo-{tag}-w"
    run.add_netns(srv)
    run.add_netns(wrk)
    run.sh("ip", "link", "add", "xo0", "netns", srv, "type", "veth", "peer", "name", "xo1",
           "netns", wrk)
    run.sh("ip", "-n", srv, "addr", "add", f"{LINK_NET}.1/24", "dev", "xo0")
    run.sh("ip", "-n", wrk, "addr", "add", f"{LINK_NET}.2/24", "dev", "xo1")
    run.sh("ip", "-n", srv, "link", "set", "xo0", "up")
    run.sh("ip", "-n", wrk, "link", "set", "xo1", "up")
    tbf(run, srv, "xo0", burst)
    tbf(run, wrk, "xo1", burst)
    return srv, wrk, f"{LINK_NET}.1", port


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_listening(host, port, netns, proc, timeout=10):
    """Returns once host:port accepts a connection from netns (the workers' side)."""
    probe = ("import socket, sys\ns = socket.socket()\ns.settimeout(0.2)\n"
             f"sys.exit(s.connect_ex(({host!r}, {port})))")
    cmd = [PYTHON, "-c", probe]
    if netns:
        cmd = ["ip", "netns", "exec", netns, *cmd]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"apsd exited with status {proc.returncode}")
        if subprocess.run(cmd).returncode == 0:
            return
        time.sleep(0.05)
    raise TimeoutError("apsd did not listen")


def run_setting(setting, args, tmp):
    run = Run()
    apsd_log = None
    try:
        srv_ns, wrk_ns, host, port = setup(run, setting, args.link, args.burst, os.getpid())
        listen = connect = f"tcp://{host}:{port}"
        apsd_log = open(tmp / f"apsd-{setting}.log", "w")
        apsd = run.start([str(ROOT / "build" / "server" / "apsd"), "--listen", listen,
                          "--log_level", "warn", "--stats", str(tmp / f"{setting}.sock"),
                          *(["--insecure", "yes"] if not listen.startswith("tcp://127.") else
                            [])], netns=srv_ns, stdout=apsd_log, stderr=apsd_log)
        wait_listening(host, port, wrk_ns, apsd)
        outs, workers = [], []
        env = dict(os.environ, OMP_NUM_THREADS="1")
        for rank in range(WORLD):
            out = tmp / f"{setting}-rank{rank}.json"
            outs.append(out)
            workers.append(run.start(
                [PYTHON, str(HERE), "--worker", "--rank", str(rank), "--endpoint", connect,
                 "--sizes", ",".join(map(str, args.sizes)), "--reps", str(args.reps),
                 "--out", str(out)], netns=wrk_ns, env=env))
        deadline = time.monotonic() + args.timeout
        for w in workers:
            try:
                w.wait(max(1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise RuntimeError(f"{setting}: the workers did not finish within "
                                   f"{args.timeout:.0f} s") from None
            if w.returncode != 0:
                raise RuntimeError(f"{setting}: a worker failed with status {w.returncode}; "
                                   f"apsd log: {(tmp / f'apsd-{setting}.log').read_text()}")
        per_rank = [json.loads(o.read_text()) for o in outs]
    finally:
        run.undo()
        if apsd_log is not None:
            apsd_log.close()
    return summarize(per_rank, args.sizes)


def summarize(per_rank, sizes, boot=2000):
    """Per size: each format's median step time (a rep's step time is the slowest
    rank's: the step ends for the job when every rank has the mean), and the
    speedup fp32 / e4m3 over paired reps (rep i of each format ran back to back)
    with a bootstrap 95% interval of its median."""
    import numpy as np

    rng = np.random.default_rng(0)
    rows = []
    for n in sizes:
        row = {"elems": n}
        steps = {}
        for fmt in FORMATS:
            steps[fmt] = np.max([r[f"{n}.{fmt}"] for r in per_rank], axis=0)
            row[fmt] = {"median_us": float(np.median(steps[fmt])) * 1e6,
                        "p10_us": float(np.quantile(steps[fmt], 0.1)) * 1e6,
                        "p90_us": float(np.quantile(steps[fmt], 0.9)) * 1e6,
                        "reps": len(steps[fmt])}
        ratio = steps["fp32"] / steps["e4m3"]
        medians = np.median(rng.choice(ratio, (boot, len(ratio))), axis=1)
        row["speedup"] = float(np.median(ratio))
        row["speedup_ci"] = [float(np.quantile(medians, 0.025)),
                             float(np.quantile(medians, 0.975))]
        rows.append(row)
    return rows


def crossover(rows, key=lambda r: r["speedup"]):
    """The smallest size from which e4m3 is faster (key > 1) at this and every larger size."""
    best = None
    for row in reversed(rows):
        if key(row) <= 1.0:
            break
        best = row["elems"]
    return best


def significant(row):
    return row["speedup_ci"][0]


def table(setting, rows):
    lines = [f"### {setting}", "",
             "| elements | fp32 KiB | fp32 us, median (p10-p90) | e4m3 us, median (p10-p90) "
             "| fp32 / e4m3, paired median [95% CI] |", "|---:|---:|---:|---:|---:|"]
    for r in rows:
        f, e = r["fp32"], r["e4m3"]
        lo, hi = r["speedup_ci"]
        lines.append(f"| {r['elems']:,} | {r['elems'] * 4 / 1024:,.2f} | {f['median_us']:,.0f} "
                     f"({f['p10_us']:,.0f}-{f['p90_us']:,.0f}) | {e['median_us']:,.0f} "
                     f"({e['p10_us']:,.0f}-{e['p90_us']:,.0f}) | {r['speedup']:.2f} "
                     f"[{lo:.2f}-{hi:.2f}] |")
    x, xs = crossover(rows), crossover(rows, significant)
    lines += ["", f"crossover ({setting}): e4m3 faster (median) from "
              + (f"{x:,} elements" if x else "no size")
              + "; faster beyond doubt (95% CI above 1) from "
              + (f"{xs:,} elements" if xs else "no size"), ""]
    return lines


def on_signal(signum, _frame):
    raise SystemExit(128 + signum)  # unwinds through the finally blocks: namespaces go


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--settings", default="loopback,1gbit")
    ap.add_argument("--link", choices=["veth", "lo"], default="veth",
                    help="1gbit: veth pair between two namespaces (full duplex) or shaped lo")
    ap.add_argument("--burst", default="4kb",
                    help="1gbit: the token bucket's burst (tc tbf); a large one (256kb) lets "
                    "every exchange under that size through at memory speed")
    ap.add_argument("--min-size", type=int, default=64)
    ap.add_argument("--max-size", type=int, default=4 << 20)
    ap.add_argument("--reps", type=int, default=150, help="reps per format up to 64Ki elements")
    ap.add_argument("--timeout", type=float, default=240, help="seconds per setting")
    ap.add_argument("--out", default=str(ROOT / "build" / "bench" / "crossover.json"))
    # worker mode (internal)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--endpoint", help=argparse.SUPPRESS)
    ap.add_argument("--sizes", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        args.sizes = [int(s) for s in args.sizes.split(",")]
        return worker_main(args)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    args.sizes = []
    n = args.min_size
    while n <= args.max_size:
        args.sizes.append(n)
        n *= 2
    settings = args.settings.split(",")
    if "1gbit" in settings and os.geteuid() != 0:
        print("bench_crossover: not root: no network namespace, loopback only", file=sys.stderr)
        settings = [s for s in settings if s != "1gbit"]
    results = {"date": datetime.datetime.now().isoformat(timespec="seconds"),
               "machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
               "link": args.link, "burst": args.burst, "world": WORLD, "settings": {}}
    lines = []
    with tempfile.TemporaryDirectory(prefix="bench-crossover-") as tmp:
        for setting in settings:
            t0 = time.monotonic()
            rows = run_setting(setting, args, pathlib.Path(tmp))
            results["settings"][setting] = {
                "rows": rows, "crossover_elems": crossover(rows),
                "crossover_ci_elems": crossover(rows, significant),
                "seconds": time.monotonic() - t0}
            print(f"bench_crossover: {setting} done in {time.monotonic() - t0:.0f} s",
                  file=sys.stderr, flush=True)
            name = setting + (f" ({args.link}, burst {args.burst})" if setting == "1gbit" else "")
            lines += table(name, rows)
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1))
    print("\n".join(lines))
    print(f"results: {out}")


if __name__ == "__main__":
    main()
