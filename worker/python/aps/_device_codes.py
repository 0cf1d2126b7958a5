"""A gradient coded where it lives (aps.torch on a GPU): the torch codec
encodes it in a codes call's send layout on its device, only the codes cross
to host memory (pinned buffers, reused step after step), and the result's
codes come back and are decoded on the device. The same bits as the C
client's own path (HostStage): the torch codec is libaps's, bit for bit, and
the exponent is the one the C client would pick.

Nothing here waits for the device while backward runs: load() queues the
encoding, the exponent, the finiteness check and their copies to host memory
on the current stream and records an event; ready(), on the client's I/O
thread just before the call starts, waits for that event and reads the
exponent. So a bucket's codes are made and copied while backward computes the
next one, and the network carries earlier buckets meanwhile."""

import torch

from aps import _torch_codec as codec
from aps._lib import error_for

APS_ENONFINITE = -6


def reason_not_served(client):
    """None when client's codes calls can serve a tensor, else why not."""
    if client.scaling == "global":
        return "global scaling (its exponent is agreed before the tensor is encoded)"
    if client.error_feedback:
        return "error_feedback (the C client keeps the residual)"
    return None


def use_device_codec(choice, client, params):
    """Whether an optimizer codes gradients on their device: choice True or
    False, or None: when a parameter is on a GPU and client's codes calls
    serve it. True for a client they do not serve is a ValueError."""
    if choice is not None and not isinstance(choice, bool):  # "no" would be True
        raise TypeError(f"device_codec must be None, True or False, not {choice!r}")
    why = reason_not_served(client)
    if choice and why is not None:
        raise ValueError(f"device_codec=True: the client's codes calls do not take {why}")
    if choice is None:
        return why is None and any(p.device.type == "cuda" for p in params)
    return bool(choice)


def encode(x, layout, scaling, out):
    """x (flat float32) in layout (aps._codes.CodesLayout) into out (uint8, on
    x's device), without waiting for the device. Returns two int64 tensors on
    x's device: the scale exponent (one element; 0 with block scaling) and
    each chunk's finite non-zero values flushed to zero (aps.quantize's stats)."""
    _check_sizes(x, out, layout, "x", "out")
    f = codec._spec(layout.format, 0)
    if layout.block or scaling == "none" or layout.format == "fp32":
        k = torch.zeros(1, dtype=torch.int32, device=x.device)
    else:
        k = codec.local_exponents(f, codec._maxabs(x).reshape(1))
    flushed = []
    for i in range(layout.chunks):
        start, n, at, nbytes = layout.chunk(i)
        part = x[start:start + n]
        if layout.block:
            codes, exps, counts = codec.quantize_blocks_into(part, f, layout.block, count=True)
            size = codes.numel()
            out[at:at + size].copy_(codes)
            out[at + size:at + nbytes].copy_(exps.view(torch.uint8))
        else:
            counts = codec.quantize_into(part, f, k, out[at:at + nbytes], count=True)
        flushed.append(counts[2:])
    return k.to(torch.int64), torch.cat(flushed)


def decode(codes, exps, layout, out):
    """The result's codes (uint8, on out's device) and per-chunk exponents
    (ints) into out (flat float32)."""
    _check_sizes(out, codes, layout, "out", "codes")
    if len(exps) < layout.chunks:
        raise ValueError(f"exps has {len(exps)} exponents, the layout {layout.chunks} chunks")
    bits = codec._spec(layout.format, 0).bits
    for i in range(layout.chunks):
        start, n, at, nbytes = layout.chunk(i)
        dest = out[start:start + n]
        if layout.block:
            size = (n * bits + 7) // 8
            exps_of_chunk = codes[at + size:at + nbytes].view(torch.int8)
            codec.dequantize_blocks(codes[at:at + size], exps_of_chunk, layout.format, n,
                                    layout.block, out=dest)
        else:
            codec.dequantize(codes[at:at + nbytes], layout.format, n, exps[i], out=dest)


def _check_sizes(values, codes, layout, values_name, codes_name):
    """values hold layout's elements and codes (uint8) room for its bytes."""
    if values.numel() != layout.count:
        raise ValueError(f"{values_name} has {values.numel()} elements, the layout "
                         f"{layout.count}")
    if codes.dtype != torch.uint8 or codes.numel() < layout.bytes:
        raise ValueError(f"{codes_name} must be uint8 with room for {layout.bytes} bytes, not "
                         f"{codes.dtype} with {codes.numel()}")


def _buffer(old, n, dtype, device, pin=False):
    """old if it holds n elements, else a new tensor."""
    if old is not None and old.numel() == n:
        return old
    return torch.empty(n, dtype=dtype, device=device, pin_memory=pin)


