#!/usr/bin/python3
"""One worker of data-parallel training on Fashion-MNIST, its gradients
all-reduced through apsd. Run N of them with the launcher:

    PYTHONPATH=worker/python python3 -m aps.launch -n 4 \\
        worker/examples/train_fashion_mnist.py --format e4m3 --scaling local

or on several machines, apsd on host A (`apsd --listen tcp://0.0.0.0:5555`)
and on each worker machine k of 4:

    APS_ENDPOINT=tcp://A:5555 RANK=k WORLD_SIZE=4 python3 train_fashion_mnist.py ...

Every step draws one global batch from a seeded permutation shared by all
ranks and each rank trains on its share, so N workers follow the same path
as one process on the whole batch (exactly so with --format fp32). Rank 0
evaluates on the test set every --eval-every steps, prints progress and, with
--out, writes the run's history as JSON.

Hybrid precision (off by default): --policy auto lets the daemon move tensors
to wider formats and send small ones in fp32, --rules pins formats by name,
--error-feedback carries what quantization lost into the next step. The
client counts bytes in the format it asked for; with --stats (the daemon's
stats socket) rank 0 reports the bytes the daemon received instead, and each
tensor's final format. The printed "gradients flushed" is always measured in
--format.

Optimize mode: --server-optimizer moves SGD (--lr, --momentum) to apsd, which
holds the fp32 weights (aps.torch.ServerOptimizer): gradients go up in
--format, APS-quantized updates come down in the same format.

DiLoCo (aps.torch.DiLoCo, as train_lm.py): --diloco H trains with each
worker's own SGD alone and every H steps sends the mean pseudo-gradient, in
--format, to apsd, whose SGD with Nesterov momentum (--outer-lr) is the outer
step; --fragments P synchronises the parameters in P staggered fragments.
"""

import argparse
import contextlib
import json
import pathlib
import socket
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "python"))
import aps  # noqa: E402
import aps.torch  # noqa: E402
import fashion_mnist  # noqa: E402


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--format", default="e4m3", help="gradient format (fp32, e4m3, e3m0, ...)")
    ap.add_argument("--scaling", default="local", choices=["local", "none", "block"],
                    help="local: APS; none: plain quantization; block: APS per block of 32")
    ap.add_argument("--model", default="mlp", choices=["mlp", "cnn"])
    ap.add_argument("--hidden", type=int, default=256, help="width of the MLP's hidden layers")
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--batch", type=int, default=32, help="examples per worker and step")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--eval-every", type=int, default=50)
    ap.add_argument("--eval-size", type=int, default=10000, help="test images evaluated")
    ap.add_argument("--train-size", type=int, default=60000, help="training images used")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--policy", default="off", choices=["off", "auto"],
                    help="auto: the daemon moves tensors that lose too much to a wider format "
                    "and sends small ones in fp32 (hybrid precision)")
    ap.add_argument("--rules", help="formats by tensor name, first match wins, e.g. "
                    "'grad.4.*=fp32' (a parameter P travels as grad.P)")
    ap.add_argument("--error-feedback", action="store_true",
                    help="carry each tensor's quantization residual into the next step")
    ap.add_argument("--downlink", help="format of results (or, with --server-optimizer, of "
                    "updates): fp32, fp16, bf16; default the uplink format")
    ap.add_argument("--server-optimizer", action="store_true",
                    help="optimize mode: apsd holds the weights and runs SGD with momentum")
    ap.add_argument("--diloco", type=int, default=0, metavar="H",
                    help="DiLoCo: SGD on each worker alone, every H steps the outer "
                    "Nesterov step on apsd (0: all-reduce every step)")
    ap.add_argument("--outer-lr", type=float, default=0.7)
    ap.add_argument("--outer-momentum", type=float, default=0.9,
                    help="DiLoCo: the outer Nesterov momentum (0: plain averaging at lr 1)")
    ap.add_argument("--fragments", type=int, default=1,
                    help="DiLoCo: parameters synchronised in this many staggered fragments")
    ap.add_argument("--stats", help="the daemon's stats socket: rank 0 reads every tensor's "
                    "format, bytes and flushed share there after the last step")
    ap.add_argument("--out", help="rank 0 writes the history here (JSON)")
    ap.add_argument("--label", help="name of the run in the output")
    args = ap.parse_args(argv)
    if args.diloco and args.server_optimizer:
        ap.error("--diloco and --server-optimizer both run the optimizer on apsd: pick one")
    return args


