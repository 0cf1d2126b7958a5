"""aps.torch.DiLoCo against a real apsd: the outer step is the daemon's
Nesterov SGD on the mean pseudo-gradient, every rank restarts from the same
weights, within half a quantization step of the master (exactly in fp32)."""

import numpy as np
import pytest
import torch

import aps
import aps.torch
from conftest import run_ranks

SPEC = aps.torch.optimizer_spec("sgd", momentum=0.9, nesterov=True)


def model_of(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))


def rank_diloco(rank, world, endpoint, fmt, scaling, steps, every):
    torch.set_num_threads(1)
    model = model_of(rank)  # rank 0's weights are the ones every rank starts from
    inner = torch.optim.AdamW(model.parameters(), lr=0.01)
    with aps.Client(endpoint, rank, world, format=fmt, scaling=scaling, optimizer=SPEC,
                    job=f"diloco-{fmt}-{scaling}") as client:
        diloco = aps.torch.DiLoCo(model, inner, client, sync_every=every, outer_lr=0.7)
        start = [p.detach().clone().numpy() for p in model.parameters()]
        rng = np.random.default_rng(rank)
        snaps = []
        for step in range(steps):
            x = torch.from_numpy(rng.standard_normal((16, 8)).astype(np.float32))
            before = [p.detach().clone() for p in model.parameters()]
            inner.zero_grad()
            torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True).sin()).backward()
            inner.step()
            local = [p.detach().clone() for p in model.parameters()]
            if diloco.step():  # [0] at a sync, [] else
                master = diloco.pull()
                snaps.append({"before": [b.numpy() for b in before],
                              "local": [v.numpy() for v in local],
                              "after": [p.detach().clone().numpy() for p in model.parameters()],
                              "master": [m.numpy() for m in master.values()]})
        return start, snaps, diloco.syncs, client.bytes_pushed


def sent(delta, fmt):
    """A pseudo-gradient as it travels: fp32, or fp4 by blocks of 32."""
    if fmt == "fp32":
        return delta
    x = delta.reshape(-1).numpy()
    back = aps.dequantize_blocks(*aps.quantize_blocks(x, fmt), fmt, x.size)
    return torch.from_numpy(back).view_as(delta)


@pytest.mark.parametrize("fmt,scaling", [("fp32", "none"), ("fp4", "block")])
def test_outer_steps_are_nesterov_on_the_mean_pseudo_gradient(apsd, fmt, scaling):
    world, steps, every = 2, 12, 4
    results = run_ranks(rank_diloco, world, apsd, fmt, scaling, steps, every)
    start0 = results[0][0]
    for r in range(world):
        assert all(np.array_equal(a, b) for a, b in zip(results[r][0], start0))  # rank 0's
        assert results[r][2] == steps // every
    # The outer optimizer, replayed: SGD(momentum 0.9, nesterov) with lr 0.7 on the
    # mean of (anchor - local); in fp32 the daemon's master is the replay's.
    anchor = [torch.from_numpy(a.copy()) for a in start0]
    master = [a.clone().requires_grad_(True) for a in anchor]
    outer = torch.optim.SGD(master, lr=0.7, momentum=0.9, nesterov=True)
    for s in range(steps // every):
        snaps = [results[r][1][s] for r in range(world)]
        for i in range(len(master)):
            local = [torch.from_numpy(sn["local"][i]) for sn in snaps]
            delta = sum(sent(anchor[i] - lo, fmt) for lo in local) / world
            master[i].grad = delta
        outer.step()
        for i, m in enumerate(master):
            got = snaps[0]["master"][i]
            np.testing.assert_allclose(got, m.detach().numpy(), rtol=1e-5, atol=1e-6)
            after = [sn["after"][i] for sn in snaps]
            assert np.array_equal(after[0], after[1])  # every rank restarts alike
            if fmt == "fp32":
                assert np.array_equal(after[0], got)
            else:  # within the fp4 step of the update (blocks of 32): 2^-k * 0.5 at most
                assert np.all(np.abs(after[0] - got) <= np.abs(got - anchor[i].numpy()) + 1e-6)
            anchor[i] = torch.from_numpy(after[0].copy())
            m.data.copy_(torch.from_numpy(got))  # follow the daemon's own master


def rank_average(rank, world, endpoint, steps, every):
    torch.set_num_threads(1)
    model = model_of(rank)
    inner = torch.optim.AdamW(model.parameters(), lr=0.01)
    spec = aps.torch.optimizer_spec("sgd", momentum=0)  # no Nesterov without momentum
    with aps.Client(endpoint, rank, world, format="fp32", optimizer=spec,
                    job="average") as client:
        diloco = aps.torch.DiLoCo(model, inner, client, sync_every=every, outer_lr=1.0,
                                  outer_momentum=0.0)
        rng = np.random.default_rng(rank)
        snaps = []
        for step in range(steps):
            x = torch.from_numpy(rng.standard_normal((16, 8)).astype(np.float32))
            inner.zero_grad()
            torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True).sin()).backward()
            inner.step()
            local = [p.detach().clone().numpy() for p in model.parameters()]
            if diloco.step():
                snaps.append((local, [p.detach().clone().numpy() for p in model.parameters()]))
        return snaps


