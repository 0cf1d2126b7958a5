"""Connections that drop and come back (network blips): a TCP proxy between
the workers and apsd resets every connection through it, several times in a
run, losing whatever was in flight either way. ZeroMQ reconnects; apsd keeps
each rank's place for reconnect_grace_ms and takes the session back; the
client sends its calls in flight again, and apsd answers or drops what it had
seen. Every result is still checked bit for bit (itest_worker), nobody gets an
error, and nothing is counted twice. A rank that does not come back is lost
after the grace."""

import signal
import socket
import struct
import threading
import time

import numpy as np
import pytest

import aps
from conftest import (ask, collect, kill_rank_2_while_the_others_wait, run_workers,
                      start_worker)
from peers import (FLAG_RESUME, HELLO, NULL_GREETING, WELCOME, decode, envelope, zmtp_frame,
                   zmtp_read_frame)
from proxy import BlipProxy


def port_of(endpoint):
    return int(endpoint.rsplit(":", 1)[1])


def cut_while(proxy, procs, every_s, limit, server_sees_it=True):
    """Cuts the proxy's connections every every_s while any process runs (at most limit)."""
    cuts = 0
    while cuts < limit and any(p.poll() is None for p in procs):
        time.sleep(every_s)
        if proxy.cut(server_sees_it) > 0:
            cuts += 1
    return cuts


class CutRequest:
    """A cut that a rank asks for and waits for (see ranks_while_cutting)."""

    def __init__(self):
        self.asked, self.done = threading.Event(), threading.Event()

    def __call__(self, timeout=20):
        self.done.clear()
        self.asked.set()
        assert self.done.wait(timeout), "the cut asked for never came"


def ranks_while_cutting(proxy, rank, world, every_s, limit=None, asked=None):
    """Runs rank(r) for every rank in threads, cutting the proxy's connections
    every every_s while they run (at most limit times); closes the proxy.
    With asked (a CutRequest), a rank may also ask for a cut at a point of its
    own: that one is made at once, beyond limit too. Returns the number of cuts."""
    threads = [threading.Thread(target=rank, args=(r,)) for r in range(world)]
    cuts = 0
    try:
        for t in threads:
            t.start()
        next_cut = time.monotonic() + every_s
        while any(t.is_alive() for t in threads):
            if asked is not None and asked.asked.is_set():
                asked.asked.clear()
                cuts += proxy.cut() > 0
                asked.done.set()
            if limit is not None and cuts >= limit:
                if asked is None:
                    break
            elif time.monotonic() >= next_cut:
                cuts += proxy.cut() > 0
                next_cut = time.monotonic() + every_s
            time.sleep(0.005)
        for t in threads:
            t.join(timeout=60)
    finally:
        proxy.close()
    return cuts


def counters(daemon):
    return ask(daemon.stats_path(), "stats")["counters"]


@pytest.mark.parametrize("opts", [
    {"format": "e4m3"},
    {"format": "e5m2", "scaling": "global", "async_": 1},
    {"format": "e4m3", "async_": 1, "chunk_elems": 1024},
], ids=["local", "global-async", "chunked-async"])
def test_results_survive_connections_that_reset(daemon_factory, opts):
    extra = ("--chunk_bytes", "4k") if opts.get("chunk_elems") else ()
    daemon = daemon_factory(extra=extra)
    proxy = BlipProxy(port_of(daemon.endpoint))
    world, steps, sizes = 3, 120, [4097, 7, 20000]
    try:
        procs = [start_worker(proxy.endpoint, r, world, sizes, steps=steps, jitter_ms=3,
                              timeout_ms=30000, **opts) for r in range(world)]
        cuts = cut_while(proxy, procs, 0.35, 6)
        results = collect(procs, 90)
    finally:
        proxy.close()
    for code, out in results:
        assert code == 0 and "done rank=" in out, out
        assert out.count("ok step=") == steps * len(sizes), out
        assert "MISMATCH" not in out and "error" not in out, out
    c = counters(daemon)
    assert cuts >= 3, "the run ended before the connections were cut"
    assert c["peers_lost"] == 0 and c["errors_sent"] == 0, c
    assert c["reconnects"] >= cuts, c  # every cut brought sessions back
    assert c["rounds"] == steps * len(sizes), c  # each round once
    assert "rank reconnected job=default" in daemon.log_path.read_text()


