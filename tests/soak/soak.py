#!/usr/bin/python3
"""Soak test: apsd under faults for a few minutes, every result checked.

What runs (all real processes on loopback):
- one apsd, with a stats socket;
- JOBS jobs of RANKS workers each (tests/integration/itest_worker, which checks
  every result bit for bit against its own computation of the exact mean and
  exits 1 on a mismatch); job 0 sends e4m3 one tensor at a time with the
  client option rejoin (it goes on across daemon restarts: the client sends
  the calls in flight again), job 1 e5m2 with every tensor of a step in
  flight at once;
- a rogue peer (tests/soak/rogue) sending garbage, truncated and bit-flipped
  messages, bad CRCs, extra frames, pushes without HELLO and HELLOs that do
  not match, all the time;
- attackers (tests/soak/attackers.py): connections that take another's routing
  id over (and sometimes flood the parked one), and slow readers that send
  thousands of requests, never read a reply and close (issue 15: each aborted
  or leaked the daemon of libzmq 4.3 before).

Faults injected:
- every --kill-every seconds, kill -9 of one random worker: the other ranks of
  its job must get APS_EPEERLOST naming it (the time until they do is
  measured, bound 2 x heartbeat + 1 s); the job is then started again under a
  new name (a new incarnation) by its supervisor;
- daemon restarts during the first 40 % of the run, alternating SIGTERM and
  SIGKILL, apsd started again on the same endpoint: every worker must get an
  error within its deadline (no half-finished round is ever delivered), and
  the jobs start again;
- every --blip-every seconds, a network blip: the workers reach apsd through
  a TCP proxy (tests/integration/proxy.py) that resets every connection
  through it, losing what was in flight. ZeroMQ reconnects, apsd takes each
  session back, the calls in flight are sent again: no worker may fail or
  see a wrong result because of it.

It reports rounds completed and results verified, faults injected, wrong
results (must be 0), daemons that died on their own (must be 0), the
daemon's descriptors once every peer is gone against its own at start (within
a few), errors by name, detection times, and the daemon's RSS
(the last incarnation lives through the last 60 % of the run: after a warm-up
of a quarter of the run, a least-squares line through the lowest RSS of each
15 s may rise by at most 5 % of its mean; socket resets make the RSS a saw
tooth of +-30 %, and each gives back what the parked connections held).
Exit status 0 when every check holds; --no-rss-check leaves the RSS out of
that (for short runs, where warm-up never ends). JSON to
build/soak/soak.json (or --out).

    make soak                                # 300 s
    tests/soak/soak.py --seconds 60 --build build
"""

import argparse
import json
import os
import pathlib
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "integration"))
from proxy import BlipProxy  # noqa: E402
sys.path.insert(0, str(ROOT / "tests" / "soak"))
import attackers  # noqa: E402
HEARTBEAT_MS = 1000  # apsd's default, which the bound below is stated against
ERROR_NAME = re.compile(r"error (APS_E[A-Z]+)")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def open_fds(pid):
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


def rss_kib(pid):
    try:
        for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


class Daemon:
    def __init__(self, build, endpoint, tmp):
        self.build, self.endpoint, self.tmp = build, endpoint, tmp
        self.stats = os.path.join(tmp, "stats.sock")
        self.proc = None
        self.incarnation = 0
        self.exits = []

    def start(self):
        self.incarnation += 1
        log = open(os.path.join(self.tmp, f"apsd{self.incarnation}.log"), "w")
        self.proc = subprocess.Popen(
            [str(self.build / "server" / "apsd"), "--listen", self.endpoint, "--stats",
             self.stats, "--heartbeat_ms", str(HEARTBEAT_MS)], stdout=log, stderr=log)
        self.log_path = log.name
        deadline = time.monotonic() + 10
        while "listening" not in pathlib.Path(self.log_path).read_text():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("apsd did not start: " + pathlib.Path(self.log_path).read_text())
            time.sleep(0.02)
        self.started = time.monotonic()
        self.idle_fds = open_fds(self.proc.pid)  # before any peer

    def died(self):
        """The exit status when it ended by itself (an abort), else None."""
        code = self.proc.poll()
        if code is not None:
            self.exits.append(("none", code))
        return code

    def stop(self, sig):
        self.proc.send_signal(sig)
        code = self.proc.wait(timeout=15)
        self.exits.append((signal.Signals(sig).name, code))
        return code

    def counters(self):
        out = subprocess.run([str(self.build / "worker" / "apsctl"), "--stats", self.stats,
                              "stats", "--json"], capture_output=True, text=True, timeout=10)
        return json.loads(out.stdout) if out.returncode == 0 else {"error": out.stderr}