def test_outer_lr_1_without_momentum_averages_the_workers_weights(apsd):
    """The setting docs/RESULTS.md recommends at small H: every sync leaves every
    rank with the mean of the ranks' weights (fp32: to its rounding)."""
    world = 3
    results = run_ranks(rank_average, world, apsd, 8, 4)
    for s in range(2):
        mean = [sum(results[r][s][0][i] for r in range(world)) / world
                for i in range(len(results[0][s][0]))]
        for r in range(world):
            for got, want in zip(results[r][s][1], mean):
                np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        assert not np.allclose(results[0][s][0][0], results[1][s][0][0])  # they had moved apart


def test_diloco_needs_the_outer_optimizer_on_the_client(apsd):
    model = model_of(0)
    inner = torch.optim.SGD(model.parameters(), lr=0.1)
    with aps.Client(apsd, 0, 1, format="fp32", job="plain") as c:
        with pytest.raises(ValueError, match="open the client with optimizer="):
            aps.torch.DiLoCo(model, inner, c, sync_every=4)
    with aps.Client(apsd, 0, 1, format="fp32", job="adam", optimizer="adam") as c:
        with pytest.raises(ValueError, match="needs the job to run 'sgd"):
            aps.torch.DiLoCo(model, inner, c, sync_every=4)


def rank_fragments(rank, world, endpoint, steps, every):
    torch.set_num_threads(1)
    model = model_of(rank)
    inner = torch.optim.SGD(model.parameters(), lr=0.05)
    with aps.Client(endpoint, rank, world, format="fp32", optimizer=SPEC,
                    job="fragments") as client:
        diloco = aps.torch.DiLoCo(model, inner, client, sync_every=every, fragments=2)
        rng = np.random.default_rng(rank)
        events = []
        for step in range(steps):
            x = torch.from_numpy(rng.standard_normal((16, 8)).astype(np.float32))
            inner.zero_grad()
            torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True)).backward()
            inner.step()
            due = diloco.step()
            if due:
                master = diloco.pull()
                events.append((step + 1, due, [p.detach().clone().numpy()
                                               for p in model.parameters()],
                               [m.numpy() for m in master.values()]))
        return diloco.fragments, events


def test_fragments_sync_in_turn_and_each_takes_the_master(apsd):
    world, steps, every = 2, 12, 4
    results = run_ranks(rank_fragments, world, apsd, steps, every)
    fragments, events = results[0]
    # in order, by size: 128 elements | 16 + 16 + 1
    assert fragments == [["outer.0.weight"], ["outer.0.bias", "outer.2.weight", "outer.2.bias"]]
    assert [(s, due) for s, due, _, _ in events] == [(2, [1]), (4, [0]), (6, [1]), (8, [0]),
                                                      (10, [1]), (12, [0])]
    for i, (_, due, held, master) in enumerate(events):
        other = results[1][1][i]
        synced = [0] if due == [0] else [1, 2, 3]  # parameter indices of the fragment
        for t in range(4):
            if t in synced:  # everyone holds the master, exactly (fp32)
                assert np.array_equal(held[t], master[t]) and np.array_equal(other[2][t],
                                                                             held[t])
            else:  # the other fragment is each rank's own since its last sync
                assert not np.array_equal(other[2][t], held[t])