def test_a_client_back_before_apsd_knows_its_connection_died_takes_it_over(daemon_factory):
    # Only the workers' side is reset: apsd's side of each connection stays
    # open and silent, and apsd would learn of it from its 5 s heartbeat
    # timeout. The client reconnects at once with the same routing id, and
    # ZMQ_ROUTER_HANDOVER gives the id to the new connection: each blip costs
    # a reconnect, not a heartbeat timeout.
    daemon = daemon_factory()
    proxy = BlipProxy(port_of(daemon.endpoint))
    world, steps, sizes = 2, 300, [4097, 7]
    start = time.monotonic()
    try:
        procs = [start_worker(proxy.endpoint, r, world, sizes, steps=steps, jitter_ms=3,
                              timeout_ms=30000) for r in range(world)]
        cuts = cut_while(proxy, procs, 0.3, 3, server_sees_it=False)
        results = collect(procs, 90)
    finally:
        proxy.close()
    elapsed = time.monotonic() - start
    for code, out in results:
        assert code == 0 and out.count("ok step=") == steps * len(sizes), out
    c = counters(daemon)
    assert cuts == 3 and c["reconnects"] >= cuts and c["peers_lost"] == 0, (cuts, c)
    assert elapsed < 10, f"{elapsed:.1f} s: the blips waited for apsd's heartbeat timeout"


def test_python_calls_survive_a_reset_mid_call(daemon_factory):
    """allreduce, broadcast and barrier of the Python client, two ranks in
    threads, with the connections reset while calls are in flight."""
    daemon = daemon_factory()
    proxy = BlipProxy(port_of(daemon.endpoint))
    n, rounds, failures = 50000, 40, []
    # The cuts every 0.15 s may all come after the last round (two idle cores run
    # the 40 rounds in less): rank 0 also asks for a cut before its allreduce of
    # rounds 10 and 25, while rank 1's of that round waits in flight for it
    cut_now = CutRequest()

    def rank(r):
        try:
            with aps.Client(proxy.endpoint, r, 2, format="fp32", timeout_ms=20000) as c:
                for i in range(rounds):
                    if r == 0 and i in (10, 25):
                        cut_now()
                    x = np.full(n, float(r + i), dtype=np.float32)
                    c.allreduce("g", x)
                    assert np.all(x == i + 0.5), (i, x[:3])
                    y = np.full(n, float(i) if r == 0 else -1.0, dtype=np.float32)
                    c.broadcast("w", y)
                    assert np.all(y == i), (i, y[:3])
                    c.barrier()
        except Exception as e:  # noqa: BLE001 - reported below
            failures.append(f"rank {r}: {e!r}")

    cuts = ranks_while_cutting(proxy, rank, 2, every_s=0.15, limit=8, asked=cut_now)
    assert not failures, failures
    c = counters(daemon)
    assert cuts >= 2 and c["reconnects"] >= 2 and c["peers_lost"] == 0, (cuts, c)
    assert c["barriers"] == rounds, c


