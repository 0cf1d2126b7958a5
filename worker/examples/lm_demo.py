#!/usr/bin/python3
"""A transformer beside Fashion-MNIST (issue 18): apsd and 4 workers train the
byte-level language model of train_lm.py with AdamW on Debian's fortunes,
the gradients travelling as fp32, e4m3 with APS, fp4 with per-tensor APS, fp4
with block scaling, and e3m0 with APS and the automatic policy, each over
--seeds seeds. Prints a table (final held-out loss, mean and spread, against
fp32; bytes per step as the daemon received them, block exponents included;
wall time) and writes a plot of the held-out loss curves.

    make demo-lm                  (about 15 minutes on 2 cores)
    PYTHONPATH=worker/python python3 worker/examples/lm_demo.py --help
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
from fashion_mnist_demo import run_one  # noqa: E402

# (label, format, scaling, train_lm.py options)
RUNS = [("fp32", "fp32", "none", []), ("e4m3 APS", "e4m3", "local", []),
        ("fp4 APS", "fp4", "local", []), ("fp4 block", "fp4", "block", []),
        ("e3m0 APS auto", "e3m0", "local", ["--policy", "auto"])]


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-n", "--workers", type=int, default=4)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--out-dir", default="build/demo")
    ap.add_argument("--only", action="append", default=[], metavar="LABEL",
                    help="run only these rows (repeat; fp32 is always run)")
    ap.add_argument("train_args", nargs="*", help="more train_lm.py options, after --")
    return ap.parse_args(argv)


def table(results):
    base = [r for r in results if r["format"] == "fp32"]
    loss0 = sum(r["test_loss"] for r in base) / len(base)
    bytes0 = sum(r["bytes_per_step"] for r in base) / len(base)
    lines = ["| run (seeds) | held-out loss, nats/byte (mean) | min - max | vs fp32 "
             "| bytes per step | % of fp32 bytes | s per run |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for label in dict.fromkeys(r["label"] for r in results):
        rs = [r for r in results if r["label"] == label]
        loss = [r["test_loss"] for r in rs]
        mean = sum(loss) / len(loss)
        nbytes = sum(r["bytes_per_step"] for r in rs) / len(rs)
        wall = sum(r["wall_s"] for r in rs) / len(rs)
        lines.append(f"| {label} ({len(rs)}) | {mean:.4f} | {min(loss):.4f} - {max(loss):.4f} "
                     f"| {100 * (mean / loss0 - 1):+.2f}% | {nbytes:,.0f} "
                     f"| {100 * nbytes / bytes0:.1f} | {wall:.0f} |")
    return lines


def plot(results, path, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 5))
    for label in dict.fromkeys(r["label"] for r in results):
        rs = [r for r in results if r["label"] == label]
        steps = [s for s, _ in rs[0]["history"]]
        mean = [sum(r["history"][i][1] for r in rs) / len(rs) for i in range(len(steps))]
        ax.plot(steps, mean, label=label)
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("step")
    ax.set_ylabel("held-out loss, nats per byte (mean over seeds)")
    ax.set_ylim(top=3.5)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv=None):
    args = parse_args(argv)
    out_dir = pathlib.Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    runs = [r for r in RUNS if not args.only or r[0] in args.only or r[1] == "fp32"]
    sockets = pathlib.Path(tempfile.mkdtemp(prefix="apsd-lm-"))
    stats = sockets / "stats.sock"
    apsd = daemon.LocalDaemon(extra_args=["--stats", str(stats)]).start()
    results = []
    path = out_dir / "lm.json"
    args.train_args = ["--steps", str(args.steps), *args.train_args]
    try:
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            for label, fmt, scaling, extra in runs:
                print(f"\n== {label}, seed {seed}", flush=True)
                results.append(run_one(label, fmt, scaling, args, apsd.endpoint, out_dir, [],
                                       f"lm-{label.replace(' ', '-')}-{seed}",
                                       [*extra, "--seed", str(seed), "--stats", str(stats)],
                                       script=HERE / "train_lm.py"))
                path.write_text(json.dumps(results, indent=1))  # what is done so far
    finally:
        apsd.stop()
        shutil.rmtree(sockets, ignore_errors=True)
    plot_path = out_dir / "lm.png"
    plot(results, plot_path, f"byte-level transformer on fortunes, {args.workers} workers "
         f"through apsd, AdamW, {args.steps} steps")
    print("\n" + "\n".join(table(results)))
    print(f"\nplot: {plot_path}  results: {path}")


if __name__ == "__main__":
    main()