def rank_run(rank, world, endpoint, seed, steps, every, job):
    """DiLoCo from model_of(seed + rank); what each rank starts from after the
    constructor, and the master weights at the end."""
    torch.set_num_threads(1)
    model = model_of(seed + rank)
    inner = torch.optim.AdamW(model.parameters(), lr=0.01)
    with aps.Client(endpoint, rank, world, format="e4m3", optimizer=SPEC, job=job,
                    timeout_ms=20000) as client:
        diloco = aps.torch.DiLoCo(model, inner, client, sync_every=every, outer_lr=0.7)
        start = [p.detach().clone().numpy() for p in model.parameters()]
        rng = np.random.default_rng(seed + rank)
        for _ in range(steps):
            x = torch.from_numpy(rng.standard_normal((16, 8)).astype(np.float32))
            inner.zero_grad()
            torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True).sin()).backward()
            inner.step()
            diloco.step()
        master = [m.numpy() for m in diloco.pull().values()]
        return diloco.resumed_syncs, start, master, diloco.syncs


def test_a_restarted_apsd_resumes_the_outer_state(tmp_path):
    """The outer state is the daemon's: apsd checkpoints it when the job ends, and a
    DiLoCo built against the restarted daemon starts every rank from the resumed
    master weights (not from rank 0's new ones) and counts on from its outer steps."""
    import aps.daemon
    from conftest import APSD
    args = ["--checkpoint_dir", str(tmp_path), "--checkpoint_steps", "1"]
    d = aps.daemon.LocalDaemon(binary=str(APSD), extra_args=args).start()
    try:
        first = run_ranks(rank_run, 2, d.endpoint, 0, 12, 4, "diloco-resume")
    finally:
        assert d.stop() == 0
    assert [r[3] for r in first] == [3, 3] and first[0][0] == 0
    d = aps.daemon.LocalDaemon(binary=str(APSD), extra_args=args).start()
    try:
        second = run_ranks(rank_run, 2, d.endpoint, 100, 4, 4, "diloco-resume")
    finally:
        assert d.stop() == 0
    for rank in (0, 1):
        resumed, start, master, syncs = second[rank]
        assert resumed == 3 and syncs == 1
        for got, want in zip(start, first[0][2]):  # the master weights of the first run
            np.testing.assert_array_equal(got, want)
    # the new rank 0's own weights were not taken
    assert not np.array_equal(second[0][1][0], model_of(100)[0].weight.detach().numpy())


def elastic_rank(rank, world, endpoint, steps, every, die_at, rejoin, out):
    """A rank of an elastic DiLoCo job: its weights after every outer step of fragment
    0; die_at: os._exit there (a lost rank); rejoin: a rank that comes back."""
    import os
    import time
    torch.set_num_threads(1)
    model = model_of(rank)
    inner = torch.optim.AdamW(model.parameters(), lr=0.01)
    with aps.Client(endpoint, rank, world, format="fp32", optimizer=SPEC, job="diloco-elastic",
                    timeout_ms=30000) as client:
        diloco = aps.torch.DiLoCo(model, inner, client, sync_every=every, elastic=True,
                                  rejoin=rejoin)
        start = [p.detach().clone().numpy() for p in model.parameters()]
        first = diloco.resumed_syncs if rejoin else 0
        left = steps - first * every
        rng = np.random.default_rng(rank)
        after = {}
        for step in range(left):
            if step == die_at:
                os._exit(1)
            x = torch.from_numpy(rng.standard_normal((16, 8)).astype(np.float32))
            inner.zero_grad()
            torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True).sin()).backward()
            inner.step()
            if diloco.step():
                after[first + diloco.syncs] = [p.detach().clone().numpy()
                                               for p in model.parameters()]
            time.sleep(0.1)
        master = [m.numpy() for m in diloco.pull().values()]
    out.put((rank, rejoin, first, start, after, master))


