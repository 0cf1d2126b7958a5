#!/usr/bin/python3
"""Throughput of aps.torch's device codec (aps/_torch_codec.py) next to libaps
and a copy of the same tensor.

For each format: aps.torch.quantize and aps.torch.dequantize on the device,
into preallocated tensors, with the tensor's local APS exponent; libaps's
aps.quantize and aps.dequantize of the same data on the host (the C codec,
which reads host memory only); and a copy_ of the fp32 tensor on the device.
Rates are GB/s of fp32 input (4 bytes per element, whatever the format), the
best of a few timed calls after a warm-up; on CUDA each call is timed between
two synchronizations.

    PYTHONPATH=worker/python /usr/bin/python3 tests/bench/bench_torch_codec.py \
        [--device cuda] [--elements N] [--format e4m3 ...] [--threads T]
"""

import argparse
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "worker" / "python"))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import aps  # noqa: E402
import aps.torch  # noqa: E402

FORMATS = ["e4m3", "e4m3fn", "e5m2", "fp16", "bf16", "e2m1", "e3m4", "fp32", "fp4", "fp6e2m3"]
REPEATS = 5
BUDGET_S = 2.0  # stop repeating a measurement after this long


def measure(fn, sync):
    """Best seconds of one call of fn() after a warm-up call."""
    fn()
    sync()
    best, start = float("inf"), time.perf_counter()
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        fn()
        sync()
        best = min(best, time.perf_counter() - t0)
        if time.perf_counter() - start > BUDGET_S:
            break
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cpu", help="torch device (cpu, cuda, cuda:1, ...)")
    ap.add_argument("--elements", type=int, default=1 << 24, help="fp32 elements (16Mi)")
    ap.add_argument("--format", action="append", choices=FORMATS, help="only these formats")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    args = ap.parse_args()

    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    n = args.elements
    gen = np.random.default_rng(0x5EED)
    host = (gen.standard_normal(n, dtype=np.float32) * np.float32(1e-3)).astype(np.float32)
    x = torch.from_numpy(host).to(device)
    dst = torch.empty_like(x)
    gb = 4 * n / 1e9
    t_copy = measure(lambda: dst.copy_(x), sync)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"bench_torch_codec.py: {n} fp32 elements ({gb:.3f} GB), device {device} ({name}), "
          f"torch {torch.__version__} ({torch.get_num_threads()} CPU threads), aps "
          f"{aps.__version__}; GB/s of fp32 input\n")
    print(f"copy_ on {device}: {gb / t_copy:.2f} GB/s\n")
    print("| format | k | torch quantize | torch dequantize | libaps quantize (host) "
          "| libaps dequantize (host) | torch quantize / libaps |")
    print("|---|--:|--:|--:|--:|--:|--:|")
    for fmt in args.format or FORMATS:
        k = aps.torch.aps_exponent(x, fmt, mode="local")
        codes = torch.empty(aps.packed_size(fmt, n), dtype=torch.uint8, device=device)
        host_codes = np.empty(codes.numel(), dtype=np.uint8)
        host_out = np.empty(n, dtype=np.float32)
        tq = measure(lambda: aps.torch.quantize(x, fmt, scale_exp=k, out=codes), sync)
        td = measure(lambda: aps.torch.dequantize(codes, fmt, n, scale_exp=k, out=dst), sync)
        cq = measure(lambda: aps.quantize(host, fmt, scale_exp=k, out=host_codes), sync)
        cd = measure(lambda: aps.dequantize(host_codes, fmt, n, scale_exp=k, out=host_out),
                     sync)
        assert np.array_equal(codes.cpu().numpy(), host_codes), f"{fmt}: codes differ"
        assert np.array_equal(dst.cpu().numpy().view(np.uint32), host_out.view(np.uint32))
        print(f"| {fmt} | {k} | {gb / tq:.2f} | {gb / td:.2f} | {gb / cq:.2f} | {gb / cd:.2f} "
              f"| {cq / tq:.2f} |", flush=True)
    print("\nblock scaling, blocks of 32 (the same columns; k: one exponent per block)\n")
    print("| format | torch quantize_blocks | torch dequantize_blocks | libaps quantize_blocks "
          "(host) | libaps dequantize_blocks (host) | torch / libaps |")
    print("|---|--:|--:|--:|--:|--:|")
    for fmt in args.format or ["fp4", "fp6e2m3", "e4m3", "e3m0"]:
        got = {}
        tq = measure(lambda: got.update(r=aps.torch.quantize_blocks(x, fmt)), sync)
        codes, exps = got["r"]
        td = measure(lambda: aps.torch.dequantize_blocks(codes, exps, fmt, n, out=dst), sync)
        cq = measure(lambda: got.update(h=aps.quantize_blocks(host, fmt)), sync)
        host_codes, host_exps = got["h"]
        cd = measure(lambda: aps.dequantize_blocks(host_codes, host_exps, fmt, n, out=host_out),
                     sync)
        assert np.array_equal(codes.cpu().numpy(), host_codes), f"{fmt}: block codes differ"
        assert np.array_equal(exps.cpu().numpy(), host_exps), f"{fmt}: exponents differ"
        assert np.array_equal(dst.cpu().numpy().view(np.uint32), host_out.view(np.uint32))
        print(f"| {fmt} | {gb / tq:.2f} | {gb / td:.2f} | {gb / cq:.2f} | {gb / cd:.2f} "
              f"| {cq / tq:.2f} |", flush=True)


if __name__ == "__main__":
    main()
