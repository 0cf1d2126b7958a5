"""A stranger's attacks on apsd (issue 15), from the protocol alone: each test is
one row of docs/RELIABILITY.md's table of what a peer may do and what apsd does
about it. Every one of them aborted, leaked or let the stranger in before the
fix (the note of the change says which did what)."""

import os
import socket
import struct
import subprocess
import sys
import time

import numpy as np
import pytest
import zmq

import aps
from conftest import SANITIZED, run_workers
from peers import (BROADCAST, BYE, EACCES, ENOSESSION, ERANGE, ERROR, ETIMEDOUT, FLAG_ALIVE,
                   FLAG_NO_CRC, FLAG_RESUME, HEARTBEAT, HELLO, NULL_GREETING, PULL, PUSH, REGISTER,
                   REGISTERED, RESULT, WELCOME, Peer, crc32c, envelope, open_fds, ready_bomb,
                   rss_kib, settle, zmtp_frame)
from test_daemon import assert_all_ok

FAST = ["--heartbeat_ms", "200", "--heartbeat_timeout_ms", "1000"]


def rid():
    return b"\x81" + os.urandom(15)


def alive(d):
    assert d.proc.poll() is None, "apsd died: " + d.log_path.read_text()[-3000:]


def stranger_heartbeat(peer, job="j", rank=0, world_size=2):
    peer.send(type=HEARTBEAT, job=job, rank=rank, world_size=world_size)


def flood_a_live_id(endpoint, dups, pause_s, owner_closes=True):
    """An owner of a routing id, then dups connections with the same id that fill
    their parked pipe and close (what libzmq never frees while the owner is
    there); the owner closes last, or is returned open."""
    x = rid()
    owner = Peer(endpoint, x)
    stranger_heartbeat(owner)
    # its answer: apsd has the owner's id, before a dup with the same id comes
    assert owner.recv() is not None
    for _ in range(dups):
        dup = Peer(endpoint, x, sndhwm=0, linger_ms=2000)
        for _ in range(3000):
            dup.send_raw(b"\x00" * 2000)
        time.sleep(pause_s)
        dup.close()
    if not owner_closes:
        return owner
    owner.close()


def take_over_one_id(endpoint, times, message=None):
    """A connection with a routing id, then times new ones with the same id, each
    opened (and given message, if any) while the one before is still open."""
    def send(peer, *frames):
        try:  # a connection turned away has no pipe to queue on: a send would block
            peer.send_raw(*frames, flags=zmq.NOBLOCK)
        except zmq.Again:
            pass

    heartbeat = envelope(type=HEARTBEAT, job="j", rank=0, world_size=2)
    x = rid()
    old = Peer(endpoint, x)
    send(old, heartbeat)
    for _ in range(times):
        new = Peer(endpoint, x, linger_ms=2000 if message else 0)
        send(new, heartbeat)
        if message:
            send(new, message)
        time.sleep(0.002)
        send(old, heartbeat)
        old.close()
        old = new
    old.close()


def a_job_still_works(d, job="after"):
    assert_all_ok(run_workers(d.endpoint, 2, [7, 4097], steps=2, job=job), 2, 2)


@pytest.mark.parametrize("grace", ["1500", "0"])
def test_a_takeover_whose_old_connection_speaks_again_does_not_abort(daemon_factory, grace):
    # Before: "Assertion failed: !_io_error (src/stream_engine_base.cpp:331)" about two
    # heartbeats after A closed, every run (libzmq's ZMTP heartbeat on a connection
    # whose input had stopped; the takeover had stopped A's).
    d = daemon_factory(extra=[*FAST, "--reconnect_grace_ms", grace])
    for _ in range(3):
        x = rid()
        a = Peer(d.endpoint, x)
        assert a.hello("j", 0, 2)["type"] == WELCOME
        b = Peer(d.endpoint, x)
        stranger_heartbeat(b)
        time.sleep(0.2)
        stranger_heartbeat(a)
        time.sleep(0.1)
        a.close()
        time.sleep(0.6)  # more than two heartbeat_ms
        b.close()
        alive(d)
    a_job_still_works(d)


def test_slow_readers_that_close_do_not_abort(daemon_factory):
    # Before: the same abort 0.5-0.8 s after the close, 3 runs of 4 (the engines'
    # input had stopped while apsd's replies waited; the peers closed).
    d = daemon_factory(extra=FAST)
    base = open_fds(d.proc.pid)
    for _ in range(2):
        peers = [Peer(d.endpoint, rid(), sndhwm=0) for _ in range(8)]
        for p in peers:
            for _ in range(12000):
                stranger_heartbeat(p)
        time.sleep(0.5)
        for p in peers:
            p.close()
        time.sleep(0.8)
        alive(d)
    assert settle(lambda: open_fds(d.proc.pid), base, slack=4) <= base + 4
    a_job_still_works(d)


def test_a_peer_that_never_reads_its_replies_is_dropped(daemon_factory):
    # Before: its replies waited in one queue of 65536 for every peer together,
    # scanned on every send, and then every peer's replies were dropped.
    d = daemon_factory()
    base = open_fds(d.proc.pid)
    p = Peer(d.endpoint, rid(), sndhwm=0, rcvhwm=1, rcvbuf=4096)
    for _ in range(30000):
        stranger_heartbeat(p)
    deadline = time.monotonic() + 10
    while d.counter("slow_readers") == 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert d.counter("slow_readers") == 1
    assert settle(lambda: open_fds(d.proc.pid), base, slack=2) <= base + 2
    a_job_still_works(d)
    p.close()


def unread_answers(d, calls, pull):
    """A job of one rank that makes calls of one 1 Mi-element tensor (PUSH of
    every step, or PULL of its weights in optimize mode) and never reads what
    apsd answers, until apsd drops it. Returns the peer."""
    n = 1 << 20
    p = Peer(d.endpoint, rid(), rcvhwm=1, rcvbuf=4096)
    fields = dict(job="unread", rank=0, world_size=1, version_minor=10)
    hello = p.hello(optimizer="sgd", **fields) if pull else p.hello(**fields)
    assert hello["type"] == WELCOME, hello
    p.send(type=REGISTER, tensor_name="w", total_count=n, format="e4m3", **fields)
    assert p.recv_type(REGISTERED) is not None
    chunk = dict(tensor_id=0, total_count=n, chunk_offset=0, chunk_count=n, **fields)
    if pull:  # the weights: rank 0's broadcast
        weights = np.ones(n, np.float32).tobytes()
        p.send(weights, type=BROADCAST, format="fp32", payload_crc32c=crc32c(weights), **chunk)
        assert p.recv_type(BROADCAST) is not None
    codes = bytes(n)
    crc = crc32c(codes)
    for step in range(calls):
        if pull:
            p.send(type=PULL, tensor_id=0, **fields)
        else:
            p.send(codes, type=PUSH, step=step, format="e4m3", payload_crc32c=crc, **chunk)
        deadline = time.monotonic() + 5  # the step's round ends before the next push
        while (not pull and d.counter("rounds") <= step and time.monotonic() < deadline
               and d.counter("unread_dropped") == 0):
            time.sleep(0.01)
        if d.counter("unread_dropped") > 0:
            break
        time.sleep(0.02)
    return p


