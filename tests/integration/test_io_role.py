"""The client's I/O role against the real apsd: a lone call is sent and its
reply read by its caller, and the I/O thread, with no call in flight, waits
quietly (it does not watch the socket's messages, it looks at them every
50 ms). What that must not cost: a call polled with aps_request_done is seen
done as soon as its reply is in, and what apsd says to an idle client (its
BYE) still reaches the next call at once."""

import ctypes
import signal
import statistics
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
