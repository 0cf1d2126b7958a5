"""Codes calls (aps.h "Calls on codes", aps.Client.allreduce_codes_async) and
the device codec path of aps.torch built on them: the caller's codes travel,
the result comes back as codes, and the mean decoded from them is the bits the
C client's own path gives, for every scaling the calls serve, over several
chunks, with real ranks and a real apsd. Bad buffers, a stale format, NaN
codes and clients the calls do not serve are refused before anything is sent.

They run on CPU tensors (Debian's torch 1.13), and on CUDA tensors too where
torch sees a GPU (DEVICES), where only codes cross to pinned host memory."""

import numpy as np
import pytest
import torch

import aps
import aps._device_codes as dc
import aps.daemon
import aps.torch
from conftest import APSD, run_ranks
from ranks import import_torch

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
CASES = [("e4m3", "local"), ("e5m2", "none"), ("fp4", "block"), ("e2m1", "local"),
         ("fp32", "local")]


@pytest.fixture
def small_chunks():
    """An apsd cutting tensors into chunks of 1024 elements."""
    d = aps.daemon.LocalDaemon(binary=str(APSD), extra_args=["--chunk_bytes", "4k"]).start()
    try:
        yield d.endpoint
    finally:
        assert d.stop() == 0, "apsd did not exit cleanly"


def grad(rank, n=5000, seed=0):
    g = torch.Generator().manual_seed(seed * 100 + rank)
    x = torch.randn(n, generator=g) * 1e-3
    x[:1024] *= 50  # chunks of different ranges get different result exponents
    return x


def rank_codes_vs_floats(rank, world, endpoint, fmt, scaling, device):
    import_torch()
    with aps.Client(endpoint, rank, world, format=fmt, scaling=scaling,
                    job=f"codes-{fmt}-{scaling}") as c:
        out = {}
        for step in range(2):
            x = grad(rank, seed=step).to(device)
            [layouts] = c.codes_layouts([("t", x.numel())])
            stage = dc.DeviceStage()
            target = x.clone()
            handle = dc.codes_call(c, [("t", target)], [layouts], [stage], False)
            assert handle.wait() == [] and stage._codes.numel() == layouts[0].bytes
            stage.store()
            want = x.cpu().clone()
            c.allreduce("floats", want)
            out[step] = (target.cpu().numpy(), want.numpy(), layouts)
        return out


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt,scaling", CASES)
def test_codes_calls_give_the_bits_of_the_float_path(small_chunks, fmt, scaling, device):
    for out in run_ranks(rank_codes_vs_floats, 2, small_chunks, fmt, scaling, device,
                         timeout=60):
        for step, (got, want, (send, result)) in out.items():
            assert send.chunks == result.chunks == 5 and send.format == fmt
            assert send.block == (32 if scaling == "block" and fmt != "fp32" else 0)
            assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), (fmt, step)
            assert np.any(got != 0)


