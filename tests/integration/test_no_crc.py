"""Payloads without CRC32C (protocol 1.8, flag NO_CRC) against the real apsd,
spoken by hand as a stranger would: a job fixes the choice at its first HELLO,
a payload whose flag is not its job's is refused and counted, a header flagged
NO_CRC that holds a CRC is dropped as invalid, a flood of both holds nothing,
and the job still sums a good step with results flagged and CRC-less."""

import numpy as np

import aps
from conftest import SANITIZED
from peers import (ERROR, PUSH, REGISTER, REGISTERED, RESULT, WELCOME,
                   Peer, keep_alive, open_fds, rss_kib, settle)

FLAG_NO_CRC = 1 << 8
N = 256


def join(d, job, no_crc):
    flags = FLAG_NO_CRC if no_crc else 0
    peers = [Peer(d.endpoint) for _ in range(2)]
    for r, p in enumerate(peers):
        w = p.hello(job, r, 2, flags=flags, version_minor=8)
        assert w["type"] == WELCOME, w
        p.send(type=REGISTER, job=job, rank=r, world_size=2, tensor_name="t", total_count=N,
               format="e4m3")
        assert p.recv_type(REGISTERED) is not None
    return peers


def codes(rank):
    x = np.linspace(-1, 1, N).astype(np.float32) * np.float32(rank + 1)
    return bytes(aps.quantize(x, "e4m3", scale_exp=3)), x


def push(p, rank, job, data, no_crc, **fields):
    if no_crc:
        fields.setdefault("payload_crc32c", 0)
    p.send(data, type=PUSH, job=job, rank=rank, world_size=2, tensor_id=0, total_count=N,
           chunk_offset=0, chunk_count=N, format="e4m3", scale_exp=3,
           flags=FLAG_NO_CRC if no_crc else 0, version_minor=8, **fields)


def test_a_no_crc_job_sums_and_answers_without_crc(daemon):
    peers = join(daemon, "plain", no_crc=True)
    for r, p in enumerate(peers):
        push(p, r, "plain", codes(r)[0], no_crc=True)
    for p in peers:
        res = p.recv_type(RESULT)
        assert res["flags"] & FLAG_NO_CRC and res.get("payload_crc32c", 0) == 0, res
    # A HELLO that asks for CRCs is refused, saying why.
    w = Peer(daemon.endpoint).hello("plain", 1, 2, version_minor=8)
    assert w["type"] == ERROR and "without CRC32C" in w["error_text"], w


def test_a_payload_whose_flag_is_not_its_jobs_is_refused(daemon):
    for job, no_crc in (("with", False), ("without", True)):
        peers = join(daemon, job, no_crc)
        before = daemon.counter("bad_state")
        push(peers[1], 1, job, codes(1)[0], no_crc=not no_crc)
        err = peers[1].recv_type(ERROR)
        assert err is not None and "CRC32C" in err["error_text"], err
        assert daemon.counter("bad_state") == before + 1
        for r, p in enumerate(peers):  # the job goes on
            push(p, r, job, codes(r)[0], no_crc=no_crc)
        for p in peers:
            assert p.recv_type(RESULT) is not None


def test_a_flood_of_wrong_crc_flags_holds_nothing(daemon):
    """3000 pushes from a rank of a CRC job: flagged NO_CRC (refused by the job),
    flagged NO_CRC with a CRC in the header (invalid), NO_CRC with NaN codes
    (invalid): each dropped and counted, descriptors and memory stay."""
    pid = daemon.proc.pid
    peers = join(daemon, "flood", no_crc=False)
    good = codes(1)[0]
    nan = bytearray(good)
    nan[7] = 0x7f
    kinds = [(good, {}), (good, {"payload_crc32c": 0x1234}), (bytes(nan), {})]
    base_fds, base_rss = open_fds(pid), rss_kib(pid)
    state0, bad0 = daemon.counter("bad_state"), daemon.counter("bad_messages")
    for i in range(3000):
        data, fields = kinds[i % len(kinds)]
        push(peers[1], 1, "flood", data, no_crc=True, **fields)
        if i % 200 == 0:  # alive, and replies read
            keep_alive(peers, "flood", peers[1])
    for r, p in enumerate(peers):
        push(p, r, "flood", codes(r)[0], no_crc=False)
    for p in peers:
        assert p.recv_type(RESULT, 10000) is not None
    bad1 = daemon.counter("bad_messages")
    assert daemon.counter("bad_state") - state0 == 1000
    assert bad1["bad_crc"] - bad0["bad_crc"] == 1000, (bad0, bad1)
    assert bad1["nonfinite"] - bad0["nonfinite"] == 1000, (bad0, bad1)
    assert settle(lambda: open_fds(pid), base_fds) <= base_fds
    if not SANITIZED:
        assert rss_kib(pid) - base_rss < 4096, (base_rss, rss_kib(pid))
