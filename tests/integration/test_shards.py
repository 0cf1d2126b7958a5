"""Several apsd shards (issue 8): the client spreads tensors, cut into
partitions, over independent daemons, and every rank gets the very bits one
daemon gives. itest_worker checks each result against its own computation of
the single-daemon result; the tests also compare the ranks' checksums with a
run against one daemon."""

import re
import sys

import numpy as np
import pytest

from conftest import ROOT, run_workers

sys.path.insert(0, str(ROOT / "worker" / "python"))
sys.path.append(str(ROOT / "tests" / "python"))  # ranks.py, after this directory

CHUNK = ["--chunk_bytes", "16k"]  # 4096 elements a chunk
# 20000 elements are 3 partitions of 8192, 9000 are 2; the small ones stay whole.
SIZES = [1, 7, 4097, 20000, 9000, 300]
PART_BYTES = 8192 * 4


def sums(results):
    lines = None
    for rank, (code, out) in enumerate(results):
        assert code == 0, f"rank {rank} exited {code}:\n{out}"
        got = re.findall(r"^ok step=\d+ tensor=\d+ n=\d+ sum=\w+$", out, re.M)
        assert lines is None or got == lines, f"rank {rank} differs"
        lines = got
    return lines


def endpoints(daemon_factory, n, extra=()):
    return ",".join(daemon_factory(extra=[*CHUNK, *extra]).endpoint for _ in range(n))


@pytest.mark.parametrize("shards,fmt,scaling,async_", [
    (2, "fp32", "local", 0), (3, "e4m3", "local", 0), (2, "e4m3", "local", 1),
    (3, "e3m0", "local", 1), (2, "e5m2", "global", 0), (3, "e4m3", "global", 1),
])
def test_shards_give_the_bits_of_one_daemon(daemon_factory, shards, fmt, scaling, async_):
    opts = dict(steps=2, format=fmt, scaling=scaling, async_=async_, chunk_elems=4096,
                jitter_ms=5, seed=shards * 13 + len(fmt))
    one = sums(run_workers(daemon_factory(extra=CHUNK).endpoint, 4, SIZES, **opts))
    many = sums(run_workers(endpoints(daemon_factory, shards), 4, SIZES,
                            partition_bytes=PART_BYTES, **opts))
    assert len(many) == 2 * len(SIZES)
    assert many == one


def test_shards_reproduce_the_papers_lowp_sum(daemon_factory):
    lowp = ["--sum", "lowp", "--scaling", "global"]
    assert len(sums(run_workers(endpoints(daemon_factory, 3, lowp), 3, SIZES, steps=2,
                                format="e4m3", scaling="global", lowp=1, chunk_elems=4096,
                                partition_bytes=PART_BYTES, async_=1))) == 2 * len(SIZES)


def test_partitions_spread_over_every_shard(daemon_factory):
    ds = [daemon_factory(extra=CHUNK) for _ in range(3)]
    sums(run_workers(",".join(d.endpoint for d in ds), 2, [20000], steps=1, chunk_elems=4096,
                     partition_bytes=PART_BYTES))
    for i, d in enumerate(ds):
        assert f"layer0.weight#{i}" in d.log_path.read_text(), f"shard {i} saw no partition"


def test_a_bad_endpoint_list_is_refused(daemon):
    import aps
    for bad in (f"{daemon.endpoint},", f",{daemon.endpoint}", f"{daemon.endpoint}, ,x"):
        with pytest.raises(aps.ArgumentError, match="endpoint list"):
            aps.Client(bad, 0, 1)


def test_a_missing_shard_names_itself(daemon):
    import aps
    with pytest.raises(aps.Error, match="shard 1"):
        aps.Client([daemon.endpoint, "tcp://127.0.0.1:1"], 0, 1, timeout_ms=300)


def rank_collectives(rank, world, endpoint):
    import aps
    big = np.arange(20000, dtype=np.float32) * (rank + 1)
    small = np.full(5, float(rank + 1), dtype=np.float32)
    with aps.Client(endpoint, rank, world, format="e4m3", scaling="global",
                    partition_bytes=PART_BYTES) as c:
        c.barrier()
        c.broadcast("params", big)
        c.broadcast("bias", small)
        c.barrier()
        g = (np.sin(np.arange(20000, dtype=np.float32)) * 2.0 ** -rank).astype(np.float32)
        c.allreduce("grad", g)
        c.barrier()
    return big.tolist() == (np.arange(20000, dtype=np.float32)).tolist(), \
        small.tolist(), g.tobytes()


def run_ranks(fn, world, endpoint, timeout=60):
    """fn(rank, world, endpoint) in `world` spawned processes; their results by rank."""
    import ranks  # tests/python/ranks.py
    return ranks.run_ranks(fn, world, endpoint, timeout=timeout)


def test_broadcast_barrier_and_global_mode_across_shards(daemon_factory):
    got = run_ranks(rank_collectives, 3, endpoints(daemon_factory, 3))
    for same, small, _ in got:
        assert same and small == [1.0] * 5
    assert got[0][2] == got[1][2] == got[2][2]
