#!/usr/bin/python3
"""Codec throughput through the Python binding, next to numpy and PyTorch.

For each size and format: quantize with the APS exponent (as a script would
write it: aps.maxabs, then aps.aps_exponent(mode="local"), which scans the
tensor again, then aps.quantize), quantize with one scan (aps_exponent and
aps.quantize), quantize alone with a known k, dequantize and accumulate, all
into preallocated buffers; as elements per second and as a ratio to
np.copyto of the same fp32 buffer. PyTorch's fp32 -> fp16 conversion into a
preallocated tensor is the row a user would compare against. One thread.

    PYTHONPATH=worker/python /usr/bin/python3 tests/bench/bench_codec.py [--quick]
"""

import argparse
import os
import pathlib
import platform
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "worker" / "python"))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import aps  # noqa: E402

SIZES = [1024, 256 * 1024, 64 * 1024 * 1024]
QUICK_MAX = 256 * 1024
FORMATS = ["fp32", "bf16", "fp16", "e5m2", "e4m3", "e4m3fn", "e3m0"]
SAMPLE_ELEMS = 1 << 20  # a timed sample covers at least this many elements
MIN_SAMPLES, MAX_SAMPLES = 3, 30
BUDGET_S = 0.3  # stop sampling after this long once MIN_SAMPLES are in


def measure(fn, n):
    """Best seconds per call of fn() over samples of at least SAMPLE_ELEMS
    elements, after one warm-up sample; a call slower than BUDGET_S is timed
    once more only."""
    inner = max(1, SAMPLE_ELEMS // n)

    def sample():
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        return (time.perf_counter() - t0) / inner

    min_samples = 1 if sample() > BUDGET_S else MIN_SAMPLES
    best = float("inf")
    start = time.perf_counter()
    for s in range(MAX_SAMPLES):
        best = min(best, sample())
        if s + 1 >= min_samples and time.perf_counter() - start > BUDGET_S:
            break
    return best


def gradient(n, seed):
    """Normal values times 1e-3, float32, deterministic."""
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(n, dtype=np.float32) * np.float32(1e-3)).astype(np.float32)


def format_ops(x, fmt, out):
    """The local APS exponent k of x and the timed operations of one format,
    keyed by column name; out is the float32 target of the decoders."""
    n = x.size
    codes = np.zeros(aps.packed_size(fmt, n), dtype=np.uint8)
    k = aps.aps_exponent(x, fmt, mode="local")

    def quant_2scans():
        aps.maxabs(x)
        kk = aps.aps_exponent(x, fmt, mode="local")
        aps.quantize(x, fmt, scale_exp=kk, out=codes)

    def quant_scan():
        aps.quantize(x, fmt, scale_exp=aps.aps_exponent(x, fmt, mode="local"), out=codes)

    aps.quantize(x, fmt, scale_exp=k, out=codes)
    return k, {
        "maxabs+exp+quant": quant_2scans,
        "exp+quant": quant_scan,
        "quant (known k)": lambda: aps.quantize(x, fmt, scale_exp=k, out=codes),
        "dequant": lambda: aps.dequantize(codes, fmt, n, scale_exp=k, out=out),
        "accum": lambda: aps.accumulate(codes, fmt, out, scale_exp=k),
    }


def rate(n, t):
    return n / t * 1e-9


def bench_size(n, formats):
    x = gradient(n, 0x5EED + n)
    out = np.zeros(n, dtype=np.float32)
    dst16 = torch.zeros(n, dtype=torch.float16)
    src = torch.from_numpy(x)
    t_copy = measure(lambda: np.copyto(out, x), n)
    t_half = measure(lambda: dst16.copy_(src), n)

    print(f"\n### {n} floats ({n * 4 / 2**20:g} MiB fp32)\n")
    print(f"np.copyto fp32: {t_copy * 1e6:.2f} us, {rate(n, t_copy):.2f} Ge/s; "
          f"torch fp32->fp16 copy_: {rate(n, t_half):.2f} Ge/s, "
          f"{t_half / t_copy:.2f} x copy\n")
    names = None
    for fmt in formats:
        k, ops = format_ops(x, fmt, out)
        if names is None:
            names = list(ops)
            print("| format | k | " + " | ".join(f"{c} Ge/s | x copy" for c in names) + " |")
            print("|---|--:|" + "--:|--:|" * len(names))
        cells = []
        for fn in ops.values():
            t = measure(fn, n)
            cells.append(f"{rate(n, t):.2f} | {t / t_copy:.2f}")
        print(f"| {fmt} | {k} | " + " | ".join(cells) + " |", flush=True)


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="skip the 64Mi-float size")
    ap.add_argument("--format", choices=FORMATS, help="only this format")
    args = ap.parse_args()

    torch.set_num_threads(1)
    isa = os.environ.get("APS_CODEC_ISA", "auto (best the CPU has)")
    print(f"bench_codec.py: cpu \"{cpu_model()}\", aps {aps.__version__}, codec isa {isa}, "
          f"numpy {np.__version__}, torch {torch.__version__} ({torch.get_num_threads()} thread), "
          f"best of {MIN_SAMPLES}-{MAX_SAMPLES} samples, Ge/s = 1e9 elements/s, "
          "x copy = time / np.copyto time")
    formats = [args.format] if args.format else FORMATS
    for n in SIZES:
        if not args.quick or n <= QUICK_MAX:
            bench_size(n, formats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
