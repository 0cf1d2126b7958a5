#!/usr/bin/python3
"""One worker of data-parallel training of a small byte-level language model
(a decoder-only transformer) with AdamW, its gradients all-reduced through
apsd. Run N of them with the launcher:

    PYTHONPATH=worker/python python3 -m aps.launch -n 4 \\
        worker/examples/train_lm.py --format fp4 --scaling block

The corpus is Debian's `fortunes` (fortunes_corpus.py): every tenth fortune is
held out. Each step draws one global batch of windows from a seeded stream
shared by all ranks and each rank trains on its share, so N workers follow
the path of one process on the whole batch (exactly so in fp32). Rank 0
measures the held-out loss (nats per byte, over fixed windows of the test
split) every --eval-every steps, prints progress and, with --out, writes the
run's history as JSON. --policy auto, --error-feedback and --stats as in
train_fashion_mnist.py. --gloo tcp://HOST:PORT trains without apsd, for
comparison: every step's gradients all-reduced in fp32 through
torch.distributed's gloo, in one flat bucket (DDP's 25 MiB bucket holds the
whole model).
"""

import argparse
import json
import math
import pathlib
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "python"))
import aps  # noqa: E402
import aps.torch  # noqa: E402
import fortunes_corpus  # noqa: E402
from aps._env import rank_and_world  # noqa: E402
from train_fashion_mnist import add_daemon_bytes  # noqa: E402


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--format", default="e4m3", help="gradient format (fp32, e4m3, fp4, ...)")
    ap.add_argument("--scaling", default="local", choices=["local", "none", "block"],
                    help="local: APS per tensor; block: APS per block of 32; none")
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--batch", type=int, default=16, help="windows per worker and step")
    ap.add_argument("--context", type=int, default=64, help="bytes per window")
    ap.add_argument("--width", type=int, default=128, help="model width")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=50, help="steps of linear warm-up")
    ap.add_argument("--weight-decay", type=float, default=0.01)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--eval-every", type=int, default=50)
    ap.add_argument("--eval-windows", type=int, default=256)
    ap.add_argument("--diloco", type=int, default=0, metavar="H",
                    help="DiLoCo: AdamW on each worker alone, every H steps the outer "
                    "Nesterov step on apsd (0: all-reduce every step)")
    ap.add_argument("--outer-lr", type=float, default=0.7)
    ap.add_argument("--outer-momentum", type=float, default=0.9,
                    help="DiLoCo: the outer Nesterov momentum (0: plain averaging at lr 1)")
    ap.add_argument("--fragments", type=int, default=1,
                    help="DiLoCo: parameters synchronised in this many staggered fragments")
    ap.add_argument("--overlap", type=int, default=0, metavar="T",
                    help="DiLoCo: inner steps that run while a sync is in flight")
    ap.add_argument("--mix", type=float, default=0.5,
                    help="DiLoCo with --overlap: weight of the local parameters at a merge")
    ap.add_argument("--gloo", metavar="tcp://HOST:PORT",
                    help="no apsd: fp32 gradients all-reduced by torch.distributed's gloo")
    ap.add_argument("--policy", default="off", choices=["off", "auto"])
    ap.add_argument("--error-feedback", action="store_true")
    ap.add_argument("--stats", help="the daemon's stats socket: report the bytes it received")
    ap.add_argument("--label", help="name of the run in the output")
    ap.add_argument("--out", help="write the run's history here (JSON, rank 0)")
    return ap.parse_args(argv)


class Block(torch.nn.Module):
    """Pre-norm transformer block: causal self-attention, then an MLP."""

    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = torch.nn.LayerNorm(width), torch.nn.LayerNorm(width)
        self.qkv = torch.nn.Linear(width, 3 * width)
        self.proj = torch.nn.Linear(width, width)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(width, 4 * width), torch.nn.GELU(),
                                       torch.nn.Linear(4 * width, width))

    def forward(self, x, mask):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(c // self.heads)
        att = att.masked_fill(mask[:t, :t], float("-inf")).softmax(-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, t, c))
        return x + self.mlp(self.ln2(x))


class ByteLM(torch.nn.Module):
    """Bytes in, the next byte's logits out."""

    def __init__(self, width, layers, heads, context):
        super().__init__()
        self.tok = torch.nn.Embedding(256, width)
        self.pos = torch.nn.Parameter(torch.zeros(context, width))
        self.blocks = torch.nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.ln = torch.nn.LayerNorm(width)
        self.head = torch.nn.Linear(width, 256)
        self.register_buffer("mask", torch.ones(context, context).triu(1).bool())
        torch.nn.init.normal_(self.pos, std=0.02)

    def forward(self, idx):
        x = self.tok(idx) + self.pos[:idx.shape[1]]
        for b in self.blocks:
            x = b(x, self.mask)
        return self.head(self.ln(x))


def windows(data, starts, context):
    """Inputs and next-byte targets of the windows starting at starts."""
    idx = starts[:, None] + np.arange(context + 1)[None, :]
    w = torch.from_numpy(data[idx].astype(np.int64))
    return w[:, :-1], w[:, 1:]


