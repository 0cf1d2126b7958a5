"""apsd's engine threads (`threads`): chunk c of tensor i is summed and encoded by
thread (i + c) mod k, in rank order, so every thread count gives the same bits.
itest_worker checks every result bit for bit against its own rank-ordered sum,
which knows nothing of threads; the stats socket says the threads did the work.
Rounds are also torn down under the threads: a rank lost mid-step, a job that
ends, a daemon stopped while chunks are in flight."""

import re
import signal
import time

import pytest

from conftest import run_workers, start_worker
from test_daemon import assert_all_ok

# 16384-element chunks (the smallest the engine takes): 19 + 5 + 1 + 1 chunks.
CHUNK = ["--chunk_bytes", "64k"]
SIZES = [300_000, 70_001, 16_384, 5]


def sums(results):
    """Each rank's result checksums (they must agree): rank 0's lines."""
    lines = [re.findall(r"^ok step=\d+ tensor=\d+ n=\d+ sum=\w+$", out, re.M)
             for _, out in results]
    assert all(line == lines[0] for line in lines), "ranks differ"
    return lines[0]


@pytest.mark.parametrize("fmt,scaling", [("e4m3", "local"), ("fp4", "block"),
                                         ("e5m2", "global"), ("fp32", "none")])
def test_every_thread_count_gives_the_same_bits(daemon_factory, fmt, scaling):
    # itest_worker's own expectation knows no blocks: there the thread counts are
    # compared with each other only
    checked = scaling != "block"
    seen = {}
    for threads in (1, 2, 3):
        # and ZeroMQ's connections over 2 I/O threads once
        io = ["--io_threads", "2"] if threads == 3 else []
        d = daemon_factory(extra=CHUNK + ["--threads", str(threads)] + io)
        results = run_workers(d.endpoint, 4, SIZES, steps=3, format=fmt, scaling=scaling,
                              chunk_elems=16384, async_=1, jitter_ms=4,
                              unchecked=int(not checked))
        assert_all_ok(results, 3, len(SIZES))
        seen[threads] = sums(results)
        counters = d.ask("stats")["counters"]
        assert counters["engine_threads"] == threads
        # per step: 4 ranks' sums and one encoding of each of the 25 large chunks
        assert counters["engine_tasks"] == (0 if threads == 1 else 3 * 25 * 5), counters
        d.stop()
    assert seen[1] == seen[2] == seen[3]


def test_the_policy_measures_its_error_on_the_threads(daemon_factory):
    """policy = auto decodes every result to measure its error, on the threads too: a
    threshold below e4m3's error moves the large tensors up, at the same steps and with
    the same measured error as on the loop."""
    seen = {}
    for threads in (1, 2):
        d = daemon_factory(extra=CHUNK + ["--threads", str(threads), "--policy", "auto",
                                          "--error_up", "0.01", "--window_up", "1"])
        results = run_workers(d.endpoint, 4, SIZES, steps=4, format="e4m3",
                              chunk_elems=16384, policy=1, unchecked=1, jitter_ms=2)
        assert_all_ok(results, 4, len(SIZES))
        d.stop()
        switches = re.findall(r"switch job=\S+ tensor=\S+ step=\d+ from=\S+ to=\S+ "
                              r"reason=\S+ flushed=\S+ error=(\S+)", d.log_path.read_text())
        seen[threads] = (sums(results), switches)
    assert seen[1] == seen[2]
    assert len(seen[2][1]) >= 2 and all(float(e) > 0.01 for e in seen[2][1]), seen[2][1]


def test_a_rank_lost_mid_step_tears_down_chunks_in_flight(daemon_factory):
    """Three ranks push 80 large chunks each and the fourth is killed: the job ends
    with APS_EPEERLOST while the threads hold their sums; apsd serves the next job."""
    d = daemon_factory(extra=CHUNK + ["--threads", "2"])
    big = [1_310_720]  # 80 chunks
    procs = [start_worker(d.endpoint, r, 4, big, steps=1, chunk_elems=16384,
                          sleep_ms=(30000 if r == 3 else 0), timeout_ms=20000)
             for r in range(4)]
    d.wait_for_stall([3])
    procs[3].send_signal(signal.SIGKILL)
    for p in procs[:3]:
        out, _ = p.communicate(timeout=20)
        assert p.returncode == 3 and "APS_EPEERLOST" in out, out
    procs[3].wait()
    assert_all_ok(run_workers(d.endpoint, 4, SIZES, steps=2, chunk_elems=16384, jitter_ms=2),
                  2, len(SIZES))


def test_elastic_job_goes_on_without_a_rank_whose_chunks_were_summed(daemon_factory):
    d = daemon_factory(extra=CHUNK + ["--threads", "2", "--elastic", "yes"])
    procs = [start_worker(d.endpoint, r, 3, [400_000], steps=2, chunk_elems=16384,
                          sleep_ms=(30000 if r == 2 else 0), timeout_ms=20000, unchecked=1)
             for r in range(3)]
    d.wait_for_stall([2])
    procs[2].send_signal(signal.SIGKILL)
    procs[2].wait()
    for p in procs[:2]:
        out, _ = p.communicate(timeout=30)
        assert p.returncode == 0, out
    assert d.counter("peers_lost") == 1


def test_stopping_apsd_while_the_threads_work_exits_cleanly(daemon_factory):
    """SIGTERM in the middle of big steps: apsd joins its threads and exits 0 (the
    fixture checks the exit code, and under ASan the leak check)."""
    d = daemon_factory(extra=CHUNK + ["--threads", "3"])
    procs = [start_worker(d.endpoint, r, 4, [2_000_000], steps=50, chunk_elems=16384,
                          timeout_ms=20000) for r in range(4)]
    deadline = time.monotonic() + 20
    while d.counter("engine_tasks") < 200 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert d.counter("engine_tasks") >= 200
    assert d.stop() == 0
    for p in procs:
        p.communicate(timeout=20)
