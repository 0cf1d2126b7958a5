"""The client's I/O role against the real apsd: a lone call is sent and its
reply read by its caller, and the I/O thread, with no call in flight, waits
quietly (it does not watch the socket's messages, it looks at them every
50 ms). What that must not cost: a call polled with aps_request_done is seen
done as soon as its reply is in, and what apsd says to an idle client (its
BYE) still reaches the next call at once."""

import ctypes
import signal
import statistics
import threading
import time

import numpy as np

import aps
from aps._lib import check, lib

N = 1024


def test_a_polled_call_is_seen_done_as_soon_as_its_reply_is_in(daemon):
    with aps.Client(daemon.endpoint, 0, 1, format="e4m3", job="poll") as c:
        x = np.ones(N, np.float32)
        c.allreduce("t", x)  # registers t
        tid = c._ids["t"][0]
        waits = []
        for _ in range(20):
            req = ctypes.c_void_p()
            check(lib.aps_client_allreduce_start(c._c, tid, x.ctypes.data, N, 5000,
                                                 ctypes.byref(req)))
            started = time.monotonic()
            while lib.aps_request_done(req) == 0:
                time.sleep(0.0002)
            waits.append(time.monotonic() - started)
            check(lib.aps_request_wait(req))
            time.sleep(0.01)  # the I/O thread goes back to its quiet wait
        assert np.allclose(x, 1.0)
        # A quiet I/O thread alone would see each reply at its next look (0-50 ms).
        assert statistics.median(waits) < 0.010, waits


def test_an_idle_client_hears_the_bye_of_a_stopping_apsd(daemon_factory):
    d = daemon_factory()
    with aps.Client(d.endpoint, 0, 1, format="e4m3", job="idle", timeout_ms=20000) as c:
        x = np.ones(N, np.float32)
        c.allreduce("t", x)
        d.proc.send_signal(signal.SIGTERM)
        assert d.proc.wait(timeout=10) == 0
        time.sleep(0.2)  # the I/O thread's next look reads the BYE
        started = time.monotonic()
        try:
            c.allreduce("t", x)
            raise AssertionError("a call after apsd stopped succeeded")
        except aps.Error as e:
            assert e.name == "APS_ECONN" and "shutting down" in str(e), e
        assert time.monotonic() - started < 1.0


def test_a_call_left_alone_while_its_caller_waits_is_read_at_once(daemon):
    # Rank 0 starts a and b and waits for a; rank 1 answers b first, a 5 ms later.
    # When b ends, a is alone and its waiting caller must read its reply (a quiet
    # I/O thread leaves it to the caller): before, it waited for the next look.
    kw = dict(format="e4m3", job="alone", timeout_ms=5000)
    with aps.Client(daemon.endpoint, 0, 2, **kw) as c0, \
            aps.Client(daemon.endpoint, 1, 2, **kw) as c1:
        xs = {n: np.ones(N, np.float32) for n in "ab"}
        ys = {n: np.ones(N, np.float32) for n in "ab"}
        first = threading.Thread(target=lambda: [c1.allreduce(n, ys[n]) for n in "ab"])
        first.start()
        for n in "ab":
            c0.allreduce(n, xs[n])  # registers a and b on both ranks
        first.join()
        started, answered = threading.Event(), []

        def rank1():
            started.wait(5)
            time.sleep(0.005)
            c1.allreduce("b", ys["b"])
            time.sleep(0.005)
            answered.append(time.monotonic())
            c1.allreduce("a", ys["a"])

        lags = []
        for _ in range(10):
            started.clear()
            answered.clear()
            t = threading.Thread(target=rank1)
            t.start()
            reqs = {}
            for n in "ab":
                reqs[n] = ctypes.c_void_p()
                check(lib.aps_client_allreduce_start(c0._c, c0._ids[n][0], xs[n].ctypes.data,
                                                     N, 5000, ctypes.byref(reqs[n])))
            started.set()
            check(lib.aps_request_wait(reqs["a"]))
            lags.append(time.monotonic() - answered[0])
            check(lib.aps_request_wait(reqs["b"]))
            t.join()
        assert statistics.median(lags) < 0.015, lags


def test_a_lone_call_fails_at_its_deadline_not_a_timer_later(daemon):
    # Before: the caller's turn that found the deadline passed then polled the
    # socket until the next timer (a 500 ms call failed after 1.0 s).
    with aps.Client(daemon.endpoint, 0, 1, format="e4m3", job="late") as c:
        x = np.ones(N, np.float32)
        c.allreduce("t", x)
        daemon.proc.send_signal(signal.SIGSTOP)
        try:
            took = []
            for timeout_ms in (500, 800):
                started = time.monotonic()
                try:
                    c.allreduce("t", x, timeout_ms=timeout_ms)
                    raise AssertionError("a call to a stopped apsd succeeded")
                except aps.Error as e:
                    assert e.name == "APS_ETIMEDOUT", e
                took.append(time.monotonic() - started - timeout_ms / 1000)
        finally:
            daemon.proc.send_signal(signal.SIGCONT)
        assert max(took) < 0.25, took
