#!/usr/bin/python3
"""What APS buys, on a real dataset: apsd and 4 workers train the same network
on Fashion-MNIST five times, the gradients travelling as fp32, e4m3 and e3m0,
the low-precision formats without scaling and with APS. Prints progress, then
a table (test accuracy, gradient bytes each worker sends per step, wall
time), and writes a plot of test accuracy against step.

    make demo                     (about 2 minutes: an MLP, 1200 steps)
    make demo-long                (about 10 minutes: a CNN, 2000 steps)
    PYTHONPATH=worker/python python3 worker/examples/fashion_mnist_demo.py --help

Each run is `python3 -m aps.launch -n 4 train_fashion_mnist.py ...` against one
apsd started here (or the one at --endpoint).
"""

import argparse
import json
import os
import pathlib
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "python"))
from aps import daemon  # noqa: E402

RUNS = [("fp32", "fp32", "none"), ("e4m3 none", "e4m3", "none"),
        ("e4m3 APS", "e4m3", "local"), ("e3m0 none", "e3m0", "none"),
        ("e3m0 APS", "e3m0", "local")]
PRESETS = {
    "default": ["--model", "mlp", "--steps", "1200", "--eval-every", "50"],
    "long": ["--model", "cnn", "--steps", "2000", "--eval-every", "100"],
}


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--long", action="store_true", help="the longer, more faithful version")
    ap.add_argument("-n", "--workers", type=int, default=4)
    ap.add_argument("--endpoint", help="use the apsd at this endpoint instead of starting one")
    ap.add_argument("--out-dir", default="build/demo", help="where results and the plot go")
    ap.add_argument("--plot", help="path of the PNG (default OUT_DIR/fashion_mnist[_long].png)")
    ap.add_argument("train_args", nargs="*",
                    help="more options for train_fashion_mnist.py (after --)")
    return ap.parse_args(argv)


def run_one(label, fmt, scaling, args, endpoint, out_dir, preset):
    """One training run through aps.launch; returns rank 0's results."""
    out = out_dir / f"{fmt}-{scaling}.json"
    out.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "aps.launch", "-n", str(args.workers), "--endpoint", endpoint,
           "--no-daemon", "--job", f"demo-{fmt}-{scaling}", str(HERE / "train_fashion_mnist.py"),
           "--format", fmt, "--scaling", scaling, "--label", label, "--out", str(out),
           *preset, *args.train_args]
    env = dict(os.environ, PYTHONPATH=str(HERE.parent / "python"))
    start = time.monotonic()
    status = subprocess.run(cmd, env=env).returncode
    if status != 0:
        raise SystemExit(f"demo: run '{label}' failed with status {status}")
    result = json.loads(out.read_text())
    result["total_s"] = time.monotonic() - start
    return result


def table(results):
    """The closing table as lines of text."""
    fp32_bytes = next((r["bytes_per_step"] for r in results if r["format"] == "fp32"), None)
    lines = ["| run | test accuracy % | gradient values flushed | bytes sent per step "
             "| vs fp32 | wall time s |", "|---|---:|---:|---:|---:|---:|"]
    for r in results:
        ratio = f"{fp32_bytes / r['bytes_per_step']:.1f}x less" if fp32_bytes else "-"
        if r["format"] == "fp32":
            ratio = "1x"
        lines.append(f"| {r['label']} | {r['accuracy']:.1f} | {r['flushed'] * 100:.1f}% "
                     f"| {r['bytes_per_step']:,.0f} | {ratio} | {r['wall_s']:.1f} |")
    return lines


def plot(results, path, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=100)
    for r in results:
        steps, acc = zip(*r["history"])
        ax.plot(steps, acc, label=f"{r['label']} ({r['accuracy']:.1f}%)",
                linestyle="--" if "none" in r["label"] else "-")
    ax.set_xlabel("step")
    ax.set_ylabel("test accuracy %")
    ax.set_ylim(0, 100)
    ax.grid(alpha=0.3)
    ax.set_title(title, fontsize=10)
    ax.legend(loc="lower right", fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv=None):
    args = parse_args(argv)
    preset_name = "long" if args.long else "default"
    out_dir = pathlib.Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    plot_path = pathlib.Path(args.plot or out_dir / f"fashion_mnist{'_long' if args.long else ''}.png")
    apsd = None if args.endpoint else daemon.LocalDaemon().start()
    endpoint = args.endpoint or apsd.endpoint
    print(f"demo: apsd at {endpoint}, {args.workers} workers, preset {preset_name}: "
          f"{' '.join(PRESETS[preset_name] + args.train_args)}", flush=True)
    results = []
    try:
        for label, fmt, scaling in RUNS:
            print(f"\n== {label}", flush=True)
            results.append(run_one(label, fmt, scaling, args, endpoint, out_dir,
                                   PRESETS[preset_name]))
    finally:
        if apsd is not None:
            apsd.stop()
    (out_dir / f"results_{preset_name}.json").write_text(json.dumps(results, indent=1))
    title = (f"Fashion-MNIST, {args.workers} workers through apsd, "
             f"{PRESETS[preset_name][1].upper()}, {results[0]['steps']} steps")
    plot(results, plot_path, title)
    print("\n" + "\n".join(table(results)))
    print(f"\nplot: {plot_path}  results: {out_dir / f'results_{preset_name}.json'}")


if __name__ == "__main__":
    main()
