"""aps.torch.ServerOptimizer against a real apsd: in fp32 two ranks train a
small model exactly as torch's own optimizer does on the mean gradient, the
weights stay within the quantization bound of the master in e4m3, and the
optimizer's arguments must agree with the client's job."""

import threading

import numpy as np
import pytest
import torch

import aps
import aps.torch


def make_model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))


def batch(rank, step):
    g = torch.Generator().manual_seed(100 * step + rank)
    return torch.randn(5, 6, generator=g), torch.randint(0, 3, (5,), generator=g)


def run_rank(endpoint, model, rank, world, fmt, steps, out, device_codec=False):
    dtype = next(model.parameters()).dtype
    client = aps.Client(endpoint, rank, world, format=fmt,
                        job=f"so-{fmt}-{device_codec}-{dtype}",
                        optimizer=aps.torch.optimizer_spec("sgd", momentum=0.9, nesterov=1),
                        timeout_ms=20000)
    opt = aps.torch.ServerOptimizer(model, client, "sgd", lr=0.1, momentum=0.9, nesterov=1,
                                    device_codec=device_codec)
    assert opt.device_codec == device_codec
    out[rank] = {"resumed": opt.resumed_step, "grads": []}
    for step in range(steps):
        opt.zero_grad()
        x, y = batch(rank, step)
        torch.nn.functional.cross_entropy(model(x.to(dtype)).float(), y).backward()
        out[rank]["grads"].append([p.grad.clone() for p in model.parameters()])
        opt.step(lr=0.1 / (1 + step))
    out[rank]["weights"] = [p.detach().clone() for p in model.parameters()]
    out[rank]["master"] = opt.pull()
    client.close()


def train(endpoint, fmt, world=2, steps=12, device_codec=False, dtype=torch.float32):
    out = {}
    # different on each rank: the broadcast aligns them (built here: the seed is global)
    models = [make_model(seed=r).to(dtype) for r in range(world)]
    threads = [threading.Thread(target=run_rank, args=(endpoint, models[r], r, world, fmt,
                                                        steps, out, device_codec))
               for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(out) == world, "a rank failed"
    return out


def test_server_optimizer_matches_torch_in_fp32(apsd):
    out = train(apsd, "fp32")
    ref = make_model(seed=0)  # rank 0's initial weights
    opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9, nesterov=True)
    for step in range(12):
        for i, p in enumerate(ref.parameters()):
            p.grad = (out[0]["grads"][step][i] + out[1]["grads"][step][i]) / 2
        opt.param_groups[0]["lr"] = float(np.float32(0.1 / (1 + step)))
        opt.step()
    assert out[0]["resumed"] == 0
    for rank in (0, 1):
        for mine, want in zip(out[rank]["weights"], ref.parameters()):
            torch.testing.assert_close(mine, want.detach(), rtol=1e-5, atol=1e-6)
    for (name, p), mine in zip(ref.named_parameters(), out[0]["weights"]):
        torch.testing.assert_close(out[0]["master"][name], p.detach(), rtol=1e-5, atol=1e-6)


def test_server_optimizer_stays_near_the_master_in_e4m3(apsd):
    out = train(apsd, "e4m3")
    for rank in (0, 1):
        for (name, master), mine in zip(out[0]["master"].items(), out[rank]["weights"]):
            # the last update was at most ~0.1 * a few units: its e4m3 step is well below 0.02
            assert (mine - master).abs().max().item() < 0.02, name
    for a, b in zip(out[0]["weights"], out[1]["weights"]):
        assert torch.equal(a, b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_server_optimizer_device_codec_gives_the_host_paths_weights(apsd, dtype):
    host = train(apsd, "e4m3", dtype=dtype)
    dev = train(apsd, "e4m3", device_codec=True, dtype=dtype)
    for rank in (0, 1):
        for a, b in zip(host[rank]["weights"], dev[rank]["weights"]):
            assert a.dtype == dtype and torch.equal(a, b)
    for name, master in host[0]["master"].items():
        assert torch.equal(master, dev[0]["master"][name])


def two_groups_with_a_failure(endpoint, device_codec):
    """One rank, two parameter groups; at step 1 the first group's gradient
    holds NaN: that step raises APS_ENONFINITE, the second group's update is
    applied all the same (the daemon applied it), and training goes on."""
    model = make_model()
    with aps.Client(endpoint, 0, 1, format="e4m3", job=f"so-fail-{device_codec}",
                    optimizer="sgd") as client:
        first, second = list(model[0].parameters()), list(model[2].parameters())
        opt = aps.torch.ServerOptimizer(model, client, "sgd", lr=0.1,
                                        device_codec=device_codec)
        opt.param_groups[0]["params"] = first  # two groups: the first layer, the last
        opt.add_param_group({"params": second, "lr": 0.05})
        for step in range(3):
            opt.zero_grad()
            x, y = batch(0, step)
            torch.nn.functional.cross_entropy(model(x), y).backward()
            if step == 1:
                first[0].grad[0, 0] = float("nan")
                with pytest.raises(aps.Error, match="NaN") as e:
                    opt.step()
                assert e.value.name == "APS_ENONFINITE"
            else:
                opt.step()
        return [p.detach().clone() for p in model.parameters()], opt.pull()


def test_server_optimizer_applies_every_update_when_a_group_fails(apsd):
    (host, host_master), (dev, dev_master) = \
        [two_groups_with_a_failure(apsd, d) for d in (False, True)]
    for a, b in zip(host, dev):
        assert torch.equal(a, b)
    for name in host_master:
        assert torch.equal(host_master[name], dev_master[name])
    for p, (name, master) in zip(dev, dev_master.items()):
        assert (p - master).abs().max().item() < 0.02, name


def test_server_optimizer_checks_its_arguments(apsd):
    model = make_model()
    plain = aps.Client(apsd, 0, 1, job="plain")
    client = aps.Client(apsd, 0, 1, job="opt", optimizer="sgd,momentum=0.9")
    with pytest.raises(ValueError, match="all-reduce mode"):
        aps.torch.ServerOptimizer(model, plain, "sgd", lr=0.1)
    assert aps.torch.optimizer_spec("adam", lr=3, betas=(0.8, 0.9)) == \
        "adam,beta1=0.8,beta2=0.9,eps=1e-08,weight_decay=0"
    with pytest.raises(ValueError, match="no setting"):
        aps.torch.optimizer_spec("sgd", betas=(0.9, 0.99))
    with pytest.raises(ValueError, match="the client's job runs"):
        aps.torch.ServerOptimizer(model, client, "sgd", lr=0.1, momentum=0.5)
    with pytest.raises(ValueError, match="the client's job runs"):
        aps.torch.ServerOptimizer(model, client, "adam", lr=0.1)
    opt = aps.torch.ServerOptimizer(model, client, lr=0.1)  # the client's optimizer
    assert opt.spec == "sgd,momentum=0.9"
    assert "ServerOptimizer" in repr(opt)
    client.close()
    plain.close()
