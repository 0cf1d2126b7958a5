"""aps.torch over real processes and a real apsd: DistributedOptimizer equals
one process on the combined batch (fp32), sends every gradient once per step
from backward hooks, does not hang on unused parameters or no_sync(), skips
non-finite steps on every rank; the DDP hook trains; host staging."""

import os

import numpy as np
import pytest
import torch

import aps
import aps.torch
from aps._optimizer import plan_buckets
from conftest import run_ranks
from ranks import import_torch

LR = 0.1


def mlp(seed=0, layers=(6, 8, 3)):
    torch.manual_seed(seed)
    mods = []
    for a, b in zip(layers, layers[1:]):
        mods += [torch.nn.Linear(a, b), torch.nn.Tanh()]
    return torch.nn.Sequential(*mods[:-1])


def batch(step, rank, n=4):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(n, 6, generator=g), torch.randint(0, 3, (n,), generator=g)


def weights(model):
    return {k: v.detach().clone().numpy() for k, v in model.state_dict().items()}


def wrap(model, client, **kwargs):
    sgd = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    return aps.torch.DistributedOptimizer(sgd, client, named_parameters=model.named_parameters(),
                                          **kwargs)


# -- single process ---------------------------------------------------------

def test_host_stage_cpu_half():
    stage = aps.torch.HostStage()
    direct = torch.ones(3)
    assert stage.load(direct) is not None and stage.load(direct).data_ptr() == direct.data_ptr()
    for t in [torch.tensor([1.5, -2.0, 0.25], dtype=torch.float16),
              torch.tensor([1.5, -2.0, 0.25], dtype=torch.bfloat16),
              torch.arange(6.0).reshape(2, 3).t()]:
        host = stage.load(t)
        assert host.dtype == torch.float32 and host.is_contiguous() and host.shape == t.shape
        assert torch.equal(host, t.float())
        host.mul_(2)
        stage.store()
        assert torch.equal(t.float(), host)


def test_buckets_follow_reverse_order_and_size():
    params = [(f"p{i}", torch.zeros(n)) for i, n in enumerate([10, 300, 20, 20, 5])]
    plan = [[n for n, _, _ in b.entries] for b in plan_buckets(params, 200)]
    assert plan == [["p4", "p3", "p2"], ["p1"], ["p0"]]


def test_optimizer_delegates_and_checks_names(apsd):
    with aps.Client(apsd, 0, 1, format="fp32") as c:
        model = mlp()
        opt = wrap(model, c)
        assert opt.param_groups is opt.optimizer.param_groups
        assert opt.buckets == [["grad.2.bias", "grad.2.weight", "grad.0.bias", "grad.0.weight"]]
        state = opt.state_dict()
        opt.load_state_dict(state)
        with pytest.raises(ValueError, match="not in named_parameters"):
            aps.torch.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1), c,
                                           named_parameters=list(model.named_parameters())[:2])


def test_fp16_and_bf16_gradients_are_staged(apsd):
    with aps.Client(apsd, 0, 1, format="fp32") as c:
        model = mlp().to(torch.bfloat16)
        opt = wrap(model, c, prefix="bf16.")
        x, y = batch(0, 0)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x.to(torch.bfloat16)), y).backward()
        grads = [p.grad.clone() for p in model.parameters()]
        assert opt.synchronize()
        for g, p in zip(grads, model.parameters()):
            assert p.grad.dtype == torch.bfloat16 and torch.equal(g, p.grad)  # mean of one rank


# -- several ranks ----------------------------------------------------------

def rank_train(rank, world, endpoint, steps):
    import_torch()
    with aps.Client(endpoint, rank, world, format="fp32", job="equiv") as c:
        model = mlp()
        opt = wrap(model, c, bucket_bytes=64)
        for step in range(steps):
            x, y = batch(step, rank)
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        return weights(model)


def test_two_workers_match_one_process_on_the_combined_batch(apsd):
    steps, world = 4, 2
    results = run_ranks(rank_train, world, apsd, steps)
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    for step in range(steps):
        xs, ys = zip(*(batch(step, r) for r in range(world)))
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(torch.cat(xs)), torch.cat(ys)).backward()
        opt.step()
    want = weights(model)
    for got in results:
        for k in want:
            np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6)
    assert all(np.array_equal(results[0][k], results[1][k]) for k in want)


