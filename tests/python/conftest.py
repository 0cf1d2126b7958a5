"""Fixtures of the Python tests: the path to the aps package, a real apsd on a
free port, and real worker processes (multiprocessing, spawn) with deadlines."""

import multiprocessing
import pathlib
import queue
import sys
import time

import pytest

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT / "worker" / "python"))
sys.path.insert(0, str(HERE))

import aps.daemon  # noqa: E402
import ranks  # noqa: E402

APSD = ROOT / "build" / "server" / "apsd"


@pytest.fixture
def apsd():
    """The endpoint of a fresh apsd (build/server/apsd) that must exit cleanly."""
    d = aps.daemon.LocalDaemon(binary=str(APSD), log_level="warn").start()
    try:
        yield d.endpoint
    finally:
        assert d.stop() == 0, "apsd did not exit cleanly"


def run_ranks(fn, world, endpoint, *args, timeout=60):
    """Runs fn(rank, world, endpoint, *args) in `world` spawned processes and
    returns their results by rank. A rank's exception fails the test with its
    traceback; past timeout seconds every process is killed."""
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=ranks.rank_main, args=(results, fn, r, world, endpoint, args),
                         daemon=True) for r in range(world)]
    for p in procs:
        p.start()
    got, deadline = {}, time.monotonic() + timeout
    try:
        while len(got) < world:
            try:
                rank, ok, value = results.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                pytest.fail(f"{fn.__name__}: ranks {sorted(set(range(world)) - set(got))} did "
                            f"not finish within {timeout} s")
            if not ok:
                pytest.fail(f"{fn.__name__}: rank {rank} failed:\n{value}")
            got[rank] = value
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join()
    return [got[r] for r in range(world)]
