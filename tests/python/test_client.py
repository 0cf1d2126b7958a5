"""aps.Client against a real apsd: argument checks before anything is sent,
error mapping, exact fp32 all-reduce of numpy and torch data over real
processes, asynchronous calls, and the environment a launcher sets."""

import os
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

import aps
import aps._env
import aps._lib
import aps.client
import aps.daemon
from conftest import run_ranks


# -- environment ------------------------------------------------------------

def test_env_defaults_and_precedence():
    assert aps._env.client_config({}) == {"endpoint": "tcp://127.0.0.1:5555", "job": "default",
                                          "rank": 0, "world_size": 1}
    env = {"APS_ENDPOINT": "ipc:///tmp/a", "APS_JOB": "j", "SLURM_PROCID": "3",
           "SLURM_NTASKS": "8"}
    assert aps._env.client_config(env) == {"endpoint": "ipc:///tmp/a", "job": "j", "rank": 3,
                                           "world_size": 8}
    assert aps._env.rank_and_world({**env, "RANK": "1", "WORLD_SIZE": "2"}) == (1, 2)
    assert aps._env.rank_and_world({**env, "RANK": "1", "WORLD_SIZE": "2", "APS_RANK": "0",
                                    "APS_WORLD_SIZE": "4"}) == (0, 4)


def test_env_job_token():
    assert aps._env.client_config({"APS_JOB_TOKEN": "t0k"})["job_token"] == "t0k"
    assert "job_token" not in aps._env.client_config({"APS_JOB_TOKEN": ""})


@pytest.mark.parametrize("env,match", [({"RANK": "1"}, "WORLD_SIZE is not"),
                                       ({"APS_WORLD_SIZE": "2"}, "APS_RANK is not"),
                                       ({"RANK": "x", "WORLD_SIZE": "2"}, "not an integer"),
                                       ({"APS_RANK": "4", "APS_WORLD_SIZE": "4"},
                                        r"APS_RANK=4 is not a rank of APS_WORLD_SIZE=4: it "
                                        r"must be 0 to 3"),
                                       ({"RANK": "-1", "WORLD_SIZE": "4"}, "RANK=-1 is not"),
                                       ({"SLURM_PROCID": "0", "SLURM_NTASKS": "0"},
                                        "SLURM_NTASKS=0 is not a world size"),
                                       ({"APS_CONNECT_TIMEOUT_MS": "-5"},
                                        "APS_CONNECT_TIMEOUT_MS=-5 is negative")])
def test_env_errors(env, match):
    # (before: a rank outside its world reached Client, which named no variable)
    with pytest.raises(ValueError, match=match):
        aps._env.client_config(env)


# -- options and connection errors ----------------------------------------------

def test_no_daemon_is_a_clear_refusal():
    endpoint = aps.daemon.free_endpoint()
    with pytest.raises(aps.Error, match="connection refused") as err:
        aps.Client(endpoint, 0, 1, timeout_ms=200)
    assert err.value.name == "APS_ECONN" and "is apsd running there" in str(err.value)


def test_connect_timeout_ms_bounds_joining():
    endpoint = aps.daemon.free_endpoint()
    start = time.monotonic()
    with pytest.raises(aps.Error, match="within connect_timeout_ms = 700: connection refused"):
        aps.Client(endpoint, 0, 1, timeout_ms=60000, connect_timeout_ms=700)
    assert time.monotonic() - start < 3
    with pytest.raises(aps.Error, match="within connect_timeout_ms = 600"):
        aps.Client.from_env({"APS_ENDPOINT": endpoint, "APS_CONNECT_TIMEOUT_MS": "600"},
                            timeout_ms=60000)
    assert aps._env.client_config({"APS_CONNECT_TIMEOUT_MS": "2500"})["connect_timeout_ms"] == 2500
    assert "connect_timeout_ms" not in aps._env.client_config({})
    with pytest.raises(ValueError, match="connect_timeout_ms must be 0"):
        aps.Client(endpoint, 0, 1, connect_timeout_ms=-1)