@pytest.mark.parametrize("pull", [False, True])
def test_a_rank_that_never_reads_its_answers_is_cut_off(daemon_factory, pull):
    # Before (2026-12-07): every answer waited for the peer, 1000 in libzmq's
    # pipe and 4096 more in apsd's queue, each a step's result (or a pull's copy
    # of the weights): 400 steps of a 4 MiB fp32 result took apsd from 6 MiB to
    # 1.6 GB, and more steps would have taken the host's memory. Now a new call
    # of a tensor whose answers libzmq has not sent drops the connection. (40
    # calls here: 40 MiB of e4m3 results, 160 MiB of pulled weights, before.)
    d = daemon_factory()
    base = rss_kib(d.proc.pid)
    p = unread_answers(d, 40, pull)
    assert d.counter("unread_dropped") >= 1
    assert "tensor=w unsent=" in d.log_path.read_text()
    if not SANITIZED:  # a step or two, not 40 (a pull's job holds weights, state, view)
        grown = rss_kib(d.proc.pid) - base
        assert grown < (64 << 10 if pull else 24 << 10), (base, grown)
    p.close()
    a_job_still_works(d)


@pytest.mark.parametrize("pull", [False, True])
def test_jobs_after_jobs_on_a_connection_that_never_reads_are_cut_off(daemon_factory, pull):
    # (found by an attack on a7cab35, 2026-12-07) A job's answers are bounded by
    # its tensors' tallies, which end with the job: a connection that never read
    # started job after job (HELLO, REGISTER, a step or pulls, BYE), and the
    # answers of every ended job stayed queued for it, counted nowhere: 30 jobs
    # of a 4 MiB tensor took apsd to 280 MiB. Now answers waiting for a rank
    # past what its job may have in flight drop the connection.
    d = daemon_factory(extra=["--chunk_bytes", "1k"])
    base = rss_kib(d.proc.pid)
    n, per = 1 << 20, 256  # 4096 chunks of 256 floats
    data = np.ones(per, np.float32).tobytes()
    p = Peer(d.endpoint, rid(), rcvhwm=1, rcvbuf=4096)
    p.sock.setsockopt(zmq.SNDTIMEO, 3000)
    for k in range(30):
        fields = dict(job=f"atk{k}", rank=0, world_size=1, version_minor=10)
        try:
            p.send(type=HELLO, flags=FLAG_NO_CRC, **({"optimizer": "sgd"} if pull else {}),
                   **fields)
            p.send(type=REGISTER, tensor_name="w", total_count=n, format="fp32", **fields)
            for off in range(0, n, per):
                p.send(data, type=BROADCAST if pull else PUSH, step=0, tensor_id=0,
                       total_count=n, chunk_offset=off, chunk_count=per, format="fp32",
                       flags=FLAG_NO_CRC, payload_crc32c=0, **fields)
            if pull:
                time.sleep(0.2)
                p.send(type=PULL, tensor_id=0, **fields)
            time.sleep(0.3)
            p.send(type=BYE, **fields)
        except zmq.Again:  # apsd shut the connection: the sends block
            break
        if d.counter("unread_dropped") > 0:
            break
    assert d.counter("unread_dropped") == 1, k
    assert k < 10, k  # a job or two, not 30
    if not SANITIZED:
        grown = rss_kib(d.proc.pid) - base
        assert grown < 64 << 10, (base, grown)
    p.close()
    a_job_still_works(d)


def test_pulls_share_one_copy_of_the_weights(daemon_factory):
    # (the same attack) Each pull copied the weights for its answer: 4 ranks
    # that pulled 8 tensors twice each without reading held 8 copies of the
    # weights (441 MiB for a 32 MiB job, counted nowhere). Now the pulls of an
    # update count share one copy, counted in the job's bytes. (Here 4 ranks
    # pull once each and do not read.)
    d = daemon_factory()
    world, n = 4, 4 << 20  # 16 MiB of weights
    peers = [Peer(d.endpoint, rid(), rcvhwm=1, rcvbuf=4096) for _ in range(world)]
    fields = [dict(job="pulls", rank=r, world_size=world, version_minor=10)
              for r in range(world)]
    for p, f in zip(peers, fields):
        p.send(type=HELLO, optimizer="sgd", flags=FLAG_NO_CRC, **f)
    for p, f in zip(peers, fields):
        assert p.recv(10000)["type"] == WELCOME
        p.send(type=REGISTER, tensor_name="w", total_count=n, format="fp32", **f)
        assert p.recv_type(REGISTERED, 10000) is not None
    per = 1 << 20  # the chunks of chunk_bytes 4M
    weights = np.ones(per, np.float32).tobytes()
    for off in range(0, n, per):  # rank 0's weights, the others' empty parts
        for p, f in zip(peers, fields):
            kw = dict(type=BROADCAST, tensor_id=0, total_count=n, chunk_offset=off,
                      chunk_count=per, format="fp32", flags=FLAG_NO_CRC, **f)
            if f["rank"] == 0:
                p.send(weights, payload_crc32c=0, **kw)
            else:
                p.send(**kw)
    time.sleep(0.5)
    base = rss_kib(d.proc.pid)
    for p, f in zip(peers, fields):
        p.send(type=PULL, tensor_id=0, **f)
    time.sleep(1)
    grown = rss_kib(d.proc.pid) - base
    if not SANITIZED:  # one copy (16 MiB), not 4 (64 MiB)
        assert grown < 40 << 10, grown
    assert d.counter("bad_state") == 0  # the weights were in: no pull was refused
    for p in peers:
        p.close()
    a_job_still_works(d)