def test_layout_is_the_wire_payload(small_chunks):
    with aps.Client(small_chunks, 0, 1, format="fp4", scaling="block", job="layout") as c:
        [(send, result)] = c.codes_layouts([("t", 2500)])
        assert (send.format, send.count, send.chunk_elems, send.chunks, send.block) == \
            ("fp4", 2500, 1024, 3, 32)
        assert send.chunk_bytes == 1024 // 2 + 1024 // 32
        assert send.bytes == 2 * send.chunk_bytes + 452 // 2 + 15
        assert send.chunk(2) == (2048, 452, 2 * send.chunk_bytes, 452 // 2 + 15)
        assert result == send
    with aps.Client(small_chunks, 0, 1, format="e4m3", downlink="fp16", job="down") as c:
        [(send, result)] = c.codes_layouts([("t", 3000)])
        assert (send.format, send.bytes, result.format, result.bytes) == \
            ("e4m3", 3000, "fp16", 6000)


def test_bad_codes_calls_are_refused_before_sending(apsd):
    with aps.Client(apsd, 0, 1, format="e4m3", job="bad-codes") as c:
        [(send, result)] = c.codes_layouts([("t", 100)])
        codes = np.zeros(send.bytes, np.uint8)
        res, exps = np.zeros(result.bytes, np.uint8), np.zeros(result.chunks, np.int32)

        def call(**kw):
            args = {"fmt": "e4m3", "codes": codes, "k": 0, "res": res, "exps": exps, **kw}
            return c.allreduce_codes_async(
                [("t", args["fmt"], args["codes"], args["k"], args["res"], args["exps"])]).wait()

        with pytest.raises(aps.Error, match="travels in e4m3 at this step") as e:
            call(fmt="e5m2")
        assert e.value.name == "APS_EMISMATCH"
        with pytest.raises(aps.ArgumentError, match="takes 100 bytes of codes"):
            call(codes=codes[:99])
        with pytest.raises(aps.ArgumentError, match="has room for 99"):
            call(res=res[:99])
        with pytest.raises(aps.ArgumentError, match="scale exponent 400"):
            call(k=400)
        nan = codes.copy()
        nan[7] = 0x7F  # e4m3's NaN code
        with pytest.raises(aps.Error, match="1 NaN or inf codes") as e:
            call(codes=nan)
        assert e.value.name == "APS_ENONFINITE"
        with pytest.raises(TypeError, match="uint8"):
            call(codes=codes.astype(np.int16))
        with pytest.raises(ValueError, match="ask codes_layouts first"):
            c.allreduce_codes_async([("u", "e4m3", codes, 0, res, exps)])
        x = (np.arange(100) % 8).astype(np.float32)  # the client works on, the tensor too
        assert np.array_equal(c.allreduce("x", x.copy()), x)
        call(codes=np.full(100, 0x38, np.uint8), k=0)
        assert np.all(aps.dequantize(res, "e4m3", 100, scale_exp=int(exps[0])) == 1.0)


def test_block_exponent_below_the_daemons_range_is_refused(apsd):
    with aps.Client(apsd, 0, 1, format="fp4", scaling="block", job="bad-block") as c:
        [(send, result)] = c.codes_layouts([("t", 64)])
        codes = np.zeros(send.bytes, np.uint8)
        codes[32] = 0x80  # the first block's exponent: -128
        with pytest.raises(aps.ArgumentError, match="exponent -128"):
            c.allreduce_codes_async([("t", "fp4", codes, 0, np.zeros(result.bytes, np.uint8),
                                      np.zeros(1, np.int32))]).wait()


@pytest.mark.parametrize("kwargs,why", [({"scaling": "global"}, "global scaling"),
                                        ({"error_feedback": True}, "error_feedback")])
def test_clients_the_codes_calls_do_not_serve(apsd, kwargs, why):
    with aps.Client(apsd, 0, 1, job="unserved", **kwargs) as c:
        with pytest.raises(aps.ArgumentError, match=why):
            c.codes_layouts([("t", 10)])
        assert dc.reason_not_served(c).startswith(why)
        with pytest.raises(ValueError, match=why):
            aps.torch.DistributedOptimizer(torch.optim.SGD([torch.nn.Parameter(torch.ones(2))],
                                                           lr=0.1), c, device_codec=True)


def rank_optimizer(rank, world, endpoint, fmt, scaling, device_codec, bucket_bytes, device):
    import_torch()
    job = f"opt-{fmt}-{scaling}-{device_codec}-{device}"
    with aps.Client(endpoint, rank, world, format=fmt, scaling=scaling, job=job) as c:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(),
                                    torch.nn.Linear(64, 10)).to(device)
        sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        opt = aps.torch.DistributedOptimizer(sgd, c, named_parameters=model.named_parameters(),
                                             bucket_bytes=bucket_bytes, device_codec=device_codec)
        assert opt.device_codec == device_codec
        skipped = []
        for step in range(4):
            g = torch.Generator().manual_seed(100 * step + rank)
            x, y = torch.randn(8, 32, generator=g), torch.randint(0, 10, (8,), generator=g)
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x.to(device)), y.to(device))
            if step == 1 and rank == 1:
                loss = loss * float("inf")  # every rank skips this step
            loss.backward()
            opt.step()
            skipped.append(opt.last_step_skipped)
        return {k: v.detach().cpu().numpy() for k, v in model.state_dict().items()}, skipped


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt,scaling", [("e4m3", "local"), ("fp4", "block")])
def test_distributed_optimizer_device_codec_matches_the_host_path(small_chunks, fmt, scaling,
                                                                  device):
    runs = {dev: run_ranks(rank_optimizer, 2, small_chunks, fmt, scaling, dev, 4096, device,
                           timeout=90)
            for dev in (False, True)}
    for rank in range(2):
        (host, s_host), (dev, s_dev) = runs[False][rank], runs[True][rank]
        assert s_host == s_dev == [False, True, False, False]
        for k in host:
            assert np.array_equal(host[k].view(np.uint32), dev[k].view(np.uint32)), (rank, k)


def rank_ddp(rank, world, endpoint, store_dir, hook):
    import os

    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    import_torch()
    store = dist.FileStore(os.path.join(store_dir, f"store{hook}{rank}"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        with aps.Client(endpoint, rank, world, format="e4m3", job=f"ddp-{hook}") as c:
            torch.manual_seed(0)
            model = DDP(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(),
                                            torch.nn.Linear(64, 10)), bucket_cap_mb=0.01)
            model.register_comm_hook(c, getattr(aps.torch, hook))
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            for step in range(3):
                g = torch.Generator().manual_seed(100 * step + rank)
                x, y = torch.randn(8, 32, generator=g), torch.randint(0, 10, (8,), generator=g)
                opt.zero_grad()
                torch.nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x[:4]), y[:4])
            (loss * (float("inf") if rank == 1 else 1.0)).backward()
            all_nan = all(torch.isnan(p.grad).all() for p in model.parameters())
            return {k: v.detach().clone().numpy() for k, v in model.module.state_dict().items()}, \
                all_nan
    finally:
        dist.destroy_process_group()