def test_joining_survives_resets(daemon_factory):
    """Clients join new jobs while every connection is reset every 50 ms: a
    HELLO or its WELCOME lost with a connection is said again on the new one
    (apsd answers a second HELLO of a session it knows with WELCOME again)."""
    daemon = daemon_factory()
    proxy = BlipProxy(port_of(daemon.endpoint))
    jobs, failures = 20, []

    def rank(r):
        try:
            for j in range(jobs):
                with aps.Client(proxy.endpoint, r, 2, job=f"join{j}", format="fp32",
                                timeout_ms=20000) as c:
                    x = np.full(1000, float(r), dtype=np.float32)
                    c.allreduce("g", x)
                    assert np.all(x == 0.5), x[:3]
        except Exception as e:  # noqa: BLE001 - reported below
            failures.append(f"rank {r}: {e!r}")

    cuts = ranks_while_cutting(proxy, rank, 2, every_s=0.05)
    assert not failures, failures
    assert cuts >= 3, cuts  # the joins did meet resets


def test_a_rank_that_does_not_come_back_is_lost_after_the_grace(daemon_factory):
    daemon = daemon_factory(extra=("--reconnect_grace_ms", "800"))
    outs, waited = kill_rank_2_while_the_others_wait(daemon)
    for out in outs:
        assert "not back within 800 ms" in out, out
    assert 0.7 <= waited < 2.5, waited  # the grace, not at once and not the deadline
    assert "connection closed job=default rank=2 waiting_ms=800" in daemon.log_path.read_text()


@pytest.mark.parametrize("server_sees_it", [True, False], ids=["reset", "silent"])
def test_without_a_grace_a_blip_fails_the_calls_at_once(daemon_factory, server_sees_it):
    # reconnect_grace_ms = 0: a closed connection is lost at once ("reset"),
    # and when apsd still holds the old connection (only the workers' side
    # was reset: "silent") the client on its new one is a stranger; either
    # way the calls fail at once instead of waiting for what apsd did not keep
    daemon = daemon_factory(extra=("--reconnect_grace_ms", "0"))
    proxy = BlipProxy(port_of(daemon.endpoint))
    try:
        procs = [start_worker(proxy.endpoint, r, 2, [4097], steps=400, jitter_ms=2,
                              timeout_ms=20000) for r in range(2)]
        daemon.wait_for_log("hello job=default rank=1")
        # well into the run, and far from its end (the 400 steps take about 0.6 s on
        # two idle cores: a fixed 0.3 s after the HELLO, stretched on a loaded machine,
        # could cut after the last step)
        daemon.wait_for_log("round job=default tensor=layer0.weight step=10 ")
        start = time.monotonic()
        proxy.cut(server_sees_it)
        results = collect(procs, 30)
        waited = time.monotonic() - start
    finally:
        proxy.close()
    assert all(code == 3 for code, _ in results), results
    assert all("APS_EPEERLOST" in out or "APS_ENOSESSION" in out for _, out in results), results
    assert waited < 5, waited
    assert counters(daemon)["reconnects"] == 0
    if not server_sees_it:
        assert "its connection was replaced" in daemon.log_path.read_text()


def test_a_job_started_again_right_after_its_ranks_were_killed(daemon_factory):
    # every rank killed: their sessions wait to reconnect; a new run under the
    # same job name is not refused as "cannot go on", the old job just ends
    daemon = daemon_factory()
    old = [start_worker(daemon.endpoint, r, 2, [8], steps=1, sleep_ms=30000,
                        timeout_ms=20000) for r in range(2)]
    # both ranks in the job before they die (a rank killed before its hello
    # never had a session to close)
    daemon.wait_for_log("hello job=default rank=0")
    daemon.wait_for_log("hello job=default rank=1")
    for p in old:
        p.send_signal(signal.SIGKILL)
        p.wait()
    # both sessions closed, as the test's premise says (waiting for rank 1's
    # alone let a new rank 0 meet the old rank 0's session still open)
    daemon.wait_for_log("connection closed job=default rank=0")
    daemon.wait_for_log("connection closed job=default rank=1")
    results = run_workers(daemon.endpoint, 2, [4097, 7], steps=3, timeout=30)
    for code, out in results:
        assert code == 0 and out.count("ok step=") == 6, out