def test_takeovers_leak_no_descriptor_and_no_memory(daemon_factory):
    # Before: +1 descriptor and +21 KiB for each takeover, held after every peer
    # had closed (libzmq's ROUTER_HANDOVER leaves the old session's engine behind).
    # Admission off: the address is not turned away, so 1200 are parked and reset.
    d = daemon_factory(extra=["--heartbeat_ms", "10000", "--heartbeat_timeout_ms", "30000",
                              "--max_silent_closes", "0"])
    pid = d.proc.pid
    warm = [Peer(d.endpoint, rid()) for _ in range(20)]  # the allocator's first growth
    for p in warm:
        stranger_heartbeat(p)
        p.recv()
        p.close()
    base_fds = open_fds(pid)

    # Memory: a connection that reused the live id is parked by libzmq and holds
    # its pipes (about 11 KiB) and the message it sent (256 KiB here) until the
    # listener resets: about every other one of these is parked, past the 64 MiB
    # that apsd lets parked connections hold (zbridge.c), and that reset gives
    # back all that was parked before it. (apsd drops a parked connection once it
    # has read over 32 KiB without a message, unheard_dropped, but its pipe stays
    # until the reset: 600 or 800 takeovers came to 58-62 MiB said parked, under
    # the 64 MiB, in 5 runs of 6.)
    base_rss = rss_kib(pid)
    take_over_one_id(d.endpoint, 1200, message=bytes(256 << 10))
    alive(d)
    fds = settle(lambda: open_fds(pid), base_fds, timeout=20, slack=3)
    assert fds <= base_fds + 3, (base_fds, fds)
    held = rss_kib(pid)
    deadline = time.monotonic() + 15
    while d.counter("listener_resets") == 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    c = d.ask("stats")["counters"]
    parked_kib = d.counter("parked_bytes") // 1024
    # Under a sanitizer apsd reads its messages slowly: most of these connections
    # have read their 256 KiB by the time apsd reads their first message, are
    # dropped then (unheard_dropped), and were never parked (1156 of 1221 in a
    # CI run): what is said parked may then stay under the 64 MiB.
    # Dropped at their first message or by a tick (unheard_dropped), fewer are
    # parked than before; what is said parked then stays under the 64 MiB that
    # calls for a reset (53 MiB after 1200 in one CI run) or a reset cleared it.
    assert d.counter("listener_resets") >= 1 or parked_kib < 64 << 10, \
        str({k: v for k, v in c.items() if v and k != "bad_messages"})
    # What was parked since then waits for a later reset, within what apsd counts.
    assert parked_kib < 64 << 10
    # The heap keeps some of the 300 MiB read and freed meanwhile: 1 MiB, or an
    # eighth of what is said parked (RSS 4.4 MiB over 54439 KiB said parked in
    # one CI run of 2026-12-07, no reset due).
    if not SANITIZED:
        slack = max(1024, parked_kib // 8)
        rss = settle(lambda: rss_kib(pid), base_rss + parked_kib, timeout=5, slack=slack)
        assert rss <= base_rss + parked_kib + slack, (base_rss, held, parked_kib, rss)


def silent_connections(endpoint, n, seconds):
    """n connections at a time that complete their handshake and close without a
    word, for seconds (a scanner, or a stranger's flood)."""
    ctx = zmq.Context()
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        socks = []
        for _ in range(n):
            s = ctx.socket(zmq.DEALER)
            s.setsockopt(zmq.LINGER, 0)
            s.setsockopt(zmq.ROUTING_ID, rid())
            s.connect(endpoint)
            socks.append(s)
        time.sleep(0.2)
        for s in socks:
            s.close()
    ctx.term()


def test_an_address_whose_connections_never_speak_is_turned_away(daemon_factory):
    # Before: apsd counted every connection that closed without a message as
    # parked (a live routing id reused) and reset its socket every 2 s under this
    # flood (15 resets in 30 s, every worker cut each time); with
    # reconnect_grace_ms = 0 the first reset ended every job. Now the stranger's
    # address (127.0.0.2) is refused at the handshake after max_silent_closes,
    # the workers' (127.0.0.1, a joined worker connected) never.
    d = daemon_factory(extra=[*FAST, "--reconnect_grace_ms", "0", "--max_silent_closes", "32"])
    wait = run_workers(d.endpoint, 2, [4097, 300], steps=100000, jitter_ms=5,
                       timeout_ms=20000, _wait=False)
    d.wait_for_log("job started job=default")
    stranger = d.endpoint.replace("tcp://", "tcp://127.0.0.2:0;")
    silent_connections(stranger, 100, 4)
    d.wait_for_log("turning away address=127.0.0.2")
    # Connections from the workers' address that never speak: not turned away.
    silent_connections(d.endpoint, 40, 1)
    began = time.monotonic()
    with pytest.raises(aps.Error) as refused:
        aps.Client(stranger, rank=0, world_size=1, job="stranger", timeout_ms=10000)
    assert time.monotonic() - began < 5
    assert "turned this client's address away" in str(refused.value)
    time.sleep(11)  # past the reset a few parked ones used to cost after 10 s
    alive(d)
    log = d.log_path.read_text()
    assert d.counter("listener_resets") == 0, log[-3000:]
    assert d.counter("addresses_turned_away") == 1
    assert d.counter("handshakes_turned_away") >= 1
    assert "turning away address=127.0.0.1" not in log
    assert "rank lost" not in log, log[-3000:]
    d.stop()
    for code, out in wait():
        assert out.count("ok step=") > 0, out[-2000:]
        assert "APS_EPEERLOST" not in out, out[-2000:]


def test_silent_handshakes_are_charged_to_their_own_address(daemon_factory):
    # Before: a close was charged to the address of the descriptor when apsd read
    # its accept, which under fast churn was sometimes another connection's: of
    # 300 addresses that each closed 20 times (under the limit of 32), 24 were
    # turned away (an attack, 2026-12-06). Handshakes are now counted by the
    # address the ZAP handler is given, first messages by the message's. 60
    # addresses with 20 handshakes each that say nothing, interleaved with one
    # address's 60: only that one is turned away.
    d = daemon_factory(extra=["--max_silent_closes", "32"])
    port = d.endpoint.rsplit(":", 1)[1]
    ctx = zmq.Context()

    def connect(x):
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.connect(f"tcp://127.0.0.{x}:0;127.0.0.1:{port}")
        return s

    for _ in range(20):
        socks = [connect(x) for x in range(2, 62)] + [connect(254) for _ in range(3)]
        time.sleep(0.1)  # their handshakes end
        for s in socks:
            s.close()
    ctx.term()
    d.wait_for_log("turning away address=127.0.0.254 ")
    time.sleep(1)
    log = d.log_path.read_text()
    assert d.counter("addresses_turned_away") == 1, log[-3000:]
    a_job_still_works(d)


def test_a_node_whose_workers_connect_early_is_not_turned_away(daemon_factory):
    # An attack on 18937c8: 40 workers of one node connected at once and said
    # HELLO 2 s later (a model loading): 40 handshakes without a message after
    # 500 ms, the node was turned away with its workers joined, and a worker's
    # reconnect after a blip was refused (its rank lost). Connections still open
    # that have not spoken yet are not counted against their address now.
    d = daemon_factory(extra=["--max_silent_closes", "32"])
    node = d.endpoint.replace("tcp://", "tcp://127.0.0.5:0;")
    peers = [Peer(node) for _ in range(40)]
    time.sleep(2)
    for rank, p in enumerate(peers):
        assert p.hello("early", rank, 40)["type"] == WELCOME
    assert d.counter("addresses_turned_away") == 0, d.log_path.read_text()[-2000:]
    assert Peer(node).hello("early2", 0, 1)["type"] == WELCOME


def test_a_turned_away_stranger_holds_little_and_costs_no_reset(daemon_factory):
    # The takeovers above with admission on: the address is turned away after
    # max_silent_closes (32) handshakes that delivered nothing (parked
    # connections, which hold about 11 KiB each until a reset 10 minutes later);
    # the stranger's later handshakes are refused.
    d = daemon_factory(extra=["--heartbeat_ms", "10000", "--heartbeat_timeout_ms", "30000",
                              "--max_silent_closes", "32"])
    pid = d.proc.pid
    base_fds, base_rss = open_fds(pid), rss_kib(pid)
    # from 127.0.0.2: 127.0.0.1, where a host's own workers connect, is never turned away
    take_over_one_id(d.endpoint.replace("tcp://", "tcp://127.0.0.2:0;"), 600)
    alive(d)
    fds = settle(lambda: open_fds(pid), base_fds, timeout=20, slack=3)
    assert fds <= base_fds + 3, (base_fds, fds)
    assert d.counter("addresses_turned_away") == 1
    # Handshakes are judged 250-500 ms after they happened, once apsd has read
    # what waits (their first messages may be there): about 320 of these 600
    # (0.8 s of them) got through before the address was turned away.
    assert d.counter("handshakes_turned_away") >= 200
    assert d.counter("listener_resets") == 0
    # No bound on parked_bytes itself: a connection whose descriptor ZeroMQ had
    # reused before apsd saw its accept is counted 1 MiB (CI: 3669 KiB once).
    parked_kib = d.counter("parked_bytes") // 1024
    assert 0 < parked_kib, parked_kib
    # What the stranger holds, not the heap's high water: a job's end trims the
    # heap (the ~320 handshakes that pass before the address is judged leave
    # freed pages resident: RSS base + 3.7 MiB against 2.7 MiB said parked).
    a_job_still_works(d)
    time.sleep(1.5)
    if not SANITIZED:
        assert rss_kib(pid) <= base_rss + parked_kib + 1024, (base_rss, rss_kib(pid))


def raw_zmtp(endpoint, source=None, timeout=10):
    """A ZMTP connection by hand (from source, if given), once the daemon's greeting
    and READY came: frames sent before the handshake ends (its ZAP reply pending)
    fail the handshake, so a client by hand waits for them, as ZeroMQ does."""
    host, port = endpoint[len("tcp://"):].rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=timeout,
                                 source_address=(source, 0) if source else None)
    ready = b"\x05READY\x0bSocket-Type" + struct.pack(">I", 6) + b"DEALER"
    s.sendall(NULL_GREETING + bytes([0x04, len(ready)]) + ready)
    got = b""
    while b"READY" not in got:
        got += s.recv(4096)
    return s