def test_ddp_codes_hook_gives_the_host_hooks_bits(small_chunks, tmp_path):
    runs = {hook: run_ranks(rank_ddp, 2, small_chunks, str(tmp_path), hook, timeout=90)
            for hook in ("allreduce_hook", "codes_hook")}
    for rank in range(2):
        (host, nan_host), (dev, nan_dev) = runs["allreduce_hook"][rank], runs["codes_hook"][rank]
        assert nan_host and nan_dev, "a NaN on rank 1 makes the bucket NaN everywhere"
        for k in host:
            assert np.array_equal(host[k].view(np.uint32), dev[k].view(np.uint32)), (rank, k)


def test_nonfinite_gradient_is_refused_or_sent_as_zeros(apsd):
    with aps.Client(apsd, 0, 1, format="e4m3", job="codes-nonfinite") as c:
        x = torch.ones(300)
        x[5] = float("nan")
        [layouts] = c.codes_layouts([("t", 300)])
        stage = dc.DeviceStage()
        with pytest.raises(aps.Error, match="holds NaN or inf") as e:
            dc.codes_call(c, [("t", x)], [layouts], [stage], False).wait()
        assert e.value.name == "APS_ENONFINITE"
        handle = dc.codes_call(c, [("t", x)], [layouts], [stage], True)
        assert handle.started() == ["t"] and handle.wait() == ["t"]
        stage.store()
        assert torch.equal(x, torch.zeros(300))
        y = torch.full((300,), 0.5)  # the stage serves the next step as before
        dc.codes_call(c, [("t", y)], [layouts], [stage], True).wait()
        stage.store()
        assert torch.equal(y, torch.full((300,), 0.5))


def daemon(*args):
    return aps.daemon.LocalDaemon(binary=str(APSD), extra_args=list(args)).start()


def test_a_scheduled_format_change_is_followed(tmp_path):
    """The daemon's schedule sends the first 2 steps in fp32, then the
    client's e4m3: the layouts follow, and each step is the float path's bits."""
    d = daemon("--schedule_steps", "2", "--chunk_bytes", "4k")
    try:
        with aps.Client(d.endpoint, 0, 1, format="e4m3", job="schedule") as c:
            stage, formats = dc.DeviceStage(), []
            for step in range(4):
                x = grad(0, seed=step)
                [layouts] = c.codes_layouts([("t", x.numel())])
                formats.append(layouts[0].format)
                got = x.clone()
                dc.codes_call(c, [("t", got)], [layouts], [stage], False).wait()
                stage.store()
                want = x.clone()
                c.allreduce("floats", want)
                assert torch.equal(got.view(torch.int32), want.view(torch.int32)), step
            assert formats == ["fp32", "fp32", "e4m3", "e4m3"]
    finally:
        assert d.stop() == 0


def test_the_policy_sees_what_the_device_codec_flushed(apsd):
    """policy="auto" moves a tensor whose small values e3m0 flushes up to a
    wider format: step by step as it moves the host path's twin."""
    x = torch.full((4096,), 1e-6)
    x[0] = 1.0
    with aps.Client(apsd, 0, 1, format="e3m0", policy="auto", job="flushed") as c:
        stage, host, dev = dc.DeviceStage(), [], []
        for step in range(6):
            [hl, dl] = c.codes_layouts([("host", 4096), ("dev", 4096)])
            host.append(hl[0].format)
            dev.append(dl[0].format)
            c.allreduce("host", x.clone())
            dc.codes_call(c, [("dev", x.clone())], [dl], [stage], False).wait()
        assert dev == host and host[0] == "e3m0" and host[-1] != "e3m0", host


def rank_shards(rank, world, endpoints, fmt, scaling, partition_bytes):
    import_torch()
    with aps.Client(endpoints, rank, world, format=fmt, scaling=scaling, job="shards",
                    partition_bytes=partition_bytes) as c:
        x = grad(rank, n=10000)
        [layouts] = c.codes_layouts([("t", x.numel())])
        got, stage = x.clone(), dc.DeviceStage()
        dc.codes_call(c, [("t", got)], [layouts], [stage], False).wait()
        stage.store()
        want = x.clone()
        c.allreduce("floats", want)
        return got.numpy(), want.numpy(), layouts


@pytest.mark.parametrize("fmt,scaling", [("e4m3", "local"), ("fp4", "block")])
def test_codes_calls_over_shards_give_the_bits_of_the_float_path(fmt, scaling):
    """Two shards, tensors cut into partitions of 4 chunks: the partitions'
    chunks end to end are the layout, and the result is the float path's."""
    shards = [daemon("--chunk_bytes", "4k") for _ in range(2)]
    try:
        endpoints = [d.endpoint for d in shards]
        for got, want, (send, result) in run_ranks(rank_shards, 2, endpoints, fmt, scaling,
                                                   16384, timeout=60):
            assert send.chunks == 10 and send.chunk_elems == 1024 and send.count == 10000
            assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
        with aps.Client(endpoints, 0, 1, format=fmt, scaling=scaling, job="odd",
                        partition_bytes=6000) as c:  # partitions of 1500: not whole chunks
            with pytest.raises(aps.ArgumentError, match="not whole chunks"):
                c.codes_layouts([("t", 10000)])
    finally:
        for d in shards:
            assert d.stop() == 0