def make_model(kind, hidden):
    """A small network; the same seed gives the same weights on every rank."""
    if kind == "mlp":
        return torch.nn.Sequential(
            torch.nn.Linear(784, hidden), torch.nn.ReLU(),
            torch.nn.Linear(hidden, hidden), torch.nn.ReLU(),
            torch.nn.Linear(hidden, 10))
    return torch.nn.Sequential(
        torch.nn.Unflatten(1, (1, 28, 28)),
        torch.nn.Conv2d(1, 16, 5, padding=2), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(16, 32, 5, padding=2), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Flatten(), torch.nn.Linear(32 * 7 * 7, 128), torch.nn.ReLU(),
        torch.nn.Linear(128, 10))


def accuracy(model, images, labels):
    with torch.no_grad():
        pred = torch.cat([model(x).argmax(1) for x in torch.split(images, 2000)])
    return float((pred == labels).float().mean()) * 100


def flushed_fraction(model, fmt, scaling):
    """Share of this rank's non-zero gradient values that quantizing them (with
    the APS exponent, or without scaling) turns into zeros."""
    flushed = nonzero = 0
    for p in model.parameters():
        g = p.grad.detach().numpy().ravel()
        stats = {}
        if scaling == "block":
            aps.quantize_blocks(g, fmt, stats=stats)
        else:
            aps.quantize(g, fmt, scale_exp=aps.aps_exponent(g, fmt, mode=scaling), stats=stats)
        flushed += stats["flushed"]
        nonzero += int(np.count_nonzero(g))
    return flushed / max(nonzero, 1)


def daemon_tensors(path, job):
    """The daemon's report of job's tensors (format, policy and reason, bytes
    received from all ranks, flushed share, error), from its stats socket."""
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(10)
        s.connect(path)
        s.sendall(b"tensors\n")
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    keep = ("name", "count", "format", "policy_format", "reason", "format_switches",
            "flushed_fraction", "rel_error", "bytes_in", "steps")
    return [{k: t[k] for k in keep} for t in json.loads(data)["tensors"] if t["job"] == job]


class Batches:
    """This rank's share of each global batch of a seeded shuffle, epoch after epoch."""

    def __init__(self, images, labels, per_rank, rank, world, seed):
        self.images, self.labels = images, labels
        self.per_rank, self.rank, self.world = per_rank, rank, world
        self.rng = np.random.default_rng(seed)
        self.order, self.pos = self.rng.permutation(len(labels)), 0

    def next(self):
        size = self.per_rank * self.world
        if self.pos + size > len(self.order):
            self.order, self.pos = self.rng.permutation(len(self.labels)), 0
        idx = self.order[self.pos + self.rank * self.per_rank:][:self.per_rank]
        self.pos += size
        return self.images[idx], self.labels[idx]


def no_sync(opt):
    """A backward pass whose gradients stay local: ServerOptimizer sends only in step()."""
    return opt.no_sync() if hasattr(opt, "no_sync") else contextlib.nullcontext()


