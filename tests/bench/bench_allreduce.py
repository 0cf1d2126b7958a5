#!/usr/bin/python3
"""All-reduce benchmarks: apsd against torch.distributed (gloo) and raw ZeroMQ.

Every job runs on this machine over tcp://127.0.0.1, each in fresh processes:

1. ResNet-50 (161 tensors, 25,557,032 parameters), 4 workers: time per step
   through apsd in fp32, e5m2, e4m3 and e3m0 (APS local scaling); torch gloo
   all_reduce of the same tensors in fp32; the raw ZeroMQ echo server moving
   each format's bytes (build/tests/bench/bench_zmq_echo). CPU seconds of every
   process over the timed steps, from /proc.
2. A profile (perf record -e cpu-clock) of the daemon and of worker rank 0
   during an e4m3 run, over the timed steps only.
3. Latency: one worker, one 4 KiB tensor (1024 floats), e4m3 and fp32, blocking
   aps_client_allreduce, against a raw DEALER -> ROUTER -> DEALER round trip of
   the same bytes.
5. Engine threads (--parts threads): apsd --threads 1 (the event loop sums) against
   --threads 2 (two engine threads), ResNet-50 and the 64Mi-element tensor in e4m3,
   4 workers, each pair in one run, alternating.
6. The client's codec threads (--parts codec): one worker, one tensor of 64Mi
   elements in e4m3, codec_threads 1 against 2: the time the caller spends
   starting the all-reduce (its scan and encoding) and the whole call,
   alternating.
4. Chunk pipelining: 4 workers, one tensor of 64Mi elements (64 MiB of e4m3
   codes per worker), the daemon at --log_level debug: its tail_us per round
   against one chunk's dequantize-accumulate time measured by rank 0 in the
   same run; the time per step against raw ZeroMQ for the same bytes.

Tables go to stdout (Markdown), everything to build/bench/allreduce.json.
Every process has a deadline; stragglers are killed, by pid, at the end.

    ninja -C build && /usr/bin/python3 tests/bench/bench_allreduce.py   # ~4 min
"""

import argparse
import datetime
import json
import math
import os
import pathlib
import platform
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))

import resnet50_shapes  # noqa: E402

FORMATS = ["fp32", "e5m2", "e4m3", "e3m0"]
BITS = {"fp32": 32, "e5m2": 8, "e4m3": 8, "e3m0": 4}
WORLD = 4
CHUNK_BYTES = 4 << 20  # apsd's default chunk_bytes: 1Mi fp32 elements
PYTHON = "/usr/bin/python3"

# ---------------------------------------------------------------- processes


class Procs:
    """Every process this driver started, so that none outlives it."""

    def __init__(self):
        self.all = []

    def start(self, argv, **kw):
        p = subprocess.Popen(argv, **kw)
        self.all.append(p)
        return p

    def kill_all(self):
        for p in self.all:
            if p.poll() is None:
                p.kill()  # one pid: our own child
        for p in self.all:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass


