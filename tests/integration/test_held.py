"""max_held_bytes: a push that comes before a lower rank's is held until its
turn (the sum is in rank order), and such pushes of every job together are
bounded. Past the bound a push is not kept: a client of protocol 1.10 is asked
for it again (AGAIN) when its turn comes, an older one gets APS_ENOMEM.

Before (2026-12-07): nothing bounded them. A job whose rank 0 never pushed
held every other rank's pushes: 15 ranks of a 16M-element e4m3 tensor took
apsd from 93 to 236 MiB, and ranks x tensor bytes have no limit but max_ranks
(1024) and max_job_bytes (8G) per job, 64 jobs."""

import time

import numpy as np

import aps
from conftest import SANITIZED, collect, start_worker
from peers import (AGAIN, ENOMEM, ERROR, PUSH, REGISTER, REGISTERED, RESULT, WELCOME, Peer,
                   crc32c, keep_alive, rss_kib)
from test_daemon import assert_all_ok


def test_early_pushes_past_the_bound_are_asked_again_and_sum_exactly(daemon_factory):
    # Rank 0 late at every step (up to 60 ms), room for about one early push of
    # the large tensor: ranks 1-3 are asked again at their turn. itest_worker
    # checks every result against the rank-ordered mean, bit for bit.
    d = daemon_factory(extra=["--max_held_bytes", "600k", "--chunk_bytes", "1M"])
    sizes = [300000, 2500000, 4097]  # 1, 3 and 1 chunks of e4m3
    procs = [start_worker(d.endpoint, r, 4, sizes, steps=6, timeout_ms=20000,
                          jitter_ms=60 if r == 0 else 0) for r in range(4)]
    out = collect(procs, 120)
    assert_all_ok(out, 6, len(sizes))
    declined, asked = d.counter("pushes_declined"), d.counter("asked_again")
    assert declined > 0 and asked == declined, (declined, asked)
    assert d.counter("held_bytes") == 0
    assert d.counter("errors_sent") == 0


def join(d, job, world, n, minor):
    peers = [Peer(d.endpoint) for _ in range(world)]
    for r, p in enumerate(peers):
        w = p.hello(job, r, world, version_minor=minor)
        assert w["type"] == WELCOME, w
        p.send(type=REGISTER, job=job, rank=r, world_size=world, tensor_name="t",
               total_count=n, format="e4m3", version_minor=minor)
        assert p.recv_type(REGISTERED) is not None
    return peers


def push(p, job, rank, world, codes, minor, crc):
    p.send(codes, type=PUSH, job=job, rank=rank, world_size=world, tensor_id=0,
           total_count=len(codes), chunk_offset=0, chunk_count=len(codes), format="e4m3",
           scale_exp=0, version_minor=minor, payload_crc32c=crc)


def test_a_job_whose_rank_0_never_pushes_holds_at_most_the_bound(daemon_factory):
    # Two jobs of 16 ranks each, rank 0 silent but alive: ranks 1-15 push 1 MiB
    # each. apsd keeps 4 MiB of them, no more; the ranks of old clients are told
    # APS_ENOMEM, those of new ones nothing until their turn. Then rank 0 of the
    # new job pushes: its declined ranks are asked in turn and the round ends.
    d = daemon_factory(extra=["--max_held_bytes", "4M", "--chunk_bytes", "4M"])
    n, world = 1 << 20, 16
    codes = bytes(aps.quantize(np.full(n, 0.5, np.float32), "e4m3", scale_exp=0))
    crc = crc32c(codes)  # once: it takes peers.py a while
    old = join(d, "old", world, n, minor=9)
    new = join(d, "new", world, n, minor=10)
    for r in range(1, world):
        push(old[r], "old", r, world, codes, 9, crc)
        push(new[r], "new", r, world, codes, 10, crc)
    time.sleep(0.5)
    keep_alive(old, "old", old[0])
    keep_alive(new, "new", new[0])
    assert 0 < d.counter("held_bytes") <= 4 << 20
    # 30 ranks pushed 1 MiB, 4 were kept (as they came); the rest declined, the
    # old clients told so
    assert d.counter("pushes_declined") == 26
    refusals = {r: old[r].recv_type(ERROR, 2000) for r in range(1, world)}
    told = [r for r, m in refusals.items() if m is not None]
    assert len(told) == 13 and all(refusals[r]["error_code"] == ENOMEM and "max_held_bytes" in
                                   refusals[r]["error_text"] for r in told), refusals
    assert all(new[r].recv_type(ERROR, 0) is None for r in range(1, world))
    # What libzmq read at once (30 MiB) stays in malloc's heap; 65 MiB more of
    # pushes, each declined again, leave it where it was
    after_burst = rss_kib(d.proc.pid)
    for _ in range(5):
        for r in told:
            push(old[r], "old", r, world, codes, 9, crc)
        for r in told:
            assert old[r].recv_type(ERROR, 5000)["error_code"] == ENOMEM, r
    keep_alive(old, "old", old[0])
    keep_alive(new, "new", new[0])
    assert d.counter("pushes_declined") == 26 + 5 * 13
    assert d.counter("held_bytes") <= 4 << 20
    if not SANITIZED:
        assert rss_kib(d.proc.pid) - after_burst < 16 << 10, (after_burst, rss_kib(d.proc.pid))
    # rank 0 comes: each declined new rank is asked in turn, pushes again, and
    # every rank gets the mean
    push(new[0], "new", 0, world, codes, 10, crc)
    results, asked = {}, 0
    deadline = time.monotonic() + 15
    while len(results) < world and time.monotonic() < deadline:
        for r, p in enumerate(new):
            msg = p.recv(0) if r not in results else None
            if msg is None:
                continue
            if msg["type"] == AGAIN:
                assert msg.get("tensor_id", 0) == 0 and msg.get("chunk_offset", 0) == 0, msg
                assert msg["chunk_count"] == n and msg["rank"] == r, msg
                asked += 1
                push(p, "new", r, world, codes, 10, crc)
            elif msg["type"] == RESULT:
                results[r] = msg
        time.sleep(0.001)
    assert len(results) == world, sorted(results)
    assert asked == 13 == d.counter("asked_again")
    for res in results.values():
        mean = aps.dequantize(np.frombuffer(res["payload"], np.uint8), res["format"], n,
                              res.get("scale_exp", 0))
        assert np.all(mean == 0.5), mean[:4]
    for p in old + new:
        p.close()
