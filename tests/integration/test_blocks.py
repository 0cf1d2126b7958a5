"""Block scaling (issue 18) against the real apsd, spoken by hand as a stranger
would from aps.proto: a block-scaled push is summed exactly, and every way a
peer can get its blocks wrong (other block sizes, no exponents, an exponent
of -128, a chunk that does not start on a block) is refused with a reason or
dropped as invalid, counted, and leaves the job working."""

import numpy as np

import aps
from conftest import SANITIZED
from peers import (ERROR, PUSH, REGISTER, REGISTERED, RESULT, WELCOME,
                   Peer, keep_alive, open_fds, rss_kib, settle)

SCALING_BLOCK = 4  # aps.proto ScalingMode
N = 200  # 7 blocks of 32, the last one short


def join(d, job, block=32):
    peers = [Peer(d.endpoint) for _ in range(2)]
    for r, p in enumerate(peers):
        w = p.hello(job, r, 2, scaling=SCALING_BLOCK, block_size=block)
        assert w["type"] == WELCOME and w["block_size"] == block, w
        p.send(type=REGISTER, job=job, rank=r, world_size=2, tensor_name="t", total_count=N,
               format="fp4")
        assert p.recv_type(REGISTERED)["format"] == "fp4"
    return peers


def payload(x, block=32):
    codes, exps = aps.quantize_blocks(x, "fp4", block=block)
    return bytes(codes) + bytes(exps.view(np.uint8))


def push(p, rank, job, data, **fields):
    fields = {"block_size": 32, "format": "fp4", "chunk_offset": 0, "chunk_count": N, **fields}
    p.send(data, type=PUSH, job=job, rank=rank, world_size=2, tensor_id=0, total_count=N,
           **fields)


def values(rank):
    x = np.linspace(-3, 5, N).astype(np.float32) * np.float32(2.0 ** (10 * rank))
    x[64:96] *= np.float32(2.0 ** -30)  # a quiet block (the third) among loud ones
    return x


def test_a_block_scaled_push_is_summed_exactly(daemon):
    peers = join(daemon, "exact")
    for r, p in enumerate(peers):
        push(p, r, "exact", payload(values(r)))
    acc = sum(aps.dequantize_blocks(*aps.quantize_blocks(values(r), "fp4"), "fp4", N)
              for r in range(2))
    want = aps.dequantize_blocks(*aps.quantize_blocks(acc / np.float32(2), "fp4"), "fp4", N)
    for p in peers:
        res = p.recv_type(RESULT)
        assert res["block_size"] == 32 and res.get("scale_exp", 0) == 0
        raw = np.frombuffer(res["payload"], np.uint8)
        assert raw.size == N // 2 + 7  # codes, then one exponent per block
        got = aps.dequantize_blocks(raw[:N // 2], raw[N // 2:].view(np.int8), "fp4", N)
        assert np.array_equal(got, want)
        assert np.count_nonzero(got[64:96]) > 24  # the quiet block kept its values
    t, = [t for t in daemon.ask("tensors")["tensors"] if t["job"] == "exact"]
    assert t["block_size"] == 32
    assert t["bits_per_element"] == (N // 2 + 7) * 8 / N  # 4 bits and the exponents


def test_wrong_blocks_are_refused_and_the_job_goes_on(daemon):
    peers = join(daemon, "wrong")
    x = values(1)
    good = payload(x)
    bad_exp = bytearray(good)
    bad_exp[N // 2 + 3] = 0x80  # -128
    refused = [
        (payload(x, 16), {"block_size": 16}),  # other blocks than the job's
        (bytes(aps.quantize(x, "fp4", scale_exp=0)), {"block_size": 0}),  # no exponents
    ]
    for data, fields in refused:
        push(peers[1], 1, "wrong", data, **fields)
        err = peers[1].recv_type(ERROR)
        assert err is not None and "blocks of" in err["error_text"], err
    before = daemon.counter("bad_messages")
    invalid = [(bytes(bad_exp), {}),  # an exponent that would scale by 2^128
               (good[:N // 2], {}),  # the exponents left off
               (good, {"block_size": 24})]  # no such block size
    for data, fields in invalid:
        push(peers[1], 1, "wrong", data, **fields)
    daemon.wait_for_log("block 3 has exponent -128")
    daemon.wait_for_log("block size 24 is not 16, 32 or 64")
    after = daemon.counter("bad_messages")
    assert after["bad_scale"] - before["bad_scale"] == 2, (before, after)
    assert after["bad_length"] - before["bad_length"] == 1, (before, after)
    # The job still sums a good step.
    for r, p in enumerate(peers):
        push(p, r, "wrong", payload(values(r)))
    for p in peers:
        assert p.recv_type(RESULT) is not None


def test_a_flood_of_wrong_blocks_holds_nothing(daemon):
    """3000 block-scaled pushes wrong in six ways from a rank of the job: each is
    dropped and counted, descriptors and memory stay where they
    were, and the job still sums a good step."""
    pid = daemon.proc.pid
    peers = join(daemon, "flood")
    base_fds, base_rss = open_fds(pid), rss_kib(pid)
    good = payload(values(1))
    bad_exp = bytearray(good)
    bad_exp[N // 2 + 1] = 0x80
    kinds = [(bytes(bad_exp), {}), (good[:-1], {}), (good, {"block_size": 16}),
             (good, {"block_size": 0}), (good, {"chunk_offset": 32, "chunk_count": N - 32}),
             (b"\0" * 10, {"block_size": 48})]
    before = daemon.counter("bad_messages")
    for i in range(3000):
        data, fields = kinds[i % len(kinds)]
        push(peers[1], 1, "flood", data, **fields)
        if i % 200 == 0:  # alive, and replies read
            keep_alive(peers, "flood", peers[1])
    for r, p in enumerate(peers):
        push(p, r, "flood", payload(values(r)))
    for p in peers:
        assert p.recv_type(RESULT, 10000) is not None
    after = daemon.counter("bad_messages")
    # every kind fails the validator (its length or its exponents do not fit the header)
    dropped = sum(after[k] - before[k] for k in after)
    assert dropped == 3000, (before, after)
    assert settle(lambda: open_fds(pid), base_fds) <= base_fds
    if not SANITIZED:
        assert rss_kib(pid) - base_rss < 4096, (base_rss, rss_kib(pid))
