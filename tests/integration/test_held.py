"""max_held_bytes: a push that comes before a lower rank's is held until its
turn (the sum is in rank order), and such pushes of every job together are
bounded. Past the bound a push is not kept: a client of protocol 1.10 is asked
for it again (AGAIN) when its turn comes; for an older one the tensor's step
fails for every rank (APS_ENOMEM) and is made again.

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
    assert d.counter("unread_dropped") == 0 and d.counter("reconnects") == 0


def join(d, job, world, n, minor, source=None):
    """world ranks of job (from source, an address of 127.0.0.0/8, if given)."""
    endpoint = d.endpoint.replace("tcp://", f"tcp://{source}:0;") if source else d.endpoint
    peers = [Peer(endpoint) for _ in range(world)]
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


def gather(peers, job, world, codes, crc, want_again):
    """Every rank's RESULT, pushing again each chunk an AGAIN asks for; returns
    the results by rank and how many AGAINs came."""
    results, asked = {}, 0
    deadline = time.monotonic() + 15
    while len(results) < world and time.monotonic() < deadline:
        for r, p in enumerate(peers):
            msg = p.recv(0) if r not in results else None
            if msg is None:
                continue
            if msg["type"] == AGAIN:
                assert want_again
                assert msg.get("tensor_id", 0) == 0 and msg.get("chunk_offset", 0) == 0, msg
                assert msg["chunk_count"] == len(codes) and msg["rank"] == r, msg
                asked += 1
                push(p, job, r, world, codes, 10, crc)
            elif msg["type"] == RESULT:
                results[r] = msg
        time.sleep(0.001)
    assert len(results) == world, sorted(results)
    return results, asked


def assert_mean(results, n, value):
    for res in results.values():
        mean = aps.dequantize(np.frombuffer(res["payload"], np.uint8), res["format"], n,
                              res.get("scale_exp", 0))
        assert np.all(mean == value), mean[:4]


def test_a_job_whose_rank_0_never_pushes_holds_at_most_the_bound(daemon_factory):
    # A job of 16 ranks, rank 0 silent but alive: ranks 1-15 push 1 MiB each,
    # then 5 times again (a stranger's flood). apsd keeps 4 MiB of them, no
    # more, and says nothing to the ranks it declined until their turn. Then
    # rank 0 pushes: the declined ranks are asked in turn and the round ends.
    d = daemon_factory(extra=["--max_held_bytes", "4M", "--chunk_bytes", "4M"])
    n, world = 1 << 20, 16
    codes = bytes(aps.quantize(np.full(n, 0.5, np.float32), "e4m3", scale_exp=0))
    crc = crc32c(codes)  # once: it takes peers.py a while
    peers = join(d, "j", world, n, minor=10)
    for r in range(1, world):
        push(peers[r], "j", r, world, codes, 10, crc)
    time.sleep(0.5)
    keep_alive(peers, "j", peers[0])
    assert d.counter("held_bytes") == 4 << 20
    assert d.ask("jobs")["jobs"][0]["held_bytes"] == 4 << 20  # which job holds it
    assert d.counter("pushes_declined") == 11  # 15 pushed, the first 4 kept
    assert all(peers[r].recv_type(ERROR, 0) is None for r in range(1, world))
    # What libzmq read at once (15 MiB) stays in malloc's heap; 75 MiB more,
    # the 11 declined again (nothing said) and the 4 kept refused as sent twice,
    # leave it where it was
    after_burst = rss_kib(d.proc.pid)
    bad_state = d.counter("bad_state")
    for _ in range(5):
        for r in range(1, world):
            push(peers[r], "j", r, world, codes, 10, crc)
        time.sleep(0.2)
        keep_alive(peers, "j", peers[0])
    assert d.counter("pushes_declined") == 11 + 5 * 11
    assert d.counter("bad_state") == bad_state + 5 * 4
    assert d.counter("held_bytes") == 4 << 20
    if not SANITIZED:
        assert rss_kib(d.proc.pid) - after_burst < 16 << 10, (after_burst, rss_kib(d.proc.pid))
    for p in peers:  # the refusals of the kept ranks' second pushes
        while p.recv(0) is not None:
            pass
    push(peers[0], "j", 0, world, codes, 10, crc)
    results, asked = gather(peers, "j", world, codes, crc, want_again=True)
    assert asked == 11 == d.counter("asked_again")
    assert_mean(results, n, 0.5)
    assert d.counter("held_bytes") == 0
    for p in peers:
        p.close()


def test_a_job_past_its_fair_part_gives_up_room_to_another(daemon_factory):
    # The stranger's job of the test above holds the whole 4 MiB. An honest job
    # (4 ranks, rank 0 up to 60 ms late) comes: it holds nothing, so the
    # stranger gives up pushes for it (what it needs, never below the
    # stranger's fair part: half, two jobs holding), and the honest ranks'
    # early pushes are kept, not declined (before: every one was declined and
    # asked again, a round trip more each). The stranger's ranks given up are
    # asked in their turn, and its mean is exact too.
    d = daemon_factory(extra=["--max_held_bytes", "4M", "--chunk_bytes", "4M"])
    n, world = 1 << 20, 16
    codes = bytes(aps.quantize(np.full(n, 0.5, np.float32), "e4m3", scale_exp=0))
    crc = crc32c(codes)
    peers = join(d, "stranger", world, n, minor=10)
    for r in range(1, world):
        push(peers[r], "stranger", r, world, codes, 10, crc)
    time.sleep(0.5)
    keep_alive(peers, "stranger", peers[0])
    assert d.counter("held_bytes") == 4 << 20 and d.counter("pushes_declined") == 11
    procs = [start_worker(d.endpoint, r, 4, [300000, 4097], steps=6, timeout_ms=20000,
                          job="honest", jitter_ms=60 if r == 0 else 0) for r in range(4)]
    while any(p.poll() is None for p in procs):
        keep_alive(peers, "stranger", peers[0])
        time.sleep(0.3)
    assert_all_ok(collect(procs, 60), 6, 2)
    assert d.counter("pushes_declined") == 11  # no honest push was
    given_up = d.counter("pushes_given_up")  # 1 MiB each: the honest job held < 1 MiB
    assert given_up == 1, given_up
    held = {j["name"]: j["held_bytes"] for j in d.ask("jobs")["jobs"]}
    assert held["stranger"] == 3 << 20 == d.counter("held_bytes"), held
    push(peers[0], "stranger", 0, world, codes, 10, crc)
    results, asked = gather(peers, "stranger", world, codes, crc, want_again=True)
    assert asked == 11 + given_up == d.counter("asked_again")
    assert_mean(results, n, 0.5)
    assert d.counter("held_bytes") == 0
    for p in peers:
        p.close()


def test_jobs_from_one_address_share_one_fair_part(daemon_factory):
    # Before: each job had a fair part of max_held_bytes, so a stranger's second
    # job from the same address took half the bound from its first (and 16
    # jobs, max_jobs_per_address, 16 parts: every honest job's share gone). Now
    # the jobs started from one address (not 127.0.0.1, ::1 or ipc, a host's own)
    # share one part; a job from another address gets a part of its own.
    d = daemon_factory(extra=["--max_held_bytes", "4M", "--chunk_bytes", "4M"])
    n, world = 1 << 20, 8
    codes = bytes(aps.quantize(np.full(n, 0.5, np.float32), "e4m3", scale_exp=0))
    crc = crc32c(codes)
    a = join(d, "a", world, n, minor=10, source="127.0.0.2")
    b = join(d, "b", world, n, minor=10, source="127.0.0.2")
    for r in range(1, world):
        push(a[r], "a", r, world, codes, 10, crc)
    time.sleep(0.5)
    for r in range(1, world):
        push(b[r], "b", r, world, codes, 10, crc)
    time.sleep(0.5)
    held = {j["name"]: j["held_bytes"] for j in d.ask("jobs")["jobs"]}
    assert held == {"a": 4 << 20, "b": 0}, held  # before: 2 MiB each, 2 given up
    assert d.counter("pushes_given_up") == 0
    assert d.counter("pushes_declined") == 3 + 7
    c = join(d, "c", 2, n, minor=10, source="127.0.0.3")
    push(c[1], "c", 1, 2, codes, 10, crc)
    time.sleep(0.5)
    held = {j["name"]: j["held_bytes"] for j in d.ask("jobs")["jobs"]}
    assert held == {"a": 3 << 20, "b": 0, "c": 1 << 20}, held
    assert d.counter("pushes_given_up") == 1
    for job, peers in (("a", a), ("b", b), ("c", c)):
        push(peers[0], job, 0, len(peers), codes, 10, crc)
        results, _ = gather(peers, job, len(peers), codes, crc, want_again=True)
        assert_mean(results, n, 0.5)
    assert d.counter("held_bytes") == 0
    for p in a + b + c:
        p.close()


def test_an_old_clients_held_step_gives_way_to_another_job(daemon_factory):
    # Before: held pushes of clients older than 1.10 were never given up (they
    # cannot be asked again), so a job of such clients whose rank 0 stayed away
    # held the whole bound as long as it sent heartbeats, and every early push
    # of every other job was declined and asked again (100 of 100 in the
    # attack). Now such a job's step is dropped for another job's pushes, as
    # when its own push is declined: each of its ranks' calls fails
    # APS_ENOMEM, and the step made again sums.
    d = daemon_factory(extra=["--max_held_bytes", "4M", "--chunk_bytes", "4M"])
    n, world = 1 << 20, 5
    codes = bytes(aps.quantize(np.full(n, 0.25, np.float32), "e4m3", scale_exp=0))
    crc = crc32c(codes)
    old = join(d, "old", world, n, minor=9)
    for r in range(1, world):
        push(old[r], "old", r, world, codes, 9, crc)
    time.sleep(0.5)
    keep_alive(old, "old", old[0])
    assert d.counter("held_bytes") == 4 << 20 and d.counter("pushes_declined") == 0
    procs = [start_worker(d.endpoint, r, 4, [300000, 4097], steps=6, timeout_ms=20000,
                          job="honest", jitter_ms=60 if r == 0 else 0) for r in range(4)]
    while any(p.poll() is None for p in procs):
        keep_alive(old, "old", old[0])
        time.sleep(0.3)
    assert_all_ok(collect(procs, 60), 6, 2)
    assert d.counter("pushes_declined") == 0  # before: most honest early pushes
    assert d.counter("held_steps_dropped") == 1 and d.counter("pushes_given_up") == 0
    for r in range(1, world):  # rank 0's were read by keep_alive
        err = old[r].recv_type(ERROR, 5000)
        assert err is not None and err["error_code"] == ENOMEM, (r, err)
        assert "gave what this step held to another job's" in err["error_text"], err
    for r, p in enumerate(old):  # each in its turn: nothing early to hold
        push(p, "old", r, world, codes, 9, crc)
        time.sleep(0.3)
    results, _ = gather(old, "old", world, codes, crc, want_again=False)
    assert_mean(results, n, 0.25)
    assert d.counter("held_bytes") == 0
    for p in old:
        p.close()


def test_an_old_client_declined_fails_the_step_for_every_rank(daemon_factory):
    # A client of protocol 1.9 cannot be asked again: when its push is declined
    # the tensor's step is dropped, every rank's call of it fails APS_ENOMEM
    # saying why, and the same step made again sums (in rank order here: a
    # connection's push can pass another's on its way, 1 run in 200).
    d = daemon_factory(extra=["--max_held_bytes", "1M", "--chunk_bytes", "4M"])
    n, world = 1 << 20, 3
    codes = bytes(aps.quantize(np.full(n, 0.25, np.float32), "e4m3", scale_exp=0))
    crc = crc32c(codes)
    peers = join(d, "old", world, n, minor=9)
    push(peers[1], "old", 1, world, codes, 9, crc)  # kept: 1 MiB
    time.sleep(0.3)
    push(peers[2], "old", 2, world, codes, 9, crc)  # declined
    for r, p in enumerate(peers):
        err = p.recv_type(ERROR, 5000)
        assert err is not None and err["error_code"] == ENOMEM, (r, err)
        assert "max_held_bytes" in err["error_text"] and "rank 2's client (protocol 1.9)" \
            in err["error_text"], err
    assert d.counter("held_bytes") == 0 and d.counter("pushes_declined") == 1
    for r, p in enumerate(peers):  # each in its turn (on time: nothing early to hold)
        push(p, "old", r, world, codes, 9, crc)
        time.sleep(0.3)
    results, _ = gather(peers, "old", world, codes, crc, want_again=False)
    assert_mean(results, n, 0.25)
    assert d.counter("asked_again") == 0
