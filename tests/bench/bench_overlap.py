#!/usr/bin/python3
"""Overlap of gradient communication with backward in aps.torch.DistributedOptimizer.

Issue 5's criterion: on a CPU model with at least 20 parameter tensors and 4
workers, the first push of a step leaves before backward returns, and the
step time is at most 1.15 x max(backward, communication) + optimizer time.

The driver starts apsd on a free loopback port and N worker processes
(/usr/bin/python3, PYTHONPATH=worker/python, torch.set_num_threads(1)). Every
worker holds two copies of the same MLP (same seed): a plain one, and one
whose optimizer is wrapped in DistributedOptimizer (hooks on every
parameter). Each timed round runs four phases, every phase started on all
ranks together by a barrier, so that each sees the contention it would see
in training (all ranks doing the same thing at once):

  backward   plain model: loss.backward() alone, no hooks (forward timed apart)
  optimizer  plain model: the wrapped optimizer's step() alone
  comm       the plain model's gradients copied into the hooked model's .grad,
             then DistributedOptimizer.synchronize(): every bucket and the
             non-finite flag through the same client, buckets and code path as
             a step, but with no backward running
  step       hooked model: zero_grad, forward (timed apart), then
             loss.backward() + DistributedOptimizer.step() timed together

A barrier between forward and backward (in the backward and step phases)
starts every rank's backward together, as comm starts after a barrier: with
4 processes on 2 cores, time slicing otherwise staggers the ends of forward by
about 20 ms, and a rank's step then includes waiting for the late ones
(--no-align measures that way).

Medians over the timed rounds of the mean over ranks. Ratio:
step / (max(backward, comm) + optimizer); the criterion holds if <= 1.15.

Where the first push leaves: Client.allreduce_many_async (called by the
backward hooks) and libaps's aps_client_allreduce_start (called by the Python
I/O thread, quantizes then queues to the C I/O thread) are wrapped from
outside to record CLOCK_MONOTONIC times; with the trace on (default) every
client also writes APS_TRACE, whose "push" events (C I/O thread, same clock)
end when the first tensor's PUSH is handed to ZeroMQ. lead = backward end -
that time (> 0: the push left before backward returned).

CPU: per phase, the process CPU time of every worker (all its threads) and of
apsd (sum of /proc/PID/task/*/schedstat), so that the step can be compared
with what 2 cores can do: work bound = CPU seconds of backward + comm +
optimizer phases, all processes, / cores. Other processes on the machine are
reported (the /proc/stat busy time that is not ours).

    ninja -C build
    PYTHONPATH=worker/python /usr/bin/python3 tests/bench/bench_overlap.py   # ~30 s
    ... --wait-quiet 600 --repeat 3                                          # ~2.5 min (docs)
    ... --workers 4,2,1 --repeat 1 --rounds 30 --width 512 --depth 12 --batch 192

Tables go to stdout (Markdown), everything to build/bench/overlap.json.
Every worker has a deadline (alarm) and the driver kills its own children,
by pid, when a configuration overruns --timeout.
"""

import argparse
import json
import os
import pathlib
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]
PYTHON = "/usr/bin/python3"
FLAG_NAME = "grad.@nonfinite"

# ------------------------------------------------------------- measurement helpers


def schedstat_ns(pid):
    """On-CPU nanoseconds of every thread of pid (None once it is gone)."""
    total = 0
    try:
        for task in pathlib.Path(f"/proc/{pid}/task").iterdir():
            try:
                total += int((task / "schedstat").read_text().split()[0])
            except (OSError, ValueError, IndexError):
                pass  # a thread that just ended
    except OSError:
        return None
    return total


