"""Run the ranks of a training script, with torchrun's flags:

    python3 -m aps.launch --nproc_per_node 4 train.py --epochs 3      # one machine

    # several machines: apsd started on purpose on host A, then on each node K
    apsd --listen tcp://0.0.0.0:5555 --insecure yes   # or CURVE keys
    python3 -m aps.launch --nnodes 2 --node_rank K --nproc_per_node 4 \\
        --master_addr A --master_port 29500 --job-token SECRET train.py

Each worker gets RANK (node_rank * nproc_per_node + LOCAL_RANK), LOCAL_RANK,
WORLD_SIZE (nnodes * nproc_per_node), LOCAL_WORLD_SIZE, GROUP_RANK (the node
rank), MASTER_ADDR and MASTER_PORT (torch.distributed's env://), and
APS_ENDPOINT, APS_JOB, APS_JOB_TOKEN, APS_RANK, APS_WORLD_SIZE (which
aps.Client.from_env reads), and OMP_NUM_THREADS=1 unless set.

apsd's endpoint: --endpoint, else $APS_ENDPOINT, else with --nnodes > 1
tcp://MASTER_ADDR:5555, else tcp://127.0.0.1:5555; a comma-separated list
names several shards. On one node, or node 0, the launcher starts apsd at each
loopback or ipc:// endpoint where nothing listens (--shards S without an
endpoint: S local shards on free ports) and stops it at the end. It never
starts one that other machines can reach: apsd listens beyond loopback only
with CURVE or insecure = yes, so that daemon is started on purpose. Nodes
other than 0 wait for the daemon.

MASTER_PORT is --master_port, else a free port on one node, else torchrun's
29500. The job token (--job-token, else $APS_JOB_TOKEN, else a random one on
one node) keeps other processes out of the job; with --nnodes > 1 every node
must be given the same one, and the job is named after it unless --job or
$APS_JOB says otherwise.

Each output line gets a "[rank k] " prefix and is written whole. When a
worker fails, the others are stopped and the launcher exits with the failed
worker's status; Ctrl-C (or SIGTERM) stops everything and exits 130.
"""

import argparse
import dataclasses
import hashlib
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.parse

from aps import _env, daemon
from aps._args import SECONDS, check_float, check_int, check_str
from aps._output import Output, say

GRACE_S = 5.0  # from SIGTERM to SIGKILL
DRAIN_S = 5.0  # for the output of a child that exited
DAEMON_WAIT_S = 300.0  # a node other than 0 waits this long for apsd
APSD_PORT = urllib.parse.urlsplit(_env.DEFAULT_ENDPOINT).port
TORCHRUN_MASTER_PORT = 29500
# libaps's limits (proto/frame.h, worker/shards.h): beyond them every worker's Client fails
WORLD_MAX = 65536  # APS_MSG_RANKS_MAX
SHARDS_MAX = 64  # APS_SHARDS_MAX
ENDPOINT_MAX = 255  # bytes of one endpoint (APS_SHARDS_ENDPOINT_MAX - 1)
JOB_MAX = 64  # bytes of a job name (APS_MSG_JOB_MAX)
TOKEN_MAX = 128  # bytes of a job token (APS_MSG_TOKEN_MAX)


@dataclasses.dataclass(frozen=True)
class Layout:
    """This node's place among the ranks, and torch.distributed's rendezvous."""
    nproc: int  # workers on this node
    nnodes: int
    node_rank: int
    master_addr: str
    master_port: int

    def __post_init__(self):
        check_int(self.nproc, "nproc", (1, WORLD_MAX))
        check_int(self.nnodes, "nnodes", (1, WORLD_MAX))
        check_int(self.node_rank, "node_rank", (0, self.nnodes - 1))
        if self.world > WORLD_MAX:
            raise ValueError(f"{self.nnodes} nodes of {self.nproc} workers: apsd takes at "
                             f"most {WORLD_MAX} ranks")
        check_int(self.master_port, "master_port", (1, 65535))
        if not check_str(self.master_addr, "master_addr"):
            raise ValueError("master_addr is empty")

    @property
    def world(self):
        return self.nnodes * self.nproc

    def rank(self, local_rank):
        return self.node_rank * self.nproc + local_rank


def _exit_status(code):
    return 128 - code if code < 0 else code  # killed by signal s: 128 + s