class Job:
    """RANKS workers of one job; started again under a new name when one ends."""

    def __init__(self, index, args, build, endpoint, tmp, report):
        self.index, self.args, self.build, self.endpoint = index, args, build, endpoint
        self.tmp, self.report = tmp, report
        self.incarnation = 0
        self.procs = []
        self.killed = None  # (rank, time) of our kill -9 in this incarnation
        self.restarted_daemon = None  # time of a daemon restart in this incarnation
        self.rejoin = index % 2 == 0  # job 0's workers join a restarted daemon again
        self.survival = []  # (incarnation, time, results so far) at each restart

    @property
    def name(self):
        return f"soak{self.index}-{self.incarnation}"

    def start(self):
        self.incarnation += 1
        self.killed = self.restarted_daemon = None
        self.started = time.monotonic()
        fmt, extra = ("e4m3", ["--rejoin", "1"]) if self.rejoin else \
            ("e5m2", ["--async", "1"])
        self.procs = []
        for rank in range(self.args.ranks):
            out = open(os.path.join(self.tmp, f"{self.name}.{rank}.out"), "w+")
            cmd = [str(self.build / "tests" / "integration" / "itest_worker"),
                   "--endpoint", self.endpoint, "--job", self.name, "--rank", str(rank),
                   "--world", str(self.args.ranks), "--steps", "1000000000",
                   "--sizes", "4097,65536,300", "--format", fmt,
                   "--seed", str(self.index * 100003 + self.incarnation),
                   "--jitter-ms", "2", "--timeout-ms", str(self.args.timeout_ms), *extra]
            self.procs.append((subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT), out))

    def results_so_far(self):
        """Results rank 0 of this incarnation has checked so far."""
        try:
            with open(os.path.join(self.tmp, f"{self.name}.0.out")) as f:
                return f.read().count("ok step=")
        except OSError:
            return 0

    def kill_one(self, rng):
        rank = rng.randrange(len(self.procs))
        self.procs[rank][0].kill()
        self.killed = (rank, time.monotonic())
        self.report["faults"]["worker_kill9"] += 1

    def poll(self):
        """Once any worker has ended: waits for the others (they must end by
        themselves), accounts for every one, and starts the job again."""
        if all(p.poll() is None for p, _ in self.procs):
            return
        first_end = time.monotonic()
        deadline = first_end + self.args.timeout_ms / 1000 + 5
        while any(p.poll() is None for p, _ in self.procs) and time.monotonic() < deadline:
            time.sleep(0.01)
        ended = time.monotonic()
        for rank, (p, out) in enumerate(self.procs):
            if p.poll() is None:  # did not end within its deadline: a hang
                self.report["hung_workers"] += 1
                p.kill()
                p.wait()
            self.account(rank, p.returncode, out)
        if self.killed is not None:
            self.report["detect_s"].append(round(ended - self.killed[1], 3))
        elif self.restarted_daemon is not None:
            self.report["daemon_restart_s"].append(round(ended - self.restarted_daemon, 3))
            if self.rejoin:  # it could not go on: ranks at different steps, said clearly
                self.report["rejoin_refused"] += 1
        else:
            self.report["unprovoked_failures"] += 1
        self.start()

    def account(self, rank, code, out):
        out.seek(0)
        text = out.read()
        out.close()
        self.report["results_verified"] += text.count("ok step=")
        if rank == 0:
            self.report["rounds"] += text.count("ok step=")
        if "MISMATCH step=" in text or "OVERFLOW step=" in text:
            self.report["wrong_results"] += 1
            self.report["wrong_samples"].append(text[-400:])
        if "Sanitizer" in text:  # an ASan/UBSan build reports at exit (status 1 too)
            self.report["sanitizer_reports"] += 1
            self.report["sanitizer_samples"].append(text[-1500:])
        for name in ERROR_NAME.findall(text):
            self.report["errors"][name] = self.report["errors"].get(name, 0) + 1
        if self.killed and rank != self.killed[0] and "APS_EPEERLOST" in text:
            if f"rank {self.killed[0]}" not in text:
                self.report["lost_rank_misnamed"] += 1

    def stop(self):
        for p, out in self.procs:
            p.kill()
            p.wait()
            out.close()


