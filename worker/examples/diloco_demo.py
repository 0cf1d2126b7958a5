#!/usr/bin/python3
"""DiLoCo against syncing every step (issue 19): apsd and 4 workers train the
byte-level transformer of train_lm.py (--workload lm, AdamW, 400 steps) or the
CNN of `make demo-long` (--workload cnn, SGD with momentum, 2000 steps), over
--seeds seeds: every step in fp32 and in e4m3 with APS, then DiLoCo (the
inner optimizer alone on each worker, every H steps the mean pseudo-gradient
to apsd's outer SGD step, by default plain averaging: --outer-lr 1, no
momentum) at H = 10 and H = 50, the pseudo-gradients in fp32,
e4m3 with APS and fp4 with block scaling. Prints a table (final held-out loss
or test accuracy, mean and spread, against every-step fp32; bytes each worker
sent over the whole run as the daemon received them; how many times fewer
than every-step fp32; wall time) and writes a plot of the curves and the
JSON of every run. A run that fails (a diverged DiLoCo run stops when a
worker's weights hold NaN: apsd's client refuses to send them) is recorded
as failed, counted in its row, and the others go on.

    make demo-diloco              (both workloads)
    PYTHONPATH=worker/python python3 worker/examples/diloco_demo.py --workload cnn
"""

import argparse
import json
import pathlib
import shutil
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "python"))
sys.path.insert(0, str(HERE))
from aps import daemon  # noqa: E402
from fashion_mnist_demo import PRESETS, run_one  # noqa: E402

# (label, format, scaling, H): H = 0 is an all-reduce every step
RUNS = [("every step fp32", "fp32", "none", 0), ("every step e4m3 APS", "e4m3", "local", 0)]
RUNS += [(f"DiLoCo H={h} {name}", fmt, scaling, h) for h in (10, 50)
         for name, fmt, scaling in (("fp32", "fp32", "none"), ("e4m3 APS", "e4m3", "local"),
                                    ("fp4 block", "fp4", "block"))]
BASE = RUNS[0][0]
# workload: (script, options before the run's own, default steps, result key, name, unit)
WORKLOADS = {
    "lm": ("train_lm.py", [], 400, "test_loss", "held-out loss, nats/byte", "%"),
    "cnn": ("train_fashion_mnist.py", PRESETS["long"], None, "accuracy", "test accuracy %",
            "points"),
}


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workload", choices=sorted(WORKLOADS), default="lm")
    ap.add_argument("-n", "--workers", type=int, default=4)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--steps", type=int,
                    help="steps per run (default: lm 400, cnn 2000 as `make demo-long`)")
    # Plain averaging: at H = 10 and 50 on both workloads it beat the paper's 0.7 with
    # Nesterov 0.9 (docs/RESULTS.md, "The outer step"); --outer-lr 0.7 --outer-momentum 0.9
    # runs the paper's.
    ap.add_argument("--outer-lr", type=float, default=1.0)
    ap.add_argument("--outer-momentum", type=float, default=0.0,
                    help="the outer step's Nesterov momentum (0: none)")
    ap.add_argument("--out-dir", default="build/demo")
    ap.add_argument("--replot", metavar="JSON",
                    help="run nothing: the table and the plot of a diloco_WORKLOAD.json "
                    "written before (by a run cut short too)")
    ap.add_argument("--only", action="append", default=[], metavar="LABEL",
                    help="run only these rows (repeat; the table needs "
                    f"{BASE!r} for its comparisons: --replot a merged JSON)")
    ap.add_argument("train_args", nargs="*", help="more options for the training script, "
                    "after --")
    return ap.parse_args(argv)


def labels(results):
    """The rows present, in the order of RUNS (then any others)."""
    seen = dict.fromkeys(r["label"] for r in results)
    return [r[0] for r in RUNS if r[0] in seen] + [x for x in seen if x not in dict(
        (r[0], 0) for r in RUNS)]


def preset(args):
    """The workload's options with --steps set."""
    _, opts, default, *_ = WORKLOADS[args.workload]
    opts = list(opts)
    if "--steps" in opts:
        i = opts.index("--steps") + 1
        opts[i] = str(args.steps or opts[i])
    else:
        opts += ["--steps", str(args.steps or default)]
    return opts