def worker_env(layout, local_rank, endpoint, job, base=None, job_token=None):
    """The environment of this node's worker local_rank."""
    check_int(local_rank, "local_rank", (0, layout.nproc - 1))
    check_str(endpoint, "endpoint")
    check_str(job, "job")
    check_str(job_token, "job_token", allow_none=True)
    env = dict(os.environ if base is None else base)
    if job_token:
        env["APS_JOB_TOKEN"] = job_token
    rank, world = str(layout.rank(local_rank)), str(layout.world)
    env.update(APS_ENDPOINT=endpoint, APS_JOB=job, APS_RANK=rank, APS_WORLD_SIZE=world,
               RANK=rank, WORLD_SIZE=world, LOCAL_RANK=str(local_rank),
               LOCAL_WORLD_SIZE=str(layout.nproc), GROUP_RANK=str(layout.node_rank),
               MASTER_ADDR=layout.master_addr, MASTER_PORT=str(layout.master_port),
               PYTHONUNBUFFERED="1")
    env.setdefault("OMP_NUM_THREADS", "1")
    # Fixed malloc thresholds, unless the user set malloc's own: glibc's sliding ones
    # may give a step's freed message buffers back and fault them in again the next
    # step (docs/PERFORMANCE.md, "The daemon's malloc"; apsd sets the same itself).
    if not any(k.startswith("MALLOC_") for k in env) and \
            "glibc.malloc." not in env.get("GLIBC_TUNABLES", ""):
        env.update(MALLOC_MMAP_THRESHOLD_=str(16 << 20), MALLOC_TRIM_THRESHOLD_=str(32 << 20))
    return env


class Workers:
    """This node's worker processes with prefixed output; stops them all on request."""

    def __init__(self, command, layout, endpoint, job, output, job_token=None):
        self.output, self.procs = output, []
        for local_rank in range(layout.nproc):
            env = worker_env(layout, local_rank, endpoint, job, job_token=job_token)
            p = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            self.procs.append((layout.rank(local_rank), p))
            output.follow(p, f"[rank {layout.rank(local_rank)}] ")

    def wait(self, poll_s=0.05):
        """Waits until all exit (0) or one fails (its exit status, once its
        output is written)."""
        check_float(poll_s, "poll_s", SECONDS)
        while True:
            codes = [(rank, p, p.poll()) for rank, p in self.procs]
            failed = [(rank, p, c) for rank, p, c in codes if c not in (None, 0)]
            if failed:
                rank, p, code = failed[0]
                self.output.drain(p, DRAIN_S)
                say(f"rank {rank} exited with status {_exit_status(code)}; stopping the others")
                return _exit_status(code)
            if all(c == 0 for _, _, c in codes):
                return 0
            time.sleep(poll_s)

    def stop(self, grace_s=GRACE_S):
        """SIGTERM to those still running, SIGKILL after grace_s."""
        check_float(grace_s, "grace_s", SECONDS)
        for _, p in self.procs:
            if p.poll() is None:
                p.terminate()
        deadline = time.monotonic() + grace_s
        for _, p in self.procs:
            try:
                p.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.output.close(DRAIN_S)


def _nnodes(text):
    """torchrun's --nnodes: N, or MIN:MAX with MIN == MAX (no elastic sizes)."""
    low, _, high = text.partition(":")
    try:
        low, high = int(low), int(high or low)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not N or N:N") from None
    if low != high:
        raise argparse.ArgumentTypeError(f"{text}: a changing number of nodes (elastic) is "
                                         "not supported: give one N")
    if low < 1:
        raise argparse.ArgumentTypeError(f"{text}: at least 1 node")
    return low


def _parser():
    ap = argparse.ArgumentParser(prog="python3 -m aps.launch", description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", "--nproc", "--nproc_per_node", "--nproc-per-node", dest="nproc",
                    type=int, default=1, help="workers on this node (default 1)")
    ap.add_argument("--nnodes", type=_nnodes, default=1,
                    help="nodes, each with its own launcher (default 1)")
    ap.add_argument("--node_rank", "--node-rank", type=int, default=0,
                    help="this node's rank, 0 to nnodes-1 (default 0)")
    ap.add_argument("--master_addr", "--master-addr",
                    help="node 0's address: MASTER_ADDR, and apsd's host without --endpoint "
                    "when --nnodes > 1 (default 127.0.0.1)")
    ap.add_argument("--master_port", "--master-port", type=int,
                    help="MASTER_PORT (default: a free port on one node, 29500 on several)")
    ap.add_argument("--standalone", action="store_true",
                    help="accepted for torchrun's sake: one node is the default")
    ap.add_argument("--endpoint", help="apsd endpoint (default $APS_ENDPOINT, else "
                    f"tcp://MASTER_ADDR:{APSD_PORT} with --nnodes > 1, else "
                    f"{_env.DEFAULT_ENDPOINT})")
    ap.add_argument("--job", help="job name (default $APS_JOB, else launch-PID on one node)")
    ap.add_argument("--job-token", help="the job's token, which apsd asks of every rank "
                    "(default $APS_JOB_TOKEN, else a random one on one node; with "
                    "--nnodes > 1 it is needed, the same on every node)")
    ap.add_argument("--shards", type=int, default=0,
                    help="without an endpoint, on one node: start this many local apsd "
                    "shards on free ports and give the workers their list")
    ap.add_argument("--no-daemon", action="store_true",
                    help="never start apsd: fail if none is listening")
    ap.add_argument("script", help="Python script each worker runs")
    ap.add_argument("args", nargs=argparse.REMAINDER, help="arguments of the script")
    return ap


