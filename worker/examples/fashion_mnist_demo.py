#!/usr/bin/python3
"""What APS buys, on a real dataset: apsd and 4 workers train the same network
on Fashion-MNIST five times, the gradients travelling as fp32, e4m3 and e3m0,
the low-precision formats without scaling and with APS. Prints progress, then
a table (test accuracy, gradient bytes each worker sends per step, wall
time), and writes a plot of test accuracy against step. A sixth run moves
the optimizer to apsd (optimize mode: the daemon holds the fp32 weights,
workers push e4m3 gradients and receive e4m3 updates; --no-server skips it).

    make demo                     (about 2 minutes: an MLP, 1200 steps)
    make demo-long                (about 10 minutes: a CNN, 2000 steps)
    PYTHONPATH=worker/python python3 worker/examples/fashion_mnist_demo.py --help

Each run is `python3 -m aps.launch -n 4 train_fashion_mnist.py ...` against one
apsd started here (or the one at --endpoint).

With --hybrid it runs hybrid precision instead (issue 6, docs/RESULTS.md), on
the same model, seed and steps: fp32; e3m0 with APS and the daemon's automatic
policy; e4m3 with APS and the classifier in fp32 (a rule); e3m0 with APS
without and with error feedback; and e3m0 with APS and the automatic policy
under the thresholds of --tuned. Each of these runs gets its own apsd (the
flags of --apsd-arg, logging at info, a stats socket), and the bytes in the
table are what that daemon received, per tensor in the format it actually
travelled in. The plot adds the bytes of every step, rebuilt from the
daemon's `policy: switch` lines.

    PYTHONPATH=worker/python python3 worker/examples/fashion_mnist_demo.py --hybrid [--long]
"""

import argparse
import json
import os
import pathlib
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "python"))
from aps import daemon  # noqa: E402

RUNS = [("fp32", "fp32", "none"), ("e4m3 none", "e4m3", "none"),
        ("e4m3 APS", "e4m3", "local"), ("e3m0 none", "e3m0", "none"),
        ("e3m0 APS", "e3m0", "local")]
# Optimize mode (issue 10): the same SGD with momentum, run by apsd on its fp32 weights;
# gradients up and updates down in e4m3 with APS. (label, format, scaling, run name, options)
SERVER_RUNS = [("e4m3 APS, SGD on apsd", "e4m3", "local", "e4m3-local-server",
                ["--server-optimizer"])]
PRESETS = {
    "default": ["--model", "mlp", "--steps", "1200", "--eval-every", "50"],
    "long": ["--model", "cnn", "--steps", "2000", "--eval-every", "100"],
}
# The classifier's gradients on the wire (DistributedOptimizer names a
# parameter P "grad.P"): the MLP's last Linear is module 4, the CNN's module 10.
CLASSIFIER = {"default": "grad.4.*", "long": "grad.10.*"}
# --blocks: block scaling against per-tensor APS at 4 bits (issue 18), seed by seed.
# (label, format, scaling, train_fashion_mnist.py options)
BLOCK_RUNS = [("fp32", "fp32", "none", []), ("e4m3 APS", "e4m3", "local", []),
              ("fp4 APS", "fp4", "local", []), ("fp4 block", "fp4", "block", []),
              ("fp4 block auto", "fp4", "block", ["--policy", "auto"])]
