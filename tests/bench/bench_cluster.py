#!/usr/bin/python3
"""All-reduce on emulated clusters (issue 8): apsd with 1, 2 and 4 shards in
fp32, e5m2, e4m3 and e3m0 against torch.distributed gloo (fp32, ring) over
the same shaped links, 4 workers, as root. Gloo runs twice: one all_reduce per
tensor, and as DistributedDataParallel calls it (the tensors copied into flat
25 MiB buckets, one all_reduce per bucket; --gloo-buckets).

Geometries (deploy/netcluster.py builds and removes them):
- shared: one namespace, loopback shaped to the rate; every byte shares it.
- switched: a namespace per node, a full-duplex shaped link each, one bridge.
  Shards either on nodes of their own ("dedicated") or co-located with the
  workers, shard j on worker node j ("colocated", as BytePS does).

Each apsd configuration is fresh processes: S apsd shards
(`--chunk_bytes 1M`) and 4 `build/tests/bench/bench_allreduce` workers (the
C client, every tensor started asynchronously, last layer first, a barrier
before each step) with `--endpoint` the shards' list and 1 MiB partitions.
Gloo runs its own ranks in the same namespaces. Rank 0 times each step;
after --warmup steps, --steps are timed and the median is reported.

Every figure is set beside the link limit: the bytes of one step on the
busiest link of the geometry divided by the rate (APS.md section 5; the
shard loads come from the same assignment the client computes), and beside
apsd fp32 with the same shards and gloo fp32 of the same geometry. Raw
ZeroMQ (build/tests/bench/bench_zmq_echo: apsd's bytes of one shard, chunk
by chunk, answered with one shared buffer, without protobuf, CRC, checks or
codec) runs where the one shard would, for apsd's overhead on a real link. The cost
model's prediction (tests/bench/model.py) is printed with each row.

    ninja -C build && /usr/bin/python3 tests/bench/bench_cluster.py            # ~15 min
    /usr/bin/python3 tests/bench/bench_cluster.py --quick                      # ~3 min

Tables go to stdout, everything to build/bench/cluster.json. Each process
has a deadline, the whole run a budget (--budget); namespaces and processes
are removed at the end, on failure and on SIGINT/SIGTERM.
"""

import argparse
import datetime
import json
import math
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
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "deploy"))

import bench_allreduce  # noqa: E402
import model  # noqa: E402
import netcluster  # noqa: E402
import resnet50_shapes  # noqa: E402

PYTHON = "/usr/bin/python3"
FORMATS = ["fp32", "e5m2", "e4m3", "e3m0"]
WORLD = 4
CHUNK = "1M"
PARTITION = 1 << 20
SMALL = 1 << 20  # the small model: one tensor of 1Mi elements (4 MiB fp32)
DEADLINE = [math.inf]


# ---------------------------------------------------------------- gloo worker


def gloo_worker(a):
    """One rank of torch.distributed gloo all_reduce (fp32) of the tensor set."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://{a.master}", rank=a.rank,
                            world_size=a.world, timeout=datetime.timedelta(seconds=300))
    gen = torch.Generator().manual_seed(a.rank)
    tensors = [torch.randn(n, generator=gen) * 1e-3 for n in tensor_sizes(a.tensors)]

    us = bench_allreduce.gloo_steps(dist, tensors, a.world, a.warmup, a.steps,
                                    a.gloo_bucket_mb << 20)
    dist.barrier()
    if a.rank == 0:
        print("RESULT what=step " + " ".join(f"s{i}_us={u:.1f}" for i, u in enumerate(us)),
              flush=True)
    dist.destroy_process_group()
    return 0


def tensor_sizes(spec):
    if spec == "resnet50":
        return [math.prod(s) for _, s in resnet50_shapes.resnet50_parameters()]
    return [int(spec)]


# ---------------------------------------------------------------- one configuration


def step_times(out):
    """The timed step times (s) from rank 0's RESULT line."""
    for line in out.splitlines():
        if line.startswith("RESULT what=step"):
            fields = dict(kv.split("=", 1) for kv in line.split()[1:])
            if "s0_us" in fields:  # gloo: every step
                return [float(v) / 1e6 for k, v in sorted(fields.items()) if k.endswith("_us")]
            return [float(fields["p50_us"]) / 1e6, float(fields["min_us"]) / 1e6,
                    float(fields["max_us"]) / 1e6]
    raise RuntimeError("no RESULT line")