def _parse(argv):
    ap = _parser()
    args = ap.parse_args(argv)
    if args.nproc < 1:
        ap.error("--nproc_per_node (-n) must be at least 1")
    if args.nnodes * args.nproc > WORLD_MAX:
        ap.error(f"--nnodes {args.nnodes} x --nproc_per_node {args.nproc} is "
                 f"{args.nnodes * args.nproc} ranks: apsd takes at most {WORLD_MAX}")
    if args.nnodes < 1 or not 0 <= args.node_rank < args.nnodes:
        ap.error(f"--node_rank {args.node_rank} is not one of 0..{args.nnodes - 1} "
                 f"(--nnodes {args.nnodes})")
    if args.master_port is not None and not 0 < args.master_port < 65536:
        ap.error(f"--master_port {args.master_port} is not a port")
    if args.shards < 0 or (args.shards and args.endpoint):
        ap.error("--shards wants a count and no --endpoint")
    if args.shards > SHARDS_MAX:
        ap.error(f"--shards {args.shards}: a client takes at most {SHARDS_MAX}")
    if args.nnodes > 1 and (args.shards or args.standalone):
        ap.error("--shards and --standalone are for one node: with --nnodes > 1 give every "
                 "node the same --endpoint (or --master_addr)")
    for what, bad in _bad_names(args):
        ap.error(f"{what}: {bad}")
    return args


def _given(args, option, var):
    """(where it comes from, value) of an option that falls back on $var."""
    value = getattr(args, option.lstrip("-").replace("-", "_"))
    return (option, value) if value else (var, os.environ.get(var))


def _bad_names(args):
    """(option or variable, why) for each endpoint, job and token that libaps
    would refuse in every worker."""
    where, given = _given(args, "--endpoint", "APS_ENDPOINT")
    if given and not args.shards:
        ends = [e.strip() for e in given.split(",")]
        if len(ends) > SHARDS_MAX:
            yield where, f"{len(ends)} endpoints: at most {SHARDS_MAX}"
        for e in ends:
            try:
                daemon._check_endpoint(e)
            except ValueError as exc:
                yield where, str(exc)
            if len(e.encode()) > ENDPOINT_MAX:
                yield where, f"endpoint {e[:32]!r}... is longer than {ENDPOINT_MAX} bytes"
    for option, var, most in (("--job", "APS_JOB", JOB_MAX),
                              ("--job-token", "APS_JOB_TOKEN", TOKEN_MAX)):
        where, text = _given(args, option, var)
        if text and not (len(text) <= most and all("!" <= c <= "~" for c in text)):
            yield where, f"{text!r}: 1 to {most} visible ASCII characters (no spaces)"


def _url_host(host):
    return f"[{host}]" if ":" in host else host


def _endpoint(args):
    """apsd's endpoint (or list of shards) for this node's workers."""
    if args.shards:
        return ",".join(daemon.free_endpoint() for _ in range(args.shards))
    given = args.endpoint or os.environ.get("APS_ENDPOINT")
    if given:
        return given
    if args.nnodes == 1:
        return _env.DEFAULT_ENDPOINT
    if args.master_addr:
        return f"tcp://{_url_host(args.master_addr)}:{APSD_PORT}"
    raise SystemExit(f"[launch] node {args.node_rank} of {args.nnodes} does not know where "
                     f"apsd is: pass --master_addr HOST (for tcp://HOST:{APSD_PORT}), "
                     "--endpoint or APS_ENDPOINT, the same on every node")


