"""Where a worker finds its daemon, job, rank and world size: the environment
its launcher set.

Rank and world size come in pairs, the first pair present wins:
APS_RANK/APS_WORLD_SIZE (explicit, e.g. from aps.launch), RANK/WORLD_SIZE
(torchrun), SLURM_PROCID/SLURM_NTASKS (srun); none of them means rank 0 of a
world of 1.
"""

import os

DEFAULT_ENDPOINT = "tcp://127.0.0.1:5555"
DEFAULT_JOB = "default"
RANK_SOURCES = (("APS_RANK", "APS_WORLD_SIZE"), ("RANK", "WORLD_SIZE"),
                ("SLURM_PROCID", "SLURM_NTASKS"))


def _int_var(environ, name):
    text = environ[name]
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"environment variable {name}={text!r} is not an integer") from None


def rank_and_world(environ=None):
    """(rank, world_size) from the first complete pair of RANK_SOURCES."""
    environ = os.environ if environ is None else environ
    for rank_var, world_var in RANK_SOURCES:
        have_rank, have_world = rank_var in environ, world_var in environ
        if have_rank != have_world:
            missing = world_var if have_rank else rank_var
            raise ValueError(f"{rank_var if have_rank else world_var} is set but {missing} "
                             "is not: set both or neither")
        if have_rank:
            rank, world = _int_var(environ, rank_var), _int_var(environ, world_var)
            if world < 1:
                raise ValueError(f"environment variable {world_var}={world} is not a world "
                                 "size: it must be at least 1")
            if not 0 <= rank < world:
                raise ValueError(f"environment variable {rank_var}={rank} is not a rank of "
                                 f"{world_var}={world}: it must be 0 to {world - 1}")
            return rank, world
    return 0, 1


def client_config(environ=None):
    """The Client arguments the environment gives: endpoint (APS_ENDPOINT, one
    endpoint or a comma-separated list of shards), job, rank, world_size, and
    job_token (APS_JOB_TOKEN) and connect_timeout_ms (APS_CONNECT_TIMEOUT_MS)
    when they are set."""
    environ = os.environ if environ is None else environ
    rank, world_size = rank_and_world(environ)
    config = {"endpoint": environ.get("APS_ENDPOINT") or DEFAULT_ENDPOINT,
              "job": environ.get("APS_JOB") or DEFAULT_JOB,
              "rank": rank, "world_size": world_size}
    if environ.get("APS_JOB_TOKEN"):
        config["job_token"] = environ["APS_JOB_TOKEN"]
    if environ.get("APS_CONNECT_TIMEOUT_MS"):
        ms = _int_var(environ, "APS_CONNECT_TIMEOUT_MS")
        if ms < 0:
            raise ValueError(f"environment variable APS_CONNECT_TIMEOUT_MS={ms} is negative: "
                             "it must be 0 (no limit) or a number of ms")
        config["connect_timeout_ms"] = ms
    return config
