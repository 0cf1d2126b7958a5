"""python3 -m aps.launch with torchrun's flags: the variables each child gets,
two launchers of one job (--nnodes 2 on loopback), a DDP script whose
gradients go through aps.torch.allreduce_hook, and torchrun itself on Debian
12's torch 1.13 with the flags that avoid its crash under Python 3.11."""

import json
import os
import subprocess
import sys

import pytest

import aps.daemon
from conftest import ROOT

ENV_KEYS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
            "MASTER_PORT", "APS_RANK", "APS_WORLD_SIZE", "APS_ENDPOINT", "APS_JOB",
            "APS_JOB_TOKEN")

READ_ENV = f"""
import json, os
env = {{k: os.environ.get(k) for k in {ENV_KEYS!r}}}
"""

PRINT_ENV = READ_ENV + "print(json.dumps(env), flush=True)\n"

# all-reduces through apsd and through torch.distributed (env://, gloo)
ALLREDUCE = READ_ENV + """
import numpy as np, torch, torch.distributed as dist, aps
torch.set_num_threads(1)
dist.init_process_group("gloo")
with aps.Client.from_env(format="fp32") as c:
    x = np.full(8, float(c.rank + 1), np.float32)
    c.allreduce("x", x)
    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    print(json.dumps({"env": env, "aps": x.tolist(), "gloo": t.item(),
                      "client": [c.rank, c.world_size]}), flush=True)
dist.destroy_process_group()
"""

DDP = """
import hashlib, os, torch, torch.distributed as dist, aps, aps.torch
from torch.nn.parallel import DistributedDataParallel as DDP
torch.set_num_threads(1)
dist.init_process_group("gloo")  # env://: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
rank, world = dist.get_rank(), dist.get_world_size()
calls = []

def hook(client, bucket):
    calls.append(bucket.index())
    return aps.torch.allreduce_hook(client, bucket)

with aps.Client.from_env(format="fp32") as c:
    torch.manual_seed(rank)  # DDP copies rank 0's weights to the others
    model = DDP(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                                    torch.nn.Linear(16, 3)))
    model.register_comm_hook(c, hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(32 * world, 8, generator=g)
    y = x[:, :3].argmax(1)
    part = slice(rank * 32, (rank + 1) * 32)
    losses = []
    for step in range(20):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x[part]), y[part]).backward()
        opt.step()
        with torch.no_grad():
            losses.append(torch.nn.functional.cross_entropy(model(x), y).item())
    digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes()
                                     for p in model.parameters())).hexdigest()
    print("ddp", rank, world, len(calls), losses[0], losses[-1], digest, flush=True)
dist.destroy_process_group()
"""


