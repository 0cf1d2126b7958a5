"""Run N worker processes of a training script on this machine:

    python3 -m aps.launch -n 4 train.py --epochs 3

Starts apsd (found by aps.daemon.find_apsd) if nothing listens at the endpoint
(--endpoint, else $APS_ENDPOINT, else tcp://127.0.0.1:5555; a comma-separated
list names several shards, and each local one that is not listening is
started; --shards S without an endpoint starts S local shards on free ports),
then N copies of
the script with APS_ENDPOINT, APS_JOB, APS_JOB_TOKEN, RANK/WORLD_SIZE/LOCAL_RANK
and APS_RANK/APS_WORLD_SIZE set (aps.Client.from_env reads them) and
OMP_NUM_THREADS=1 unless set. The job token (--job-token, else $APS_JOB_TOKEN,
else a random one for this launch) keeps other processes out of the job. Each output line gets a "[rank k] " prefix.
When a worker fails the others are stopped and the launcher exits with the
failed worker's status; Ctrl-C (or SIGTERM) stops everything and exits 130.
"""

import argparse
import os
import secrets
import signal
import subprocess
import sys
import threading
import time

from aps import _env, daemon

GRACE_S = 5.0  # from SIGTERM to SIGKILL

_print_lock = threading.Lock()


def say(text):
    with _print_lock:
        sys.stderr.write(f"[launch] {text}\n")
        sys.stderr.flush()


def _pump(stream, sink, prefix):
    """Copies stream to sink line by line with prefix (a reader thread)."""
    for line in iter(stream.readline, b""):
        with _print_lock:
            sink.write(prefix + line)
            sink.flush()
    stream.close()


def _exit_status(code):
    return 128 - code if code < 0 else code  # killed by signal s: 128 + s


def worker_env(rank, world, endpoint, job, base=None, job_token=None):
    """The environment of worker rank."""
    env = dict(os.environ if base is None else base)
    if job_token:
        env["APS_JOB_TOKEN"] = job_token
    env.update(APS_ENDPOINT=endpoint, APS_JOB=job, APS_RANK=str(rank), APS_WORLD_SIZE=str(world),
               RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
               LOCAL_WORLD_SIZE=str(world), PYTHONUNBUFFERED="1")
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


class Workers:
    """N worker processes with prefixed output; stops them all on request."""

    def __init__(self, command, world, endpoint, job, job_token=None):
        self.procs, self.pumps = [], []
        for rank in range(world):
            p = subprocess.Popen(command, env=worker_env(rank, world, endpoint, job,
                                                         job_token=job_token),
                                 stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE)
            self.procs.append(p)
            prefix = f"[rank {rank}] ".encode()
            for stream, sink in ((p.stdout, sys.stdout.buffer), (p.stderr, sys.stderr.buffer)):
                t = threading.Thread(target=_pump, args=(stream, sink, prefix), daemon=True)
                t.start()
                self.pumps.append(t)

    def wait(self, poll_s=0.05):
        """Waits until all exit (0) or one fails (its exit status)."""
        while True:
            codes = [p.poll() for p in self.procs]
            failed = [(r, c) for r, c in enumerate(codes) if c not in (None, 0)]
            if failed:
                rank, code = failed[0]
                say(f"rank {rank} exited with status {_exit_status(code)}; stopping the others")
                return _exit_status(code)
            if all(c == 0 for c in codes):
                return 0
            time.sleep(poll_s)

    def stop(self, grace_s=GRACE_S):
        """SIGTERM to those still running, SIGKILL after grace_s."""
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        deadline = time.monotonic() + grace_s
        for p in self.procs:
            try:
                p.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for t in self.pumps:
            t.join(timeout=1.0)


def _parse(argv):
    ap = argparse.ArgumentParser(prog="python3 -m aps.launch", description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", "--nproc", type=int, required=True, help="number of workers")
    ap.add_argument("--endpoint", help="apsd endpoint (default $APS_ENDPOINT or "
                    f"{_env.DEFAULT_ENDPOINT})")
    ap.add_argument("--job", help="job name (default $APS_JOB or launch-PID)")
    ap.add_argument("--job-token", help="the job's token, which apsd asks of every rank "
                    "(default $APS_JOB_TOKEN, else a random one for this launch)")
    ap.add_argument("--shards", type=int, default=0,
                    help="without an endpoint: start this many local apsd shards on free "
                    "ports and give the workers their list")
    ap.add_argument("--no-daemon", action="store_true",
                    help="never start apsd: fail if none is listening")
    ap.add_argument("script", help="Python script each worker runs")
    ap.add_argument("args", nargs=argparse.REMAINDER, help="arguments of the script")
    args = ap.parse_args(argv)
    if args.nproc < 1:
        ap.error("-n must be at least 1")
    if args.shards < 0 or (args.shards and args.endpoint):
        ap.error("--shards wants a count and no --endpoint")
    return args


def _ensure_daemon(endpoint, allowed):
    """A LocalDaemon started for endpoint, or None if one already listens."""
    if daemon.is_listening(endpoint):
        return None
    if not allowed or not daemon.is_local(endpoint):
        raise SystemExit(f"[launch] nothing listens at {endpoint}")
    d = daemon.LocalDaemon(endpoint).start()
    say(f"started apsd at {endpoint} (pid {d.proc.pid})")
    return d


def _on_sigterm(_signum, _frame):
    raise KeyboardInterrupt


def main(argv=None):
    args = _parse(argv)
    if args.shards:
        endpoint = ",".join(daemon.free_endpoint() for _ in range(args.shards))
    else:
        endpoint = args.endpoint or os.environ.get("APS_ENDPOINT") or _env.DEFAULT_ENDPOINT
    job = args.job or os.environ.get("APS_JOB") or f"launch-{os.getpid()}"
    token = args.job_token or os.environ.get("APS_JOB_TOKEN") or secrets.token_hex(16)
    signal.signal(signal.SIGTERM, _on_sigterm)
    shards = []
    workers = None
    try:
        for one in endpoint.split(","):
            d = _ensure_daemon(one.strip(), not args.no_daemon)
            if d is not None:
                shards.append(d)
        workers = Workers([sys.executable, args.script, *args.args], args.nproc, endpoint, job,
                          job_token=token)
        status = workers.wait()
    except KeyboardInterrupt:
        say("interrupted; stopping the workers")
        status = 130
    finally:
        if workers is not None:
            workers.stop()
        for d in shards:
            d.stop()
    return status


if __name__ == "__main__":
    sys.exit(main())
