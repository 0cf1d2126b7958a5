"""apsd client: the low-precision codec of Auto-Precision Scaling (APS), the
client of the apsd daemon, and PyTorch helpers.

    import numpy as np, aps
    x = np.random.randn(1000).astype(np.float32)
    k = aps.aps_exponent(x, "e4m3", mode="local")
    codes = aps.quantize(x, "e4m3", scale_exp=k)
    y = aps.dequantize(codes, "e4m3", x.size, scale_exp=k)

    with aps.Client.from_env(format="e4m3") as client:   # rank and world from the launcher
        client.allreduce("grad", x)                        # x becomes the mean over ranks

aps.torch (DistributedOptimizer, ServerOptimizer, broadcast_parameters, allreduce_hook) is
imported on first use, so that `import aps` does not load PyTorch.
"""

import importlib

from aps._io import Handle
from aps._lib import ArgumentError, Error, lib
from aps.client import Client
from aps.codec import (accumulate, aps_exponent, dequantize, dequantize_blocks, format_info,
                       maxabs, packed_size, quantize, quantize_blocks)

__version__ = lib.aps_version().decode()

__all__ = ["ArgumentError", "Client", "Error", "Handle", "accumulate", "aps_exponent",
           "dequantize", "dequantize_blocks", "format_info", "maxabs", "packed_size", "quantize",
           "quantize_blocks", "__version__"]


def __getattr__(name):
    if name in ("torch", "launch", "daemon"):
        return importlib.import_module(f"aps.{name}")
    raise AttributeError(f"module 'aps' has no attribute {name!r}")