@pytest.mark.parametrize("spoke", [True, False])
def test_a_message_without_end_is_cut_off(daemon_factory, spoke):
    # Before: frames of 1 MiB flagged MORE, never a last one, each under
    # max_message_bytes: libzmq kept every one (RSS +200 MiB for 200 MiB sent on
    # one connection, found by an attack), all a stranger's to grow. A connection
    # that has spoken is cut at twice max_message_bytes a tick (unfinished_dropped),
    # one that has not at 32 KiB (unheard_dropped) once apsd has read all that waits.
    d = daemon_factory()
    pid = d.proc.pid
    base_rss = rss_kib(pid)
    s = raw_zmtp(d.endpoint, timeout=60)
    if spoke:
        s.sendall(zmtp_frame(envelope(type=HEARTBEAT, job="j", rank=0, world_size=2)))
        s.recv(4096)  # apsd read it: it does not know this peer
    frame = b"\x03" + struct.pack(">Q", 1 << 20) + bytes(1 << 20)
    sent, peak = 0, 0
    with pytest.raises(OSError) as cut:
        for sent in range(1, 1025):
            s.sendall(frame)
            if sent % 16 == 0:
                peak = max(peak, rss_kib(pid))
    s.close()
    alive(d)
    why = (sent, repr(cut.value),
           [line for line in d.log_path.read_text().splitlines() if " debug server" not in line])
    assert sent < 200, why  # cut off within about a tick (250 ms)
    if spoke:
        assert d.counter("unfinished_dropped") == 1, why
    else:  # 32 KiB when every message waiting was read, else the bound above
        assert d.counter("unheard_dropped") + d.counter("unfinished_dropped") == 1, why
    if not SANITIZED:
        assert peak < base_rss + 160 * 1024, (base_rss, peak)
    a_job_still_works(d)


@pytest.mark.skipif(SANITIZED, reason="a sanitizer's quarantine keeps what was freed resident")
def test_messages_left_half_sent_cost_no_reset(daemon_factory):
    # Before: connections that sent 8 MiB of a message they never finished and
    # closed, from a new address each, counted 8 MiB each as parked: 8 of them
    # reset the socket every 10 s (every worker cut; with a grace of 0 the job
    # ended), though libzmq had freed those bytes (an attack, 2026-12-06). A
    # reset now needs resident memory to have grown by half of what is said parked.
    d = daemon_factory(extra=["--reconnect_grace_ms", "0"])
    wait = run_workers(d.endpoint, 2, [4097], steps=100000, timeout_ms=20000, _wait=False)
    d.wait_for_log("job started job=default")
    frame = b"\x03" + struct.pack(">Q", 1 << 20) + bytes(1 << 20)
    for i in range(24):
        s = raw_zmtp(d.endpoint, f"127.0.0.{2 + i}")
        try:  # a tick may find it read over 32 KiB before a message: dropped
            for _ in range(8):
                s.sendall(frame)
        except OSError:
            pass
        time.sleep(0.1)
        s.close()
    time.sleep(1)
    alive(d)
    log = d.log_path.read_text()
    assert d.counter("parked_bytes") >= 64 << 20, log[-2000:]  # the guess is as before
    assert d.counter("listener_resets") == 0, log[-3000:]
    assert "no reset: parked connections may hold" in log
    assert "rank lost" not in log, log[-3000:]
    d.stop()
    for code, out in wait():
        assert "APS_EPEERLOST" not in out, out[-2000:]


def test_a_handshake_with_many_properties_is_dropped(daemon_factory):
    # Before: libzmq keeps every property of a handshake's READY for the
    # connection's life, at about 40 times its bytes: 4 connections that each sent
    # a READY of 4 MB (500000 properties, under max_message_bytes) held 390 MB,
    # and their HELLOs joined a job (an attack, 2026-12-07). Now a connection that
    # read over 32 KiB before its first message is dropped, its HELLO unread, and
    # the heap trimmed of what libzmq parsed.
    d = daemon_factory()
    pid = d.proc.pid
    base_rss = rss_kib(pid)
    for x in range(2):
        assert ready_bomb(d.endpoint, f"127.0.0.{2 + x}"), "the connection stayed open"
    assert d.counter("unheard_dropped") == 2
    assert d.ask("stats")["jobs"] == 0, "a HELLO after the handshake was read"
    assert "reason=\"read over 32768 bytes before a message" in d.log_path.read_text()
    if not SANITIZED:  # what libzmq parsed goes back
        rss = settle(lambda: rss_kib(pid), base_rss, timeout=5, slack=16 << 10)
        assert rss <= base_rss + (16 << 10), (base_rss, rss)
    a_job_still_works(d)