def test_a_rank_back_in_an_elastic_job_takes_the_master_weights(tmp_path):
    """Rank 2 of 3 dies; the job goes on with 2; a new rank 2 (rejoin=True) waits in
    the barrier after an outer step, starts from the master weights of that step
    (what the others hold, exactly in fp32), and syncs with them to the end."""
    import multiprocessing
    import aps.daemon
    from conftest import APSD
    log = open(tmp_path / "apsd.log", "w")
    d = aps.daemon.LocalDaemon(binary=str(APSD), log_level="info", output=log,
                               extra_args=["--elastic", "yes"]).start()
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    steps, every = 60, 2

    def spawn(rank, die_at=-1, rejoin=False):
        p = ctx.Process(target=elastic_rank, daemon=True,
                        args=(rank, 3, d.endpoint, steps, every, die_at, rejoin, out))
        p.start()
        return p

    try:
        procs = [spawn(0), spawn(1), spawn(2, die_at=9)]
        procs[2].join(30)
        assert procs[2].exitcode == 1
        back = spawn(2, rejoin=True)
        got = [out.get(timeout=60) for _ in range(3)]
        for p in (*procs[:2], back):
            p.join(10)
    finally:
        assert d.stop() == 0
        log.close()
    by_rank = {r[0]: r for r in got}
    _, _, first, start, after, master = by_rank[2]
    assert 5 <= first < steps // every, first  # it came back in the middle
    for got_w, want in zip(start, by_rank[0][4][first]):  # rank 0's weights after that sync
        np.testing.assert_array_equal(got_w, want)
    assert sorted(after) == list(range(first + 1, steps // every + 1))
    for r in (0, 1):
        for a, b in zip(master, by_rank[r][5]):
            np.testing.assert_array_equal(a, b)
        for a, b in zip(after[steps // every], by_rank[r][4][steps // every]):
            np.testing.assert_array_equal(a, b)
    text = (tmp_path / "apsd.log").read_text()
    assert "job shrinks job=diloco-elastic members=2" in text
    assert "rank back job=diloco-elastic rank=2 members=3" in text


def rank_overlap(rank, world, endpoint, steps, every, overlap, mix):
    """Inner steps with DiLoCo's syncs in flight; at each landing, the parameters just
    before it (local) and after, and the master weights."""
    torch.set_num_threads(1)
    model = model_of(rank)
    inner = torch.optim.AdamW(model.parameters(), lr=0.01)
    with aps.Client(endpoint, rank, world, format="fp32", optimizer=SPEC,
                    job=f"diloco-overlap-{overlap}-{mix}") as client:
        diloco = aps.torch.DiLoCo(model, inner, client, sync_every=every, overlap=overlap,
                                  mix=mix)
        rng = np.random.default_rng(rank)
        lands = []
        for step in range(1, steps + 1):
            x = torch.from_numpy(rng.standard_normal((16, 8)).astype(np.float32))
            inner.zero_grad()
            torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True).sin()).backward()
            inner.step()
            local = [p.detach().clone().numpy() for p in model.parameters()]
            syncs = diloco.syncs
            diloco.step()
            if diloco.syncs > syncs:  # a sync landed in this step
                lands.append((step, local, [p.detach().clone().numpy()
                                            for p in model.parameters()],
                              [m.numpy() for m in diloco.pull().values()]))
        diloco.finish()
        return lands, diloco.syncs


@pytest.mark.parametrize("mix", [0.0, 0.5])
def test_overlapped_syncs_land_later_and_merge(apsd, mix):
    """overlap=T: a sync that left at step s lands at step s + T, where the parameters
    become mix * local + (1 - mix) * master (fp32: the master is exact)."""
    results = run_ranks(rank_overlap, 2, apsd, 12, 4, 2, mix)
    for lands, syncs in results:
        assert syncs == 3 and [s for s, *_ in lands] == [6, 10]  # 12 left at 12: finish()
        for _, local, after, master in lands:
            for lo, af, ma in zip(local, after, master):
                want = torch.from_numpy(lo).mul(mix).add(torch.from_numpy(ma), alpha=1 - mix)
                np.testing.assert_allclose(af, want.numpy(), rtol=1e-6, atol=1e-7)
                if mix == 0.5:
                    assert not np.allclose(af, ma)  # local progress kept


def test_overlap_is_checked(apsd):
    model = model_of(0)
    with aps.Client(apsd, 0, 1, optimizer=SPEC, job="diloco-check") as client:
        inner = torch.optim.SGD(model.parameters(), lr=0.1)
        for bad in [dict(overlap=4), dict(overlap=-1), dict(mix=1.5),
                    dict(overlap=1, elastic=True)]:
            with pytest.raises(ValueError):
                aps.torch.DiLoCo(model, inner, client, sync_every=4, **bad)
