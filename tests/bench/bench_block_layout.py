#!/usr/bin/python3
"""Which way should a 2-D gradient be cut into blocks? (issue 18)

A torch Linear weight is [out, in]: blocks in memory order span `block` input
features of one output unit; blocks of the transposed tensor span `block`
output units of one input feature. Block scaling pays where the values inside
a block are alike in size, so the better direction is the one whose blocks mix
fewer loud and quiet values. This trains the Fashion-MNIST models of `make
demo` (MLP) and `make demo-long` (CNN) in one process with SGD, and the
byte-level transformer of `make demo-lm` with AdamW, and at several steps
quantizes each 2-D weight gradient (conv weights as [out, in*k*k]) with
per-tensor APS, with blocks in memory order and with blocks of the transposed
tensor, and prints the relative error ||q(g) - g|| / ||g|| of each, and the
share of non-zero values flushed to zero.

    PYTHONPATH=worker/python python3 tests/bench/bench_block_layout.py [--format fp4]
"""
import argparse
import pathlib
import sys

import numpy as np
import torch
import torch.nn.functional as F

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "worker" / "examples"))
sys.path.insert(0, str(HERE.parents[1] / "worker" / "python"))
import aps  # noqa: E402
import fashion_mnist  # noqa: E402
import fortunes_corpus  # noqa: E402
from train_fashion_mnist import make_model  # noqa: E402
from train_lm import ByteLM, windows  # noqa: E402


KINDS = ("mlp", "cnn", "lm")


def blocks(x, fmt, block):
    """x quantized and decoded by blocks in its memory order."""
    flat = np.ascontiguousarray(x).ravel()
    codes, exps = aps.quantize_blocks(flat, fmt, block=block)
    return aps.dequantize_blocks(codes, exps, fmt, flat.size, block=block).reshape(x.shape)


def errors(g, fmt, block):
    """(relative error, flushed share) of per-tensor APS, blocks along the rows
    (memory order) and blocks along the columns (of the transposed tensor)."""
    flat = g.ravel()
    k = aps.aps_exponent(flat, fmt, mode="local")
    tensor = aps.dequantize(aps.quantize(flat, fmt, scale_exp=k), fmt, flat.size, scale_exp=k)
    rows = blocks(g, fmt, block).ravel()
    cols = blocks(g.T, fmt, block).T.ravel()
    norm, nonzero = np.linalg.norm(flat), max(np.count_nonzero(flat), 1)
    return [(float(np.linalg.norm(back - flat) / norm),
             float(np.count_nonzero((back == 0) & (flat != 0)) / nonzero))
            for back in (tensor, rows, cols)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--format", default="fp4")
    ap.add_argument("--block", type=int, default=32)
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--every", type=int, default=150)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    x_all, y_all = (torch.from_numpy(a) for a in fashion_mnist.load("train"))
    text = fortunes_corpus.load("train")
    print(f"{args.format}, blocks of {args.block}: relative error (flushed share) of each "
          "2-D weight gradient; MLP and CNN: batch 128, SGD lr 0.05 momentum 0.9; "
          "LM: 64 windows of 64 bytes, AdamW lr 3e-3\n")
    print("| model | step | tensor [out, in] | per-tensor APS | blocks along in (memory "
          "order) | blocks along out (transposed) |")
    print("|---|---:|---|---:|---:|---:|")
    totals = {}
    for kind in KINDS:
        rng = np.random.default_rng(0)
        if kind == "lm":
            model = ByteLM(128, 2, 4, 64)
            opt = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.95))
        else:
            model = make_model(kind, 256)
            opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        for step in range(args.steps + 1):
            opt.zero_grad()
            if kind == "lm":
                x, y = windows(text, rng.integers(0, text.size - 65, 64), 64)
                F.cross_entropy(model(x).reshape(-1, 256), y.reshape(-1)).backward()
            else:
                idx = torch.from_numpy(rng.integers(0, len(y_all), 128))
                F.cross_entropy(model(x_all[idx]), y_all[idx]).backward()
            if step % args.every == 0:
                for name, p in model.named_parameters():
                    if p.dim() < 2:
                        continue
                    g = p.grad.detach().reshape(p.shape[0], -1).numpy()
                    e = errors(g, args.format, args.block)
                    for i, (rel, _) in enumerate(e):
                        totals.setdefault((kind, i), []).append(rel)
                    cells = " | ".join(f"{rel:.4f} ({fl * 100:.1f}%)" for rel, fl in e)
                    print(f"| {kind} | {step} | {name} {list(g.shape)} | {cells} |")
            opt.step()
    print("\nmean relative error over every tensor and step:")
    for kind in KINDS:
        means = [np.mean(totals[(kind, i)]) for i in range(3)]
        print(f"  {kind}: per-tensor {means[0]:.4f}, along in {means[1]:.4f}, "
              f"along out {means[2]:.4f}")


if __name__ == "__main__":
    main()