def _free_port():
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _layout(args, endpoint):
    addr = args.master_addr
    if addr is None and args.nnodes > 1:  # node 0 is where apsd is, if nothing else says
        first = urllib.parse.urlsplit(endpoint.split(",")[0].strip())
        if first.scheme == "tcp" and first.hostname not in (None, "*", "0.0.0.0", "::"):
            addr = first.hostname
    port = args.master_port
    if port is None:
        port = _free_port() if args.nnodes == 1 else TORCHRUN_MASTER_PORT
    return Layout(args.nproc, args.nnodes, args.node_rank, addr or "127.0.0.1", port)


def _job_and_token(args):
    token = args.job_token or os.environ.get("APS_JOB_TOKEN")
    if not token and args.nnodes > 1:
        raise SystemExit(f"[launch] --nnodes {args.nnodes}: give every node the same "
                         "--job-token (or APS_JOB_TOKEN), e.g. the output of python3 -c "
                         "'import secrets; print(secrets.token_hex(16))'")
    token = token or secrets.token_hex(16)
    job = args.job or os.environ.get("APS_JOB")
    if not job:
        job = (f"launch-{os.getpid()}" if args.nnodes == 1 else
               "launch-" + hashlib.sha256(token.encode()).hexdigest()[:12])
    return job, token


def _starts_here(endpoint):
    """True for the endpoints the launcher may start apsd at: ipc://, loopback tcp://."""
    if endpoint.startswith("ipc://"):
        return True
    host = urllib.parse.urlsplit(endpoint).hostname if endpoint.startswith("tcp://") else None
    return host is not None and (host in ("localhost", "::1") or host.startswith("127."))


def _start_daemon(endpoint, output):
    d = daemon.LocalDaemon(endpoint, output=subprocess.PIPE)
    try:
        d.start()
    except (RuntimeError, TimeoutError) as exc:
        d.stop()
        for line in d.proc.stderr.read().decode(errors="replace").splitlines():
            say(f"apsd: {line}")
        raise SystemExit(f"[launch] {exc}") from None
    output.follow(d.proc, "[apsd] ")
    say(f"started apsd at {endpoint} (pid {d.proc.pid})")
    return d


def _ensure_daemon(endpoint, allowed, output):
    """A LocalDaemon started for endpoint, or None if one already listens."""
    if daemon.is_listening(endpoint):
        return None
    if not allowed:
        raise SystemExit(f"[launch] nothing listens at {endpoint}")
    if not _starts_here(endpoint):
        raise SystemExit(f"[launch] nothing listens at {endpoint}, and the launcher starts "
                         "apsd on loopback only: start it there on purpose (apsd --listen "
                         "with CURVE keys, or --insecure yes on a trusted network)")
    return _start_daemon(endpoint, output)


def _wait_for_daemon(endpoint, node_rank, timeout=DAEMON_WAIT_S):
    if daemon.is_listening(endpoint):
        return
    say(f"node {node_rank}: waiting up to {timeout:.0f} s for apsd at {endpoint}")
    deadline = time.monotonic() + timeout
    while not daemon.is_listening(endpoint):
        if time.monotonic() > deadline:
            raise SystemExit(f"[launch] nothing listens at {endpoint} after {timeout:.0f} s: "
                             "node 0's launcher starts a loopback apsd; any other is started "
                             "on purpose")
        time.sleep(0.2)


def _daemons(args, endpoint, output, started):
    """Node 0 starts the shards nothing listens at (appended to started, to be
    stopped at the end); other nodes wait for theirs."""
    for one in (e.strip() for e in endpoint.split(",")):
        if args.node_rank > 0:
            _wait_for_daemon(one, args.node_rank)
            continue
        d = _ensure_daemon(one, not args.no_daemon, output)
        if d is not None:
            started.append(d)


def _on_sigterm(_signum, _frame):
    raise KeyboardInterrupt


def main(argv=None):
    args = _parse(argv)
    endpoint = _endpoint(args)
    layout = _layout(args, endpoint)
    job, token = _job_and_token(args)
    signal.signal(signal.SIGTERM, _on_sigterm)
    output, shards, workers = Output(), [], None
    try:
        _daemons(args, endpoint, output, shards)
        workers = Workers([sys.executable, args.script, *args.args], layout, endpoint, job,
                          output, job_token=token)
        status = workers.wait()
    except KeyboardInterrupt:
        say("interrupted; stopping the workers")
        status = 130
    finally:
        if workers is not None:
            workers.stop()
        for d in shards:
            d.stop()
        output.close(DRAIN_S)
    return status


if __name__ == "__main__":
    sys.exit(main())
