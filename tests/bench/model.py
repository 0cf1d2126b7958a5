#!/usr/bin/python3
"""Cost model of one all-reduce step (APS.md section 5), per geometry.

The time of a step is the bytes on the busiest link over its rate, plus the
latency terms; what the link carries comes from the geometry:

- ring all-reduce (gloo): every node sends and receives 2(N-1)/N of the
  tensor; 2(N-1) latencies. On a shared medium the N nodes' traffic adds up:
  2(N-1) tensors.
- apsd: every worker pushes its codes (U bytes) and receives the mean in the
  same format. One shard on its own node carries N*U each way; S dedicated
  shards divide that by S (exactly: shard s carries N * load_s, the loads of
  the client's own assignment, worker/shards.c); S shards co-located on
  worker nodes: node j carries (N-1)*load_j + (U - load_j) each way, which is
  U (N+S-2)/S when balanced. On a shared medium all 2*N*U bytes share it.
  2 latencies (4 in global mode: the exponent exchange).
- The rate a tbf-shaped link gives to payload: tbf counts whole frames, so a
  1500-byte MTU carries 1448 bytes of TCP payload (timestamps on) per 1514
  bytes of frame: 95.6%.

The model knows no CPU: where the cores, not the link, set the pace (loopback,
10 Gbit/s on this 2-core machine), it predicts too little, and says so only by
the comparison in docs/PERFORMANCE.md.

    /usr/bin/python3 tests/bench/model.py --kind switched --placement colocated \\
        --shards 4 --format e4m3 --rate 1gbit          # one prediction
    /usr/bin/python3 tests/bench/model.py --extrapolate  # 64 and 512 workers
"""

import argparse
import dataclasses
import math
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

BITS = {"fp32": 32, "bf16": 16, "fp16": 16, "e5m2": 8, "e4m3": 8, "e4m3fn": 8, "e3m0": 4}
HEADERS = 52 + 14  # IPv4 20 + TCP 20 + timestamps 12; Ethernet 14 (what tbf counts)


@dataclasses.dataclass
class Geometry:
    kind: str  # "shared" or "switched"
    placement: str  # "dedicated", "colocated" (switched apsd), "-" otherwise
    workers: int
    shards: int  # 0 for the ring
    rate_bps: float
    latency_s: float = 25e-6  # one way through the emulated switch (veth + bridge)
    mtu: int = 1500


def packed(fmt, n):
    return (n * BITS[fmt] + 7) // 8


def shard_loads(sizes, fmt, shards, partition_bytes):
    """Bytes each shard receives from one worker: the client's assignment
    (worker/shards.c): partitions of partition_bytes/4 elements, each to the
    least loaded shard, in registration order."""
    part = max(8, (partition_bytes // 4) & ~7)
    loads = [0] * shards
    for n in sizes:
        for off in range(0, n, part):
            s = loads.index(min(loads))
            loads[s] += packed(fmt, min(part, n - off))
    return loads


def busiest_link_bytes(g, system, fmt, sizes, partition_bytes=4 << 20):
    """Bytes one step puts on the busiest link, in its busier direction (for a
    shared medium: all of them)."""
    n, N = sum(sizes), g.workers
    if system == "gloo":
        full = 4 * n
        return 2 * (N - 1) * full if g.kind == "shared" else 2 * (N - 1) / N * full
    up = sum(packed(fmt, k) for k in sizes)
    if g.kind == "shared":
        return 2 * N * up
    loads = shard_loads(sizes, fmt, g.shards, partition_bytes)
    if g.placement == "dedicated":
        return max(N * max(loads), up)
    # co-located: shard j on worker node j; nodes without a shard carry U
    return max(max((N - 1) * load + up - load for load in loads), up)


def payload_share(mtu):
    return (mtu - 52) / (mtu + 14)


def predict(g, system, fmt, sizes, partition_bytes=4 << 20, scaling="local"):
    """Seconds per step."""
    link = busiest_link_bytes(g, system, fmt, sizes, partition_bytes) * 8 / (
        g.rate_bps * payload_share(g.mtu))
    if system == "gloo":
        hops = 2 * (g.workers - 1)
    else:
        hops = 4 if scaling == "global" else 2
    return link + hops * g.latency_s


def resnet50_sizes():
    import resnet50_shapes
    return [math.prod(s) for _, s in resnet50_shapes.resnet50_parameters()]


def parse_rate(rate):
    for unit, f in (("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3)):
        if rate.endswith(unit):
            return float(rate[: -len(unit)]) * f
    return float(rate)


def partition_for(sizes, shards):
    """A partition size that spreads the tensors evenly: about 16 pieces per
    shard, a power of two between 4 KiB and 4 MiB of fp32."""
    want = 4 * sum(sizes) / (16 * shards)
    return int(min(4 << 20, max(4 << 10, 2 ** math.floor(math.log2(want)))))


def extrapolate(rate_bps, workers=(64, 512), shards=(1, 8, 32)):
    """Rows (workers, system, seconds per ResNet-50 step) on a switched network
    (full-duplex links of rate_bps, one per node). Co-located shards also on
    every worker node (S = N), the arrangement whose traffic equals the ring's."""
    sizes = resnet50_sizes()
    rows = []
    for N in workers:
        ring = Geometry("switched", "-", N, 0, rate_bps)
        rows.append((N, "ring all-reduce fp32", predict(ring, "gloo", "fp32", sizes)))
        for fmt in ("fp32", "e4m3"):
            for placement in ("dedicated", "colocated"):
                for S in (*shards, N) if placement == "colocated" else shards:
                    g = Geometry("switched", placement, N, S, rate_bps)
                    t = predict(g, "apsd", fmt, sizes, partition_for(sizes, S))
                    rows.append((N, f"apsd {fmt}, {S} {placement} shard{'s' * (S > 1)}", t))
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kind", default="switched", choices=["shared", "switched"])
    ap.add_argument("--placement", default="colocated", choices=["dedicated", "colocated"])
    ap.add_argument("--system", default="apsd", choices=["apsd", "gloo"])
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--shards", type=int, default=1)
    ap.add_argument("--format", default="e4m3", choices=sorted(BITS))
    ap.add_argument("--rate", default="1gbit")
    ap.add_argument("--partition-bytes", type=int, default=1 << 20)
    ap.add_argument("--elements", type=int, default=0, help="one tensor (0: ResNet-50)")
    ap.add_argument("--extrapolate", action="store_true")
    a = ap.parse_args()
    rate = parse_rate(a.rate)
    if a.extrapolate:
        print(f"ResNet-50 ({sum(resnet50_sizes()):,} parameters), switched, {a.rate} per "
              "node, 25 us one way, MTU 1500")
        print("| workers | system | s/step | x ring |\n|--:|---|--:|--:|")
        ring = {}
        for N, name, t in extrapolate(rate):
            ring.setdefault(N, t)
            print(f"| {N} | {name} | {t:.3f} | {ring[N] / t:.2f} |")
        return 0
    sizes = [a.elements] if a.elements else resnet50_sizes()
    g = Geometry(a.kind, a.placement, a.workers, a.shards, rate)
    b = busiest_link_bytes(g, a.system, a.format, sizes, a.partition_bytes)
    t = predict(g, a.system, a.format, sizes, a.partition_bytes)
    print(f"busiest link {b / 1e6:.1f} MB, link limit {b * 8 / rate * 1e3:.0f} ms, "
          f"predicted {t * 1e3:.0f} ms per step")
    return 0


if __name__ == "__main__":
    sys.exit(main())