@pytest.mark.skipif(SANITIZED, reason="a sanitizer's quarantine keeps what was freed resident")
def test_large_handshakes_that_close_cost_no_reset(daemon_factory):
    # Each such connection closes without a message: it counts as parked (4 MB
    # read), and resident memory rose 100 MB while libzmq parsed it. One every
    # 1.5 s from a new address bore out a reset after 16 (an attack, 2026-12-07):
    # every worker cut. A reset now needs memory that stayed up for 5 s.
    d = daemon_factory()
    wait = run_workers(d.endpoint, 2, [4097], steps=100000, timeout_ms=20000, _wait=False)
    d.wait_for_log("job started job=default")
    for x in range(24):
        assert ready_bomb(d.endpoint, f"127.0.1.{2 + x}", hello=False)
    time.sleep(2)
    log = d.log_path.read_text()
    # each closed within 5 s (ready_bomb), nearly all by the 32 KiB rule (19 of 20
    # once in CI: one went some other way)
    assert d.counter("unheard_dropped") >= 18
    assert d.counter("parked_bytes") >= 64 << 20, log[-2000:]  # the guess is as before
    assert d.counter("listener_resets") == 0, log[-3000:]
    d.stop()
    for code, out in wait():
        assert "APS_EPEERLOST" not in out, out[-2000:]


@pytest.mark.parametrize("transport", ["tcp", "ipc"])
def test_connections_that_reuse_a_live_id_and_flood_it_are_cleared(daemon_factory, transport):
    # Without ROUTER_HANDOVER libzmq parks a second connection with a live routing
    # id and never reads it: once its pipe is full and it closes, its engine waits
    # for a read that never comes (a descriptor and the pipe's messages). apsd
    # finds such connections and resets its socket (on the same listening socket).
    # The owner holds the id before the first dup comes (its answer came) and
    # stays until the reset: before, a dup could win the id and the owner be
    # the one parked, holding nothing, and no reset came (one run in about 8,
    # 2026-12-07); once the owner leaves, libzmq may give its id to a parked
    # pipe and read it out.
    d = daemon_factory(transport=transport, extra=FAST)
    pid = d.proc.pid
    base_fds, base_rss = open_fds(pid), rss_kib(pid)
    owner = flood_a_live_id(d.endpoint, 6, 0.3, owner_closes=False)
    deadline = time.monotonic() + 20
    while d.counter("listener_resets") < 1 and time.monotonic() < deadline:
        time.sleep(0.2)
    owner.close()
    alive(d)
    assert d.counter("listener_resets") >= 1
    fds = settle(lambda: open_fds(pid), base_fds, timeout=20, slack=3)
    assert fds <= base_fds + 3, (base_fds, fds)
    assert SANITIZED or settle(lambda: rss_kib(pid), base_rss * 1.05, timeout=10,
                               slack=2048) <= base_rss * 1.05 + 2048
    a_job_still_works(d)


def test_ranks_keep_their_sessions_across_the_resets_an_attacker_forces(daemon_factory):
    # The flood above, again and again, while an 8-rank job runs: every reset
    # cuts the job's connections, and the clients, waiting in the backlog, are
    # accepted the moment the new socket listens. Before: the new socket was
    # bound before its monitor was set, an accept in between was never seen,
    # and that rank's resume HELLO was dropped as a closed connection's (the
    # soak: 4 ranks of a job lost after one reset in 27).
    d = daemon_factory(extra=FAST)
    wait = run_workers(d.endpoint, 8, [4097, 300], steps=100000, jitter_ms=5,
                       timeout_ms=20000, _wait=False)
    d.wait_for_log("job started job=default")
    deadline = time.monotonic() + 60
    while d.counter("listener_resets") < 4 and time.monotonic() < deadline:
        flood_a_live_id(d.endpoint, 2, 0.2)
        time.sleep(0.5)
    resets = d.counter("listener_resets")
    alive(d)
    log = d.log_path.read_text()
    assert "rank lost" not in log, log[-3000:]
    assert resets >= 4, resets
    assert d.counter("reconnects") >= 8 * resets
    d.stop()  # the workers fail, each at the call it was in
    for code, out in wait():
        assert out.count("ok step=") > 0, out[-2000:]
        assert "APS_EPEERLOST" not in out and "APS_ENOSESSION" not in out, out[-2000:]


def test_a_stranger_cannot_join_a_job_that_has_a_token(daemon_factory):
    # Before: accepted; the victims pushed 1.0 and got 334.0 back.
    d = daemon_factory()
    v0 = Peer(d.endpoint)
    assert v0.hello("victims", 0, 3, job_token="s3cret")["type"] == WELCOME
    refused = 0
    for token in (None, "guess", "s3cret-not"):
        s = Peer(d.endpoint)
        fields = {} if token is None else {"job_token": token}
        reply = s.hello("victims", 1, 3, **fields)
        assert reply["type"] == ERROR and reply["error_code"] == EACCES, reply
        assert "not allowed in job 'victims'" in reply["error_text"], reply
        # since when the name is held, for a run that finds it taken; from where
        # only in apsd's log
        assert "(held by a job started " in reply["error_text"], reply
        assert " with 1 of 3 ranks; apsd's log names its address" in reply["error_text"]
        assert "127.0.0.1" not in reply["error_text"], reply
        refused += 1
        s.close()
    assert d.counter("refused_token") == refused
    assert "job=victims rank=1 address=127.0.0.1 holder=127.0.0.1" in d.log_path.read_text()
    # the job is undisturbed: its ranks join with the token and sum exactly
    env = {"APS_JOB_TOKEN": "s3cret"}
    v0.close()
    time.sleep(0.3)
    d2 = d  # same daemon, the job ended with its last rank; a real run now
    out = run_workers(d2.endpoint, 2, [7, 4097], steps=2, job="victims2", env=env)
    assert_all_ok(out, 2, 2)
    s = Peer(d.endpoint)
    reply = s.hello("victims2", 0, 2)  # the job is over: a new one may start
    assert reply["type"] == WELCOME


def test_a_wrong_token_does_not_end_a_job_whose_ranks_wait_to_reconnect(daemon_factory):
    # Before: a HELLO for the rank of a session waiting in its reconnect grace ended
    # the job whose every session waited (a new run under the same name), whoever
    # sent it.
    d = daemon_factory(extra=["--reconnect_grace_ms", "3000"])
    v = Peer(d.endpoint)
    assert v.hello("v", 0, 1, job_token="t")["type"] == WELCOME
    v.close()  # the session waits to reconnect
    time.sleep(0.3)
    s = Peer(d.endpoint)
    reply = s.hello("v", 0, 1, job_token="x")
    assert reply["type"] == ERROR and reply["error_code"] == EACCES, reply
    # a new run of the job (a new token) is told when it may start
    assert "it ends within reconnect_grace_ms = 3000 ms" in reply["error_text"], reply
    reply = s.hello("v", 0, 1, flags=FLAG_RESUME, session=os.urandom(16))
    assert reply["type"] == ERROR and reply["error_code"] == ENOSESSION, reply
    jobs = d.ask("jobs")["jobs"]
    assert [j["name"] for j in jobs] == ["v"], jobs