# --hybrid: (label, job suffix, format, scaling, train_fashion_mnist.py options, tuned daemon)
HYBRID_RUNS = [
    ("fp32", "fp32", "fp32", "none", [], False),
    ("e3m0 APS auto", "e3m0-auto", "e3m0", "local", ["--policy", "auto"], False),
    ("e4m3 APS, classifier fp32", "e4m3-rule", "e4m3", "local", ["--rules", "{classifier}=fp32"],
     False),
    ("e3m0 APS", "e3m0-aps", "e3m0", "local", [], False),
    ("e3m0 APS + error feedback", "e3m0-ef", "e3m0", "local", ["--error-feedback"], False),
    ("e3m0 APS auto, tuned", "e3m0-auto-tuned", "e3m0", "local", ["--policy", "auto"], True),
]
# Thresholds for e3m0 (docs/RESULTS.md, "Hybrid precision"). The first measurement found
# the daemon's defaults of then (1% flushed, 10% error) below what e3m0 loses on every
# gradient of this demo; the defaults are now these values, so both auto runs match.
TUNED = "--flush_up 0.5 --error_up 0.35"
SWITCH = re.compile(r"policy: switch job=(\S+) tensor=(\S+) step=(\d+) from=(\S+) to=(\S+) "
                    r"reason=(\S+)")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--long", action="store_true", help="the longer, more faithful version")
    ap.add_argument("-n", "--workers", type=int, default=4)
    ap.add_argument("--endpoint", help="use the apsd at this endpoint instead of starting one")
    ap.add_argument("--out-dir", default="build/demo", help="where results and the plot go")
    ap.add_argument("--plot", help="path of the PNG (default OUT_DIR/fashion_mnist[_long].png, "
                    "with --hybrid OUT_DIR/hybrid[_long].png)")
    ap.add_argument("--blocks", action="store_true",
                    help="block scaling: fp32, e4m3 APS, fp4 APS, fp4 block, fp4 block with "
                    "the automatic policy, each over --seeds seeds")
    ap.add_argument("--seeds", type=int, default=3, help="--blocks: seeds per run")
    ap.add_argument("--hybrid", action="store_true",
                    help="the hybrid-precision runs (automatic policy, rules, error feedback)")
    ap.add_argument("--apsd-arg", action="append", default=[], metavar="FLAG",
                    help="a flag for every apsd started here, e.g. --apsd-arg=--flush_up=0.3 "
                    "(repeat for more)")
    ap.add_argument("--tuned", default=TUNED, metavar="FLAGS",
                    help=f"--hybrid: apsd flags of the 'auto, tuned' run (default: {TUNED!r}; "
                    "empty: no such run)")
    ap.add_argument("--no-server", action="store_true",
                    help="skip the optimize-mode run (SGD on apsd)")
    ap.add_argument("train_args", nargs="*",
                    help="more options for train_fashion_mnist.py (after --)")
    return ap.parse_args(argv)


def run_one(label, fmt, scaling, args, endpoint, out_dir, preset, name=None, extra=(),
            script=HERE / "train_fashion_mnist.py"):
    """One training run of script through aps.launch; returns rank 0's results."""
    name = name or f"{fmt}-{scaling}"
    out = out_dir / f"{name}.json"
    out.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "aps.launch", "-n", str(args.workers), "--endpoint", endpoint,
           "--no-daemon", "--job", f"demo-{name}", str(script),
           "--format", fmt, "--scaling", scaling, "--label", label, "--out", str(out),
           *preset, *extra, *args.train_args]
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


# -- --hybrid -----------------------------------------------------------------


def switches(log_text, job):
    """The daemon's `policy: switch` lines of job: [(tensor, step, from, to, reason)]."""
    return [(m[2], int(m[3]), m[4], m[5], m[6]) for m in SWITCH.finditer(log_text)
            if m[1] == job]


def timeline(result, moves):
    """Gradient bytes each worker sent at every step, rebuilt from each tensor's
    formats (the first one, then the daemon's switches: step N is the first step
    in the new format). Checks the total against the daemon's bytes_in."""
    import aps

    steps = result["steps"]
    per_step = [0] * steps
    for t in result["tensors"]:
        mine = sorted((step, old, new) for name, step, old, new, _ in moves if name == t["name"])
        fmt = mine[0][1] if mine else t["format"]
        changes = {step: new for step, _, new in mine}
        sent = 0
        for step in range(steps):
            fmt = changes.get(step, fmt)
            size = aps.packed_size(fmt, t["count"])
            per_step[step] += size
            sent += size
        if sent * result["world_size"] != t["bytes_in"]:
            print(f"demo: warning: {t['name']}: the switches account for "
                  f"{sent * result['world_size']} bytes, the daemon received {t['bytes_in']}",
                  flush=True)
    return per_step


def run_hybrid(args, preset_name, out_dir):
    """The hybrid-precision runs, each against its own apsd; returns their results."""
    preset = PRESETS[preset_name]
    # the tuned run needs a daemon of its own: not with --endpoint
    runs = [r for r in HYBRID_RUNS if not r[5] or (args.tuned.strip() and not args.endpoint)]
    results = []
    sockets = pathlib.Path(tempfile.mkdtemp(prefix="apsd-demo-"))
    try:
        for label, name, fmt, scaling, extra, tuned in runs:
            extra = [e.format(classifier=CLASSIFIER[preset_name]) for e in extra]
            flags = list(args.apsd_arg) + (shlex.split(args.tuned) if tuned else [])
            print(f"\n== {label}", flush=True)
            if args.endpoint:  # someone else's daemon: no stats, the client's count of bytes
                results.append(run_one(label, fmt, scaling, args, args.endpoint, out_dir, preset,
                                       f"hybrid-{name}", extra))
                continue
            log_path = out_dir / f"hybrid-{name}.apsd.log"
            stats = sockets / f"{name}.sock"
            with open(log_path, "w") as log:
                apsd = daemon.LocalDaemon(log_level="info", output=log,
                                          extra_args=["--stats", str(stats), *flags]).start()
                try:
                    r = run_one(label, fmt, scaling, args, apsd.endpoint, out_dir, preset,
                                f"hybrid-{name}", [*extra, "--stats", str(stats)])
                finally:
                    apsd.stop()
            r["apsd_flags"] = flags
            r["switch_log"] = switches(log_path.read_text(), f"demo-hybrid-{name}")
            r["switches"] = len(r["switch_log"])
            r["bytes_timeline"] = timeline(r, r["switch_log"])
            results.append(r)
            print(tensor_report(r), flush=True)
    finally:
        shutil.rmtree(sockets, ignore_errors=True)
    return results