@pytest.mark.parametrize("kwargs,exc,match", [
    ({"format": "e9m2"}, ValueError, "'e9m2' is not a format"),
    ({"downlink": "fp7"}, ValueError, "downlink 'fp7' is not a format"),
    ({"scaling": "paper"}, ValueError, "scaling must be one of"),
    ({"rank": 2, "world_size": 2}, ValueError, "rank 2 is not in a world of 2"),
    ({"rank": -1}, ValueError, "rank -1 is not in a world of 1"),
    ({"rank": "0"}, TypeError, "rank must be an int"),
    ({"format": 8}, TypeError, "format must be a str"),
    ({"job": ""}, ValueError, "job name must have 1 to 64 bytes"),
    ({"job_token": "two words"}, ValueError, "job_token must be 1 to 128 visible ASCII"),
    ({"job_token": "x" * 129}, ValueError, "job_token must be 1 to 128 visible ASCII"),
    # (found by helper-36) "no" and "False" were truthy: they meant yes
    ({"error_feedback": "no"}, TypeError, "error_feedback must be True or False, not 'no'"),
    ({"rejoin": "False"}, TypeError, "rejoin must be True or False"),
    ({"payload_crc": "off"}, TypeError, "payload_crc must be True or False"),
    ({"payload_crc": 2}, TypeError, "payload_crc must be True or False, not 2"),
])
def test_bad_options_are_refused_before_connecting(kwargs, exc, match):
    args = {"endpoint": "tcp://127.0.0.1:1", "rank": 0, "world_size": 1, **kwargs}
    with pytest.raises(exc, match=match):
        aps.Client(**args)


def test_argument_checks_happen_before_sending(apsd):
    with aps.Client(apsd, 0, 1, format="fp32") as c:
        x = np.arange(12, dtype=np.float32).reshape(3, 4)
        cases = [
            (np.zeros(12), TypeError, "dtype float32"),
            ([1.0, 2.0], TypeError, "numpy.ndarray or torch.Tensor"),
            (np.zeros((4, 6), np.float32)[:, :3], ValueError, "C-contiguous"),
            (torch.zeros(12, dtype=torch.float16), TypeError, "torch.float32"),
            (torch.zeros(4, 3).t(), ValueError, "contiguous"),
            (np.zeros(13, np.float32), ValueError, "has 13 elements but was registered with 12"),
            (np.zeros(0, np.float32), ValueError, "empty"),
        ]
        assert c.allreduce("x", x) is x
        for bad, exc, match in cases:
            with pytest.raises(exc, match=match):
                c.allreduce("x" if bad.__class__ is not list else "y", bad)
        ro = np.zeros(12, np.float32)
        ro.flags.writeable = False
        with pytest.raises(ValueError, match="read-only"):
            c.allreduce("x", ro)
        for name, exc in [("", ValueError), ("n" * 256, ValueError), (3, TypeError)]:
            with pytest.raises(exc):
                c.allreduce(name, x)
        with pytest.raises(ValueError, match="rank 0 only"):
            c.broadcast("x", x, root=1)
        # Nothing above reached the daemon: the tensor is still at its first step.
        assert np.array_equal(c.allreduce("x", x), np.arange(12, dtype=np.float32).reshape(3, 4))


def test_tensors_the_daemon_would_refuse_are_refused_by_the_client(apsd):
    """Names of non-ASCII or spaces and counts past 2**32 (what apsd takes) are
    refused by libaps before REGISTER goes, and the client goes on."""
    with aps.Client(apsd, 0, 1, format="fp32") as c:
        for name in ("two words", "caf\u00e9", "tab\there"):
            with pytest.raises(aps.ArgumentError, match="visible ASCII"):
                c.codes_layouts([(name, 4)])
        with pytest.raises(aps.ArgumentError, match="4294967296"):
            c.codes_layouts([("big", 2**32 + 1)])
        x = np.ones(4, np.float32)
        assert np.array_equal(c.allreduce("fine", x), np.ones(4, np.float32))


def test_nonfinite_raises_or_is_sent_as_zeros(apsd):
    with aps.Client(apsd, 0, 1, format="e4m3") as c:
        x = np.array([1.0, np.inf, 2.0], np.float32)
        with pytest.raises(aps.Error, match="1 NaN or inf values; nothing was sent") as err:
            c.allreduce("g", x)
        assert err.value.name == "APS_ENONFINITE"
        y = np.array([0.5, 0.25], np.float32)
        assert c.allreduce_many_async([("g", x), ("h", y)], nonfinite="zero").wait() == ["g"]
        assert np.array_equal(x, np.zeros(3, np.float32)) and np.array_equal(y, [0.5, 0.25])
        with pytest.raises(ValueError):
            c.allreduce_many_async([("g", x)], nonfinite="ignore")


