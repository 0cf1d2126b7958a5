"""deploy/slurm/apsd.sbatch on a real one-node Slurm cluster started by the test.

Debian's slurmctld, slurmd and munged run as root from a temporary directory:
their own munge key and socket, a slurm.conf on free loopback ports, state,
spool, pid and log files there; /etc/slurm and /etc/munge are not read.
The job runs the script's default worker (deploy/slurm/allreduce_check.py) as
2 tasks on the one node, against the shard the script starts with srun.
Everything started is stopped by pid at the end, whatever happened.
"""

import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pytest

from conftest import APSD, ROOT, free_port

SBATCH = ROOT / "deploy" / "slurm" / "apsd.sbatch"
TOOLS = ("munged", "mungekey", "slurmctld", "slurmd", "sbatch", "scontrol", "sinfo", "squeue",
         "scancel")
JOB_DEADLINE_S = 45

missing = [t for t in TOOLS if shutil.which(t) is None and not os.path.exists(f"/usr/sbin/{t}")]
pytestmark = [
    pytest.mark.skipif(bool(missing), reason="Slurm/munge not installed (missing: "
                       + ", ".join(missing) + "; deploy/install-deps.sh installs "
                       "slurm-wlm and munge)"),
    pytest.mark.skipif(os.geteuid() != 0, reason="a test Slurm cluster runs its "
                       "daemons as root (SlurmUser=root)"),
]

SLURM_CONF = """\
ClusterName=apstest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={tmp}/munge.sock
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MailProg=/bin/true
ReturnToService=2
StateSaveLocation={tmp}/state
SlurmdSpoolDir={tmp}/spool
SlurmctldPidFile={tmp}/slurmctld.pid
SlurmdPidFile={tmp}/slurmd.pid
SlurmctldLogFile={tmp}/slurmctld.log
SlurmdLogFile={tmp}/slurmd.log
PlugStackConfig={tmp}/plugstack.conf
{node} NodeAddr=127.0.0.1 State=UNKNOWN
PartitionName=apstest Nodes={node_name} Default=YES MaxTime=5 State=UP
"""


def tool(name):
    return shutil.which(name) or f"/usr/sbin/{name}"


def node_line():
    """slurmd -C's NodeName line: this machine's real CPUs and memory."""
    out = subprocess.run([tool("slurmd"), "-C"], capture_output=True, text=True,
                         check=True, timeout=20).stdout
    return next(line for line in out.splitlines() if line.startswith("NodeName="))


def stop(proc, timeout=10):
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def tail(path, n=3000):
    path = pathlib.Path(path)
    return f"--- {path.name}:\n" + (path.read_text(errors="replace")[-n:]
                                   if path.exists() else "(none)\n")


class Cluster:
    """munged, slurmctld and slurmd of a one-node cluster in a temporary dir."""

    def __init__(self, tmp):
        self.tmp = tmp
        self.host = socket.gethostname().split(".")[0]
        self.conf = tmp / "slurm.conf"
        self.env = {**{k: v for k, v in os.environ.items() if not k.startswith("SLURM")},
                    "SLURM_CONF": str(self.conf)}
        self.procs = []

    def start(self):
        (self.tmp / "state").mkdir()
        (self.tmp / "spool").mkdir()
        (self.tmp / "plugstack.conf").write_text("")
        node = node_line()
        self.node_name = node.split()[0].split("=")[1]
        self.conf.write_text(SLURM_CONF.format(
            host=self.host, tmp=self.tmp, node=node, node_name=self.node_name,
            ctld_port=free_port(), slurmd_port=free_port()))
        subprocess.run([tool("mungekey"), "-c", "-k", str(self.tmp / "munge.key")],
                       check=True, timeout=20)
        self.spawn("munged", "-F", f"--socket={self.tmp}/munge.sock",
                   f"--key-file={self.tmp}/munge.key", f"--pid-file={self.tmp}/munged.pid",
                   f"--seed-file={self.tmp}/munged.seed")
        self.wait_for(lambda: (self.tmp / "munge.sock").exists(), "munged's socket")
        self.spawn("slurmctld", "-D", "-i", "-f", str(self.conf))
        self.spawn("slurmd", "-D", "-f", str(self.conf))
        self.wait_for(lambda: self.node_state() == "idle", "the node to be idle", 30)

    def spawn(self, name, *args):
        log = open(self.tmp / f"{name}.out", "w")
        self.procs.append(subprocess.Popen([tool(name), *args], stdout=log, stderr=log,
                                           env=self.env, cwd=self.tmp))
        log.close()

    def run(self, *args, timeout=20):
        return subprocess.run(args, capture_output=True, text=True, env=self.env,
                              cwd=ROOT, timeout=timeout)

    def node_state(self):
        return self.run("sinfo", "-h", "-n", self.node_name, "-o", "%T").stdout.strip()

    def wait_for(self, ready, what, timeout=10):
        deadline = time.monotonic() + timeout
        while not ready():
            for p in self.procs:
                if p.poll() is not None:
                    raise RuntimeError(f"{p.args[0]} exited {p.returncode} waiting for "
                                       f"{what}\n" + self.logs())
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {what} after {timeout} s\n" + self.logs())
            time.sleep(0.2)

    def logs(self):
        names = ("munged.out", "slurmctld.log", "slurmd.log", "slurmctld.out", "slurmd.out")
        return "".join(tail(self.tmp / n) for n in names)

    def stop(self):
        """Cancels what still runs, then stops slurmd, slurmctld and munged."""
        try:
            if len(self.procs) == 3 and self.procs[1].poll() is None:
                self.run("scancel", "--full", "--user=root")
                deadline = time.monotonic() + 10
                while (time.monotonic() < deadline
                       and self.run("squeue", "-h", "-o", "%i").stdout.strip()):
                    time.sleep(0.2)
        finally:
            for p in reversed(self.procs):
                stop(p)


