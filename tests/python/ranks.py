"""What the ranks of multi-process tests run (imported by spawned processes:
keep torch imports inside the functions that need it)."""

import multiprocessing
import queue
import time
import traceback


def rank_main(results, fn, rank, world, endpoint, args):
    """Entry point of one spawned rank: reports (rank, ok, result or traceback)."""
    try:
        results.put((rank, True, fn(rank, world, endpoint, *args)))
    except BaseException:
        results.put((rank, False, traceback.format_exc()))


def import_torch():
    import torch
    torch.set_num_threads(1)
    return torch


def run_ranks(fn, world, endpoint, *args, timeout=60):
    """Runs fn(rank, world, endpoint, *args) in `world` spawned processes and
    returns their results by rank. A rank's exception fails the test with its
    traceback; past timeout seconds every process is killed."""
    import pytest
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=rank_main, args=(results, fn, r, world, endpoint, args),
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