def run(args):
    build = pathlib.Path(args.build).resolve()
    rng = random.Random(args.seed)
    tmp = tempfile.mkdtemp(prefix="apsd-soak-")
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    report = {"seconds": args.seconds, "jobs": args.jobs, "ranks_per_job": args.ranks,
              "rounds": 0, "results_verified": 0, "wrong_results": 0, "wrong_samples": [],
              "hung_workers": 0, "unprovoked_failures": 0, "lost_rank_misnamed": 0,
              "restarts_survived": 0, "rejoin_refused": 0, "sanitizer_reports": 0,
              "sanitizer_samples": [],
              "faults": {"worker_kill9": 0, "daemon_sigterm": 0, "daemon_sigkill": 0,
                         "network_blips": 0},
              "daemon_deaths": [], "attacks": {},
              "errors": {}, "detect_s": [], "daemon_restart_s": [], "rogue": [],
              "rss_kib": [], "tmp": tmp}
    daemon = Daemon(build, endpoint, tmp)
    daemon.start()
    proxy = BlipProxy(int(endpoint.rsplit(":", 1)[1]))  # the workers' way in
    jobs = [Job(j, args, build, proxy.endpoint, tmp, report) for j in range(args.jobs)]
    for job in jobs:
        job.start()
    start = time.monotonic()
    end = start + args.seconds
    restarts = [start + f * args.seconds for f in (0.1, 0.25, 0.4)]
    next_kill = start + args.kill_every
    next_blip = start + args.blip_every if args.blip_every > 0 else float("inf")
    stop_rogue = threading.Event()

    def rogue_loop():
        n = 0
        while not stop_rogue.is_set():
            n += 1
            # Not the rejoin job's name: after a restart, whoever says HELLO first
            # creates the job, and a rogue HELLO with another world size would
            # take it (apsd without CURVE lets anyone in; CURVE is the answer).
            names = [j.name for j in jobs if not j.rejoin]
            r = subprocess.run([str(build / "tests" / "soak" / "rogue"), endpoint, "3",
                                str(args.seed * 1000 + n), *names],
                               capture_output=True, text=True, timeout=30)
            report["rogue"].append(r.stdout.strip())
    rogue = threading.Thread(target=rogue_loop, daemon=True)
    rogue.start()
    attack = threading.Thread(target=attackers.run, daemon=True,
                              args=(endpoint, args.seed, stop_rogue, report["attacks"]))
    attack.start()
    last_progress = start
    while time.monotonic() < end:
        now = time.monotonic()
        for job in jobs:
            job.poll()
        code = daemon.died()
        if code is not None:  # not one of ours: an abort or a crash
            report["daemon_deaths"].append(code)
            daemon.start()
            continue
        if restarts and now >= restarts[0]:
            restarts.pop(0)
            sig = signal.SIGTERM if report["faults"]["daemon_sigterm"] <= \
                report["faults"]["daemon_sigkill"] else signal.SIGKILL
            daemon.stop(sig)
            report["faults"]["daemon_" + sig.name.lower()] += 1
            for job in jobs:
                job.restarted_daemon = time.monotonic()
                # every job: one started just before the restart may join the new
                # daemon and go on (its mark then clears, so that it is killed again)
                job.survival.append((job.incarnation, job.restarted_daemon,
                                     job.results_so_far()))
            daemon.start()
            report["rss_kib"] = []
        elif now >= next_blip:
            next_blip = now + args.blip_every
            if proxy.cut() > 0:
                report["faults"]["network_blips"] += 1
        elif now >= next_kill:
            next_kill = now + args.kill_every
            # only a job whose every rank has joined (rank 0 has a result): a rank
            # killed before its HELLO is noticed by the others' call deadline, not
            # by apsd (once 6.6 s against the 3 s bound, after a daemon restart)
            candidates = [j for j in jobs if j.killed is None and now - j.started > 1.0 and
                          j.restarted_daemon is None and not j.survival and
                          j.results_so_far() > 0]
            if candidates:
                rng.choice(candidates).kill_one(rng)
        for job in jobs:  # did a job go on across the restart, and make progress?
            for mark in [x for x in job.survival if now - x[1] > 4.0]:
                job.survival.remove(mark)
                inc, when, before = mark
                if job.incarnation == inc and job.results_so_far() > before:
                    report["restarts_survived"] += job.rejoin
                    if job.restarted_daemon == when:  # no later restart: a later
                        job.restarted_daemon = None  # failure has another cause
        rss = rss_kib(daemon.proc.pid)
        if rss is not None:
            report["rss_kib"].append((round(now - daemon.started, 1), rss))
        if now - last_progress >= 10:
            last_progress = now
            print(f"soak: {now - start:5.0f}/{args.seconds} s, {report['rounds']} rounds, "
                  f"{report['results_verified']} results verified, "
                  f"{sum(report['faults'].values())} faults, "
                  f"{report['wrong_results']} wrong, rss {rss} KiB", flush=True)
        time.sleep(0.05)
    stop_rogue.set()
    rogue.join(timeout=30)
    attack.join(timeout=30)
    for job in jobs:
        job.poll()
    report["counters"] = daemon.counters()
    for job in jobs:
        job.stop()
    proxy.close()
    # Every peer is gone: the descriptors go back to the daemon's own at its start.
    deadline = time.monotonic() + 15
    while open_fds(daemon.proc.pid) > daemon.idle_fds + 4 and time.monotonic() < deadline:
        time.sleep(0.2)
    report["fds"] = {"at_start": daemon.idle_fds, "peers_gone": open_fds(daemon.proc.pid)}
    if report["fds"]["peers_gone"] > daemon.idle_fds + 4:  # what is left, for the report
        ss = subprocess.run(["ss", "-tanp"], capture_output=True, text=True).stdout
        report["fds"]["sockets"] = [line for line in ss.splitlines()
                                    if f"pid={daemon.proc.pid}," in line]
    report["final_exit"] = daemon.stop(signal.SIGTERM)
    report["daemon_exits"] = daemon.exits
    report["daemon_sanitizer_reports"] = sum(
        pathlib.Path(tmp, f"apsd{i}.log").read_text(errors="replace").count("Sanitizer")
        for i in range(1, daemon.incarnation + 1))
    return report