def test_batches_calls_and_waits_say_what_is_wrong(apsd):
    # (found by helper-36's audit) each of these passed or failed with another
    # call's words before
    with aps.Client(apsd, 0, 1, format="fp32") as c:
        x = np.ones(4, np.float32)
        with pytest.raises(ValueError, match="tensor 'g' comes twice in one batch"):
            c.allreduce_many_async([("g", x), ("g", x.copy())])  # was APS_EBUSY
        with pytest.raises(ValueError, match="timeout -1.0 is out of range"):
            c.allreduce_async("g", x).wait(timeout=-1)  # was TimeoutError
        # a tensor whose registration failed takes its next first use's size
        with pytest.raises(aps.ArgumentError, match="4294967296"):
            c.codes_layouts([("huge", 2**33)])
        assert np.array_equal(c.allreduce("huge", x), np.ones(4, np.float32))
        codes = np.zeros((4, 8), np.uint8)[:, :4]
        with pytest.raises(ValueError, match="codes of 'huge' must be C-contiguous"):
            c.allreduce_codes_async([("huge", "fp32", codes, 0, np.zeros(16, np.uint8),
                                      np.zeros(1, np.int32))])


@pytest.mark.parametrize("flushed,exc,match", [
    (2**70, ValueError, r"flushed counts of 't' 1180591620717411303424 is out of range"),
    ("abc", TypeError, "flushed counts of 't' must be ints, not <U3"),
    (None, TypeError, "flushed counts of 't' must be an int"),
    (1.7, TypeError, "flushed counts of 't' must be ints, not float64"),
    ([1, -1], ValueError, "flushed counts of 't' must be non-negative, not -1"),
    ([[1]], ValueError, "one count per chunk, not 2-d"),
])
def test_flushed_counts_are_checked(flushed, exc, match):
    # (found by helper-36) 1.7 was cut to 1, 2**70 raised a bare OverflowError
    with pytest.raises(exc, match=match):
        aps.client._flushed_counts(aps._lib.CodesCall(), flushed, "t")
    counts = aps.client._flushed_counts(aps._lib.CodesCall(), [3, 0], "t")
    assert counts.tolist() == [3, 0] and counts.dtype == np.uint64


def test_step_reads_a_read_only_gradient(apsd):
    # (found by helper-36) a read-only gradient or like was refused as if
    # written into ("tensor 'w' is read-only: the result is written into it")
    with aps.Client(apsd, 0, 1, format="fp32", optimizer="sgd", job="ro") as c:
        w = np.ones(8, np.float32)
        c.broadcast("w", w)
        grad = np.full(8, 2.0, np.float32)
        grad.flags.writeable = False
        assert c.updates("w", grad) == 0
        c.step("w", grad, w, 0.5)
        assert np.array_equal(w, np.zeros(8, np.float32))
        with pytest.raises(ValueError, match="weights of 'w' is read-only"):
            c.step("w", np.ones(8, np.float32), grad, 0.5)
        with pytest.raises(aps.Error, match=r"Client.step in Python"):
            c.allreduce("w", np.ones(8, np.float32))
        with pytest.raises(aps.Error, match=r"pull of tensor 'never' \(id 1\): it has no "
                                            r"weights yet"):  # was "tensor id 1"
            c.pull("never", np.zeros(4, np.float32))


def test_closed_client_raises(apsd):
    with aps.Client(apsd, 0, 1) as c:
        c.barrier()
    assert c.closed and "closed" in repr(c)
    c.close()
    with pytest.raises(aps.Error, match="closed") as err:
        c.allreduce("x", np.zeros(3, np.float32))
    assert err.value.name == "APS_ECLOSED"


def test_a_job_token_keeps_others_out(apsd):
    with aps.Client(apsd, 0, 2, format="fp32", job="tok", job_token="s3cret") as c0:
        for token in (None, "guess"):
            with pytest.raises(aps.Error, match="not allowed in job 'tok'") as err:
                aps.Client(apsd, 1, 2, format="fp32", job="tok", job_token=token)
            assert err.value.name == "APS_EACCES"
        with aps.Client(apsd, 1, 2, format="fp32", job="tok", job_token="s3cret") as c1:
            h = c1.allreduce_async("t", np.full(4, 3, np.float32))
            assert c0.allreduce("t", np.ones(4, np.float32)).tolist() == [2, 2, 2, 2]
            assert h.wait().tolist() == [2, 2, 2, 2]


