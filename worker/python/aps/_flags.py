"""Every rank learns whether any rank raised a flag: a 1-element tensor
all-reduced through apsd after the tensors it is about.

This is the Python half of the "skip" protocol for non-finite gradients
(until apsd carries a SKIP flag in PUSH/RESULT): a rank whose gradient holds
NaN or inf sends that tensor as zeros, so that no rank waits, and raises its
flag; the flag's mean is non-zero on every rank exactly when some rank raised
it. Rank r sends V (flag raised) or 0, V the largest power of two the uplink
format holds, so the value is exact in every format and scaling; the mean,
at least V/N, survives the downlink quantization (checked when scaling is
"none", where it could be flushed).
"""

import math

import numpy as np

from aps.codec import dequantize, format_info, quantize


def flag_value(client):
    """V for client's format; ValueError if the mean V/N could be flushed."""
    fmt_max = format_info(client.format)["max"]
    value = 2.0 ** math.floor(math.log2(fmt_max))
    if client.scaling == "none":
        down = client.downlink or client.format
        least = np.array([value / client.world_size], dtype=np.float32)
        if dequantize(quantize(least, down), down, 1)[0] == 0:
            raise ValueError(f"a flag of {value} from one rank of {client.world_size} is "
                             f"flushed to zero by {down} without scaling: use "
                             "scaling='local' or check_finite=False")
    return value


class AnyRankFlag:
    """A named flag, reduced after a set of handles in the client's call order."""

    def __init__(self, client, name):
        self.client = client
        self.name = name
        self.value = flag_value(client)

    def reduce_after(self, handles):
        """Queues the flag's all-reduce after handles; this rank raises the flag
        if any of them sent a tensor as zeros (known once it has started, which
        every earlier call has when the flag's call starts). Returns a
        FlagHandle whose wait() says whether any rank raised it."""
        buf = np.zeros(1, dtype=np.float32)

        def raise_if_needed():  # on the I/O thread, just before the flag starts
            for h in handles:
                try:
                    bad = h.started()
                except Exception:  # whoever waits on that handle sees its error
                    continue
                if bad:
                    buf[0] = self.value
        call = self.client._prepare(self.name, buf)
        handle = self.client._queue_reduce([call], False, None, f"flag {self.name!r}",
                                           lambda _bad: None, before=raise_if_needed)
        return FlagHandle(handle, buf)


class FlagHandle:
    """The pending outcome of AnyRankFlag.reduce_after."""

    def __init__(self, handle, buf):
        self._handle = handle
        self._buf = buf

    def done(self):
        return self._handle.done()

    def wait(self, timeout=None):
        """True if any rank raised the flag; raises the call's error."""
        self._handle.wait(timeout)
        return bool(self._buf[0] > 0)

    def add_done_callback(self, fn):
        self._handle.add_done_callback(lambda _h: fn(self))
