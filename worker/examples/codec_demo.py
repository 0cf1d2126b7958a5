#!/usr/bin/python3
"""Why APS matters, in one screen: gradient-like tensors that sit many binades
apart (as ResNet-50's layers do, APS.md section 2) quantized to 8 and 4 bits
without scaling and with the APS exponent. Shows the share of non-zero values
flushed to zero and the relative error of each tensor after the round trip.

    make demo        (or: PYTHONPATH=worker/python /usr/bin/python3 worker/examples/codec_demo.py)
"""

import pathlib
import sys
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "python"))
import aps  # noqa: E402

# (layer, scale of its gradients): magnitudes like those of APS.md section 2.
LAYERS = [("conv1.weight", 2.0**-10), ("res3.conv.weight", 2.0**-14),
          ("res5c.conv.weight", 2.0**-18), ("fc1000.weight", 2.0**-24)]
FORMATS = ["e5m2", "e4m3", "e3m0"]
N = 1 << 20


def roundtrip(g, fmt, scaling):
    k = aps.aps_exponent(g, fmt, nworkers=4, mode=scaling)
    stats = {}
    codes = aps.quantize(g, fmt, scale_exp=k, stats=stats)
    back = aps.dequantize(codes, fmt, g.size, scale_exp=k)
    rel = np.linalg.norm(back - g) / np.linalg.norm(g)
    return stats["flushed"] / np.count_nonzero(g), rel, codes.nbytes


def main():
    rng = np.random.default_rng(0)
    print(f"apsd codec demo (libaps {aps.__version__}): {N} gradient values per layer, "
          "4 workers, APS global exponent\n")
    print(f"{'layer':<20} {'format':<7} {'bytes':>9} | {'no scaling: flushed':>20} "
          f"{'rel.err':>8} | {'APS: flushed':>13} {'rel.err':>8} {'k':>4}")
    t0 = time.perf_counter()
    for name, scale in LAYERS:
        g = (rng.standard_normal(N) * scale).astype(np.float32)
        for fmt in FORMATS:
            f0, e0, nbytes = roundtrip(g, fmt, "none")
            f1, e1, _ = roundtrip(g, fmt, "global")
            k = aps.aps_exponent(g, fmt, nworkers=4, mode="global")
            print(f"{name:<20} {fmt:<7} {nbytes:>9} | {f0:>19.1%} {e0:>8.3f} | "
                  f"{f1:>12.2%} {e1:>8.3f} {k:>4}")
    dt = time.perf_counter() - t0
    print(f"\nfp32 would send {4 * N} bytes per layer. Without scaling the small layers "
          "vanish (flushed 100%, error 1.0);\nwith APS each keeps its own exponent and "
          f"loses only what lies below the format's range. ({dt:.2f} s)")


if __name__ == "__main__":
    main()