def test_a_new_run_joins_once_the_last_runs_places_are_free(daemon_factory, caplog):
    # Before: a job launched again within reconnect_grace_ms of its last run (a new
    # job token each launch, as aps.launch makes) was refused at once, APS_EACCES.
    # Now apsd says when the name is free (protocol 1.9) and the client joins then.
    d = daemon_factory(extra=["--reconnect_grace_ms", "2000"])
    old = Peer(d.endpoint)
    assert old.hello("relaunch", 0, 1, job_token="run1")["type"] == WELCOME
    old.close()  # the last run's rank waits out its grace
    time.sleep(0.3)
    raw = Peer(d.endpoint)  # what a client is told
    reply = raw.hello("relaunch", 0, 1, job_token="run2")
    assert reply["type"] == ERROR and reply["error_code"] == EACCES, reply
    assert 1000 < reply["retry_after_ms"] <= 2000 + 100, reply
    raw.close()
    # a deadline before the name is free: refused at once, saying why
    t0 = time.monotonic()
    with pytest.raises(aps.Error) as err:
        aps.Client(d.endpoint, 0, 1, job="relaunch", job_token="run2", format="fp32",
                   timeout_ms=500)
    assert time.monotonic() - t0 < 0.4 and "reconnect_grace_ms" in str(err.value)
    caplog.set_level("WARNING", logger="aps.client")
    with aps.Client(d.endpoint, 0, 1, job="relaunch", job_token="run2", format="fp32",
                    timeout_ms=10000) as c:
        waited = time.monotonic() - t0
        assert c.allreduce("w", np.arange(3, dtype=np.float32)).tolist() == [0, 1, 2]
    assert 0.8 < waited < 3.0, waited
    assert "still held by the ranks of its last run" in caplog.text, caplog.text

def test_idle_hellos_give_their_job_slots_back(daemon_factory):
    # Before: max_jobs stayed full for as long as the 64 connections stayed open.
    d = daemon_factory(extra=[*FAST, "--reconnect_grace_ms", "300", "--max_jobs", "16"])
    idle = [Peer(d.endpoint) for _ in range(16)]
    for i, p in enumerate(idle):
        assert p.hello(f"idle{i}", 0, 2)["type"] == WELCOME
    late = Peer(d.endpoint)
    reply = late.hello("late", 0, 1)
    assert reply["type"] == ERROR and "16 jobs is the limit" in reply["error_text"], reply
    # heartbeat_timeout_ms (1000) of silence, then the grace (300), and the idle jobs
    # have ended (a fixed 2 s was not always enough on a loaded machine)
    deadline = time.monotonic() + 15
    while d.ask("stats")["jobs"] > 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert d.counter("silent_dropped") >= 16
    reply = late.hello("late2", 0, 1)
    assert reply["type"] == WELCOME, reply


def test_one_address_cannot_fill_max_jobs(daemon_factory):
    # Before: HELLOs to new job names from one stranger, kept alive, held every
    # slot of max_jobs, and every honest job got "64 jobs is the limit" for as long
    # as they stayed. Now one address starts at most max_jobs_per_address jobs.
    d = daemon_factory(extra=["--max_jobs", "6", "--max_jobs_per_address", "4"])
    stranger = d.endpoint.replace("tcp://", "tcp://127.0.0.2:0;")
    squatters = [Peer(stranger) for _ in range(6)]
    replies = [p.hello(f"squat{i}", 0, 2) for i, p in enumerate(squatters)]
    assert [r["type"] for r in replies] == [WELCOME] * 4 + [ERROR] * 2, replies
    text = replies[4]["error_text"]
    assert replies[4]["error_code"] == ERANGE, replies[4]
    assert "cannot start job 'squat4': 127.0.0.2 already started 4 jobs" in text, text
    assert "max_jobs_per_address" in text, text
    assert d.counter("refused_address_jobs") == 2
    # the stranger's jobs still take their other ranks, from anywhere
    assert Peer(d.endpoint).hello("squat0", 1, 2)["type"] == WELCOME
    # and honest jobs from another address start while the stranger holds its 4
    a_job_still_works(d)
    assert d.ask("stats")["jobs"] >= 4


IPC_HELLO = """
import sys
sys.path.insert(0, {here!r})
from peers import Peer
reply = Peer({endpoint!r}).hello({job!r}, 0, 2)
print(reply["type"], reply.get("error_text", ""))
"""


def test_every_process_of_an_ipc_user_is_one_address(daemon_factory):
    # An attack on the limit above: ipc's Peer-Address names the connecting
    # process (localhost:UID:GID:PID), so 5 processes of one user started 64
    # jobs. Now an ipc job is charged to its user.
    # (a long grace: each job stays while the next process starts)
    d = daemon_factory(transport="ipc", extra=["--max_jobs_per_address", "2",
                                               "--reconnect_grace_ms", "60000"])
    here = os.path.dirname(__file__)
    replies = [subprocess.run([sys.executable, "-c", IPC_HELLO.format(
        here=here, endpoint=d.endpoint, job=f"ipc{i}")], capture_output=True, text=True,
        timeout=30).stdout.strip() for i in range(3)]
    assert [r.split()[0] for r in replies] == [str(WELCOME)] * 2 + [str(ERROR)], replies
    assert f"ipc uid {os.getuid()} already started 2 jobs" in replies[2], replies
    assert d.counter("refused_address_jobs") == 1


def test_a_stranger_cannot_keep_a_dead_job_alive(daemon_factory):
    # An attack on the limit above: a stranger joined rank 1 of 4 jobs without a
    # token that 127.0.0.1 had started, their ranks 0 left, and by heartbeats alone
    # the stranger held the 4 dead jobs (charged to 127.0.0.1, whose next job got
    # APS_ERANGE) for as long as it liked. A job that cannot go on now ends
    # join_timeout_ms after, whoever stays.
    d = daemon_factory(extra=[*FAST, "--reconnect_grace_ms", "200", "--join_timeout_ms",
                              "1500", "--max_jobs_per_address", "1"])
    owner = Peer(d.endpoint)
    assert owner.hello("open", 0, 2)["type"] == WELCOME
    stranger = Peer(d.endpoint.replace("tcp://", "tcp://127.0.0.3:0;"))
    assert stranger.hello("open", 1, 2)["type"] == WELCOME
    owner.close()
    d.wait_for_log("rank lost job=open rank=0")
    began = time.monotonic()
    reply = None
    while reply is None and time.monotonic() - began < 10:
        stranger.send(type=HEARTBEAT, job="open", rank=1, world_size=2, flags=FLAG_ALIVE)
        reply = stranger.recv_type(ERROR, 200)
    assert reply is not None and "the job ended join_timeout_ms = 1500 ms later" in \
        reply["error_text"], reply
    assert "rank 0 of job 'open' was lost" in reply["error_text"], reply
    assert time.monotonic() - began < 4
    assert d.ask("stats")["jobs"] == 0
    assert Peer(d.endpoint).hello("next", 0, 2)["type"] == WELCOME


