"""A gradient coded where it lives (aps.torch on a GPU): the torch codec
encodes it in a codes call's send layout on its device, only the codes cross
to host memory (pinned buffers, reused step after step), and the result's
codes come back and are decoded on the device. The same bits as the C
client's own path (HostStage): the torch codec is libaps's, bit for bit, and
the exponent is the one the C client would pick."""

import torch

from aps import _torch_codec as codec
from aps.codec import format_info

APS_ENONFINITE = -6


def reason_not_served(client):
    """None when client's codes calls can serve a tensor, else why not."""
    if "," in client.endpoint:
        return "several endpoints (shards)"
    if client.scaling == "global":
        return "global scaling (its exponent is agreed before the tensor is encoded)"
    if client.error_feedback:
        return "error_feedback (the C client keeps the residual)"
    return None


def use_device_codec(choice, client, params):
    """Whether an optimizer codes gradients on their device: choice True or
    False, or None: when a parameter is on a GPU and client's codes calls
    serve it. True for a client they do not serve is a ValueError."""
    why = reason_not_served(client)
    if choice and why is not None:
        raise ValueError(f"device_codec=True: the client's codes calls do not take {why}")
    if choice is None:
        return why is None and any(p.device.type == "cuda" for p in params)
    return bool(choice)


def encode(x, layout, scaling):
    """x (flat float32, on its device) in layout (aps._codes.CodesLayout):
    (uint8 codes on x's device, the scale exponent)."""
    fmt = layout.format
    if layout.block:
        codes, exps = codec.quantize_blocks(x, fmt, layout.block)
        if layout.chunks == 1:
            return torch.cat([codes, exps.view(torch.uint8)]), 0
        out = torch.empty(layout.bytes, dtype=torch.uint8, device=x.device)
        bits = format_info(fmt)["bits"]
        for i in range(layout.chunks):
            start, n, at, nbytes = layout.chunk(i)
            lo, size = start * bits // 8, (n * bits + 7) // 8
            out[at:at + size].copy_(codes[lo:lo + size])
            b0 = start // layout.block
            out[at + size:at + nbytes].copy_(exps[b0:b0 - (-n // layout.block)].view(torch.uint8))
        return out, 0
    k = 0 if scaling == "none" or fmt == "fp32" else codec.aps_exponent(x, fmt, mode="local")
    return codec.quantize(x, fmt, k), k


def decode(codes, exps, layout, out):
    """The result's codes (uint8, on out's device) and per-chunk exponents
    (ints) into out (flat float32)."""
    fmt = layout.format
    bits = format_info(fmt)["bits"]
    for i in range(layout.chunks):
        start, n, at, nbytes = layout.chunk(i)
        dest = out[start:start + n]
        if layout.block:
            size = (n * bits + 7) // 8
            exps_of_chunk = codes[at + size:at + nbytes].view(torch.int8)
            codec.dequantize_blocks(codes[at:at + size], exps_of_chunk, fmt, n, layout.block,
                                    out=dest)
        else:
            codec.dequantize(codes[at:at + nbytes], fmt, n, exps[i], out=dest)


class DeviceStage:
    """One tensor's way through a codes call: load() encodes it into host
    codes, store() decodes the result into it. Reusable step after step."""

    def __init__(self):
        self._codes = self._result = self._exps = None
        self._target = None
        self._layout = None

    def load(self, name, t, layouts, scaling, zero_nonfinite):
        """Encodes t for layouts ((send, result) of its call). Returns (the
        codes call's item for aps.Client.allreduce_codes_async, whether t held
        NaN or inf and was sent as zeros). Without zero_nonfinite such a
        tensor raises aps.Error APS_ENONFINITE."""
        send, result = layouts
        x = codec._flat_float32(t)
        zeroed = not bool(torch.isfinite(x).all())
        if zeroed:
            if not zero_nonfinite:
                from aps._lib import error_for
                raise error_for(APS_ENONFINITE, f"tensor {name!r} holds NaN or inf values; "
                                                "nothing was sent")
            x = torch.zeros_like(x)
        codes, k = encode(x, send, scaling)
        pin = t.device.type == "cuda"
        if self._codes is None or self._codes.numel() != send.bytes:
            self._codes = torch.empty(send.bytes, dtype=torch.uint8, pin_memory=pin)
        if self._result is None or self._result.numel() != result.bytes:
            self._result = torch.empty(result.bytes, dtype=torch.uint8, pin_memory=pin)
            self._exps = torch.empty(result.chunks, dtype=torch.int32)
        self._codes.copy_(codes)  # blocking: C reads the codes once the call starts
        self._target, self._layout = t, result
        return (name, send.format, self._codes, k, self._result, self._exps), zeroed

    def store(self, into=None, add=False):
        """Decodes the result into into (default: the tensor load() encoded),
        or with add adds it there (an optimize-mode update), as the C client
        adds an update to its weights: decoded to fp32, then one fp32 add."""
        t = self._target if into is None else into
        if t is None:
            return
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
