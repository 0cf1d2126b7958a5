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