def train(args, client):
    torch.manual_seed(args.seed)
    model = make_model(args.model, args.hidden)
    outer = None
    if args.server_optimizer:
        opt = aps.torch.ServerOptimizer(model, client, "sgd", lr=args.lr,
                                        momentum=args.momentum)
    elif args.diloco:  # the inner optimizer alone; the outer step every H steps
        opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
        outer = aps.torch.DiLoCo(model, opt, client, sync_every=args.diloco,
                                 outer_lr=args.outer_lr, outer_momentum=args.outer_momentum,
                                 nesterov=args.outer_momentum > 0,
                                 fragments=args.fragments)
    else:
        sgd = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
        opt = aps.torch.DistributedOptimizer(sgd, client,
                                             named_parameters=model.named_parameters())
    train_x, train_y = (torch.from_numpy(a[:args.train_size]) for a in fashion_mnist.load("train"))
    test_x, test_y = (torch.from_numpy(a[:args.eval_size]) for a in fashion_mnist.load("test"))
    batches = Batches(train_x, train_y, args.batch, client.rank, client.world_size, args.seed)
    history, flushed, label = [], [], args.label or f"{args.format} {args.scaling}"
    client.barrier()
    start = time.monotonic()
    for step in range(args.steps + 1):
        if step % args.eval_every == 0 or step == args.steps:
            if client.rank == 0:
                history.append((step, accuracy(model, test_x, test_y)))
            if step == args.steps:
                break
        x, y = batches.next()
        if step % args.eval_every == 0:
            with no_sync(opt):  # look at this rank's gradients before they travel
                F.cross_entropy(model(x), y).backward()
            flushed.append(flushed_fraction(model, args.format, args.scaling))
            opt.zero_grad()
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        if outer is not None:
            outer.step()
        if client.rank == 0 and step % args.eval_every == 0:
            print(f"{label}: step {step:5d}/{args.steps}  loss {loss.item():6.3f}  test acc "
                  f"{history[-1][1]:5.1f}%  gradients flushed {flushed[-1] * 100:5.1f}%",
                  flush=True)
    wall = time.monotonic() - start
    result = {"label": label, "format": args.format, "scaling": args.scaling,
              "diloco": args.diloco, "fragments": args.fragments,
              "bytes_total": client.bytes_pushed, "policy": args.policy, "rules": args.rules,
              "error_feedback": args.error_feedback,
              "world_size": client.world_size, "steps": args.steps, "wall_s": wall,
              "history": history, "accuracy": history[-1][1] if history else None,
              "bytes_per_step": client.bytes_pushed / max(args.steps, 1),
              "flushed": float(np.mean(flushed)) if flushed else None,
              "skipped_steps": getattr(opt, "skipped_steps", 0),
              "server_optimizer": args.server_optimizer}
    if args.stats and client.rank == 0:
        add_daemon_bytes(result, args.stats, client, args.steps)
    return result


def add_daemon_bytes(result, stats, client, steps):
    """Rank 0 at the end of a run: the daemon's tensors into result, and as its
    bytes_per_step what the daemon received, in each tensor's actual formats
    (block exponents included), per worker and step; every rank has pushed
    every step once rank 0 holds the last results."""
    tensors = daemon_tensors(stats, client.job)
    result["tensors"] = tensors
    result["client_bytes_per_step"] = result["bytes_per_step"]
    result["bytes_per_step"] = sum(t["bytes_in"] for t in tensors) / (
        client.world_size * max(steps, 1))


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(1)
    if args.diloco:
        spec = aps.torch.optimizer_spec("sgd", momentum=args.outer_momentum,
                                           nesterov=args.outer_momentum > 0)
    elif args.server_optimizer:
        spec = aps.torch.optimizer_spec("sgd", momentum=args.momentum)
    else:
        spec = None
    with aps.Client.from_env(format=args.format, scaling=args.scaling,
                             policy="auto" if args.policy == "auto" else None, rules=args.rules,
                             error_feedback=args.error_feedback, downlink=args.downlink,
                             optimizer=spec) as client:
        result = train(args, client)
    if client.rank == 0:
        print(f"{result['label']}: test accuracy {result['accuracy']:.1f}% after "
              f"{args.steps} steps in {result['wall_s']:.1f} s", flush=True)
        if args.out:
            pathlib.Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
