"""Host staging: the float32, contiguous CPU memory the C client reduces in
place, standing for a tensor that is not such memory itself (a CUDA tensor,
fp16/bf16, non-contiguous).

A tensor that already is contiguous CPU float32 is used as it is, without a
copy. Otherwise load() copies it into a host buffer kept for reuse (pinned
when the tensor is on a GPU) and store() copies the result back.
"""

import torch

from aps._args import check_has_data


def is_direct(t):
    """True if the C client can use t's memory in place."""
    return (t.device.type == "cpu" and t.dtype == torch.float32 and t.is_contiguous()
            and not t.is_sparse)


class HostStage:
    """One tensor's way to and from the C client; reusable step after step."""

    def __init__(self):
        self._host = None
        self._source = None  # the tensor load() copied from, if it copied

    def load(self, t):
        """The memory to reduce for t: t itself, or a host copy of it in float32."""
        check_has_data(t, "a staged tensor")
        t = t.detach()
        if is_direct(t):
            self._source = None
            return t
        if self._host is None or self._host.shape != t.shape:
            self._host = torch.empty(t.shape, dtype=torch.float32,
                                     pin_memory=t.device.type == "cuda")
        self._host.copy_(t)  # blocking: the data must be on the host before C reads it
        self._source = t
        return self._host

    def store(self):
        """Copies the result back into the tensor load() staged (no-op if direct)."""
        if self._source is not None:
            self._source.copy_(self._host, non_blocking=self._source.device.type == "cuda")
            self._source = None