def table(results, workload):
    _, _, _, key, name, unit = WORKLOADS[workload]
    done = [r for r in results if not r.get("failed")]
    base = [r for r in done if r["label"] == BASE]
    metric0 = sum(r[key] for r in base) / len(base) if base else None
    bytes0 = sum(r["bytes_per_step"] * r["steps"] for r in base) / len(base) if base else None
    lines = [f"| run (seeds) | {name} (mean) | min - max | vs every-step fp32 ({unit}) "
             "| bytes per worker, whole run | x fewer bytes | s per run |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for label in labels(results):
        rs = [r for r in done if r["label"] == label]
        failed = sum(1 for r in results if r["label"] == label and r.get("failed"))
        seeds = f"{len(rs)}" + (f", {failed} failed" if failed else "")
        if not rs:
            lines.append(f"| {label} ({seeds}) | failed | - | - | - | - | - |")
            continue
        vals = [r[key] for r in rs]
        mean = sum(vals) / len(vals)
        nbytes = sum(r["bytes_per_step"] * r["steps"] for r in rs) / len(rs)
        wall = sum(r["wall_s"] for r in rs) / len(rs)
        if metric0 is None:
            delta = "-"
        elif workload == "lm":
            delta = f"{100 * (mean / metric0 - 1):+.2f}%"
        else:
            delta = f"{mean - metric0:+.2f}"
        if workload == "lm":
            cells = (f"{mean:.4f}", f"{min(vals):.4f} - {max(vals):.4f}", delta)
        else:
            cells = (f"{mean:.2f}", f"{min(vals):.1f} - {max(vals):.1f}", delta)
        fewer = f"{bytes0 / nbytes:.1f}" if bytes0 else "-"
        lines.append(f"| {label} ({seeds}) | {' | '.join(cells)} | {nbytes:,.0f} "
                     f"| {fewer} | {wall:.0f} |")
    return lines


def plot(results, workload, path, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    _, _, _, _, name, _ = WORKLOADS[workload]
    colours = {"fp32": "C0", "e4m3": "C1", "fp4": "C2"}
    styles = {0: "-", 10: "--", 50: ":"}
    results = [r for r in results if not r.get("failed")]
    fig, ax = plt.subplots(figsize=(8, 5))
    for label in labels(results):
        rs = [r for r in results if r["label"] == label]
        steps = [s for s, _ in rs[0]["history"]]
        mean = [sum(r["history"][i][1] for r in rs) / len(rs) for i in range(len(steps))]
        ax.plot(steps, mean, label=label, color=colours.get(rs[0]["format"]),
                linestyle=styles.get(rs[0].get("diloco") or 0, "-."))
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("step")
    ax.set_ylabel(f"{name} (mean over seeds)")
    if workload == "lm":
        ax.set_ylim(top=3.5)
    else:
        ax.set_ylim(bottom=max(0, min(r["accuracy"] for r in results) - 15), top=95)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def report(results, args, out_dir, path):
    plot_path = out_dir / f"diloco_{args.workload}.png"
    what = ("byte-level transformer, AdamW" if args.workload == "lm"
            else "Fashion-MNIST CNN, SGD with momentum")
    print("\n" + "\n".join(table(results, args.workload)))
    done = [r for r in results if not r.get("failed")]
    if not done:
        sys.exit(f"demo: every run failed (see above); results: {path}")
    plot(done, args.workload, plot_path, f"DiLoCo: {what}, {args.workers} workers through "
         f"apsd, {done[0]['steps']} steps")
    print(f"\nplot: {plot_path}  results: {path}")


def main(argv=None):
    args = parse_args(argv)
    out_dir = pathlib.Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if args.replot:
        return report(json.loads(pathlib.Path(args.replot).read_text()), args, out_dir,
                      args.replot)
    script = HERE / WORKLOADS[args.workload][0]
    runs = [r for r in RUNS if not args.only or r[0] in args.only]
    opts = preset(args)
    sockets = pathlib.Path(tempfile.mkdtemp(prefix="apsd-diloco-"))
    stats = sockets / "stats.sock"
    apsd = daemon.LocalDaemon(extra_args=["--stats", str(stats)]).start()
    results = []
    path = out_dir / f"diloco_{args.workload}.json"
    print(f"demo: DiLoCo, {args.workload}, {args.workers} workers: {' '.join(opts)}", flush=True)
    try:
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            for label, fmt, scaling, h in runs:
                print(f"\n== {label}, seed {seed}", flush=True)
                diloco = ["--diloco", str(h), "--outer-lr", str(args.outer_lr),
                          "--outer-momentum", str(args.outer_momentum)] if h else []
                slug = label.replace(" ", "-").replace("=", "")
                try:
                    r = run_one(label, fmt, scaling, args, apsd.endpoint, out_dir, opts,
                                f"diloco-{args.workload}-{slug}-{seed}",
                                [*diloco, "--seed", str(seed), "--stats", str(stats)],
                                script=script)
                except SystemExit as e:  # recorded; the other runs go on
                    print(f"demo: {label}, seed {seed}: {e}: recorded as failed", flush=True)
                    r = {"label": label, "format": fmt, "scaling": scaling, "diloco": h,
                         "failed": str(e)}
                r["seed"] = seed
                results.append(r)
                path.write_text(json.dumps(results, indent=1))  # what is done so far
    finally:
        apsd.stop()
        shutil.rmtree(sockets, ignore_errors=True)
    report(results, args, out_dir, path)


if __name__ == "__main__":
    main()