@pytest.fixture(scope="module")
def slurm_cluster():
    # munged wants every directory above its socket searchable by all: /tmp, not $TMPDIR
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="apsd-slurm-", dir="/tmp"))
    tmp.chmod(0o755)
    cluster = Cluster(tmp)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def submit(cluster, name, *command):
    """Runs apsd.sbatch as 2 tasks on the one node to its end; returns sbatch's
    exit status, the job id and the job's output."""
    out = cluster.tmp / f"{name}.out"
    port = free_port()
    env = {**cluster.env, "APSD": str(APSD), "APS_PORT": str(port), "PYTHON": sys.executable}
    start = time.monotonic()
    try:
        sub = subprocess.run(["sbatch", "--wait", "--parsable", "--nodes=1", "--ntasks=2",
                              f"--output={out}", "--time=2", str(SBATCH), *command],
                             capture_output=True, text=True, env=env, cwd=ROOT,
                             timeout=JOB_DEADLINE_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the job ran past {JOB_DEADLINE_S} s\n" + tail(out) + cluster.logs())
    text = out.read_text() if out.exists() else "(no output file)\n"
    print(f"{name}: sbatch exited {sub.returncode} after {time.monotonic() - start:.1f} s\n"
          + sub.stderr + text)
    # The shard stopped cleanly (SIGTERM through scancel, not srun's SIGKILL).
    assert "apsd: stopped" in text and "a shard exited" not in text, text
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0, "the shard still listens"
    return sub.returncode, sub.stdout.strip().split(";")[0], text


def test_sbatch_runs_shard_and_workers_on_one_node(slurm_cluster):
    code, job_id, text = submit(slurm_cluster, "check")
    assert code == 0, text + slurm_cluster.logs()
    assert "1 shards: tcp://127.0.0.1:" in text, text
    assert "listening endpoint=tcp://127.0.0.1:" in text, text  # the shard's log, via srun
    assert f"job started job=slurm-{job_id} world_size=2" in text, text
    for rank in range(2):
        assert f"rank {rank}/2: allreduce ok" in text, text
    assert "allreduce check passed: 2 ranks, 1 shards" in text, text
    assert "apsd.sbatch: workers exited with status 0" in text, text
    job = slurm_cluster.run("scontrol", "show", "job", job_id).stdout
    assert "JobState=COMPLETED" in job and "ExitCode=0:0" in job, job


def test_failed_worker_fails_the_job_and_stops_the_shard(slurm_cluster):
    code, job_id, text = submit(slurm_cluster, "fail", "sh", "-c",
                                'echo "task $SLURM_PROCID of $SLURM_NTASKS: $APS_ENDPOINT"; '
                                "exit 3")
    assert code == 3, text
    assert "task 1 of 2: tcp://127.0.0.1:" in text, text
    assert "apsd.sbatch: workers exited with status 3" in text, text
    job = slurm_cluster.run("scontrol", "show", "job", job_id).stdout
    assert "JobState=FAILED" in job and "ExitCode=3:0" in job, job