def test_from_env(apsd):
    env = {"APS_ENDPOINT": apsd, "APS_JOB": "envjob", "RANK": "0", "WORLD_SIZE": "1"}
    with aps.Client.from_env(env, format="fp32") as c:
        assert (c.endpoint, c.job, c.rank, c.world_size, c.format) == (apsd, "envjob", 0, 1,
                                                                      "fp32")
        assert c.allreduce("t", np.ones(3, np.float32)).tolist() == [1, 1, 1]


# -- several ranks ----------------------------------------------------------

def data(rank, kind, shape):
    """Rank-dependent values with a varied exponent range."""
    n = int(np.prod(shape))
    x = (np.arange(n, dtype=np.float32) - n / 3) * np.float32(1.37 ** (rank + 1)) / 7
    return x.reshape(shape) if kind == "numpy" else torch.from_numpy(x.reshape(shape))


SHAPES = [("numpy", (7,)), ("numpy", (3, 4, 5)), ("torch", (2, 3)), ("torch", (33, 1, 2))]


def rank_allreduce(rank, world, endpoint):
    with aps.Client(endpoint, rank, world, format="fp32", job="exact") as c:
        out = []
        for step in range(2):
            for i, (kind, shape) in enumerate(SHAPES):
                x = data(rank + step, kind, shape)
                assert c.allreduce(f"t{i}", x) is x
                out.append(np.array(x))
        return out


@pytest.mark.parametrize("world", [2, 3])
def test_allreduce_numpy_and_torch_is_the_exact_mean(apsd, world):
    results = run_ranks(rank_allreduce, world, apsd)
    want = []
    for step in range(2):
        for kind, shape in SHAPES:
            acc = np.zeros(shape, np.float32)
            for r in range(world):  # the daemon sums in rank order, in fp32
                acc += np.asarray(data(r + step, kind, shape))
            want.append(acc / np.float32(world))
    for rank, got in enumerate(results):
        for g, w in zip(got, want):
            assert g.shape == w.shape and np.array_equal(g, w), f"rank {rank}"


def rank_async(rank, world, endpoint):
    with aps.Client(endpoint, rank, world, format="e4m3", job="async") as c:
        xs = [np.full(5, rank + i, np.float32) for i in range(3)]
        c.barrier()  # both have joined: rank 1's sleep is not spent on rank 0's start
        if rank == 1:
            time.sleep(0.5)
        handles = [c.allreduce_async(f"a{i}", x) for i, x in enumerate(xs)]
        pending = [not h.done() for h in handles]
        spins = 0
        while not handles[-1].done():  # Python runs while the I/O thread waits
            spins += 1
            time.sleep(0.001)
        return pending, [h.wait().tolist() for h in handles], spins


def test_async_calls_run_in_order_while_python_computes(apsd):
    (pending, got, spins), (_, got1, _) = run_ranks(rank_async, 2, apsd)
    assert pending == [True, True, True] and spins > 10
    assert got == got1 == [[0.5] * 5, [1.5] * 5, [2.5] * 5]


def rank_crossed(rank, world, endpoint):
    """Rank 0 starts a then b, rank 1 b then a: only batches in flight together
    can complete (one at a time, each rank would wait for the other's first)."""
    with aps.Client(endpoint, rank, world, format="e4m3", job="crossed",
                    timeout_ms=5000) as c:
        xs = {name: np.full(4, rank + 1, np.float32) for name in "ab"}
        order = "ab" if rank == 0 else "ba"
        handles = [c.allreduce_async(name, xs[name]) for name in order]
        t0 = time.monotonic()
        got = [h.wait().tolist() for h in handles]
        c.barrier()  # waits for nothing in flight, then meets the other rank
        return got, time.monotonic() - t0


def test_async_batches_are_in_flight_together(apsd):
    for got, seconds in run_ranks(rank_crossed, 2, apsd):
        assert got == [[1.5] * 4, [1.5] * 4]
        assert seconds < 4, f"the crossed calls took {seconds:.1f} s (a timeout?)"


def rank_reuse(rank, world, endpoint):
    """The same tensor queued twice in a row: the second waits for the first."""
    with aps.Client(endpoint, rank, world, format="fp32", job="reuse") as c:
        x = np.full(3, rank + 1, np.float32)
        first = c.allreduce_async("t", x)
        second = c.allreduce_async("t", x)  # starts once x holds the first mean
        second.wait()
        return first.done(), x.tolist()