def tensor_report(r):
    """Where each tensor of a run ended and what it cost."""
    if "tensors" not in r:
        return ""
    total = sum(t["bytes_in"] for t in r["tensors"]) or 1
    flags = f", apsd {' '.join(r['apsd_flags'])}" if r.get("apsd_flags") else ""
    lines = [f"{r['label']}{flags}: per tensor (format at the end, why, switches, share of the "
             "bytes, flushed share of the last step and, with the policy, its error)"]
    for t in sorted(r["tensors"], key=lambda t: -t["count"]):
        error = f"  error {t['rel_error']:.3f}" if r.get("policy") == "auto" else ""
        lines.append(f"  {t['name']:18s} {t['count']:8,d}  {t['policy_format']:5s} "
                     f"{t['reason']:9s} {t['format_switches']:3d} switches  "
                     f"{t['bytes_in'] / total * 100:5.1f}% of bytes  flushed "
                     f"{t['flushed_fraction'] * 100:5.1f}%{error}")
    return "\n".join(lines)


def hybrid_table(results):
    """The closing table of --hybrid as lines of text."""
    fp32 = next((r for r in results if r["format"] == "fp32"), None)
    lines = ["| run | test accuracy % | vs fp32 (points) | mean of the last 5 evaluations "
             "| bytes sent per step | % of fp32 | format switches | wall time s |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        delta = f"{r['accuracy'] - fp32['accuracy']:+.1f}" if fp32 else "-"
        last5 = sum(a for _, a in r["history"][-5:]) / len(r["history"][-5:])
        share = f"{r['bytes_per_step'] / fp32['bytes_per_step'] * 100:.1f}%" if fp32 else "-"
        label = r["label"] + (f" ({' '.join(r['apsd_flags'])})" if r.get("apsd_flags") else "")
        lines.append(f"| {label} | {r['accuracy']:.1f} | {delta} | {last5:.1f} | "
                     f"{r['bytes_per_step']:,.0f} | {share} | {r.get('switches', '-')} "
                     f"| {r['wall_s']:.1f} |")
    return lines


def plot_hybrid(results, path, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (acc_ax, bytes_ax) = plt.subplots(2, 1, figsize=(7.5, 7), dpi=100, sharex=True)
    fp32 = next((r for r in results if r["format"] == "fp32"), None)
    styles = ["-", "-", "-", "--", "-.", ":"]
    for i, r in enumerate(results):
        steps, acc = zip(*r["history"])
        style = styles[i % len(styles)]
        line, = acc_ax.plot(steps, acc, label=f"{r['label']} ({r['accuracy']:.1f}%)",
                            linestyle=style)
        if fp32 and r.get("bytes_timeline"):
            share = [b / fp32["bytes_per_step"] * 100 for b in r["bytes_timeline"]]
            bytes_ax.plot(range(len(share)), share, color=line.get_color(), linewidth=1.2,
                          linestyle=style, drawstyle="steps-post")
    acc_ax.set_ylabel("test accuracy %")
    acc_ax.set_ylim(max(0, min(r["accuracy"] for r in results) - 15), 95)
    acc_ax.grid(alpha=0.3)
    acc_ax.set_title(title, fontsize=10)
    acc_ax.legend(loc="lower right", fontsize=8)
    bytes_ax.axhline(35, color="grey", linestyle=":", linewidth=1)
    bytes_ax.text(results[0]["steps"], 36, "target: 35% of fp32", fontsize=8, color="grey",
                  ha="right")
    bytes_ax.set_ylabel("gradient bytes of the step, % of fp32")
    bytes_ax.set_xlabel("step")
    bytes_ax.set_ylim(0, 105)
    bytes_ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main_hybrid(args, preset_name, out_dir):
    suffix = "_long" if args.long else ""
    plot_path = pathlib.Path(args.plot or out_dir / f"hybrid{suffix}.png")
    print(f"demo: hybrid precision, {args.workers} workers, preset {preset_name}: "
          f"{' '.join(PRESETS[preset_name] + args.train_args)}", flush=True)
    results = run_hybrid(args, preset_name, out_dir)
    results_path = out_dir / f"hybrid_{preset_name}.json"
    results_path.write_text(json.dumps(results, indent=1))
    title = (f"Fashion-MNIST, {args.workers} workers through apsd, hybrid precision, "
             f"{PRESETS[preset_name][1].upper()}, {results[0]['steps']} steps")
    plot_hybrid(results, plot_path, title)
    print("\n" + "\n\n".join(filter(None, (tensor_report(r) for r in results))))
    print("\n" + "\n".join(hybrid_table(results)))
    print(f"\nplot: {plot_path}  results: {results_path}")


def blocks_table(results, seeds):
    """--blocks: accuracy mean and spread over the seeds, bytes against fp32."""
    fp32 = [r for r in results if r["format"] == "fp32"]
    base = sum(r["bytes_per_step"] for r in fp32) / len(fp32) if fp32 else None
    lines = [f"| run ({seeds} seeds) | test accuracy % (mean) | min - max | bytes per step "
             "| % of fp32 |", "|---|---:|---:|---:|---:|"]
    for label in dict.fromkeys(r["label"] for r in results):
        rs = [r for r in results if r["label"] == label]
        acc = [r["accuracy"] for r in rs]
        nbytes = sum(r["bytes_per_step"] for r in rs) / len(rs)
        share = f"{100 * nbytes / base:.1f}" if base else "-"
        lines.append(f"| {label} | {sum(acc) / len(acc):.2f} | {min(acc):.1f} - {max(acc):.1f} "
                     f"| {nbytes:,.0f} | {share} |")
    return lines


def main_blocks(args, preset_name, out_dir):
    """Each run of BLOCK_RUNS for every seed, against one daemon with a stats socket
    (the bytes are what it received, exponents included)."""
    sockets = pathlib.Path(tempfile.mkdtemp(prefix="apsd-blocks-"))
    stats = sockets / "stats.sock"
    apsd = daemon.LocalDaemon(extra_args=[*args.apsd_arg, "--stats", str(stats)]).start()
    results = []
    try:
        for seed in range(args.seeds):
            for label, fmt, scaling, extra in BLOCK_RUNS:
                print(f"\n== {label}, seed {seed}", flush=True)
                name = f"blocks-{label.replace(' ', '-')}-{seed}"
                results.append(run_one(label, fmt, scaling, args, apsd.endpoint, out_dir,
                                       PRESETS[preset_name], name,
                                       [*extra, "--seed", str(seed), "--stats", str(stats)]))
    finally:
        apsd.stop()
        shutil.rmtree(sockets, ignore_errors=True)
    path = out_dir / f"blocks_{preset_name}.json"
    path.write_text(json.dumps(results, indent=1))
    print("\n" + "\n".join(blocks_table(results, args.seeds)))
    print(f"\nresults: {path}")


def main(argv=None):
    args = parse_args(argv)
    preset_name = "long" if args.long else "default"
    out_dir = pathlib.Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if args.hybrid:
        return main_hybrid(args, preset_name, out_dir)
    if args.blocks:
        return main_blocks(args, preset_name, out_dir)
    plot_name = f"fashion_mnist{'_long' if args.long else ''}.png"
    plot_path = pathlib.Path(args.plot or out_dir / plot_name)
    apsd = None if args.endpoint else daemon.LocalDaemon(extra_args=args.apsd_arg).start()
    endpoint = args.endpoint or apsd.endpoint
    print(f"demo: apsd at {endpoint}, {args.workers} workers, preset {preset_name}: "
          f"{' '.join(PRESETS[preset_name] + args.train_args)}", flush=True)
    results = []
    try:
        for label, fmt, scaling in RUNS:
            print(f"\n== {label}", flush=True)
            results.append(run_one(label, fmt, scaling, args, endpoint, out_dir,
                                   PRESETS[preset_name]))
        for label, fmt, scaling, name, extra in [] if args.no_server else SERVER_RUNS:
            print(f"\n== {label}", flush=True)
            results.append(run_one(label, fmt, scaling, args, endpoint, out_dir,
                                   PRESETS[preset_name], name, extra))
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