class DeviceStage:
    """One tensor's way through a codes call: load() encodes it into host
    codes, ready() waits for them, store() decodes the result into it.
    Reusable step after step."""

    def __init__(self):
        self._made = None  # the codes on the device
        self._codes = self._result = self._exps = self._scalars = None  # host
        self._event = None
        self._name = self._target = self._layout = None

    def load(self, name, t, layouts, scaling):
        """Queues the encoding of t for layouts ((send, result) of its call)
        and the copy of its codes to host memory. Returns the codes call's
        item for aps.Client.allreduce_codes_async; its scale exponent is
        ready()'s."""
        send, result = layouts
        x = codec._flat_float32(t, f"tensor {name!r}")
        if x.numel() != send.count or result.count != send.count:
            raise ValueError(f"tensor {name!r} has {x.numel()} elements, its layouts "
                             f"{send.count} and {result.count}")
        pin = t.device.type == "cuda"
        self._made = _buffer(self._made, send.bytes, torch.uint8, t.device)
        k, flushed = encode(x, send, scaling, self._made)
        finite = torch.isfinite(x).all().reshape(1).to(torch.int64)
        self._codes = _buffer(self._codes, send.bytes, torch.uint8, "cpu", pin)
        # the exponent, the finiteness flag, then each chunk's flushed count
        self._scalars = _buffer(self._scalars, 2 + send.chunks, torch.int64, "cpu", pin)
        self._codes.copy_(self._made, non_blocking=pin)
        self._scalars[0:1].copy_(k, non_blocking=pin)
        self._scalars[1:2].copy_(finite, non_blocking=pin)
        self._scalars[2:].copy_(flushed, non_blocking=pin)
        self._event = None
        if pin:
            self._event = torch.cuda.Event()
            self._event.record()
        self._result = _buffer(self._result, result.bytes, torch.uint8, "cpu", pin)
        self._exps = _buffer(self._exps, result.chunks, torch.int32, "cpu")
        self._name, self._target, self._layout = name, t, result
        return (name, send.format, self._codes, 0, self._result, self._exps)

    def ready(self, zero_nonfinite):
        """Waits until load()'s codes are in host memory (the client's I/O
        thread, before the call starts); returns ((scale exponent, each
        chunk's values flushed to zero), whether the tensor held NaN or inf
        and goes as zeros). Without zero_nonfinite such a tensor raises
        aps.Error APS_ENONFINITE."""
        if self._event is not None:
            self._event.synchronize()
        k, finite, *flushed = self._scalars.tolist()
        if finite:
            return (k, flushed), False
        if not zero_nonfinite:
            raise error_for(APS_ENONFINITE, f"tensor {self._name!r} holds NaN or inf values; "
                                            "nothing was sent")
        self._codes.zero_()  # zeros in every format and layout: all-zero bytes
        return (0, []), True

    def store(self, into=None, add=False):
        """Decodes the result into into (default: the tensor load() encoded),
        or with add adds it there (an optimize-mode update), as the C client
        adds an update to its weights: decoded to fp32, then one fp32 add."""
        t = self._target if into is None else into
        if t is None:
            return
        if t.numel() != self._layout.count:
            raise ValueError(f"into has {t.numel()} elements, the result of {self._name!r} "
                             f"{self._layout.count}")
        codes = self._result.to(t.device, non_blocking=True)
        exps = self._exps.tolist()
        if not add and t.dtype == torch.float32 and t.is_contiguous():
            decode(codes, exps, self._layout, t.view(-1))
        else:
            flat = torch.empty(t.numel(), dtype=torch.float32, device=t.device)
            decode(codes, exps, self._layout, flat)
            if add:
                t.add_(flat.view_as(t))
            else:
                t.copy_(flat.view_as(t))
        self._target = None


def codes_call(client, named, layouts, stages, zero_nonfinite, lr=None):
    """Queues the codes call of named ([(name, tensor)]) with their layouts and
    DeviceStages: all-reduces, or optimizer steps with lr. Returns its Handle."""
    if not len(named) == len(layouts) == len(stages):  # zip would drop the extra ones
        raise ValueError(f"{len(named)} tensors, {len(layouts)} layouts and {len(stages)} "
                         "stages: one of each per tensor")
    items = [stage.load(name, t, layout, client.scaling)
             for (name, t), layout, stage in zip(named, layouts, stages)]

    def before():  # on the client's I/O thread
        settings, zeroed = [], []
        for (name, _), stage in zip(named, stages):
            setting, was_zeroed = stage.ready(zero_nonfinite)
            settings.append(setting)
            if was_zeroed:
                zeroed.append(name)
        return settings, zeroed
    if lr is None:
        return client.allreduce_codes_async(items, before=before)
    return client.step_codes_async(items, lr, before=before)