def test_same_tensor_twice_in_a_row_waits_for_itself(apsd):
    for first_done, got in run_ranks(rank_reuse, 2, apsd):
        assert first_done and got == [1.5] * 3  # mean of 1 and 2, then of 1.5 and 1.5


def rank_barrier_mismatch(rank, world, endpoint):
    with aps.Client(endpoint, rank, world, job="mismatch", timeout_ms=5000) as c:
        c.barrier()
        try:
            c.allreduce("w", np.zeros(4 + rank, np.float32))
        except aps.Error as e:
            return e.name, str(e)
        return None, ""


def test_size_mismatch_across_ranks_is_reported_to_every_rank(apsd):
    for name, text in run_ranks(rank_barrier_mismatch, 2, apsd):
        assert name == "APS_EMISMATCH" and "'w'" in text


DYING_RANK = """
import os, sys, time, aps
c = aps.Client(sys.argv[1], 1, 2, job="lost")
c.barrier()
time.sleep(0.3)
os._exit(0)  # dies mid-round, without BYE
"""


def test_lost_rank_is_named(apsd):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    dying = subprocess.Popen([sys.executable, "-c", DYING_RANK, apsd], env=env)
    try:
        with aps.Client(apsd, 0, 2, job="lost", timeout_ms=10000) as c:
            c.barrier()
            with pytest.raises(aps.Error, match="rank 1 of job 'lost' was lost") as err:
                c.allreduce("w", np.ones(3, np.float32))
            assert err.value.name == "APS_EPEERLOST"
    finally:
        assert dying.wait(timeout=10) == 0


def rank_broadcast(rank, world, endpoint):
    with aps.Client(endpoint, rank, world, format="e3m0", job="bcast", timeout_ms=5000) as c:
        x = np.full(6, 0.1 + rank, np.float32)
        return c.broadcast("b", x).tolist()


def test_broadcast_of_one_rank(apsd):
    assert run_ranks(rank_broadcast, 1, apsd) == [[np.float32(0.1).item()] * 6]


def test_broadcast_copies_rank_0_exactly(apsd):
    results = run_ranks(rank_broadcast, 2, apsd)
    assert results == [[np.float32(0.1).item()] * 6] * 2


def test_close_lets_queued_calls_finish(apsd):
    c = aps.Client(apsd, 0, 1, format="fp32")
    xs = [np.full(4, i, np.float32) for i in range(5)]
    handles = [c.allreduce_async(f"q{i}", x) for i, x in enumerate(xs)]
    c.close()
    assert [h.wait()[0] for h in handles] == [0, 1, 2, 3, 4]


# -- payloads without CRC32C (payload_crc=False) ------------------------------

def rank_crc(rank, world, endpoint, job, crc):
    """e4m3 all-reduces of a tensor of 3 chunks (apsd's 4 MiB default) and an fp32
    broadcast, in a job whose payloads carry a CRC32C or not."""
    rng = np.random.default_rng(rank)
    with aps.Client(endpoint, rank, world, format="e4m3", job=job, payload_crc=crc) as c:
        out = []
        for step in range(2):
            x = (rng.standard_normal(3 << 20) * 2.0 ** -(6 + step)).astype(np.float32)
            out.append(np.array(c.allreduce("g", x)))
        b = np.arange(1000, dtype=np.float32) * (rank + 1)
        out.append(np.array(c.broadcast("b", b)))
        return out


def test_payloads_without_crc_give_the_same_results(apsd):
    with_crc = run_ranks(rank_crc, 2, apsd, "crc", True)
    without = run_ranks(rank_crc, 2, apsd, "nocrc", False)
    for rank in range(2):
        for a, b in zip(with_crc[rank], without[rank]):
            assert np.array_equal(a, b), f"rank {rank}"
    assert np.array_equal(without[1][2], np.arange(1000, dtype=np.float32))


def rank_crc_mismatch(rank, world, endpoint):
    try:
        with aps.Client(endpoint, rank, world, job="crc-mixed", payload_crc=rank == 0,
                        timeout_ms=5000) as c:
            c.barrier()
    except aps.Error as e:
        return e.name, str(e)
    return None, ""


def test_ranks_that_disagree_on_the_crc_are_refused(apsd):
    # The first HELLO fixes the job's choice; the other rank's is refused saying why.
    got = run_ranks(rank_crc_mismatch, 2, apsd)
    assert any(name == "APS_EMISMATCH" and "CRC32C" in text for name, text in got), got
