"""apsd client: the low-precision codec of Auto-Precision Scaling (APS).

    import numpy as np, aps
    x = np.random.randn(1000).astype(np.float32)
    k = aps.aps_exponent(x, "e4m3", mode="local")
    codes = aps.quantize(x, "e4m3", scale_exp=k)
    y = aps.dequantize(codes, "e4m3", x.size, scale_exp=k)
"""

from aps._lib import ArgumentError, Error, lib
from aps.codec import (accumulate, aps_exponent, dequantize, format_info, maxabs, packed_size,
                       quantize)

__version__ = lib.aps_version().decode()

__all__ = ["ArgumentError", "Error", "accumulate", "aps_exponent", "dequantize", "format_info",
           "maxabs", "packed_size", "quantize", "__version__"]
