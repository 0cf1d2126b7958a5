"""What the ranks of multi-process tests run (imported by spawned processes:
keep torch imports inside the functions that need it)."""

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
