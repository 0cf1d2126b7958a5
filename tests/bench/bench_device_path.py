#!/usr/bin/python3
"""One all-reduce step of ResNet-50's gradients through a real apsd, by the
two ways aps.torch has: the host path (HostStage: every gradient to host
memory as fp32, the C client scans and codes it, the fp32 mean back) and the
device path (DeviceStage: the torch codec codes it where it lives, only codes
cross to host memory and back, decoded there). Side by side in one run:

- bytes that cross between the tensor's device and host memory per step, each
  way (on a GPU: PCIe traffic; the host path's are fp32, 4 bytes an element);
- wall time per step (median), with the caller's CPU time;
- the results of both paths compared bit for bit.

On a CPU-only machine the tensors are CPU tensors: the bytes are what a GPU
would move, and the device path's time is the torch codec on the CPU (slower
than libaps's vector codec: it exists for the GPU).

    PYTHONPATH=worker/python /usr/bin/python3 tests/bench/bench_device_path.py \
        [--device cuda] [--format e4m3] [--scaling local|none|block] [--steps 5]
"""

import argparse
import pathlib
import statistics
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "worker" / "python"))
sys.path.insert(0, str(HERE))

import torch  # noqa: E402

import aps  # noqa: E402
import aps.daemon  # noqa: E402
from aps._device_codes import DeviceStage, codes_call  # noqa: E402
from aps._staging import HostStage  # noqa: E402
from resnet50_shapes import resnet50_parameters  # noqa: E402


def gradients(device):
    g = torch.Generator().manual_seed(0)
    return [(name, (torch.randn(shape, generator=g) * 1e-3).to(device))
            for name, shape in reversed(resnet50_parameters())]


def host_step(client, grads, stages):
    items = [(name, stages[name].load(t)) for name, t in grads]
    client.allreduce_many_async(items).wait()
    for name, _ in grads:
        stages[name].store()
    moved = sum(4 * t.numel() for _, t in grads)
    return moved, moved


def device_step(client, grads, stages):
    layouts = client.codes_layouts([(name, t.numel()) for name, t in grads])
    codes_call(client, grads, layouts, [stages[name] for name, _ in grads], False).wait()
    for name, _ in grads:
        stages[name].store()
    return sum(s.bytes for s, _ in layouts), sum(r.bytes for _, r in layouts)


def run(client, grads, step, stages, steps, sync):
    walls, cpus = [], []
    for _ in range(steps + 1):  # the first registers the tensors: not timed
        work = [(name, t.clone()) for name, t in grads]
        sync()
        w0, c0 = time.perf_counter(), time.process_time()
        down, up = step(client, work, stages)
        sync()
        walls.append(time.perf_counter() - w0)
        cpus.append(time.process_time() - c0)
    return statistics.median(walls[1:]), statistics.median(cpus[1:]), down, up, work


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--format", default="e4m3")
    ap.add_argument("--scaling", default="local", choices=["local", "none", "block"])
    ap.add_argument("--steps", type=int, default=5)
    args = ap.parse_args()
    device = torch.device(args.device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    grads = gradients(device)
    n = sum(t.numel() for _, t in grads)
    print(f"ResNet-50: {len(grads)} tensors, {n} elements, {args.format} scaling "
          f"{args.scaling}, on {device}, one worker, median of {args.steps} steps")
    rows, results = [], {}
    with aps.daemon.LocalDaemon() as d:
        for label, step, stage in [("host path (fp32 staging)", host_step, HostStage),
                                   ("device path (codes only)", device_step, DeviceStage)]:
            with aps.Client(d.endpoint, 0, 1, format=args.format, scaling=args.scaling,
                            job=label.split()[0]) as c:
                stages = {name: stage() for name, _ in grads}
                wall, cpu, down, up, work = run(c, grads, step, stages, args.steps, sync)
                results[label] = work
                rows.append((label, down, up, wall, cpu))
    print(f"{'path':28} {'to host MB':>11} {'back MB':>9} {'step ms':>8} {'CPU ms':>8}")
    for label, down, up, wall, cpu in rows:
        print(f"{label:28} {down / 1e6:11.1f} {up / 1e6:9.1f} {wall * 1e3:8.1f} {cpu * 1e3:8.1f}")
    (_, d0, u0, _, _), (_, d1, u1, _, _) = rows
    print(f"bytes across: {(d0 + u0) / (d1 + u1):.2f}x fewer on the device path")
    host, dev = results.values()
    same = all(torch.equal(a.view(torch.int32), b.view(torch.int32))
               for (_, a), (_, b) in zip(host, dev))
    print(f"results bit-identical: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