def test_a_job_whose_ranks_never_all_arrive_is_ended(daemon_factory):
    d = daemon_factory(extra=[*FAST, "--join_timeout_ms", "800"])
    p = Peer(d.endpoint)
    assert p.hello("half", 0, 3)["type"] == WELCOME
    deadline = time.monotonic() + 3
    reply = None
    while time.monotonic() < deadline and reply is None:
        p.send(type=HEARTBEAT, job="half", rank=0, world_size=3, flags=FLAG_ALIVE)
        reply = p.recv_type(ERROR, 200)
    assert reply is not None and reply["error_code"] == ETIMEDOUT, reply
    assert "ranks 1, 2 never joined" in reply["error_text"], reply
    assert d.counter("jobs_expired") == 1
    assert d.ask("stats")["jobs"] == 0


def test_a_connection_that_never_joins_is_dropped(daemon_factory):
    d = daemon_factory(extra=["--join_timeout_ms", "500"])
    base = open_fds(d.proc.pid)
    quiet = [Peer(d.endpoint) for _ in range(5)]
    for q in quiet:
        q.sock.poll(50)  # connected, never a word
    # until apsd took them (a fixed 0.3 s could end before it did on a loaded machine)
    deadline = time.monotonic() + 10
    while open_fds(d.proc.pid) <= base and time.monotonic() < deadline:
        time.sleep(0.01)
    assert open_fds(d.proc.pid) > base
    assert settle(lambda: open_fds(d.proc.pid), base, timeout=5, slack=1) <= base + 1
    assert d.counter("unjoined_dropped") >= 5


def test_max_connections_is_a_limit_and_a_counter(daemon_factory):
    d = daemon_factory(extra=["--max_connections", "8"])
    base = open_fds(d.proc.pid)
    crowd = [Peer(d.endpoint) for _ in range(40)]
    # until apsd has seen them all and closed those it refused (a fixed 1 s was not
    # always enough on a loaded machine; it counts a refusal before the close)
    deadline = time.monotonic() + 15
    while d.counter("refused_connections") < 32 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert settle(lambda: open_fds(d.proc.pid), base + 2 * 8 + 4) <= base + 2 * 8 + 4
    assert d.counter("refused_connections") >= 32
    for c in crowd:
        c.close()
    settle(lambda: open_fds(d.proc.pid), base, slack=2)
    a_job_still_works(d)


def test_one_address_cannot_take_every_connection(daemon_factory):
    # Before: one address could open every connection max_connections allows
    # (joined ranks of its own jobs, or connections that never speak, kept open
    # until join_timeout_ms and opened again), and no one else could connect.
    # Now max_connections_per_address are open from one address at most (IPv6:
    # its /64); 127.0.0.1, where a host's own workers connect, is not counted.
    d = daemon_factory(extra=["--max_connections_per_address", "20"])

    def crowd(source, n):
        return [socket.create_connection(("127.0.0.1", int(d.endpoint.rsplit(":", 1)[1])),
                                         timeout=10, source_address=(source, 0))
                for _ in range(n)]

    def closed(s):  # after libzmq's greeting, sent at accept, before apsd shuts it
        s.settimeout(5)
        try:
            while s.recv(64) != b"":
                pass
            return True
        except ConnectionResetError:
            return True
        except socket.timeout:
            return False

    def refused(n):
        deadline = time.monotonic() + 10
        while d.counter("refused_address_connections") < n and time.monotonic() < deadline:
            time.sleep(0.05)
        return d.counter("refused_address_connections")

    stranger = crowd("127.0.0.2", 30)
    assert refused(10) == 10
    # the 21st to 30th were shut; the first 20 stay
    assert [closed(s) for s in stranger[20:]] == [True] * 10
    assert "address=127.0.0.2:" in d.log_path.read_text()
    assert "max_connections_per_address=20 open from its address" in d.log_path.read_text()
    # another address, and the host's own, connect as before
    other = raw_zmtp(d.endpoint, "127.0.0.3")
    local = crowd("127.0.0.1", 30)
    a_job_still_works(d)
    assert refused(10) == 10
    # a closed connection gives its place back
    for s in stranger[:5]:
        s.close()
    time.sleep(0.5)
    again = crowd("127.0.0.2", 5)
    time.sleep(0.5)
    assert refused(10) == 10
    for s in stranger + again + local + [other]:
        s.close()


def test_an_oversized_frame_moves_a_counter(daemon_factory):
    # Before: the connection closed and no counter moved.
    d = daemon_factory(extra=["--chunk_bytes", "16k", "--max_message_bytes", "128k"])
    p = Peer(d.endpoint)
    assert p.hello("big", 0, 1)["type"] == WELCOME
    p.send_raw(b"\x00" * (1 << 20))
    deadline = time.monotonic() + 5
    while d.counter("zmtp_refused") == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert d.counter("zmtp_refused") == 1
    assert "max_message_bytes" in d.log_path.read_text()


def test_memory_of_a_finished_job_goes_back(daemon_factory):
    # Before: RSS 6.5 MiB -> 1.24 GiB during the round and 213 MiB after the job ended.
    d = daemon_factory()
    pid = d.proc.pid
    # rank 1 pushes, rank 0 never does: apsd holds rank 1's 64 chunks of codes until
    # rank 0's come (the sum is in rank order), 64 MiB in ZeroMQ's messages
    n = 64 << 20
    x = np.ones(n, dtype=np.float32)
    base = rss_kib(pid)
    for rnd in range(2):
        job = f"big{rnd}"
        waiting = Peer(d.endpoint)  # rank 0 registers, and never pushes
        assert waiting.hello(job, 0, 2)["type"] == WELCOME
        pusher = aps.Client(d.endpoint, 1, 2, job=job, format="e4m3", timeout_ms=20000)
        pending = pusher.allreduce_async("w", x)
        waiting.send(type=REGISTER, job=job, rank=0, world_size=2, tensor_name="w",
                     total_count=n, format="e4m3")
        assert waiting.recv_type(REGISTERED) is not None
        # 30 s: under a loaded CI machine the pusher's quantizing and sending of 64 Mi
        # elements took longer than the 10 s this waited before (2 failures in ~10 runs)
        deadline = time.monotonic() + 30
        while rss_kib(pid) < base + 60_000 and time.monotonic() < deadline:
            waiting.send(type=HEARTBEAT, job=job, rank=0, world_size=2, flags=FLAG_ALIVE)
            time.sleep(0.1)
        peak = rss_kib(pid)
        assert peak >= base + 60_000, (base, peak)  # the round did hold its memory
        waiting.send(type=BYE, job=job, rank=0, world_size=2)
        waiting.close()
        with pytest.raises(aps.Error):
            pending.wait()
        pusher.close()
    if not SANITIZED:
        after = settle(lambda: rss_kib(pid), base * 1.05, timeout=20, slack=1024)
        assert after <= base * 1.05 + 1024, (base, peak, after)