PROCS = Procs()
DEADLINE = [math.inf]  # time.monotonic() by which the whole run must end (--budget)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid):
    """utime + stime of every thread of pid, in seconds (None once it is gone)."""
    try:
        fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_busy():
    """Busy CPU seconds of the whole machine since boot (/proc/stat, every core)."""
    f = [int(x) for x in pathlib.Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (f[0] + f[1] + f[2] + f[5] + f[6] + f[7]) / os.sysconf("SC_CLK_TCK")


def parse_result(line):
    out = {}
    for kv in line.split()[1:]:
        k, _, v = kv.partition("=")
        try:
            out[k] = float(v) if re.fullmatch(r"-?[0-9.]+(e-?[0-9]+)?", v) else v
        except ValueError:
            out[k] = v
    return out


class Perf:
    """perf record -e cpu-clock attached to some pids between start() and stop()."""

    def __init__(self, outdir, pids):
        self.outdir, self.pids, self.procs = outdir, pids, {}

    def start(self):
        for name, pid in self.pids.items():
            data = self.outdir / f"perf-{name}.data"
            for old in [data, data.with_suffix(".data.old")]:
                old.unlink(missing_ok=True)  # perf would keep the last one as .old
            self.procs[name] = PROCS.start(
                ["perf", "record", "-q", "-e", "cpu-clock", "-F", "2000", "-p", str(pid),
                 "-o", str(data)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(0.3)  # perf attaches before the timed steps run far

    def stop(self):
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGINT)
        for p in self.procs.values():
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()


def run_job(name, server_argv, worker_argvs, timeout, logdir, perf=False, env=None):
    """Starts a server (or None) and the workers; rank 0's stdout carries the results.

    Returns {"results": [...], "cpu": {...}, "wall": s, "server_log": path}.
    """
    logdir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    timeout = min(timeout, DEADLINE[0] - started)
    if timeout < 10:
        raise SystemExit(f"bench_allreduce.py: --budget spent before job {name}")
    server, server_log = None, logdir / f"{name}.server.log"
    if server_argv is not None:
        with open(server_log, "w") as f:
            server = PROCS.start(server_argv, stdout=f, stderr=subprocess.STDOUT)
        time.sleep(0.2)
    workers = []
    for rank, argv in enumerate(worker_argvs):
        if rank == 0:
            workers.append(PROCS.start(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                       text=True, env=env))
        else:
            with open(logdir / f"{name}.rank{rank}.log", "w") as f:
                workers.append(PROCS.start(argv, stdout=f, stderr=subprocess.STDOUT, env=env))
    everyone = ([server] if server else []) + workers
    timer = threading.Timer(timeout, lambda: [p.kill() for p in everyone if p.poll() is None])
    timer.start()
    pids = {f"rank{r}": p.pid for r, p in enumerate(workers)}
    if server:
        pids["server"] = server.pid
    profiler = Perf(logdir, {"server": server.pid, "rank0": workers[0].pid}) if perf else None
    out = {"name": name, "results": [], "lines": []}
    cpu0 = {}
    for line in workers[0].stdout:
        out["lines"].append(line.rstrip())
        if line.startswith("TIMED begin"):
            cpu0 = {k: cpu_seconds(p) for k, p in pids.items()}
            busy0, window0 = machine_busy(), time.monotonic()
            if profiler:
                profiler.start()
        elif line.startswith("TIMED end"):
            if profiler:
                profiler.stop()
            cpu1 = {k: cpu_seconds(p) for k, p in pids.items()}
            out["cpu"] = {k: cpu1[k] - cpu0[k] for k in pids
                          if cpu0.get(k) is not None and cpu1.get(k) is not None}
            out["window"] = time.monotonic() - window0  # timed steps and their barriers
            # Everything else the machine ran meanwhile (other sessions, perf).
            out["cpu"]["others"] = machine_busy() - busy0 - sum(out["cpu"].values())
        elif line.startswith("RESULT"):
            out["results"].append(parse_result(line))
    codes = []
    for p in workers:
        try:
            codes.append(p.wait(timeout=max(1.0, timeout - (time.monotonic() - started))))
        except subprocess.TimeoutExpired:
            p.kill()
            codes.append("timeout")
    if server:
        if server.poll() is None:
            server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
    timer.cancel()
    out["wall"] = time.monotonic() - started
    out["server_log"] = str(server_log)
    if any(c != 0 for c in codes) or not out["results"]:
        tail = "\n".join(out["lines"][-10:])
        raise SystemExit(f"bench_allreduce.py: job {name} failed (exit codes {codes}); "
                         f"rank 0 said:\n{tail}\nlogs in {logdir}")
    return out


def step_result(job, what="step"):
    return next(r for r in job["results"] if r["what"] == what)


# ---------------------------------------------------------------- the jobs


def apsd_argv(build, port, extra=()):
    level = [] if "--log_level" in extra else ["--log_level", "info"]
    return [str(build / "server/apsd"), "--listen", f"tcp://127.0.0.1:{port}", *level, *extra]


def apsd_job(a, name, fmt, tensors, world, steps, warmup, extra_worker=(), extra_server=(),
             perf=False, timeout=150):
    port = free_port()
    workers = [[str(a.build / "tests/bench/bench_allreduce"),
                "--endpoint", f"tcp://127.0.0.1:{port}", "--rank", str(r), "--world", str(world),
                "--format", fmt, "--tensors", str(tensors), "--steps", str(steps),
                "--warmup", str(warmup), *extra_worker] for r in range(world)]
    return run_job(name, apsd_argv(a.build, port, extra_server), workers, timeout, a.out,
                   perf=perf)


def echo_job(a, name, fmt, tensors, world, steps, warmup, timeout=120):
    port = free_port()
    exe = str(a.build / "tests/bench/bench_zmq_echo")
    server = [exe, "--serve", "--endpoint", f"tcp://127.0.0.1:{port}", "--world", str(world),
              "--idle-exit-ms", str(timeout * 1000)]
    workers = [[exe, "--endpoint", f"tcp://127.0.0.1:{port}", "--rank", str(r), "--world",
                str(world), "--format", fmt, "--tensors", str(tensors), "--chunk_bytes",
                str(CHUNK_BYTES), "--steps", str(steps), "--warmup", str(warmup)]
               for r in range(world)]
    return run_job(name, server, workers, timeout, a.out)


def gloo_job(a, steps, warmup, timeout=180):
    port = free_port()
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    workers = [[PYTHON, str(HERE / "bench_allreduce.py"), "--gloo-worker", "--rank", str(r),
                "--world", str(WORLD), "--port", str(port), "--steps", str(steps),
                "--warmup", str(warmup)] for r in range(WORLD)]
    return run_job("gloo-fp32", None, workers, timeout, a.out, env=env)


def torch_cat_into(group, flat):
    offset = 0
    for t in group:
        flat[offset:offset + t.numel()].copy_(t.view(-1))
        offset += t.numel()


def ddp_buckets(tensors, bucket_bytes, first_bytes=1 << 20):
    """DDP's buckets (torch's compute_bucket_assignment_by_size): the tensors last
    layer first, a bucket closed once it holds bucket_bytes of fp32 or more (the
    first once it holds first_bytes, DDP's 1 MiB), each with a flat buffer."""
    import torch
    groups, group, size = [], [], 0
    for t in reversed(tensors):
        group.append(t)
        size += t.numel() * 4
        if size >= (first_bytes if not groups else bucket_bytes):
            groups.append(group)
            group, size = [], 0
    if group:
        groups.append(group)
    return [(g, torch.empty(sum(t.numel() for t in g))) for g in groups]


def gloo_steps(dist, tensors, world, warmup, steps, bucket_bytes=0):
    """warmup, then steps all-reduce steps of tensors through gloo (each after a
    barrier); returns the timed steps' microseconds. bucket_bytes 0: one
    all_reduce per tensor, every one started last layer first, then waited for;
    else as DistributedDataParallel does it: the tensors copied into flat buckets
    of bucket_bytes (25 MiB is DDP's default), one all_reduce per bucket, the
    results copied back."""
    buckets = ddp_buckets(tensors, bucket_bytes) if bucket_bytes else None

    def step():
        if not buckets:
            works = [dist.all_reduce(t, async_op=True) for t in reversed(tensors)]
            for w, t in zip(works, reversed(tensors)):
                w.wait()
                t.div_(world)  # apsd returns the mean; gloo the sum
            return
        works = []
        for group, flat in buckets:
            torch_cat_into(group, flat)
            works.append(dist.all_reduce(flat, async_op=True))
        for w, (group, flat) in zip(works, buckets):
            w.wait()
            flat.div_(world)
            offset = 0
            for t in group:
                t.view(-1).copy_(flat[offset:offset + t.numel()])
                offset += t.numel()

    for _ in range(warmup):
        dist.barrier()
        step()
    us = []
    for _ in range(steps):
        dist.barrier()
        t0 = time.perf_counter()
        step()
        us.append((time.perf_counter() - t0) * 1e6)
    return us


def gloo_worker(a):
    """One rank of torch.distributed gloo all_reduce of ResNet-50's tensors, fp32."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{a.port}", rank=a.rank,
                            world_size=a.world, timeout=datetime.timedelta(seconds=120))
    gen = torch.Generator().manual_seed(a.rank)
    tensors = [torch.randn(*shape, generator=gen) * 2.0 ** -(8 + (i * 7) % 17)
               for i, (_, shape) in enumerate(resnet50_shapes.resnet50_parameters())]

    gloo_steps(dist, tensors, a.world, a.warmup, 0)
    print("TIMED begin", flush=True)
    c0 = time.process_time()
    us = gloo_steps(dist, tensors, a.world, 0, a.steps)
    cpu = time.process_time() - c0
    print("TIMED end", flush=True)
    dist.barrier()
    if a.rank == 0:
        us.sort()
        q = lambda f: us[max(0, math.ceil(f * len(us)) - 1)]  # noqa: E731 nearest rank
        n = sum(t.numel() for t in tensors)
        print(f"RESULT what=step n={len(us)} min_us={us[0]:.1f} p10_us={q(0.1):.1f} "
              f"p50_us={q(0.5):.1f} p90_us={q(0.9):.1f} p99_us={q(0.99):.1f} "
              f"max_us={us[-1]:.1f} mean_us={statistics.mean(us):.1f} "
              f"cpu_ms_per_sample={cpu * 1e3 / len(us):.3f} format=fp32 tensors=resnet50 "
              f"n_tensors={len(tensors)} elements={n} world={a.world} mode=gloo "
              f"bytes_up={4 * n}", flush=True)
    dist.destroy_process_group()
    return 0


# ---------------------------------------------------------------- profile


def perf_top(data, sort, limit):
    """[(percent, fields...)] of perf report's flat profile."""
    if not data.exists():
        return []
    r = subprocess.run(["perf", "report", "-i", str(data), "--stdio", "--no-children",
                        "--sort", sort, "--percent-limit", "0.5"],
                       capture_output=True, text=True, timeout=120)
    rows = []
    for line in r.stdout.splitlines():
        m = re.match(r"\s+([0-9.]+)%\s+(.*)$", line)
        if m:
            rows.append((float(m[1]), re.sub(r"\s+", " ", m[2]).strip()))
    return rows[:limit]


# ---------------------------------------------------------------- tables


def ms(us):
    return f"{us / 1e3:.1f}"


def table_resnet(res):
    gloo = step_result(res["gloo"])["p50_us"]
    echo_fp32 = step_result(res["echo"]["fp32"])
    # The loopback "link" of the cost model, from the raw fp32 run: every byte
    # goes up once and down once per worker (APS.md 5, one shared medium).
    b_eff = 2 * WORLD * echo_fp32["bytes_up"] / (echo_fp32["p50_us"] * 1e-6)
    lines = [
        f"Effective loopback bandwidth B (raw ZeroMQ fp32, 2 x {WORLD} x 97.5 MiB per step): "
        f"{b_eff / 1e9:.2f} GB/s",
        "",
        "| all-reduce | MiB up per worker | p50 ms/step | p10 | p90 | x gloo | raw ZeroMQ "
        "p50 ms (same bytes) | x raw | model ms (2 N bytes / B) | CPU ms/step: workers | "
        "daemon | cores busy (ours) | cores busy (others) |",
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    rows = [(f"apsd {f}", res["apsd"][f], res["echo"][f]) for f in FORMATS]
    rows.append(("gloo fp32 (ring)", res["gloo"], res["echo"]["fp32"]))
    rows.append(("raw ZeroMQ fp32 echo", res["echo"]["fp32"], None))
    rows.append(("raw ZeroMQ 8-bit echo", res["echo"]["e4m3"], None))
    rows.append(("raw ZeroMQ 4-bit echo", res["echo"]["e3m0"], None))
    for label, job, echo in rows:
        r = step_result(job)
        cpu = job.get("cpu", {})
        wcpu = sum(v for k, v in cpu.items() if k.startswith("rank")) / r["n"] * 1e3
        scpu = cpu.get("server", 0.0) / r["n"] * 1e3
        others = max(0.0, cpu.get("others", 0.0)) / r["n"] * 1e3
        per_step_ms = job["window"] / r["n"] * 1e3  # wall, barriers included
        hops = 2 * (WORLD - 1) if label.startswith("gloo") else 2 * WORLD
        model = hops * r["bytes_up"] / b_eff * 1e6
        raw = "- | -"
        if echo:
            e = step_result(echo)["p50_us"]
            raw = f"{ms(e)} | {r['p50_us'] / e:.2f}"
        lines.append(f"| {label} | {r['bytes_up'] / 2**20:.1f} | {ms(r['p50_us'])} | "
                     f"{ms(r['p10_us'])} | {ms(r['p90_us'])} | {r['p50_us'] / gloo:.2f} | "
                     f"{raw} | {ms(model)} | {wcpu:.0f} | {scpu:.0f} | "
                     f"{(wcpu + scpu) / per_step_ms:.2f} | {others / per_step_ms:.2f} |")
    lines += ["", "CPU per step against its floor: raw ZeroMQ moving the same bytes (its "
              "workers' and server's CPU in this run) plus the codec's own passes over them "
              "(timed on one core by rank 0 after its steps: 4 workers' exponent, quantize "
              "and dequantize, and the daemon's 4 dequantize-accumulates, divide, exponent "
              "and quantize per chunk; no CRC, no check).", "",
              "| all-reduce | CPU ms/step | raw ZeroMQ CPU ms | codec passes ms | floor ms | "
              "x floor |", "|---|--:|--:|--:|--:|--:|"]
    for f in FORMATS:
        job, echo = res["apsd"][f], res["echo"][f]
        floor_w = next((r for r in job["results"] if r["what"] == "codec_floor_worker"), None)
        floor_d = next((r for r in job["results"] if r["what"] == "codec_floor_daemon"), None)
        if floor_w is None or floor_d is None:
            continue
        codec = (WORLD * floor_w["p50_us"] + floor_d["p50_us"]) / 1e3
        raw = cpu_per_step(echo)
        cpu = cpu_per_step(job)
        lines.append(f"| apsd {f} | {cpu:.0f} | {raw:.0f} | {codec:.0f} | {raw + codec:.0f} | "
                     f"{cpu / (raw + codec):.2f} |")
    return "\n".join(lines)


def cpu_per_step(job):
    """Workers' and server's CPU ms per timed step."""
    r = step_result(job)
    cpu = job.get("cpu", {})
    return sum(v for k, v in cpu.items() if k.startswith("rank") or k == "server") / r["n"] * 1e3


def table_threads(res):
    lines = ["| job, e4m3, 4 workers | apsd threads | p50 ms/step | p10 | p90 | "
             "CPU ms/step: workers | daemon | engine busy ms/step |",
             "|---|--:|--:|--:|--:|--:|--:|--:|"]
    for (what, threads), job in sorted(res.items()):
        r = step_result(job)
        cpu = job.get("cpu", {})
        wcpu = sum(v for k, v in cpu.items() if k.startswith("rank")) / r["n"] * 1e3
        scpu = cpu.get("server", 0.0) / r["n"] * 1e3
        busy = job.get("engine_busy_ms")
        busy = f"{busy / (r['n'] + job['warmup']):.1f}" if busy is not None else "-"
        lines.append(f"| {what} | {threads} | {ms(r['p50_us'])} | {ms(r['p10_us'])} | "
                     f"{ms(r['p90_us'])} | {wcpu:.0f} | {scpu:.0f} | {busy} |")
    return "\n".join(lines)


def table_codec(res):
    lines = ["| one worker, 64Mi elements, e4m3 | codec_threads | start (scan + encode) p50 ms | "
             "min | whole call p50 ms | worker CPU ms/call |", "|---|--:|--:|--:|--:|--:|"]
    for (run, threads), job in sorted(res.items()):
        s, r = step_result(job, "start"), step_result(job)
        cpu = job.get("cpu", {}).get("rank0", 0.0) / r["n"] * 1e3
        lines.append(f"| run {run} | {threads} | {ms(s['p50_us'])} | {ms(s['min_us'])} | "
                     f"{ms(r['p50_us'])} | {cpu:.0f} |")
    return "\n".join(lines)


def engine_busy_ms(log_path):
    """The daemon's engine time over the whole job, from its last counters line."""
    text = pathlib.Path(log_path).read_text() if log_path else ""
    found = re.findall(r"engine_busy_ms=([0-9.]+)", text)
    return float(found[-1]) if found else None


def table_latency(res):
    lines = ["| call (1 worker, 1024 floats) | payload bytes | p50 us | p99 us | "
             "x raw p50 | x raw p99 | CPU us/call (worker) |",
             "|---|--:|--:|--:|--:|--:|--:|"]
    for f in ["e4m3", "fp32"]:
        for label, job, raw in [(f"apsd {f}", res["apsd"][f], res["echo"][f]),
                                (f"raw ZeroMQ {f} bytes", res["echo"][f], None)]:
            r = step_result(job)
            x = step_result(raw) if raw else None
            lines.append(f"| {label} | {r['bytes_up']:.0f} | {r['p50_us']:.1f} | "
                         f"{r['p99_us']:.1f} | {r['p50_us'] / x['p50_us']:.2f} | "
                         f"{r['p99_us'] / x['p99_us']:.2f} | {r['cpu_ms_per_sample'] * 1e3:.1f} |"
                         if x else
                         f"| {label} | {r['bytes_up']:.0f} | {r['p50_us']:.1f} | "
                         f"{r['p99_us']:.1f} | - | - | {r['cpu_ms_per_sample'] * 1e3:.1f} |")
    return "\n".join(lines)


def tails_of(log, warmup):
    """tail_us of every round of the log, timed steps only."""
    tails = []
    for line in pathlib.Path(log).read_text().splitlines():
        m = re.search(r"\bround\b.*\bstep=(\d+)\b.*\btail_us=([0-9.]+)", line)
        if m and int(m[1]) >= warmup:
            tails.append(float(m[2]))
    return tails


def table_chunk(res):
    tails = res["tails"]
    hot = step_result(res["apsd"], "chunk_accumulate_hot")
    cold = step_result(res["apsd"], "chunk_accumulate_cold")
    deq = step_result(res["apsd"], "chunk_dequantize")
    enc = step_result(res["apsd"], "chunk_encode")
    r = step_result(res["apsd"])
    e = step_result(res["echo"])
    t50 = statistics.median(tails) if tails else float("nan")
    lines = [
        f"One tensor of {int(r['elements'])} elements, e4m3 ({r['bytes_up'] / 2**20:.0f} MiB of "
        f"codes per worker), {WORLD} workers, chunks of {CHUNK_BYTES >> 22} Mi elements.",
        "",
        "| quantity | median | min | max |",
        "|---|--:|--:|--:|",
        f"| daemon tail_us, {len(tails)} timed rounds | {t50:.0f} | "
        f"{min(tails, default=float('nan')):.0f} | {max(tails, default=float('nan')):.0f} |",
    ]
    for label, x in [("one chunk dequantize-accumulate, buffers in cache (us)", hot),
                     ("one chunk dequantize-accumulate, cold buffers (us)", cold),
                     ("one chunk dequantize (us)", deq),
                     ("one chunk encode: max-abs, exponent, quantize (us)", enc)]:
        lines.append(f"| {label} | {x['p50_us']:.0f} | {x['min_us']:.0f} | {x['max_us']:.0f} |")
    lines += [
        f"| tail / hot accumulate | {t50 / hot['p50_us']:.2f} | | |",
        f"| tail / cold accumulate | {t50 / cold['p50_us']:.2f} | | |",
        f"| apsd ms per step | {ms(r['p50_us'])} | {ms(r['min_us'])} | {ms(r['max_us'])} |",
        f"| raw ZeroMQ ms per step (same bytes) | {ms(e['p50_us'])} | {ms(e['min_us'])} | "
        f"{ms(e['max_us'])} |",
        f"| apsd / raw ZeroMQ | {r['p50_us'] / e['p50_us']:.2f} | | |",
    ]
    return "\n".join(lines)


def table_profile(prof):
    lines = []
    for who in ["server", "rank0"]:
        title = "apsd (every thread)" if who == "server" else "worker rank 0 (every thread)"
        lines += [f"{title}: by thread " + ", ".join(f"{c} {p:.1f}%" for p, c in
                                                      prof[who]["comm"]),
                  "", "| % of samples | object | symbol |", "|--:|---|---|"]
        for p, rest in prof[who]["sym"]:
            obj, _, sym = rest.partition(" ")
            lines.append(f"| {p:.1f} | {obj} | {sym} |")
        lines.append("")
    return "\n".join(lines)


# ---------------------------------------------------------------- main


def machine():
    model = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo")
                  if l.startswith("model name")), "?")
    try:
        rev = subprocess.run(["git", "-C", str(ROOT), "describe", "--always", "--dirty"],
                             capture_output=True, text=True).stdout.strip()
    except OSError:
        rev = "?"
    return {"cpu": model, "cores": os.cpu_count(), "kernel": platform.release(),
            "python": platform.python_version(), "tree": rev,
            "mem_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", type=pathlib.Path, default=ROOT / "build")
    ap.add_argument("--out", type=pathlib.Path, default=None,
                    help="logs, perf data and allreduce.json (default BUILD/bench)")
    ap.add_argument("--steps", type=int, default=20, help="timed ResNet-50 steps")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--latency-calls", type=int, default=20000)
    ap.add_argument("--chunk-elements", default="64M", help="elements of the big tensor")
    ap.add_argument("--parts", default="resnet,profile,latency,chunk,threads,codec")
    ap.add_argument("--budget", type=float, default=570,
                    help="seconds for the whole run: each job's deadline is cut to fit")
    ap.add_argument("--gloo-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--world", type=int, default=WORLD, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.gloo_worker:
        return gloo_worker(a)
    a.out = a.out or a.build / "bench"
    a.out.mkdir(parents=True, exist_ok=True)
    parts = a.parts.split(",")
    if resnet50_shapes.read_header() != [(n, math.prod(s)) for n, s in
                                         resnet50_shapes.resnet50_parameters()]:
        raise SystemExit("tests/bench/resnet50_shapes.h is stale: run resnet50_shapes.py --write")
    for exe in ["server/apsd", "tests/bench/bench_allreduce", "tests/bench/bench_zmq_echo"]:
        if not (a.build / exe).exists():
            raise SystemExit(f"{a.build / exe} is missing: ninja -C {a.build}")
    info = {"machine": machine(), "started": time.strftime("%Y-%m-%dT%H:%M:%S")}
    print(f"# bench_allreduce: {info['machine']}\n", flush=True)
    t_start = time.monotonic()
    DEADLINE[0] = t_start + a.budget
    try:
        if "resnet" in parts:
            res = {"apsd": {}, "echo": {}}
            for f in FORMATS:
                res["apsd"][f] = apsd_job(a, f"resnet-apsd-{f}", f, "resnet50", WORLD, a.steps,
                                          a.warmup, extra_worker=["--codec-floor"])
                print(f"apsd {f}: {step_result(res['apsd'][f])['p50_us'] / 1e3:.1f} ms/step",
                      flush=True)
            for f in FORMATS:  # e5m2 and e4m3 move the same bytes: both run, as a check
                res["echo"][f] = echo_job(a, f"resnet-echo-{f}", f, "resnet50", WORLD,
                                          a.steps, a.warmup)
            res["gloo"] = gloo_job(a, a.steps, a.warmup)
            info["resnet"] = res
            print("\n## ResNet-50, 4 workers\n\n" + table_resnet(res) + "\n", flush=True)
        if "profile" in parts and shutil.which("perf"):
            job = apsd_job(a, "profile-apsd-e4m3", "e4m3", "resnet50", WORLD, 8, 2, perf=True)
            prof = {w: {"sym": perf_top(a.out / f"perf-{w}.data", "dso,sym", 15),
                        "comm": perf_top(a.out / f"perf-{w}.data", "comm", 6),
                        "dso": perf_top(a.out / f"perf-{w}.data", "dso", 8)}
                    for w in ["server", "rank0"]}
            info["profile"] = {"job": job, "perf": prof}
            print("## Profile, e4m3 (perf record -e cpu-clock, timed steps only)\n\n"
                  + table_profile(prof), flush=True)
        if "latency" in parts:
            res = {"apsd": {}, "echo": {}}
            for f in ["e4m3", "fp32"]:
                res["apsd"][f] = apsd_job(a, f"latency-apsd-{f}", f, 1024, 1, a.latency_calls,
                                          2000, extra_worker=["--blocking"])
                res["echo"][f] = echo_job(a, f"latency-echo-{f}", f, 1024, 1,
                                          a.latency_calls, 2000)
            info["latency"] = res
            print("## Latency, 4 KiB, one worker\n\n" + table_latency(res) + "\n", flush=True)
        if "threads" in parts:
            res = {}
            for rep in range(2):  # alternating, so that load drifts hit both
                for threads in (1, 2):
                    for what, tensors, steps, warmup in [("ResNet-50", "resnet50", a.steps,
                                                          a.warmup),
                                                         ("one 64Mi tensor", a.chunk_elements,
                                                          4, 1)]:
                        job = apsd_job(a, f"threads-{threads}-{what[:6]}-{rep}", "e4m3",
                                       tensors, WORLD, steps, warmup,
                                       extra_server=["--threads", str(threads)], timeout=300)
                        job["warmup"] = warmup
                        job["engine_busy_ms"] = engine_busy_ms(job.get("server_log"))
                        key = (f"{what} (run {rep + 1})", threads)
                        res[key] = job
            info["threads"] = {f"{k[0]} threads={k[1]}": v for k, v in res.items()}
            print("## Engine threads\n\n" + table_threads(res) + "\n", flush=True)
        if "codec" in parts:
            res = {}
            for rep in range(2):
                for threads in (1, 2):
                    res[(rep + 1, threads)] = apsd_job(
                        a, f"codec-{threads}-{rep}", "e4m3", a.chunk_elements, 1, 6, 1,
                        extra_worker=["--codec-threads", str(threads)])
            info["codec"] = {f"run {k[0]} codec_threads={k[1]}": v for k, v in res.items()}
            print("## The client's codec threads\n\n" + table_codec(res) + "\n", flush=True)
        if "chunk" in parts:
            n = a.chunk_elements
            res = {"apsd": apsd_job(a, "chunk-apsd-e4m3", "e4m3", n, WORLD, 5, 1,
                                    extra_worker=["--time-chunk", str(CHUNK_BYTES // 4)],
                                    extra_server=["--log_level", "debug"], timeout=300),
                   "echo": echo_job(a, "chunk-echo-e4m3", "e4m3", n, WORLD, 5, 1)}
            res["tails"] = tails_of(res["apsd"]["server_log"], 1)
            info["chunk"] = res
            print("## Chunk pipelining\n\n" + table_chunk(res) + "\n", flush=True)
    finally:
        PROCS.kill_all()
        info["seconds"] = round(time.monotonic() - t_start, 1)
        (a.out / "allreduce.json").write_text(json.dumps(info, indent=1, default=str))
    print(f"total {info['seconds']} s; logs and allreduce.json in {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