def machine_busy_ns():
    """Busy CPU time of the whole machine since boot, every core (/proc/stat)."""
    f = [int(x) for x in pathlib.Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (f[0] + f[1] + f[2] + f[5] + f[6] + f[7]) * 1e9 / os.sysconf("SC_CLK_TCK")


def wait_quiet(limit_s, busy_cores=0.3, window_s=3.0):
    """Waits (at most limit_s) until the machine was less than busy_cores busy
    over window_s; returns the busy cores of the last window."""
    deadline = time.monotonic() + limit_s
    while True:
        b0 = machine_busy_ns()
        time.sleep(window_s)
        busy = (machine_busy_ns() - b0) / 1e9 / window_s
        if busy < busy_cores or time.monotonic() > deadline:
            return busy
        print(f"# waiting for a quiet machine: {busy:.2f} cores busy", flush=True)


def median(xs):
    return statistics.median(xs) if xs else float("nan")


# ------------------------------------------------------------------------ worker


def build_model(torch, a):
    layers = []
    width = a.width
    for i in range(a.depth):
        out = a.classes if i == a.depth - 1 else width
        layers.append(torch.nn.Linear(width, out))
        if i != a.depth - 1:
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


def worker(a):
    deadline = int(a.timeout)
    signal.alarm(deadline)  # SIGALRM's default action ends the process
    import torch
    torch.set_num_threads(1)

    import aps
    import aps.client as aps_client
    import aps.torch as aps_torch
    from aps._lib import lib

    rank, world = int(os.environ["APS_RANK"]), int(os.environ["APS_WORLD_SIZE"])
    client = aps.Client.from_env(format=a.format, scaling=a.scaling,
                                 timeout_ms=int(a.timeout * 1000),
                                 trace=os.environ.get("BENCH_TRACE") or None)

    torch.manual_seed(1234)
    plain = build_model(torch, a)
    hooked = build_model(torch, a)
    hooked.load_state_dict(plain.state_dict())
    plain_opt = torch.optim.SGD(plain.parameters(), lr=a.lr, momentum=0.9)
    dopt = aps_torch.DistributedOptimizer(
        torch.optim.SGD(hooked.parameters(), lr=a.lr, momentum=0.9), client,
        named_parameters=hooked.named_parameters(), bucket_bytes=a.bucket_bytes)
    n_tensors = sum(1 for _ in hooked.parameters())
    n_params = sum(p.numel() for p in hooked.parameters())

    g = torch.Generator().manual_seed(100 + rank)
    x = torch.randn(a.batch, a.width, generator=g)
    y = torch.randint(0, a.classes, (a.batch,), generator=g)
    loss_fn = torch.nn.CrossEntropyLoss()

    # -- instrumentation from outside: hook-side queueing, the C start call --
    events = {"queued": [], "start_in": [], "start_out": []}
    real_many = client.allreduce_many_async

    def many(items, *args, **kw):
        if items and items[0][0] != FLAG_NAME:
            events["queued"].append(time.monotonic_ns())
        return real_many(items, *args, **kw)
    client.allreduce_many_async = many
    real_start = lib.aps_client_allreduce_start

    def start(c, tid, addr, n, timeout, req):
        events["start_in"].append(time.monotonic_ns())
        ret = real_start(c, tid, addr, n, timeout, req)
        events["start_out"].append(time.monotonic_ns())
        return ret
    lib.aps_client_allreduce_start = start
    assert aps_client.lib is lib

    opt_time = []  # the wrapped optimizer's step inside DistributedOptimizer.step

    real_opt_step = dopt.optimizer.step

    def timed_opt_step(*args, **kw):
        t = time.monotonic_ns()
        out = real_opt_step(*args, **kw)
        opt_time.append(time.monotonic_ns() - t)
        return out
    dopt.optimizer.step = timed_opt_step

    daemon_pid = int(os.environ.get("BENCH_APSD_PID", "0"))
    cpu = time.process_time_ns

    def daemon_cpu():
        return schedstat_ns(daemon_pid) if rank == 0 and daemon_pid else 0

    rows = []
    for rnd in range(a.warmup + a.rounds):
        row = {}
        # backward alone, no hooks
        client.barrier()
        plain_opt.zero_grad()
        d0 = daemon_cpu()
        t0 = time.monotonic_ns()
        loss = loss_fn(plain(x), y)
        t1 = tf = time.monotonic_ns()
        if a.align:
            client.barrier()
            t1 = time.monotonic_ns()
        c1 = cpu()
        loss.backward()
        t2 = time.monotonic_ns()
        row["fwd_plain"] = tf - t0
        row["backward"] = t2 - t1
        row["cpu_backward"] = cpu() - c1
        # optimizer alone
        client.barrier()
        d1 = daemon_cpu()
        c0, t0 = cpu(), time.monotonic_ns()
        plain_opt.step()
        row["optimizer"] = time.monotonic_ns() - t0
        row["cpu_optimizer"] = cpu() - c0
        # communication alone: the same gradients through the same buckets
        with torch.no_grad():
            for hp, pp in zip(hooked.parameters(), plain.parameters()):
                if hp.grad is None:
                    hp.grad = pp.grad.clone()
                else:
                    hp.grad.copy_(pp.grad)
        client.barrier()
        d2 = daemon_cpu()
        c0, t0 = cpu(), time.monotonic_ns()
        ok = dopt.synchronize()
        row["comm"] = time.monotonic_ns() - t0
        row["cpu_comm"] = cpu() - c0
        assert ok, "non-finite gradients"
        # the full step
        client.barrier()
        d3 = daemon_cpu()
        for k in events:
            events[k].clear()
        opt_time.clear()
        dopt.zero_grad()
        t0 = time.monotonic_ns()
        loss = loss_fn(hooked(x), y)
        t1 = tf = time.monotonic_ns()
        if a.align:
            client.barrier()
            t1 = time.monotonic_ns()
        c1 = cpu()
        loss.backward()
        t2 = time.monotonic_ns()
        dopt.step()
        t3 = time.monotonic_ns()
        row["cpu_step"] = cpu() - c1
        client.barrier()
        d4 = daemon_cpu()
        row["fwd_hooked"] = tf - t0
        row["bw_start"], row["bw_end"], row["step_end"] = t1, t2, t3
        row["step"] = t3 - t1
        row["step_backward"] = t2 - t1
        row["step_opt"] = opt_time[0] if opt_time else 0
        row["step_after_bw"] = t3 - t2
        row["first_queued"] = events["queued"][0] - t1 if events["queued"] else None
        row["first_start_out"] = events["start_out"][0] - t1 if events["start_out"] else None
        row["queued_before_bw_end"] = sum(1 for t in events["queued"] if t < t2)
        row["buckets"] = len(events["queued"])
        row["loss"] = float(loss)
        if rank == 0 and daemon_pid:
            row["apsd_backward"] = d1 - d0  # includes one barrier
            row["apsd_optimizer"] = d2 - d1
            row["apsd_comm"] = d3 - d2
            row["apsd_step"] = d4 - d3
        if rnd >= a.warmup:
            rows.append(row)
    client.barrier()
    client.close()
    out = {"rank": rank, "world": world, "tensors": n_tensors, "params": n_params,
           "buckets": dopt.buckets, "rows": rows, "cpu_total": time.process_time_ns()}
    pathlib.Path(a.out).write_text(json.dumps(out))


# ------------------------------------------------------------------------ driver


def first_pushes(trace_path, rows):
    """Per timed row: end of the first gradient "push" event in [bw_start, step_end]
    (ns, CLOCK_MONOTONIC), and how many pushes ended before backward did."""
    text = pathlib.Path(trace_path).read_text()
    try:
        events = json.loads(text)
    except json.JSONDecodeError:  # a trace cut short: close the array
        events = json.loads(text.rstrip().rstrip(",") + "]")
    pushes = sorted((e["ts"] * 1e3, (e["ts"] + e["dur"]) * 1e3)
                    for e in events if e.get("name") == "push"
                    and e.get("args", {}).get("tensor") != FLAG_NAME)
    out = []
    for r in rows:
        inside = [(s, e) for s, e in pushes if r["bw_start"] <= s <= r["step_end"]]
        first = min((e for _, e in inside), default=None)
        before = sum(1 for _, e in inside if e < r["bw_end"])
        out.append((first, before, len(inside)))
    return out


def run_config(a, world, tmp):
    sys.path.insert(0, str(ROOT / "worker" / "python"))
    from aps.daemon import LocalDaemon

    log = open(tmp / f"apsd-{world}.log", "w")
    daemon = LocalDaemon(output=log).start()
    env = dict(os.environ, PYTHONPATH=str(ROOT / "worker" / "python"),
               APS_ENDPOINT=daemon.endpoint, APS_WORLD_SIZE=str(world),
               APS_JOB=f"overlap{world}", BENCH_APSD_PID=str(daemon.proc.pid),
               OMP_NUM_THREADS="1")
    procs, outs, traces = [], [], []
    busy0, ours0 = machine_busy_ns(), schedstat_ns(daemon.proc.pid)
    started = time.monotonic()
    try:
        for rank in range(world):
            outs.append(tmp / f"w{world}-rank{rank}.json")
            traces.append(tmp / f"w{world}-rank{rank}.trace.json")
            e = dict(env, APS_RANK=str(rank),
                     BENCH_TRACE=str(traces[-1]) if a.trace else "")
            argv = [PYTHON, str(pathlib.Path(__file__).resolve()), "--worker",
                    "--out", str(outs[-1])] + a.worker_args
            procs.append(subprocess.Popen(argv, env=e, stdin=subprocess.DEVNULL))
        codes = []
        for p in procs:
            left = a.timeout - (time.monotonic() - started)
            try:
                codes.append(p.wait(timeout=max(1.0, left)))
            except subprocess.TimeoutExpired:
                codes.append("timeout")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()  # our own child, by pid
                p.wait()
        wall = time.monotonic() - started
        ours1 = schedstat_ns(daemon.proc.pid)
        busy1 = machine_busy_ns()
        daemon.stop()
        log.close()
    if any(c != 0 for c in codes):
        raise RuntimeError(f"{world} workers: exit codes {codes} (see {tmp})")
    results = [json.loads(o.read_text()) for o in outs]
    worker_cpu = sum(sum(r[k] for r in res["rows"] for k in
                         ("cpu_backward", "cpu_optimizer", "cpu_comm", "cpu_step"))
                     for res in results)
    if a.trace:
        for res, tr in zip(results, traces):
            for row, (first, before, n) in zip(res["rows"], first_pushes(tr, res["rows"])):
                row["first_push_end"] = None if first is None else first - row["bw_start"]
                row["lead"] = None if first is None else row["bw_end"] - first
                row["pushes_before_bw_end"] = before
                row["pushes"] = n
    return {"world": world, "results": results, "wall_s": wall,
            "machine_busy_s": (busy1 - busy0) / 1e9,
            "apsd_cpu_s": (ours1 - ours0) / 1e9 if ours0 is not None and ours1 else None,
            "timed_worker_cpu_s": worker_cpu / 1e9}


def summarize(cfg, cores):
    res = cfg["results"]
    rounds = len(res[0]["rows"])
    world = cfg["world"]

    def per_round(key, how=statistics.fmean):
        vals = []
        for i in range(rounds):
            xs = [r["rows"][i][key] for r in res if r["rows"][i].get(key) is not None]
            vals.append(how(xs) if xs else None)
        return [v for v in vals if v is not None]

    m = {k: median(per_round(k)) / 1e6 for k in
         ("backward", "comm", "optimizer", "step", "step_backward", "step_opt",
          "step_after_bw", "fwd_plain", "fwd_hooked", "first_queued", "first_start_out",
          "first_push_end", "lead")}
    # CPU per round, summed over ranks (+ apsd, measured by rank 0), ms of CPU
    rows0 = res[0]["rows"]
    for phase in ("backward", "optimizer", "comm", "step"):
        wk = median(per_round(f"cpu_{phase}", sum)) / 1e6
        ap = median([r.get(f"apsd_{phase}", 0) for r in rows0]) / 1e6
        m[f"cpu_{phase}"] = wk + ap
        m[f"cpu_{phase}_apsd"] = ap
    leads = [r["rows"][i].get("lead") for r in res for i in range(rounds)]
    leads = [x for x in leads if x is not None]
    queued = [r["rows"][i]["queued_before_bw_end"] for r in res for i in range(rounds)]
    m["lead_positive"] = (sum(1 for x in leads if x > 0), len(leads))
    m["min_lead"] = min(leads) / 1e6 if leads else float("nan")
    m["queued_before_bw_end"] = median(queued)
    m["buckets"] = len(res[0]["buckets"])
    m["pushes_before_bw_end"] = median([r["rows"][i].get("pushes_before_bw_end", 0)
                                        for r in res for i in range(rounds)])
    # Skew between ranks (one machine, one clock): when backward starts and ends.
    m["start_skew"] = median([(max(r["rows"][i]["bw_start"] for r in res) -
                               min(r["rows"][i]["bw_start"] for r in res)) / 1e6
                              for i in range(rounds)])
    m["end_skew"] = median([(max(r["rows"][i]["bw_end"] for r in res) -
                             min(r["rows"][i]["bw_end"] for r in res)) / 1e6
                            for i in range(rounds)])
    m["ideal"] = max(m["backward"], m["comm"]) + m["optimizer"]
    m["ratio"] = m["step"] / m["ideal"]
    # What 2 cores can do at best: every CPU second of the phases, spread on all cores.
    m["work_bound"] = (m["cpu_backward"] + m["cpu_comm"] + m["cpu_optimizer"]) / cores
    m["bound"] = max(m["ideal"], m["work_bound"])
    m["ratio_bound"] = m["step"] / m["bound"]
    m["serial"] = m["backward"] + m["comm"] + m["optimizer"]
    m["world"] = world
    m["rounds"] = rounds
    m["tensors"] = res[0]["tensors"]
    m["params"] = res[0]["params"]
    return m


def table(sums, a, cores):
    out = []
    label = (lambda m: f"{m['world']} (run {m['run']})") if a.repeat > 1 else \
        (lambda m: str(m["world"]))
    out.append("| workers | backward | comm | optimizer | max(b,c)+opt | step (bw+sync+opt) "
               "| ratio | verdict <= 1.15 | b+c+opt (no overlap) | other load (cores) |")
    out.append("|---|---|---|---|---|---|---|---|---|---|")
    for m in sums:
        out.append(f"| {label(m)} | {m['backward']:.1f} | {m['comm']:.1f} | "
                   f"{m['optimizer']:.1f} | {m['ideal']:.1f} | {m['step']:.1f} | "
                   f"{m['ratio']:.2f} | {'holds' if m['ratio'] <= 1.15 else 'fails'} | "
                   f"{m['serial']:.1f} | {m['others_cores']:.2f} |")
    out.append("")
    out.append("ms, medians over rounds of the mean over ranks. Other load: CPU the "
               "machine spent outside this run (other sessions), averaged over the run.")
    out.append("")
    out.append("Inside the step (ms, medians): backward with hooks, time from backward's "
               "end to step()'s end, the wrapped optimizer inside step(); first push "
               "(from backward start): queued by the hook, quantized and queued to the C "
               "I/O thread, handed to ZeroMQ (trace); lead = backward end - first push; "
               "skew: latest - earliest rank, per round.")
    out.append("")
    out.append("| workers | bw in step | after bw | opt in step | first queued | first "
               "started | first push | lead (min) | lead > 0 | buckets queued before bw "
               "end | pushes before bw end | bw start / end skew |")
    out.append("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for m in sums:
        pos, n = m["lead_positive"]
        out.append(f"| {label(m)} | {m['step_backward']:.1f} | {m['step_after_bw']:.1f} | "
                   f"{m['step_opt']:.1f} | {m['first_queued']:.1f} | "
                   f"{m['first_start_out']:.1f} | {m['first_push_end']:.1f} | "
                   f"{m['lead']:.1f} ({m['min_lead']:.1f}) | {pos}/{n} | "
                   f"{m['queued_before_bw_end']:.0f}/{m['buckets']} | "
                   f"{m['pushes_before_bw_end']:.0f}/{m['tensors']} | "
                   f"{m['start_skew']:.1f} / {m['end_skew']:.1f} |")
    out.append("")
    out.append(f"CPU per round, all workers + apsd (ms of CPU; {cores} cores), and the "
               "work bound (backward + comm + optimizer CPU) / cores:")
    out.append("")
    out.append("| workers | backward | comm (apsd) | optimizer | step (apsd) | work bound "
               "| max(ideal, work bound) | step / that | other load (cores) |")
    out.append("|---|---|---|---|---|---|---|---|---|")
    for m in sums:
        out.append(f"| {label(m)} | {m['cpu_backward']:.1f} | {m['cpu_comm']:.1f} "
                   f"({m['cpu_comm_apsd']:.1f}) | {m['cpu_optimizer']:.1f} | "
                   f"{m['cpu_step']:.1f} ({m['cpu_step_apsd']:.1f}) | {m['work_bound']:.1f} | "
                   f"{m['bound']:.1f} | {m['ratio_bound']:.2f} | {m['others_cores']:.2f} |")
    return "\n".join(out)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    p.add_argument("--workers", default="4,2,1", help="worker counts to run, in order")
    p.add_argument("--repeat", type=int, default=1, help="runs of every worker count")
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--depth", type=int, default=12, help="Linear layers (2 tensors each)")
    p.add_argument("--batch", type=int, default=192)
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--format", default="e4m3")
    p.add_argument("--scaling", default="local")
    p.add_argument("--bucket-bytes", type=int, default=256 << 10)
    p.add_argument("--no-trace", dest="trace", action="store_false")
    p.add_argument("--no-align", dest="align", action="store_false",
                   help="no barrier between forward and backward: ranks start backward "
                        "when their forward ends (staggered when processes share cores)")
    p.add_argument("--timeout", type=float, default=300, help="seconds per configuration")
    p.add_argument("--wait-quiet", type=float, default=0, metavar="S",
                   help="before each configuration, wait up to S seconds for the machine "
                        "to be idle (other sessions)")
    p.add_argument("--json", default=str(ROOT / "build" / "bench" / "overlap.json"))
    a = p.parse_args()
    if a.worker:
        return worker(a)
    a.worker_args = [f"--{k}={v}" for k, v in
                     (("rounds", a.rounds), ("warmup", a.warmup), ("width", a.width),
                      ("depth", a.depth), ("batch", a.batch), ("classes", a.classes),
                      ("lr", a.lr), ("format", a.format), ("scaling", a.scaling),
                      ("bucket-bytes", a.bucket_bytes), ("timeout", a.timeout))]
    if not a.align:
        a.worker_args.append("--no-align")
    cores = os.cpu_count()
    print(f"# MLP {a.depth} x Linear({a.width}) ({2 * a.depth} tensors), batch {a.batch}, "
          f"{a.format} scaling={a.scaling}, bucket {a.bucket_bytes} B, {a.rounds} rounds "
          f"after {a.warmup}, {'ranks aligned before backward' if a.align else 'no align'}"
          f"; {cores} cores; load average before: "
          f"{os.getloadavg()[0]:.2f}", flush=True)
    sums, raw = [], []
    with tempfile.TemporaryDirectory(prefix="bench-overlap-") as tmp:
        worlds = [int(w) for w in a.workers.split(",")]
        for run, world in [(r, w) for r in range(a.repeat) for w in worlds]:
            if a.wait_quiet > 0:
                wait_quiet(a.wait_quiet)
            cfg = run_config(a, world, pathlib.Path(tmp))
            m = summarize(cfg, cores)
            m["run"] = run + 1
            ours = (cfg["apsd_cpu_s"] or 0) + sum(r["cpu_total"] for r in cfg["results"]) / 1e9
            m["others_cores"] = max(0.0, cfg["machine_busy_s"] - ours) / cfg["wall_s"]
            m["wall_s"] = cfg["wall_s"]
            m["machine_busy_s"] = cfg["machine_busy_s"]
            sums.append(m)
            raw.append(cfg)
            print(f"# run {run + 1}, {world} workers: {m['tensors']} tensors, "
                  f"{m['params'] / 1e6:.2f} M parameters, {m['buckets']} buckets; "
                  f"step {m['step']:.1f} ms, ratio {m['ratio']:.2f}; "
                  f"run {cfg['wall_s']:.0f} s, machine busy "
                  f"{cfg['machine_busy_s'] / cfg['wall_s']:.2f} cores on average, of which "
                  f"{m['others_cores']:.2f} not ours, "
                  f"load average now {os.getloadavg()[0]:.2f}", flush=True)
    print()
    print(table(sums, a, cores))
    path = pathlib.Path(a.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"args": {k: v for k, v in vars(a).items()},
                                "machine": platform.platform(), "summary": sums,
                                "raw": raw}, indent=1, default=str))
    print(f"\n(raw rows: {path})")


if __name__ == "__main__":
    sys.exit(main())
