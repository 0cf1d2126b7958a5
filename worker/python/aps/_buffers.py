"""The memory of a tensor handed to libaps: a C-contiguous float32 numpy array
or CPU torch tensor, used in place (no copy in Python).

Checks raise TypeError/ValueError before anything reaches C. torch is not
imported here: a torch tensor is recognised only if torch is already loaded.
"""

import sys

import numpy as np

from aps._args import check_has_data, check_writable


def _torch_tensor_type():
    torch = sys.modules.get("torch")
    return getattr(torch, "Tensor", None)


def float32_buffer(x, what="x", writable=True):
    """Returns (address, element count) of x's memory after checking that x is
    a contiguous float32 numpy array or CPU torch tensor (writable if asked)."""
    tensor_type = _torch_tensor_type()
    if tensor_type is not None and isinstance(x, tensor_type):
        return _torch_buffer(x, what, writable)
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{what} must be a numpy.ndarray or torch.Tensor, "
                        f"not {type(x).__name__}")
    if x.dtype != np.float32:
        raise TypeError(f"{what} must have dtype float32, not {x.dtype}")
    if not x.flags.c_contiguous:
        raise ValueError(f"{what} must be C-contiguous (use numpy.ascontiguousarray "
                         "and copy the result back)")
    if writable:
        check_writable(x, what)
    return x.ctypes.data, x.size


def _torch_buffer(x, what, writable):
    import torch

    check_has_data(x, what)
    if x.dtype != torch.float32:
        raise TypeError(f"{what} must have dtype torch.float32, not {x.dtype} "
                        "(aps.torch stages other dtypes through host buffers)")
    if x.device.type != "cpu":
        raise TypeError(f"{what} is on {x.device}: only CPU tensors are used in place "
                        "(aps.torch stages device tensors through host buffers)")
    if x.is_sparse or not x.is_contiguous():
        raise ValueError(f"{what} must be a dense contiguous tensor (use .contiguous() "
                         "and copy the result back)")
    if writable:
        check_writable(x, what)
    return x.data_ptr(), x.numel()


_TORCH_DTYPES = {np.uint8: "uint8", np.int32: "int32"}


def raw_buffer(x, dtype, what="x", writable=True):
    """Returns (address, element count) of x's memory after checking that x is
    a contiguous numpy array or CPU torch tensor of dtype (numpy.uint8 or
    numpy.int32): the codes and exponents of aps.Client's codes calls."""
    tensor_type = _torch_tensor_type()
    if tensor_type is not None and isinstance(x, tensor_type):
        import torch

        check_has_data(x, what)
        want = getattr(torch, _TORCH_DTYPES[dtype])
        if x.dtype != want or x.device.type != "cpu":
            raise TypeError(f"{what} must be a contiguous CPU tensor of {want}, not "
                            f"{x.dtype} on {x.device}")
        if x.is_sparse or not x.is_contiguous():
            raise ValueError(f"{what} must be a dense contiguous tensor (use .contiguous())")
        if writable:
            check_writable(x, what)
        return x.data_ptr(), x.numel()
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{what} must be a numpy.ndarray or torch.Tensor, "
                        f"not {type(x).__name__}")
    if x.dtype != dtype:
        raise TypeError(f"{what} must be an array of {np.dtype(dtype)}, not {x.dtype}")
    if not x.flags.c_contiguous:
        raise ValueError(f"{what} must be C-contiguous (use numpy.ascontiguousarray)")
    if writable:
        check_writable(x, what)
    return x.ctypes.data, x.size