def test_a_new_client_takes_the_rank_of_one_that_did_not_come_back(daemon_factory):
    # elastic: the killed rank's session waits for its grace; a new process for
    # the same rank is not refused as "held by a live session": the old one is
    # counted lost at once and the new one comes back at the next barrier
    daemon = daemon_factory(extra=("--elastic", "yes", "--reconnect_grace_ms", "60000"))
    proc = start_worker(daemon.endpoint, 1, 2, [8], steps=1, sleep_ms=30000,
                        timeout_ms=20000)
    with aps.Client(daemon.endpoint, 0, 2, format="fp32", timeout_ms=20000) as c0:
        daemon.wait_for_log("hello job=default rank=1")
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        daemon.wait_for_log("connection closed job=default rank=1")
        with aps.Client(daemon.endpoint, 1, 2, format="fp32", timeout_ms=20000) as c1:
            done = threading.Thread(target=c1.barrier)
            done.start()
            c0.barrier()
            done.join(timeout=20)
    text = daemon.log_path.read_text()
    assert "a new client took its rank" in text, text[-3000:]


class WelcomeThenClose:
    """A daemon by hand (raw ZMTP): it welcomes every HELLO, and closes the
    first connection right after its WELCOME, the FIN behind the frame: the
    client reads the WELCOME and its connection's end together. The WELCOME's
    keepalive_ms of 60 s leaves the loss of the connection as the only way for
    the client to see that it must come back."""

    READY = b"\x05READY\x0bSocket-Type" + struct.pack(">I", 6) + b"ROUTER"

    def __init__(self):
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"tcp://127.0.0.1:{self.listener.getsockname()[1]}"
        self.hellos = []  # (time, flags) of every HELLO
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self):
        first = True
        while True:
            try:
                s, _ = self.listener.accept()
            except OSError:
                return  # closed
            with s:
                try:
                    first = self.converse(s, first)
                except (EOFError, OSError):
                    pass

    def converse(self, s, first):
        s.sendall(NULL_GREETING)
        s.recv(64, socket.MSG_WAITALL)
        s.sendall(zmtp_frame(self.READY, command=True))
        while True:
            flags, body = zmtp_read_frame(s)
            if flags & 4:
                continue  # the client's READY
            m = decode(body)
            while flags & 1:
                flags, _ = zmtp_read_frame(s)
            if m["type"] != HELLO:
                continue
            self.hellos.append((time.monotonic(), m.get("flags", 0)))
            s.sendall(zmtp_frame(envelope(
                type=WELCOME, keepalive_ms=60000, version_major=1, version_minor=8,
                session=m.get("session", b""),
                **{k: m[k] for k in ("job", "rank", "world_size") if k in m})))
            if first:
                return False  # closed by the caller's with, right behind the WELCOME

    def close(self):
        self.listener.close()


def test_a_connection_that_closes_right_after_its_welcome_is_noticed_at_once():
    # The soak's one failure in a clean-clone CI (rank 0 of a job that had just
    # started, APS_ENOSESSION after a blip): the join waits for its WELCOME in
    # zmq_poll, which took the monitor's signal of the close that came with it;
    # the I/O thread's poll then waited on that signal, and the client saw the
    # loss only at keepalive_ms (5 s), after its grace of 1.5 s. Missed in 29 of
    # 40 tries before the fix.
    for attempt in range(20):
        d = WelcomeThenClose()
        try:
            c = aps.Client(d.endpoint, 0, 1, format="e4m3", job="w", timeout_ms=3000)
            welcomed = time.monotonic()
            while len(d.hellos) < 2 and time.monotonic() - welcomed < 1.0:
                time.sleep(0.005)
            c.close()
        finally:
            d.close()
        assert len(d.hellos) >= 2, f"try {attempt}: no HELLO again 1 s after the close"
        assert d.hellos[1][1] & FLAG_RESUME, f"try {attempt}: not a resume: {d.hellos}"
