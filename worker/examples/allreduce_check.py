#!/usr/bin/python3
"""One rank of a short all-reduce whose result is known: the default worker of
deploy/slurm/apsd.sbatch and of deploy/k8s/workers.yaml, a check that a job's
daemons and ranks found each other before anything long runs on them.

Rank r of W contributes (r + 1) * base to a tensor larger than one partition
(so that with several shards it is cut across them) and to a small one; in
fp32 the daemons' mean is exactly base * (W + 1) / 2. Every rank checks its
result and prints one line; rank 0 ends with "allreduce check passed". Exits 1
on a wrong result (aps.Error on a failed call). The rank, world size, shards
and token come from the environment (aps.Client.from_env: SLURM_PROCID,
SLURM_NTASKS or RANK, WORLD_SIZE; APS_ENDPOINT, APS_JOB, APS_JOB_TOKEN):

    APS_ENDPOINT=tcp://127.0.0.1:5555 RANK=0 WORLD_SIZE=1 python3 allreduce_check.py
"""

import pathlib
import sys

import numpy as np

TREE = pathlib.Path(__file__).resolve().parents[1] / "python"
if (TREE / "aps").is_dir():
    sys.path.insert(0, str(TREE))  # in a source tree: its package, build/worker/libaps
import aps  # noqa: E402

# (name, elements): 1.5 partitions of the default 4 MiB, and a bias-sized one.
TENSORS = [("check.large", (3 << 20) // 2 + 17), ("check.small", 1000)]


def base(n):
    """Values exactly representable, with every (r+1)-multiple and mean too."""
    return (np.arange(n, dtype=np.float32) % 251 - 125) * np.float32(0.25)


def main():
    with aps.Client.from_env(format="fp32") as client:
        rank, world = client.rank, client.world_size
        for name, n in TENSORS:
            x = base(n) * np.float32(rank + 1)
            client.allreduce(name, x)
            want = base(n) * np.float32((world + 1) / 2)
            if not np.array_equal(x, want):
                bad = int(np.flatnonzero(x != want)[0])
                print(f"rank {rank}/{world}: {name}[{bad}] = {x[bad]}, expected {want[bad]}",
                      flush=True)
                return 1
        client.barrier()
        shards = len(client.endpoint.split(","))
        print(f"rank {rank}/{world}: allreduce ok", flush=True)
        if rank == 0:
            print(f"allreduce check passed: {world} ranks, {shards} shards", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