def run_ranks(cluster, nodes, argvs, timeout, logdir, name):
    """Runs one rank per node, waits (at most timeout s); rank 0's output."""
    procs = []
    for rank, (node, argv) in enumerate(zip(nodes, argvs)):
        log = open(logdir / f"{name}.rank{rank}.log", "w")
        procs.append((cluster.start(node, argv, stdout=log, stderr=subprocess.STDOUT,
                                    env=dict(os.environ, OMP_NUM_THREADS="1",
                                             GLOO_SOCKET_IFNAME=cluster.ifname)), log))
    deadline = time.monotonic() + min(timeout, DEADLINE[0] - time.monotonic())
    codes = []
    for p, log in procs:
        try:
            codes.append(p.wait(max(1.0, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            p.kill()  # one pid: our own child
            p.wait()
            codes.append("timeout")
        log.close()
    out = (logdir / f"{name}.rank0.log").read_text()
    if any(c != 0 for c in codes):
        raise RuntimeError(f"{name}: ranks exited {codes}; rank 0 said:\n{out[-1500:]}")
    return out


def apsd_config(cluster, geo, fmt, shards, a, logdir, port):
    """S shards and 4 workers; the step times of rank 0."""
    name = f"{geo['name']}-{fmt}-s{shards}"
    shard_nodes = [WORLD + j if geo["placement"] == "dedicated" else j for j in range(shards)]
    if geo["kind"] == "shared":
        shard_nodes = [0] * shards
    endpoints = []
    for j, node in enumerate(shard_nodes):
        addr = cluster.addr(node)
        listen = f"tcp://{addr}:{port + j}"
        log = open(logdir / f"{name}.apsd{j}.log", "w")
        cluster.start(node, [str(a.build / "server/apsd"), "--listen", listen,
                             "--chunk_bytes", CHUNK, "--log_level", "warn",
                             "--stats", str(logdir / f"{name}.apsd{j}.sock"),
                             *(["--insecure", "yes"] if addr != "127.0.0.1" else [])],
                      stdout=log, stderr=subprocess.STDOUT)
        endpoints.append(listen)
    argvs = [[str(a.build / "tests/bench/bench_allreduce"), "--endpoint", ",".join(endpoints),
              "--rank", str(r), "--world", str(WORLD), "--format", fmt, "--tensors",
              a.tensors, "--steps", str(a.steps), "--warmup", str(a.warmup),
              "--partition-bytes", str(a.partition_bytes), "--timeout_ms", "120000",
              *(["--no-crc"] if not a.crc else [])]
             for r in range(WORLD)]
    try:
        out = run_ranks(cluster, range(WORLD), argvs, a.timeout, logdir, name)
    finally:
        cluster.stop_procs()  # the shards, by pid
    return step_times(out)


def raw_config(cluster, geo, fmt, a, logdir, port):
    """The bytes of apsd with one shard and nothing else: the echo server
    (build/tests/bench/bench_zmq_echo) where the shard runs, 4 echo workers
    sending each chunk's codes and getting one shared answer per chunk."""
    name = f"{geo['name']}-raw-{fmt}"
    node = WORLD if geo["placement"] == "dedicated" else 0
    listen = f"tcp://{cluster.addr(node)}:{port}"
    exe = str(a.build / "tests/bench/bench_zmq_echo")
    log = open(logdir / f"{name}.server.log", "w")
    cluster.start(node, [exe, "--serve", "--endpoint", listen, "--world", str(WORLD),
                         "--idle-exit-ms", str(int(a.timeout * 1000))],
                  stdout=log, stderr=subprocess.STDOUT)
    argvs = [[exe, "--endpoint", listen, "--rank", str(r), "--world", str(WORLD), "--format",
              fmt, "--tensors", a.tensors, "--chunk_bytes", CHUNK, "--steps", str(a.steps),
              "--warmup", str(a.warmup), "--timeout_ms", "120000"] for r in range(WORLD)]
    try:
        out = run_ranks(cluster, range(WORLD), argvs, a.timeout, logdir, name)
    finally:
        cluster.stop_procs()
    return step_times(out)


def gloo_config(cluster, geo, a, logdir, port, bucket_mb):
    name = f"{geo['name']}-gloo" + (f"-b{bucket_mb}" if bucket_mb else "")
    argvs = [[PYTHON, str(HERE / "bench_cluster.py"), "--gloo-worker", "--rank", str(r),
              "--world", str(WORLD), "--master", f"{cluster.addr(0)}:{port}", "--tensors",
              a.tensors, "--steps", str(a.steps), "--warmup", str(a.warmup),
              "--gloo-bucket-mb", str(bucket_mb)]
             for r in range(WORLD)]
    try:
        out = run_ranks(cluster, range(WORLD), argvs, a.timeout, logdir, name)
    finally:
        cluster.stop_procs()
    return step_times(out)


# ---------------------------------------------------------------- geometries


def geometries(a):
    out = []
    for rate in a.rates:
        if "shared" in a.kinds:
            out.append({"name": f"shared-{rate}", "kind": "shared", "placement": "-",
                        "rate": rate})
        for placement in a.placements:
            if "switched" in a.kinds:
                out.append({"name": f"switched-{rate}-{placement}", "kind": "switched",
                            "placement": placement, "rate": rate})
    return out


def busy_cores(seconds=1.0):
    """Cores the whole machine kept busy over the next `seconds` (/proc/stat)."""
    def sample():
        f = [int(x) for x in pathlib.Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        return sum(f[:8]) - f[3] - f[4], sum(f[:8])
    b0, t0 = sample()
    time.sleep(seconds)
    b1, t1 = sample()
    return (b1 - b0) / max(1, t1 - t0) * os.cpu_count()


def wait_quiet(limit_s, cores=0.5):
    """Waits (at most limit_s) until other work keeps under `cores` cores busy."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline and busy_cores() > cores:
        pass


def run_geometry(geo, a, logdir, results):
    nodes = WORLD + (max(a.shards) if geo["placement"] == "dedicated" else 0)
    burst = a.burst or None
    make = (lambda: netcluster.SharedMedium(geo["rate"], burst, a.mtu)) \
        if geo["kind"] == "shared" else \
        (lambda: netcluster.Switched(nodes, geo["rate"], burst, a.mtu))
    port = 5700
    with make() as cluster:
        for shards in a.shards:
            for fmt in a.formats:
                port += 10
                wait_quiet(a.wait_quiet)
                t = apsd_config(cluster, geo, fmt, shards, a, logdir, port)
                results.append(row(geo, "apsd", fmt, shards, t, a))
                say(results[-1])
        for fmt in a.formats if a.raw and 1 in a.shards else []:
            port += 10
            wait_quiet(a.wait_quiet)
            t = raw_config(cluster, geo, fmt, a, logdir, port)
            results.append(row(geo, "raw", fmt, 1, t, a))
            say(results[-1])
        for bucket_mb in a.gloo_buckets if a.gloo else []:
            port += 10
            wait_quiet(a.wait_quiet)
            t = gloo_config(cluster, geo, a, logdir, port, bucket_mb)
            system = "gloo-ddp" if bucket_mb else "gloo"
            results.append(row(geo, system, "fp32", 0, t, a))
            results[-1]["bucket_mb"] = bucket_mb
            say(results[-1])


def row(geo, system, fmt, shards, times, a):
    sizes = tensor_sizes(a.tensors)
    g = model.Geometry(kind=geo["kind"], placement=geo["placement"], workers=WORLD,
                       shards=shards, rate_bps=netcluster.parse_rate(geo["rate"]), mtu=a.mtu)
    as_system = {"raw": "apsd", "gloo-ddp": "gloo"}.get(system, system)  # the same bytes
    busiest = model.busiest_link_bytes(g, as_system, fmt, sizes, a.partition_bytes)
    limit = busiest * 8 / g.rate_bps
    pred = model.predict(g, as_system, fmt, sizes, a.partition_bytes)
    step = statistics.median(times) if system.startswith("gloo") else times[0]
    return {"geometry": geo["name"], "kind": geo["kind"], "placement": geo["placement"],
            "rate": geo["rate"], "system": system, "format": fmt, "shards": shards,
            "step_s": step, "steps_s": times, "busiest_bytes": busiest, "limit_s": limit,
            "utilisation": limit / step, "model_s": pred, "load1_after": load()[0]}


def say(r):
    print(f"# {r['geometry']} {r['system']} {r['format']} S={r['shards']}: "
          f"{r['step_s'] * 1e3:.0f} ms/step, limit {r['limit_s'] * 1e3:.0f} ms, "
          f"util {r['utilisation'] * 100:.0f}%, model {r['model_s'] * 1e3:.0f} ms, "
          f"load {r['load1_after']}",
          flush=True)


# ---------------------------------------------------------------- tables


def tables(results):
    lines = []
    for geo in dict.fromkeys(r["geometry"] for r in results):
        rows = [r for r in results if r["geometry"] == geo]
        gloo = next((r for r in rows if r["system"] == "gloo"), None)
        ddp = next((r for r in rows if r["system"] == "gloo-ddp"), None)
        lines += ["", f"### {geo}", "",
                  "| system | shards | MB on busiest link | link limit ms | ms/step | "
                  "utilisation | x apsd fp32 | x gloo | x gloo, DDP buckets | / raw ZeroMQ | "
                  "model ms | model / measured |",
                  "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|"]
        for r in rows:
            fp32 = next((x for x in rows if x["system"] == "apsd" and x["format"] == "fp32"
                         and x["shards"] == r["shards"]), None)
            raw = next((x for x in rows if x["system"] == "raw" and x["format"] == r["format"]),
                       None)
            vs32 = f"{fp32['step_s'] / r['step_s']:.2f}" if fp32 and r["system"] == "apsd" \
                else "-"
            vsg = f"{gloo['step_s'] / r['step_s']:.2f}" if gloo else "-"
            vsddp = f"{ddp['step_s'] / r['step_s']:.2f}" if ddp else "-"
            vsraw = f"{r['step_s'] / raw['step_s']:.2f}" \
                if raw and r["system"] == "apsd" and r["shards"] == 1 else "-"
            label = {"raw": f"raw ZeroMQ {r['format']}",
                     "gloo": "gloo fp32, one all_reduce per tensor",
                     "gloo-ddp": f"gloo fp32, DDP's {r.get('bucket_mb')} MiB buckets"}.get(
                r["system"], f"{r['system']} {r['format']}")
            lines.append(f"| {label} | {r['shards'] or '-'} | {r['busiest_bytes'] / 1e6:.1f} | "
                         f"{r['limit_s'] * 1e3:.0f} | {r['step_s'] * 1e3:.0f} | "
                         f"{r['utilisation'] * 100:.0f}% | {vs32} | {vsg} | {vsddp} | {vsraw} | "
                         f"{r['model_s'] * 1e3:.0f} | {r['model_s'] / r['step_s']:.2f} |")
    return "\n".join(lines)


def load():
    return pathlib.Path("/proc/loadavg").read_text().split()[:3]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", type=pathlib.Path, default=ROOT / "build")
    ap.add_argument("--rates", default="1gbit,10gbit")
    ap.add_argument("--kinds", default="shared,switched")
    ap.add_argument("--placements", default="colocated,dedicated")
    ap.add_argument("--shards", default="1,2,4")
    ap.add_argument("--formats", default=",".join(FORMATS))
    ap.add_argument("--tensors", default="resnet50", help="resnet50, or N: one tensor of N "
                    f"elements (the small model: {SMALL})")
    ap.add_argument("--burst", default="", help="tbf bucket (default: 250 us of the rate)")
    ap.add_argument("--mtu", type=int, default=1500)
    ap.add_argument("--partition-bytes", type=int, default=PARTITION,
                    help="the client's partition size (keep it a multiple of 1 MiB, the "
                    "shards' chunk_bytes)")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--no-crc", dest="crc", action="store_false",
                    help="apsd's payloads without CRC32C (the workers' no_payload_crc)")
    ap.add_argument("--no-gloo", dest="gloo", action="store_false")
    ap.add_argument("--gloo-buckets", default="0,25", metavar="MB,...",
                    help="gloo runs: 0 = one all_reduce per tensor, M = DDP's way, flat "
                    "buckets of M MiB (default both: 0,25)")
    ap.add_argument("--gloo-bucket-mb", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--no-raw", dest="raw", action="store_false",
                    help="leave out the raw ZeroMQ echo of apsd's bytes (1 server)")
    ap.add_argument("--timeout", type=float, default=240, help="s per configuration")
    ap.add_argument("--budget", type=float, default=1800, help="s for the whole run")
    ap.add_argument("--wait-quiet", type=float, default=0, metavar="S",
                    help="before each configuration wait up to S s for the machine to be "
                    "idle (under 0.5 busy cores)")
    ap.add_argument("--quick", action="store_true",
                    help="1gbit only; shared 1 shard, switched co-located 4 shards; "
                         "fp32 and e4m3; 2 timed steps")
    ap.add_argument("--out", type=pathlib.Path, default=None)
    ap.add_argument("--gloo-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--world", type=int, default=WORLD, help=argparse.SUPPRESS)
    ap.add_argument("--master", default="127.0.0.1:29500", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.gloo_worker:
        return gloo_worker(a)
    if os.geteuid() != 0:
        raise SystemExit("bench_cluster.py: needs root (network namespaces, tc)")
    a.rates, a.kinds = a.rates.split(","), a.kinds.split(",")
    a.placements, a.formats = a.placements.split(","), a.formats.split(",")
    a.shards = [int(s) for s in a.shards.split(",")]
    a.gloo_buckets = [int(m) for m in a.gloo_buckets.split(",")]
    if a.quick:
        a.rates, a.formats, a.steps = ["1gbit"], ["fp32", "e4m3"], 2
    DEADLINE[0] = time.monotonic() + a.budget
    out = a.out or a.build / "bench" / "cluster.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    results, started = [], time.monotonic()
    info = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "host": platform.node(), "kernel": platform.release(), "load_before": load(),
            "args": {k: str(v) for k, v in vars(a).items()}}
    with tempfile.TemporaryDirectory(prefix="apsd-bench-cluster-") as tmp:
        for geo in geometries(a):
            if a.quick:
                a.shards = [1] if geo["kind"] == "shared" else [4]
                if geo["kind"] == "switched" and geo["placement"] != "colocated":
                    continue
            if time.monotonic() > DEADLINE[0]:
                print(f"# budget spent: {geo['name']} skipped", flush=True)
                continue
            run_geometry(geo, a, pathlib.Path(tmp), results)
    info["load_after"] = load()
    info["seconds"] = time.monotonic() - started
    out.write_text(json.dumps({"info": info, "results": results}, indent=1))
    print(f"\nbench_cluster.py: {WORLD} workers, tensors {a.tensors}, {a.warmup} warm-up + "
          f"{a.steps} timed steps (median), load average before {info['load_before']} after "
          f"{info['load_after']}, {info['seconds']:.0f} s")
    print(tables(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
