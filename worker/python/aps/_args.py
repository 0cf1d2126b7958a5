"""Argument checks of the binding: what ctypes would pass on silently, refused
before it reaches libaps. ctypes wraps an int into its C type's range (2**32 + 1
becomes 1, -1 becomes 2**64 - 1), a str is cut at its first NUL ("e4m3\\0x" is
"e4m3"), and a pointer is written through whatever the memory is (a read-only
array, a tensor autograd tracks, a meta tensor that has none). Each check
raises TypeError (not an int, not a str) or ValueError (out of range, a NUL,
memory that cannot be written); check_float does the same for a number that
must be finite (NaN fails every comparison: `if x < 0: raise` lets it through).

torch is not imported here: a torch tensor is recognised only if torch is
already loaded.
"""

import math
import sys

import numpy as np

INT32 = (-(1 << 31), (1 << 31) - 1)
UINT32 = (0, (1 << 32) - 1)
UINT64 = (0, (1 << 64) - 1)
POSITIVE_INT32 = (1, (1 << 31) - 1)
ANY_INT = (-math.inf, math.inf)  # a Python int, range checked where it is used
SECONDS = (0.0, 1e9)  # a timeout: socket.settimeout takes up to about 9.2e9 s


def check_int(value, what, bounds=INT32):
    """value as a Python int within bounds (lo, hi), both included."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{what} must be an int, not {type(value).__name__}")
    value = int(value)
    lo, hi = bounds
    if not lo <= value <= hi:
        raise ValueError(f"{what} {value} is out of range ({lo} to {hi})")
    return value


def check_bool(value, what):
    """value as a bool: True, False, or the ints 1 and 0 ("no" is truthy: refused)."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)) and value in (0, 1):
        return bool(value)
    raise TypeError(f"{what} must be True or False, not {value!r}")


def check_float(value, what, bounds=(-math.inf, math.inf)):
    """value as a finite Python float within bounds (lo, hi), both included."""
    if isinstance(value, (bool, str, bytes)) or not hasattr(value, "__float__"):
        raise TypeError(f"{what} must be a number, not {type(value).__name__}")
    value = float(value)
    lo, hi = bounds
    if not math.isfinite(value):
        raise ValueError(f"{what} {value} is not a finite number")
    if not lo <= value <= hi:
        raise ValueError(f"{what} {value} is out of range ({lo} to {hi})")
    return value


def check_str(value, what, allow_none=False):
    """value encoded for a C string (bytes), or None when allowed."""
    if value is None and allow_none:
        return None
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, not {type(value).__name__}")
    if "\0" in value:
        raise ValueError(f"{what} {value!r} holds a NUL character (C would cut it there)")
    return value.encode()


def _torch():
    return sys.modules.get("torch")


def check_has_data(t, what):
    """A torch tensor whose memory exists: a meta tensor has only a shape."""
    if t.device.type == "meta":
        raise ValueError(f"{what} is a meta tensor: it has a shape but no data "
                         "(materialize it, e.g. with .to_empty(device='cpu'), first)")


def check_writable(x, what):
    """x (a numpy array or torch tensor) may be written in place through its pointer."""
    torch = _torch()
    if torch is not None and isinstance(x, torch.Tensor):
        check_has_data(x, what)
        if x.requires_grad:
            raise ValueError(f"{what} requires grad: autograd would not see the results "
                             "written into it (pass .detach() or write under torch.no_grad() "
                             "into .data)")
        if x.is_inference() and not torch.is_inference_mode_enabled():
            raise ValueError(f"{what} is an inference tensor: it cannot be written "
                             "outside torch.inference_mode() (pass a clone)")
        return x
    if isinstance(x, np.ndarray) and not x.flags.writeable:
        raise ValueError(f"{what} is read-only: the result is written into it")
    return x