def test_max_total_bytes_bounds_every_job_together(daemon_factory):
    # one address may hold all of it here (max_address_bytes is tested below)
    d = daemon_factory(extra=["--max_total_bytes", "64M", "--max_address_bytes", "64M"])
    a, b = Peer(d.endpoint), Peer(d.endpoint)
    assert a.hello("a", 0, 1)["type"] == WELCOME
    assert b.hello("b", 0, 1)["type"] == WELCOME
    # 5M elements: 20 MiB of sum and 20 of the last result kept, per job
    a.send(type=REGISTER, job="a", rank=0, world_size=1, tensor_name="w",
           total_count=5 << 20, format="e4m3")
    assert a.recv_type(REGISTERED) is not None
    b.send(type=REGISTER, job="b", rank=0, world_size=1, tensor_name="w",
           total_count=5 << 20, format="e4m3")
    reply = b.recv()
    assert reply["type"] == ERROR and "max_total_bytes" in reply["error_text"], reply


def test_one_address_cannot_register_every_jobs_memory(daemon_factory):
    # Before (helper-38's attack, 2026-12-08): a stranger's 3 one-rank jobs from one
    # address registered tensors, halving each refused size, until max_total_bytes
    # was full (103 REGISTERs, 0.04 s; a registration costs nothing until a push),
    # and kept them with heartbeats: every other job's REGISTER got APS_ERANGE
    # "max_total_bytes" and made no step. Now one address holds at most
    # max_address_bytes (half of max_total_bytes by default).
    d = daemon_factory(extra=["--max_total_bytes", "64M"])
    stranger_ep = d.endpoint.replace("tcp://", "tcp://127.0.0.2:0;")
    hogs = [Peer(stranger_ep) for _ in range(3)]
    refusals = []
    for j, p in enumerate(hogs):
        assert p.hello(f"hog{j}", 0, 1)["type"] == WELCOME
        count, i = 1 << 30, 0
        while count >= 1:
            p.send(type=REGISTER, job=f"hog{j}", rank=0, world_size=1,
                   tensor_name=f"t{i}", total_count=count, format="e4m3")
            reply = p.recv()
            if reply["type"] == ERROR:
                refusals.append(reply["error_text"])
                count //= 2
            i += 1
    # the last refusal of each: even 1 element no longer fits the address's part
    assert all("max_address_bytes is 33554432" in t and "127.0.0.2" in t
               for t in refusals[-3:]), refusals[-3:]
    jobs = {j["name"]: j for j in d.ask("jobs")["jobs"]}
    held = sum(jobs[f"hog{j}"]["bytes"] for j in range(3))
    assert all(jobs[f"hog{j}"]["origin"] == "127.0.0.2" for j in range(3)), jobs
    assert 32 << 20 >= held > 31 << 20, held
    for j, p in enumerate(hogs):  # the stranger's jobs stay: it keeps them alive
        p.send(type=HEARTBEAT, job=f"hog{j}", rank=0, world_size=1, flags=FLAG_ALIVE)
    # an honest job from another address still registers 2M elements (16 MiB
    # with the result kept) and steps, exactly
    x = np.arange(2 << 20, dtype=np.float32) / 7
    with aps.Client(d.endpoint, 0, 1, job="honest", format="fp32", timeout_ms=10000) as c:
        for _ in range(3):
            assert np.array_equal(c.allreduce("w", x), x)
    assert {j["name"] for j in d.ask("jobs")["jobs"]} >= {"hog0", "hog1", "hog2"}
    for p in hogs:
        p.close()


def test_what_a_tensor_keeps_per_rank_counts_against_max_total_bytes(daemon_factory):
    # Before: rank 0 of a job of 1024 ranks (the others never come) registered
    # 32768 one-element tensors: 2.2 GiB of RSS in 16 s past --max_total_bytes 1G,
    # refused_memory 0 (a tensor's per-rank bookkeeping, ~70 KiB at 1024 ranks,
    # was not counted; only its 4 bytes of values were).
    d = daemon_factory(extra=["--max_total_bytes", "64M", "--max_address_bytes", "64M"])
    pid = d.proc.pid
    base = rss_kib(pid)
    p = Peer(d.endpoint)
    assert p.hello("wide", 0, 1024)["type"] == WELCOME
    refused = None
    for i in range(4000):
        p.send(type=REGISTER, job="wide", rank=0, world_size=1024, tensor_name=f"t{i}",
               total_count=1, format="fp32")
        reply = p.recv()
        if reply["type"] == ERROR:
            refused = (i, reply["error_text"])
            break
    assert refused is not None, "4000 tensors of a 1024-rank job fitted in 64 MiB"
    assert "max_total_bytes" in refused[1] and "bookkeeping" in refused[1], refused
    assert d.counter("refused_memory") == 1
    assert SANITIZED or rss_kib(pid) <= base + 96 * 1024, (base, rss_kib(pid))
    p.close()
    alive(d)


def test_a_push_in_another_format_is_decoded_exactly(daemon_factory):
    d = daemon_factory()
    peers = [Peer(d.endpoint) for _ in range(2)]
    for r, p in enumerate(peers):
        assert p.hello("mixed", r, 2)["type"] == WELCOME
        p.send(type=REGISTER, job="mixed", rank=r, world_size=2, tensor_name="t",
               total_count=8, format="e4m3")
        assert p.recv_type(REGISTERED)["format"] == "e4m3"
    x0 = np.linspace(-1, 1, 8).astype(np.float32)
    x1 = np.linspace(0.5, 3, 8).astype(np.float32)
    pushes = [("fp16", x0), ("e4m3", x1)]
    for r, (fmt, x) in enumerate(pushes):
        codes = aps.quantize(x, fmt, scale_exp=0)
        peers[r].send(bytes(codes), type=PUSH, job="mixed", rank=r, world_size=2,
                      tensor_id=0, chunk_offset=0, chunk_count=8, total_count=8, format=fmt)
    want = (aps.dequantize(aps.quantize(x0, "fp16"), "fp16", 8)
            + aps.dequantize(aps.quantize(x1, "e4m3"), "e4m3", 8)) / 2
    for p in peers:
        res = p.recv_type(RESULT)
        got = aps.dequantize(np.frombuffer(res["payload"], np.uint8), res["format"], 8,
                             scale_exp=res.get("scale_exp", 0))
        exact = aps.dequantize(aps.quantize(want, res["format"],
                                            scale_exp=res.get("scale_exp", 0)),
                               res["format"], 8, scale_exp=res.get("scale_exp", 0))
        assert np.array_equal(got, exact), (got, exact)
