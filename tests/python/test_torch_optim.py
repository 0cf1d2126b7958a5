"""Both aps.torch wrappers are torch.optim.Optimizer objects: an lr scheduler
changes the lr that is applied (the wrapped optimizer's, or the one
ServerOptimizer sends to apsd), state_dict() round-trips through torch.save,
zero_grad() and add_param_group() work, and a GradScaler(enabled=False)
steps them. One rank and a real apsd, so the mean gradient is the gradient
and the results equal torch's own optimizer."""

import io

import pytest
import torch
from torch.optim.lr_scheduler import StepLR

import aps
import aps.torch


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 2))


def backward(model, step):
    g = torch.Generator().manual_seed(step)
    x, y = torch.randn(5, 4, generator=g), torch.randn(5, 2, generator=g)
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    return loss


def train(pairs, scheds, steps, first=0):
    """Steps every (optimizer, model) of pairs alike, then every scheduler."""
    for step in range(first, first + steps):
        for opt, model in pairs:
            opt.zero_grad()
            backward(model, step)
            opt.step()
        for s in scheds:
            s.step()


def assert_same_weights(a, b):
    for p, q in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(p, q)


def saved(obj):
    """obj after torch.save and torch.load, as a checkpoint holds it."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf)


def zero_grad_modes(opt, model):
    backward(model, 0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    assert all(p.grad is None for p in model.parameters())
    backward(model, 0)
    opt.step()
    opt.zero_grad(set_to_none=False)
    assert all(p.grad is not None and not p.grad.any() for p in model.parameters())


def scaler_step(opt, model, step):
    scaler = torch.cuda.amp.GradScaler(enabled=False)  # what a CPU run of an AMP script does
    opt.zero_grad()
    loss = backward(model, step)
    scaler.scale(loss)
    scaler.step(opt)
    scaler.update()


def test_distributed_optimizer_is_a_torch_optimizer(apsd):
    with aps.Client(apsd, 0, 1, format="fp32", job="optim-dist") as c:
        model, ref = make_model(), make_model()
        inner = torch.optim.SGD(model.parameters(), lr=1.0, momentum=0.9)
        opt = aps.torch.DistributedOptimizer(inner, c, named_parameters=model.named_parameters())
        ref_opt = torch.optim.SGD(ref.parameters(), lr=1.0, momentum=0.9)
        assert isinstance(opt, torch.optim.Optimizer)
        assert opt.param_groups is inner.param_groups and opt.state is inner.state
        assert opt.defaults is inner.defaults
        sched, ref_sched = StepLR(opt, step_size=1, gamma=0.5), StepLR(ref_opt, 1, gamma=0.5)
        train([(opt, model), (ref_opt, ref)], [sched, ref_sched], 3)
        assert inner.param_groups[0]["lr"] == sched.get_last_lr()[0] == 0.125
        assert_same_weights(model, ref)

        # a checkpoint: another model and optimizer resume from it and go on alike
        ckpt = saved({"model": model.state_dict(), "opt": opt.state_dict(),
                      "sched": sched.state_dict()})
        model2 = make_model()
        model2.load_state_dict(ckpt["model"])
        inner2 = torch.optim.SGD(model2.parameters(), lr=1.0, momentum=0.9)
        opt2 = aps.torch.DistributedOptimizer(inner2, c, prefix="again.",
                                              named_parameters=model2.named_parameters())
        opt2.load_state_dict(ckpt["opt"])
        sched2 = StepLR(opt2, step_size=1, gamma=0.5)
        sched2.load_state_dict(ckpt["sched"])
        assert inner2.param_groups[0]["lr"] == 0.125
        assert opt2.state_dict()["state"].keys() == opt.state_dict()["state"].keys()
        train([(opt, model), (opt2, model2), (ref_opt, ref)], [sched, sched2, ref_sched], 2, 3)
        assert inner2.param_groups[0]["lr"] == inner.param_groups[0]["lr"] == 0.125 / 4
        assert_same_weights(model2, ref)

        zero_grad_modes(opt, model)
        scaler_step(opt2, model2, 5)
        assert opt2.skipped_steps == 0


def test_distributed_optimizer_adds_a_param_group(apsd):
    with aps.Client(apsd, 0, 1, format="fp32", job="optim-group") as c:
        model, ref = make_model(), make_model()
        opt = aps.torch.DistributedOptimizer(torch.optim.SGD(model[0].parameters(), lr=0.1), c,
                                             named_parameters=model.named_parameters())
        ref_opt = torch.optim.SGD(ref[0].parameters(), lr=0.1)
        opt.add_param_group({"params": model[2].parameters(), "lr": 0.5})
        ref_opt.add_param_group({"params": ref[2].parameters(), "lr": 0.5})
        assert len(opt.optimizer.param_groups) == 2
        assert sorted(n for b in opt.buckets for n in b) == \
            ["grad.0.bias", "grad.0.weight", "grad.2.bias", "grad.2.weight"]
        train([(opt, model), (ref_opt, ref)], [], 2)
        assert_same_weights(model, ref)
        with pytest.raises(ValueError):
            opt.add_param_group({"params": [torch.nn.Parameter(torch.zeros(2))]})  # nameless
        backward(model, 0)
        with pytest.raises(RuntimeError, match="being all-reduced"):
            opt.add_param_group({"params": [torch.nn.Parameter(torch.zeros(2))]})
        opt.step()


def server_client(apsd, job):
    return aps.Client(apsd, 0, 1, format="fp32", job=job, optimizer="sgd")


def test_server_optimizer_is_a_torch_optimizer(apsd):
    with server_client(apsd, "optim-server") as c:
        model, ref = make_model(), make_model()
        opt = aps.torch.ServerOptimizer(model, c, "sgd", lr=1.0)
        ref_opt = torch.optim.SGD(ref.parameters(), lr=1.0)
        assert isinstance(opt, torch.optim.Optimizer)
        sched, ref_sched = StepLR(opt, step_size=1, gamma=0.5), StepLR(ref_opt, 1, gamma=0.5)
        train([(opt, model), (ref_opt, ref)], [sched, ref_sched], 3)
        assert opt.lr == opt.param_groups[0]["lr"] == sched.get_last_lr()[0] == 0.125
        assert_same_weights(model, ref)  # apsd stepped with 1, 0.5 and 0.25

        ckpt = saved(opt.state_dict())
        assert ckpt["spec"] == "sgd" and ckpt["steps"] == 3
        opt.param_groups[0]["lr"] = 9.0
        opt.load_state_dict(ckpt)
        assert opt.lr == 0.125 and opt.steps == 3
        with pytest.raises(ValueError, match="adam"):
            opt.load_state_dict({**ckpt, "spec": "adam"})
        train([(opt, model), (ref_opt, ref)], [sched, ref_sched], 1, 3)
        assert_same_weights(model, ref)

        zero_grad_modes(opt, model)
        scaler_step(opt, model, 5)
        assert opt.steps == 7


def test_server_optimizer_adds_a_param_group(apsd):
    with server_client(apsd, "optim-server-group") as c:
        model, ref = make_model(), make_model()
        model[2].requires_grad_(False)  # frozen at first, then trained at its own lr
        opt = aps.torch.ServerOptimizer(model, c, lr=0.1)
        ref_opt = torch.optim.SGD(ref[0].parameters(), lr=0.1)
        train([(opt, model), (ref_opt, ref)], [], 1)
        model[2].requires_grad_(True)
        opt.add_param_group({"params": model[2].parameters(), "lr": 0.5})
        ref_opt.add_param_group({"params": ref[2].parameters(), "lr": 0.5})
        train([(opt, model), (ref_opt, ref)], [], 2, 1)
        assert_same_weights(model, ref)
        assert set(opt.pull()) == {"0.weight", "0.bias", "2.weight", "2.bias"}
        with pytest.raises(ValueError, match="momentum"):
            opt.add_param_group({"params": [torch.nn.Parameter(torch.zeros(2))],
                                 "momentum": 0.9})