def launch_env():
    env = {**os.environ, "PYTHONPATH": str(ROOT / "worker" / "python"),
           "APSD": str(ROOT / "build" / "server" / "apsd")}
    for k in ("APS_ENDPOINT", "APS_JOB", "APS_JOB_TOKEN", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    return env


def launch(tmp_path, source, *flags):
    script = tmp_path / "worker.py"
    script.write_text(source)
    return subprocess.Popen([sys.executable, "-m", "aps.launch", *flags, str(script)],
                            env=launch_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def reports(out):
    """The JSON each rank printed, by rank (the "[rank k] " prefix removed)."""
    got = {}
    for line in out.splitlines():
        prefix, _, text = line.partition("] ")
        got[int(prefix[len("[rank "):])] = json.loads(text)
    return got


def run(tmp_path, source, *flags, timeout=90):
    p = launch(tmp_path, source, *flags)
    out, err = p.communicate(timeout=timeout)
    assert p.returncode == 0, err
    return out, err


@pytest.mark.parametrize("spelling", [
    ("--nproc_per_node", "2", "--master_port", "29517", "--master_addr", "127.0.0.1"),
    ("--nproc-per-node=2", "--master-port=29517", "--master-addr=127.0.0.1", "--standalone",
     "--nnodes", "1", "--node_rank", "0"),
])
def test_torchrun_flags_set_each_childs_variables(tmp_path, apsd, spelling):
    out, _ = run(tmp_path, PRINT_ENV, *spelling, "--endpoint", apsd, "--job-token", "t0k")
    envs = reports(out)
    assert sorted(envs) == [0, 1], out
    for rank, env in envs.items():
        assert env == {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2",
                       "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": "29517", "APS_RANK": str(rank), "APS_WORLD_SIZE": "2",
                       "APS_ENDPOINT": apsd, "APS_JOB": envs[0]["APS_JOB"],
                       "APS_JOB_TOKEN": "t0k"}, env


def test_master_port_is_a_free_port_by_default(tmp_path, apsd):
    out, _ = run(tmp_path, PRINT_ENV, "-n", "2", "--endpoint", apsd)
    envs = reports(out)
    ports = {env["MASTER_PORT"] for env in envs.values()}
    assert len(ports) == 1 and 1024 <= int(ports.pop()) < 65536, out
    assert {env["MASTER_ADDR"] for env in envs.values()} == {"127.0.0.1"}


def test_two_nodes_on_loopback_reduce_together(tmp_path):
    # node 1 starts first and waits for node 0's apsd; 4 ranks, 2 on each node
    endpoint = aps.daemon.free_endpoint()
    port = aps.daemon.free_endpoint().rsplit(":", 1)[1]
    nodes = []
    for node in (1, 0):
        node_dir = tmp_path / f"node{node}"
        node_dir.mkdir()
        nodes.append(launch(node_dir, ALLREDUCE, "--nnodes", "2", "--node_rank", str(node),
                            "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
                            "--master_port", port, "--endpoint", endpoint,
                            "--job-token", "two-nodes"))
        if node == 1:
            waiting = nodes[0].stderr.readline()
            assert f"[launch] node 1: waiting up to 300 s for apsd at {endpoint}" in waiting
    (out1, err1), (out0, err0) = [p.communicate(timeout=120) for p in nodes]
    assert nodes[0].returncode == 0 and nodes[1].returncode == 0, err0 + err1
    assert f"started apsd at {endpoint}" in err0 and "started apsd" not in err1
    r0, r1 = reports(out0), reports(out1)
    assert sorted(r0) == [0, 1] and sorted(r1) == [2, 3], out0 + out1
    for rank, r in {**r0, **r1}.items():
        env = r["env"]
        assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"], env["LOCAL_WORLD_SIZE"],
                env["GROUP_RANK"]) == (str(rank), str(rank % 2), "4", "2", str(rank // 2))
        assert env["MASTER_PORT"] == port and env["APS_ENDPOINT"] == endpoint
        assert r["client"] == [rank, 4]
        assert r["aps"] == [2.5] * 8 and r["gloo"] == 10.0, r
    assert len({r["env"]["APS_JOB"] for r in {**r0, **r1}.values()}) == 1
    assert not aps.daemon.is_listening(endpoint), "node 0 left its apsd running"


def test_ddp_comm_hook_runs_under_the_launcher(tmp_path, apsd):
    out, _ = run(tmp_path, DDP, "--nproc_per_node", "2", "--endpoint", apsd)
    lines = sorted(line.split() for line in out.splitlines())
    assert [line[:4] for line in lines] == [["[rank", "0]", "ddp", "0"],
                                            ["[rank", "1]", "ddp", "1"]], out
    for _, _, _, _, world, calls, first, last, _ in lines:
        assert world == "2" and int(calls) >= 20, out
        assert float(last) < 0.8 * float(first), out
    assert lines[0][-1] == lines[1][-1], "the ranks' weights differ"


def fails(*flags, env=None):
    p = subprocess.run([sys.executable, "-m", "aps.launch", *flags, "train.py"],
                       env={**launch_env(), **(env or {})}, capture_output=True, text=True,
                       timeout=60)
    assert p.returncode != 0
    return p.stderr


def test_other_nodes_say_what_they_miss():
    err = fails("--nnodes", "2", "--node_rank", "1", "--job-token", "t")
    assert "node 1 of 2 does not know where apsd is: pass --master_addr HOST" in err, err
    err = fails("--nnodes", "2", "--node_rank", "1", "--master_addr", "127.0.0.1")
    assert "give every node the same --job-token (or APS_JOB_TOKEN)" in err, err
    assert "--node_rank 2 is not one of 0..1" in fails("--nnodes", "2", "--node_rank", "2")
    assert "elastic" in fails("--nnodes", "1:4")
    assert "for one node" in fails("--nnodes", "2", "--standalone", "--master_addr", "h")


def test_nodes_derive_apsd_and_master_from_each_other(monkeypatch):
    from aps import launch as L
    monkeypatch.delenv("APS_ENDPOINT", raising=False)
    args = L._parse(["--nnodes", "2", "--node_rank", "1", "--master_addr", "10.1.2.3",
                     "train.py"])
    assert L._endpoint(args) == "tcp://10.1.2.3:5555"
    layout = L._layout(args, L._endpoint(args))
    assert (layout.master_addr, layout.master_port, layout.world) == ("10.1.2.3", 29500, 2)
    args = L._parse(["--nnodes", "3", "--node_rank", "2", "-n", "4",
                     "--endpoint", "tcp://10.9.9.9:7000", "train.py"])
    layout = L._layout(args, L._endpoint(args))
    assert layout.master_addr == "10.9.9.9" and [layout.rank(i) for i in (0, 3)] == [8, 11]
    monkeypatch.setenv("APS_ENDPOINT", "tcp://10.7.7.7:6000")
    assert L._endpoint(L._parse(["--nnodes", "2", "--node_rank", "1", "x.py"])) == \
        "tcp://10.7.7.7:6000"


def test_the_launcher_starts_no_apsd_beyond_loopback(tmp_path):
    err = fails("--endpoint", f"tcp://0.0.0.0:{aps.daemon.free_endpoint().rsplit(':', 1)[1]}")
    assert "the launcher starts apsd on loopback only" in err, err


def test_torchrun_runs_aps_workers_with_the_debian_workaround(tmp_path, apsd):
    # torch 1.13's Std.from_str under Python 3.11 reads the default "0" of
    # --redirects and --tee as None; --redirects 1 --tee 1 parse
    script = tmp_path / "worker.py"
    script.write_text(ALLREDUCE)
    env = {**launch_env(), "APS_ENDPOINT": apsd, "APS_JOB": "torchrun"}
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--redirects", "1",
                        "--tee", "1", "--nproc_per_node", "2", str(script)], env=env,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    got = [json.loads(line.split(":", 1)[1]) for line in p.stdout.splitlines()
           if line.startswith("[default")]
    assert sorted(r["client"][0] for r in got) == [0, 1], p.stdout
    assert all(r["aps"] == [1.5] * 8 and r["gloo"] == 3.0 for r in got), p.stdout