def rank_count_calls(rank, world, endpoint):
    """Records every all-reduce the optimizer queues and whether backward had
    returned when the first of a step was queued."""
    import_torch()
    with aps.Client(endpoint, rank, world, format="e4m3", job="hooks") as c:
        model = mlp(layers=(6,) + (5,) * 10 + (3,))  # 22 parameter tensors
        calls, in_backward = [], [False]
        queue = c._queue_reduce  # every batch of all-reduces, the flag's too

        def spy(items, *args, **kw):
            calls.append(([name for name, _, _ in items], in_backward[0]))
            return queue(items, *args, **kw)
        c._queue_reduce = spy
        opt = wrap(model, c, bucket_bytes=200)
        steps = []
        for step in range(3):
            x, y = batch(step, rank)
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            in_backward[0] = True
            loss.backward()
            in_backward[0] = False
            opt.step()
            steps.append(calls[:])
            calls.clear()
        return steps, opt.buckets


def test_hooks_send_every_gradient_once_per_step(apsd):
    for steps, buckets in run_ranks(rank_count_calls, 2, apsd):
        assert len(buckets) > 3
        names = [n for b in buckets for n in b]
        assert len(names) == 22
        for calls in steps:
            sent = [n for names_, _ in calls for n in names_]
            assert sorted(sent) == sorted(names + ["grad.@nonfinite"])
            assert [c[0] for c in calls[:-1]] == buckets  # in bucket order
            assert calls[0][1], "the first bucket left only after backward returned"


class TwoBranches(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b = torch.nn.Linear(6, 3), torch.nn.Linear(6, 3)
        self.frozen = torch.nn.Linear(6, 3)
        self.frozen.requires_grad_(False)

    def forward(self, x, branch):
        return (self.a if branch == 0 else self.b)(x) + self.frozen(x)


def rank_unused(rank, world, endpoint):
    import_torch()
    with aps.Client(endpoint, rank, world, format="fp32", job="unused", timeout_ms=5000) as c:
        model = TwoBranches()
        opt = wrap(model, c)
        for step in range(3):
            x, y = batch(step, rank)
            opt.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(model(x, branch=rank), y).backward()
            opt.step()
        return weights(model), model.frozen.weight.grad is None


def test_unused_parameters_do_not_hang(apsd):
    (w0, frozen0), (w1, frozen1) = run_ranks(rank_unused, 2, apsd, timeout=30)
    assert frozen0 and frozen1
    for k in w0:
        assert np.array_equal(w0[k], w1[k]), k
    assert not np.array_equal(w0["a.weight"], TwoBranches().a.weight.detach().numpy())


def rank_no_sync(rank, world, endpoint):
    import_torch()
    with aps.Client(endpoint, rank, world, format="fp32", job="nosync", timeout_ms=5000) as c:
        model = mlp()
        opt = aps.torch.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR), c,
                                             named_parameters=model.named_parameters())
        opt.zero_grad()
        for micro in range(3):
            x, y = batch(micro, rank)
            loss = torch.nn.functional.cross_entropy(model(x), y)
            if micro < 2:
                with opt.no_sync():
                    loss.backward()
            else:
                loss.backward()
        opt.step()
        return weights(model)


def test_no_sync_accumulates_then_sends_the_sum(apsd):
    results = run_ranks(rank_no_sync, 2, apsd, timeout=30)
    model = mlp()
    for micro in range(3):
        for r in range(2):
            x, y = batch(micro, r)
            (torch.nn.functional.cross_entropy(model(x), y) / 2).backward()
    with torch.no_grad():
        for p in model.parameters():
            p -= LR * p.grad
    for got in results:
        for k, w in weights(model).items():
            np.testing.assert_allclose(got[k], w, rtol=1e-5, atol=1e-6)


def rank_nonfinite(rank, world, endpoint):
    import_torch()
    with aps.Client(endpoint, rank, world, format="e4m3", job="nonfinite") as c:
        model = mlp()
        opt = wrap(model, c)
        before = weights(model)
        skipped = []
        for step in range(2):
            x, y = batch(step, rank)
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            if step == 0 and rank == 1:
                loss = loss * float("inf")  # as an fp16 overflow would
            loss.backward()
            opt.step()
            skipped.append(opt.last_step_skipped)
            if step == 0:
                unchanged = all(np.array_equal(v, before[k]) for k, v in weights(model).items())
        return skipped, opt.skipped_steps, unchanged, weights(model)


def test_nonfinite_gradients_skip_the_step_on_every_rank(apsd):
    (s0, n0, same0, w0), (s1, n1, same1, w1) = run_ranks(rank_nonfinite, 2, apsd)
    assert s0 == s1 == [True, False] and n0 == n1 == 1 and same0 and same1
    for k in w0:
        assert np.array_equal(w0[k], w1[k])


