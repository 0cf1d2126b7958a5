"""The client against a daemon that floods it (flood_daemon.py, a stand-in apsd
in a process of its own): while a call waits, the socket never runs dry, of
stale RESULTs (valid messages for another step) or of garbage frames. The call
still fails by its deadline (the client reads the socket in batches and runs its
timers between them), its memory stays bounded, and once the flood is over the
same client makes its next call."""

import os
import pathlib
import subprocess
import sys
import time

import numpy as np
import pytest

import aps
from conftest import free_port
from peers import rss_kib

HERE = pathlib.Path(__file__).resolve().parent
N = 1024
TIMEOUT_MS = 2000
FLOOD_S = 6.0


@pytest.mark.parametrize("mode", ["stale", "garbage"])
def test_a_flood_does_not_hold_a_call_past_its_deadline(mode):
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    daemon = subprocess.Popen([sys.executable, str(HERE / "flood_daemon.py"), endpoint, mode,
                               str(FLOOD_S)], stdout=subprocess.PIPE, text=True)
    try:
        assert daemon.stdout.readline().strip() == "listening"
        x = np.linspace(-1, 1, N).astype(np.float32)
        base = rss_kib(os.getpid())
        with aps.Client(endpoint, 0, 1, format="e4m3", job="flood", timeout_ms=TIMEOUT_MS) as c:
            started = time.monotonic()
            with pytest.raises(aps.Error) as e:
                c.allreduce("t", x)
            took = time.monotonic() - started
            assert e.value.name == "APS_ETIMEDOUT", e.value
            assert took < TIMEOUT_MS / 1000 + 1.0, f"the call failed after {took:.1f} s"
            grown = rss_kib(os.getpid()) - base
            assert daemon.stdout.readline().strip() == "flooding"
            done = daemon.stdout.readline().split()  # the flood's end
            assert done[0] == "flooded" and int(done[1]) > 10000, done
            assert grown < 32 * 1024, f"the client grew by {grown} KiB under the flood"
            # the stale results left on the socket are read and dropped; the next
            # call gets its own answer
            y = c.allreduce("t", x)
            assert np.allclose(y, x, rtol=0.07, atol=1e-3)
    finally:
        daemon.kill()
        daemon.wait()