def held_out_loss(model, test, context, n):
    """Mean next-byte loss (nats) over n windows spread evenly over the test split."""
    starts = np.linspace(0, test.size - context - 2, n).astype(np.int64)
    with torch.no_grad():
        total = 0.0
        for part in np.array_split(starts, max(1, n // 64)):
            x, y = windows(test, part, context)
            total += F.cross_entropy(model(x).reshape(-1, 256), y.reshape(-1),
                                     reduction="sum").item()
    return total / (n * context)


class Gloo:
    """torch.distributed's gloo where apsd would be: rank and world from the same
    environment, and every step's gradients averaged in one flat fp32 bucket."""

    def __init__(self, init_method):
        import torch.distributed as dist
        self.dist = dist
        self.rank, self.world_size = rank_and_world()
        dist.init_process_group("gloo", init_method=init_method, rank=self.rank,
                                world_size=self.world_size)
        self.bytes_pushed = 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.dist.destroy_process_group()

    def barrier(self):
        self.dist.barrier()

    def average(self, params):
        grads = [p.grad for p in params if p.grad is not None]
        flat = torch.cat([g.reshape(-1) for g in grads])
        self.dist.all_reduce(flat)
        flat /= self.world_size
        offset = 0
        for g in grads:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()
        self.bytes_pushed += flat.numel() * 4


def train(args, client):
    torch.manual_seed(args.seed)
    model = ByteLM(args.width, args.layers, args.heads, args.context)
    adamw = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95),
                              weight_decay=args.weight_decay)
    if args.gloo:
        opt, outer = adamw, None
    elif args.diloco:  # the inner optimizer alone; the outer step every H steps
        opt, outer = adamw, aps.torch.DiLoCo(
            model, adamw, client, sync_every=args.diloco, outer_lr=args.outer_lr,
            outer_momentum=args.outer_momentum,
            nesterov=args.outer_momentum > 0, fragments=args.fragments,
            overlap=args.overlap, mix=args.mix)
    else:
        opt, outer = aps.torch.DistributedOptimizer(
            adamw, client, named_parameters=model.named_parameters()), None
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / args.warmup)
                                             * 0.5 * (1 + math.cos(math.pi * s / args.steps)))
    train_bytes, test_bytes = fortunes_corpus.load("train"), fortunes_corpus.load("test")
    rng = np.random.default_rng(args.seed)  # the same stream on every rank
    label = args.label or ("gloo fp32" if args.gloo else f"{args.format} {args.scaling}")
    history = []
    client.barrier()
    start = time.monotonic()
    for step in range(args.steps + 1):
        if step == args.steps and outer is not None:
            outer.finish()  # the syncs still in flight land before the last measure
        if client.rank == 0 and (step % args.eval_every == 0 or step == args.steps):
            history.append((step, held_out_loss(model, test_bytes, args.context,
                                                args.eval_windows)))
            print(f"{label}: step {step:5d}/{args.steps}  held-out loss {history[-1][1]:.4f} "
                  f"nats/byte", flush=True)
        if step == args.steps:
            break
        starts = rng.integers(0, train_bytes.size - args.context - 1,
                              args.batch * client.world_size)
        x, y = windows(train_bytes, starts[client.rank * args.batch:][:args.batch],
                       args.context)
        opt.zero_grad()
        F.cross_entropy(model(x).reshape(-1, 256), y.reshape(-1)).backward()
        if args.gloo:
            client.average(list(model.parameters()))
        opt.step()
        if outer is not None:
            outer.step()
        sched.step()
    wall = time.monotonic() - start
    result = {"label": label, "format": "fp32" if args.gloo else args.format,
              "scaling": "none" if args.gloo else args.scaling, "gloo": bool(args.gloo),
              "diloco": args.diloco, "fragments": args.fragments, "overlap": args.overlap,
              "bytes_total": client.bytes_pushed,
              "policy": args.policy, "error_feedback": args.error_feedback, "seed": args.seed,
              "world_size": client.world_size, "steps": args.steps, "wall_s": wall,
              "parameters": sum(p.numel() for p in model.parameters()),
              "history": history, "test_loss": history[-1][1] if history else None,
              "bytes_per_step": client.bytes_pushed / max(args.steps, 1)}
    if args.stats and client.rank == 0:
        add_daemon_bytes(result, args.stats, client, args.steps)
    return result


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(1)
    spec = aps.torch.optimizer_spec("sgd", momentum=args.outer_momentum,
                                    nesterov=args.outer_momentum > 0) if args.diloco else None
    comm = Gloo(args.gloo) if args.gloo else aps.Client.from_env(
        format=args.format, scaling=args.scaling,
        policy="auto" if args.policy == "auto" else None,
        error_feedback=args.error_feedback, optimizer=spec)
    with comm as client:
        result = train(args, client)
    if client.rank == 0:
        print(f"{result['label']}: held-out loss {result['test_loss']:.4f} nats/byte after "
              f"{args.steps} steps in {result['wall_s']:.1f} s", flush=True)
        if args.out:
            pathlib.Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
