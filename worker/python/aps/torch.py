"""PyTorch helpers: apsd as the gradient all-reduce of a training script.

    client = aps.Client.from_env(format="e4m3")
    aps.torch.broadcast_parameters(model, client)        # same start on every rank
    opt = aps.torch.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         client, named_parameters=model.named_parameters())
    for x, y in batches:                                  # this rank's share of the batch
        opt.zero_grad()
        loss_fn(model(x), y).backward()                   # gradients leave as they are ready
        opt.step()                                        # mean over ranks, then SGD
    client.close()                                        # BYE, or apsd counts a lost rank

or, with the optimizer on the daemon (apsd holds the weights, optimize mode):

    client = aps.Client.from_env(format="e4m3", optimizer="sgd,momentum=0.9")
    opt = aps.torch.ServerOptimizer(model, client, "sgd", lr=0.1, momentum=0.9)

or, for a DDP script (torch.distributed initialised, e.g. gloo with a world of 1
per process): ddp_model.register_comm_hook(client, aps.torch.allreduce_hook).

Both optimizers are torch.optim.Optimizer objects: lr schedulers, state_dict()
and load_state_dict(), zero_grad() and add_param_group() work on them.

Tensors that are not contiguous CPU float32 (CUDA, fp16, bf16) are staged
through host buffers (aps._staging), but for GPU gradients of a client whose
codes calls serve them (local, none or block scaling; no error_feedback;
with shards, partitions of whole chunks): those are coded on the GPU and only their codes cross to
host memory and back (aps._device_codes; device_codec=, codes_hook).

quantize, dequantize, aps_exponent, quantize_blocks and dequantize_blocks
are the codec on tensors, on the tensor's device, bit for bit as
aps.quantize and friends (aps._torch_codec).
"""

import weakref

import torch

from aps._device_codes import DeviceStage, codes_call, reason_not_served
from aps._diloco import DiLoCo
from aps._flags import AnyRankFlag
from aps._optimizer import DEFAULT_BUCKET_BYTES, DistributedOptimizer
from aps._server_optimizer import ServerOptimizer, optimizer_spec
from aps._staging import HostStage
from aps._torch_codec import (aps_exponent, dequantize, dequantize_blocks, quantize,
                               quantize_blocks)

__all__ = ["DEFAULT_BUCKET_BYTES", "DiLoCo", "DistributedOptimizer", "HostStage", "ServerOptimizer",
           "allreduce_hook", "aps_exponent", "broadcast_parameters", "codes_hook", "dequantize",
           "dequantize_blocks", "optimizer_spec", "quantize", "quantize_blocks"]


def _named_tensors(source):
    if isinstance(source, torch.nn.Module):
        return list(source.state_dict().items())
    if isinstance(source, dict):
        return list(source.items())
    return list(source)


def broadcast_parameters(source, client, prefix="param."):
    """Copies rank 0's values into every rank's tensors, in place: source is a
    module (its parameters and floating-point buffers), a state dict or an
    iterable of (name, tensor). Integer tensors (step counters) are left as
    they are. Call it on every rank with the same names, before training."""
    stages, handles = [], []
    with torch.no_grad():
        for name, t in _named_tensors(source):
            if not (t.is_floating_point() and t.numel() > 0):
                continue
            stage = HostStage()
            handles.append(client.broadcast_async(prefix + name, stage.load(t)))
            stages.append(stage)
        for stage, h in zip(stages, handles):
            h.wait()
            stage.store()


def _bucket_views(buffer, params):
    """One view of the flat bucket buffer per parameter (DDP lays them out in
    order); the whole buffer if the sizes do not add up."""
    sizes = [p.numel() for p in params]
    if sum(sizes) != buffer.numel():
        return [buffer]
    return list(torch.split(buffer, sizes))


def allreduce_hook(client, bucket):
    """DDP communication hook (model.register_comm_hook(client, allreduce_hook)):
    the bucket's gradients become their mean over client's job, each parameter
    with its own APS exponent. Returns a torch.futures.Future of the buffer.

    A NaN or inf on any rank makes the whole bucket NaN on every rank, as a sum
    through gloo or NCCL would, so that a grad scaler skips the step; the
    tensor is sent as zeros and one flag per bucket tells the other ranks.
    Names are derived from the bucket's index and sizes, identical on every
    rank (DDP builds the same buckets everywhere). A bucket on a GPU is coded
    there when the client's codes calls serve it (codes_hook)."""
    buffer = bucket.buffer()
    if buffer.device.type == "cuda" and reason_not_served(client) is None:
        return codes_hook(client, bucket)
    stage = HostStage()
    host = stage.load(buffer)
    views = _bucket_views(host, bucket.parameters())
    items = [(_hook_name(bucket, i, v), v) for i, v in enumerate(views)]
    handle = client.allreduce_many_async(items, nonfinite="zero")
    return _hook_future(client, bucket, handle, host, [stage])


def codes_hook(client, bucket):
    """allreduce_hook with the bucket's gradients coded on their device (the
    torch codec, aps._device_codes) and only codes crossing to host memory:
    what allreduce_hook does for a GPU bucket, here on any device (the same
    results)."""
    views = _bucket_views(bucket.buffer(), bucket.parameters())
    named = [(_hook_name(bucket, i, v), v) for i, v in enumerate(views)]
    known = _HOOK_STAGES.setdefault(client, {})
    stages = [known.setdefault(name, DeviceStage()) for name, _ in named]
    layouts = client.codes_layouts([(name, v.numel()) for name, v in named])
    handle = codes_call(client, named, layouts, stages, True)
    return _hook_future(client, bucket, handle, bucket.buffer(), stages)


# The DeviceStages of codes_hook by client and bucket tensor name: pinned buffers reused.
_HOOK_STAGES = weakref.WeakKeyDictionary()


def _hook_name(bucket, i, view):
    return f"ddp.{bucket.index()}.{i}:{view.numel()}"


def _hook_future(client, bucket, handle, values, stages):
    """The hook's future: after handle and the bucket's flag, the stages store
    their results, and values become NaN if any rank had NaN or inf."""
    flagged = AnyRankFlag(client, "ddp.@nonfinite").reduce_after([handle])
    future = torch.futures.Future()

    def finish(_flag_handle):
        try:
            handle.wait()
            nonfinite = flagged.wait()
            for stage in stages:
                if isinstance(stage, DeviceStage):
                    stage.store()
            if nonfinite:
                values.fill_(float("nan"))
            for stage in stages:
                if not isinstance(stage, DeviceStage):
                    stage.store()
            future.set_result(bucket.buffer())
        except Exception as exc:
            future.set_exception(exc)
    flagged.add_done_callback(finish)
    return future