def rank_ddp(rank, world, endpoint, store_dir):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    import_torch()
    store = dist.FileStore(os.path.join(store_dir, f"store{rank}"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        with aps.Client(endpoint, rank, world, format="fp32", job="ddp") as c:
            model = DDP(mlp())
            model.register_comm_hook(c, aps.torch.allreduce_hook)
            opt = torch.optim.SGD(model.parameters(), lr=0.5)
            x = torch.cat([batch(0, r, 32)[0] for r in range(world)])
            y = x[:, :3].argmax(1)  # a rule the network can learn
            losses = []
            for step in range(30):
                part = slice(rank * 32, (rank + 1) * 32)
                opt.zero_grad()
                loss = torch.nn.functional.cross_entropy(model(x[part]), y[part])
                loss.backward()
                opt.step()
                with torch.no_grad():
                    losses.append(torch.nn.functional.cross_entropy(model(x), y).item())
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x[:4]), y[:4])
            (loss * (float("inf") if rank == 1 else 1.0)).backward()
            all_nan = all(torch.isnan(p.grad).all() for p in model.parameters())
            return losses, weights(model.module), all_nan
    finally:
        dist.destroy_process_group()


def test_ddp_comm_hook_trains(apsd, tmp_path):
    (l0, w0, nan0), (l1, w1, nan1) = run_ranks(rank_ddp, 2, apsd, str(tmp_path), timeout=60)
    assert l0 == l1 and l0[-1] < 0.6 * l0[0], l0
    assert nan0 and nan1, "a non-finite gradient on rank 1 must make the bucket NaN everywhere"
    for k in w0:
        assert np.array_equal(w0[k], w1[k])


def rank_broadcast_params(rank, world, endpoint):
    import_torch()
    with aps.Client(endpoint, rank, world, format="e3m0", job="bparams", timeout_ms=5000) as c:
        model = mlp(seed=rank)
        aps.torch.broadcast_parameters(model, c)
        return weights(model)


def test_broadcast_parameters_copies_rank_0(apsd):
    w0, w1 = run_ranks(rank_broadcast_params, 2, apsd)
    for k, v in weights(mlp(seed=0)).items():
        assert np.array_equal(w0[k], v) and np.array_equal(w1[k], v)


@pytest.mark.skipif(not hasattr(torch, "compile"),
                    reason="torch.compile is torch 2.x's (Debian 12 has torch 1.13)")
def test_torch_compile_keeps_the_gradient_hooks(apsd):
    """A model run through torch.compile (AOTAutograd, the part that rebuilds
    backward) still fires DistributedOptimizer's hooks: every bucket is queued
    by the time backward returns, and one rank in fp32 steps as torch's own
    SGD on the same batches."""
    with aps.Client(apsd, 0, 1, format="fp32", job="compile") as c:
        model, ref = mlp(), mlp()
        opt = wrap(model, c, bucket_bytes=64)
        ref_opt = torch.optim.SGD(ref.parameters(), lr=LR, momentum=0.9)
        compiled = torch.compile(model, backend="aot_eager")
        for step in range(3):
            x, y = batch(step, 0)
            for m, o in ((compiled, opt), (ref, ref_opt)):
                o.zero_grad()
                torch.nn.functional.cross_entropy(m(x), y).backward()
                if o is opt:  # the hooks queued every bucket during backward
                    assert all(b.handle is not None for b in opt._buckets)
                o.step()
        for k, v in weights(ref).items():
            np.testing.assert_allclose(weights(model)[k], v, rtol=1e-6, atol=1e-7)


def test_a_failed_bucket_leaves_no_call_in_flight(apsd):
    """Without check_finite a NaN gradient fails its bucket's all-reduce; step()
    raises only once every other bucket is done (none writes into a gradient
    later), and the next step works."""
    with aps.Client(apsd, 0, 1, format="fp32", job="failed-bucket") as c:
        model = mlp(layers=(6,) + (5,) * 6 + (3,))
        opt = wrap(model, c, bucket_bytes=64, check_finite=False)
        x, y = batch(0, 0)
        opt.zero_grad()
        last = list(model.parameters())[-1]  # its bucket is sent first
        hook = last.register_hook(lambda g: torch.full_like(g, float("nan")))
        torch.nn.functional.cross_entropy(model(x), y).backward()
        hook.remove()
        handles = [b.handle for b in opt._buckets]  # every bucket was queued by backward
        assert len(handles) > 2 and all(handles)
        with pytest.raises(aps.Error, match="NaN or inf") as e:
            opt.step()
        assert e.value.name == "APS_ENONFINITE"
        assert all(h.done() for h in handles) and not c._in_flight
        before = weights(model)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        assert any(not np.array_equal(v, before[k]) for k, v in weights(model).items())