RSS_WINDOW_S = 15  # longer than the saw tooth of socket resets (one in 10 s at most)


def rss_check(samples, warmup_s):
    """(floor of the first RSS_WINDOW_S s after warm-up, of the last, growth) of
    the last incarnation's RSS. A window's floor is its lowest sample: what
    parked connections hold between two socket resets comes and goes by 30 %
    and more, and each reset gives it back, while a leak raises the floor. The
    growth is that of a least-squares line through the floors of consecutive
    windows, over their span, against their mean."""
    after = [(t, kib) for t, kib in samples if t >= warmup_s]
    if len(after) < 40 or after[-1][0] - after[0][0] < 2 * RSS_WINDOW_S:
        return None, None, None
    windows = {}
    for t, kib in after:
        w = int((t - after[0][0]) // RSS_WINDOW_S)
        windows[w] = min(kib, windows.get(w, kib))
    if after[-1][0] - after[0][0] < (max(windows) + 1) * RSS_WINDOW_S:
        del windows[max(windows)]  # a window cut short by the end has too few samples
    pts = [((w + 0.5) * RSS_WINDOW_S, kib) for w, kib in sorted(windows.items())]
    n = len(pts)
    mean_t = sum(t for t, _ in pts) / n
    mean_k = sum(k for _, k in pts) / n
    slope = sum((t - mean_t) * (k - mean_k) for t, k in pts) / \
        sum((t - mean_t) ** 2 for t, _ in pts)
    growth = slope * (pts[-1][0] - pts[0][0]) / mean_k
    return pts[0][1], pts[-1][1], 1 + growth


def summarize(args, report):
    warmup = max(10.0, 0.25 * args.seconds)
    rss0, rss1, ratio = rss_check(report["rss_kib"], warmup)
    bound = 2 * HEARTBEAT_MS / 1000 + 1
    detect = report["detect_s"]
    counters = report["counters"].get("counters", report["counters"])
    rogue_errors = sum(int(m.group(1)) for line in report["rogue"]
                       for m in [re.search(r"errors=(\d+)", line)] if m)
    rogue_sent = sum(int(m.group(1)) for line in report["rogue"]
                     for m in [re.search(r"sent=(\d+)", line)] if m)
    checks = {
        "rounds completed": report["rounds"] > 0,
        "no wrong result": report["wrong_results"] == 0,
        "no sanitizer report from a worker": report["sanitizer_reports"] == 0,
        "no hung worker": report["hung_workers"] == 0,
        "lost ranks named": report["lost_rank_misnamed"] == 0,
        f"kill -9 detected within {bound:.0f} s": bool(detect) and max(detect) <= bound,
        "daemon restarts noticed within a deadline":
            all(t <= args.timeout_ms / 1000 + 2 for t in report["daemon_restart_s"]),
        "rogue answered with errors": rogue_errors > 0,
        "the rejoin job went on across a daemon restart": report["restarts_survived"] >= 1,
        "no failure without an injected cause (a blip is not one)":
            report["unprovoked_failures"] == 0,
        "sessions came back after blips":
            report["faults"]["network_blips"] == 0 or counters.get("reconnects", 0) > 0,
        "daemon ends with exit 0": report["final_exit"] == 0,
        "every SIGTERM ended the daemon with exit 0":
            all(code == 0 for name, code in report["daemon_exits"] if name == "SIGTERM"),
        "no sanitizer report from the daemon": report["daemon_sanitizer_reports"] == 0,
        "the daemon never died by itself": not report["daemon_deaths"],
        "attackers ran": sum(v for k, v in report["attacks"].items()
                             if k in ("takeovers", "slow_readers")) > 0,
        "descriptors back to their level once the peers are gone":
            report["fds"]["peers_gone"] is not None and
            report["fds"]["peers_gone"] <= report["fds"]["at_start"] + 4,
    }
    if not args.no_rss_check:
        checks["RSS within 5 % after warm-up (the trend of its floor)"] = ratio is not None and \
            ratio <= 1.05
    report["rss_check"] = {"warmup_s": warmup, "after_warmup_kib": rss0, "end_kib": rss1,
                           "ratio": ratio}
    report["rogue_sent"], report["rogue_errors"] = rogue_sent, rogue_errors
    report["checks"] = checks
    print(f"\n| soak ({args.seconds} s, {args.jobs} jobs x {args.ranks} ranks) | |")
    print("|---|---|")
    print(f"| rounds completed (rank 0, per tensor) | {report['rounds']} |")
    print(f"| results verified bit for bit (all ranks) | {report['results_verified']} |")
    print(f"| wrong results | {report['wrong_results']} |")
    print(f"| workers killed (kill -9) | {report['faults']['worker_kill9']} |")
    print(f"| daemon restarts (SIGTERM / SIGKILL) | {report['faults']['daemon_sigterm']} / "
          f"{report['faults']['daemon_sigkill']} |")
    print(f"| network blips (every connection reset) / sessions taken back, "
          f"calls answered again or dropped (last apsd) | {report['faults']['network_blips']} / "
          f"{counters.get('reconnects')}, {counters.get('resent')} |")
    print(f"| rogue messages sent / ERROR replies | {rogue_sent} / {rogue_errors} |")
    print(f"| attack rounds (takeovers, slow readers) | "
          f"{json.dumps(report['attacks'], sort_keys=True)} |")
    print(f"| daemons that died by themselves | {len(report['daemon_deaths'])} |")
    print(f"| apsd descriptors at start / once every peer is gone | "
          f"{report['fds']['at_start']} / {report['fds']['peers_gone']} |")
    if detect:
        print(f"| kill -9 to the job's end, median / max (s) | "
              f"{sorted(detect)[len(detect) // 2]:.2f} / {max(detect):.2f} |")
    if report["daemon_restart_s"]:
        print(f"| daemon restart to the job's end, max (s) | "
              f"{max(report['daemon_restart_s']):.2f} |")
    print(f"| job 0 (rejoin): restarts it went on across / ended with APS_EMISMATCH | "
          f"{report['restarts_survived']} / {report['rejoin_refused']} |")
    print(f"| failures with no injected cause | {report['unprovoked_failures']} |")
    print(f"| errors seen by workers | {json.dumps(report['errors'], sort_keys=True)} |")
    print(f"| apsd RSS after warm-up / at the end, lowest in 15 s (KiB); trend | {rss0} / "
          f"{rss1}; {(ratio - 1) * 100 if ratio else float('nan'):+.1f} % |")
    for key in ("faults_total", "errors_sent", "peers_lost", "dropped", "bad_session",
                "refused_hello", "slow_readers", "listener_resets", "silent_dropped"):
        if key in counters:
            print(f"| apsd counter {key} (last incarnation) | {counters[key]} |")
    print()
    for name, ok in checks.items():
        print(f"{'PASS' if ok else 'FAIL'}  {name}")
    return all(checks.values())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=int, default=300)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--kill-every", type=float, default=5.0)
    ap.add_argument("--blip-every", type=float, default=3.0,
                    help="seconds between network blips (0: none)")
    ap.add_argument("--timeout-ms", type=int, default=8000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--build", default=str(ROOT / "build"))
    ap.add_argument("--out", default=None)
    ap.add_argument("--no-rss-check", action="store_true")
    args = ap.parse_args()
    report = run(args)
    ok = summarize(args, report)
    out = pathlib.Path(args.out or pathlib.Path(args.build) / "soak" / "soak.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1))
    print(f"(report: {out}; logs: {report['tmp']})")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
