"""python3 -m aps.launch: starts apsd when none listens, runs N workers with
their rank variables and prefixed output, and stops everything when one fails
or on Ctrl-C."""

import os
import signal
import subprocess
import sys
import time

import aps.daemon
from conftest import ROOT

WORKER = """
import os, sys, time, aps
with aps.Client.from_env() as c:
    print("hello", os.environ["RANK"], os.environ["WORLD_SIZE"], c.job,
          "token=" + os.environ.get("APS_JOB_TOKEN", ""), flush=True)
    c.barrier()
    mode = sys.argv[1]
    if mode == "fail" and c.rank == 1:
        sys.exit(3)
    if mode in ("fail", "hang"):
        print("waiting", flush=True)
        time.sleep(60)
"""


def launch(tmp_path, mode, endpoint, *extra):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "worker" / "python"),
           "APSD": str(ROOT / "build" / "server" / "apsd")}
    env.pop("APS_JOB", None)
    env.pop("APS_JOB_TOKEN", None)
    return subprocess.Popen([sys.executable, "-m", "aps.launch", "-n", "2", "--endpoint",
                             endpoint, *extra, str(script), mode], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_launch_starts_apsd_and_prefixes_output(tmp_path):
    endpoint = aps.daemon.free_endpoint()
    p = launch(tmp_path, "ok", endpoint)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    lines = sorted(out.splitlines())
    assert lines[0].startswith("[rank 0] hello 0 2 launch-") and \
        lines[1].startswith("[rank 1] hello 1 2 launch-"), out
    assert f"started apsd at {endpoint}" in err
    assert not aps.daemon.is_listening(endpoint), "the launcher left its apsd running"


def test_launch_gives_the_job_a_token(tmp_path):
    # a random one per launch, the same for every rank; or the one it is given
    endpoint = aps.daemon.free_endpoint()
    p = launch(tmp_path, "ok", endpoint)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    tokens = {line.split("token=")[1] for line in out.splitlines()}
    assert len(tokens) == 1 and len(tokens.pop()) == 32, out
    p = launch(tmp_path, "ok", endpoint, "--job-token", "s3cret")
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    assert out.count("token=s3cret") == 2, out


def test_launch_starts_every_shard_of_an_endpoint_list(tmp_path):
    endpoints = [aps.daemon.free_endpoint() for _ in range(2)]
    p = launch(tmp_path, "ok", ",".join(endpoints))
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    assert len(out.splitlines()) == 2, out
    for e in endpoints:
        assert f"started apsd at {e}" in err
        assert not aps.daemon.is_listening(e), "the launcher left a shard running"


def test_a_failed_worker_stops_the_others_and_sets_the_exit_status(tmp_path, apsd):
    start = time.monotonic()
    p = launch(tmp_path, "fail", apsd)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 3, err
    assert "rank 1 exited with status 3; stopping the others" in err
    assert time.monotonic() - start < 30  # rank 0 slept 60 s: it was stopped


def test_ctrl_c_stops_everything(tmp_path):
    endpoint = aps.daemon.free_endpoint()
    p = launch(tmp_path, "hang", endpoint)
    seen = []
    while len([s for s in seen if "waiting" in s]) < 2:
        line = p.stdout.readline()
        assert line, p.stderr.read()
        seen.append(line)
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=30)
    assert p.returncode == 130 and "interrupted" in err
    assert not aps.daemon.is_listening(endpoint)


def test_no_daemon_flag_refuses_to_start_one(tmp_path):
    endpoint = aps.daemon.free_endpoint()
    p = launch(tmp_path, "ok", endpoint, "--no-daemon")
    _, err = p.communicate(timeout=30)
    assert p.returncode != 0 and f"nothing listens at {endpoint}" in err


def test_workers_get_fixed_malloc_thresholds_unless_they_set_malloc():
    from aps.launch import Layout, worker_env
    layout = Layout(nproc=1, nnodes=1, node_rank=0, master_addr="127.0.0.1",
                    master_port=29500)
    env = worker_env(layout, 0, "tcp://127.0.0.1:5555", "j", base={})
    assert env["MALLOC_MMAP_THRESHOLD_"] == str(16 << 20)
    assert env["MALLOC_TRIM_THRESHOLD_"] == str(32 << 20)
    for own in ({"MALLOC_ARENA_MAX": "2"}, {"GLIBC_TUNABLES": "glibc.malloc.tcache_count=0"}):
        env = worker_env(layout, 0, "tcp://127.0.0.1:5555", "j", base=own)
        assert "MALLOC_TRIM_THRESHOLD_" not in env and "MALLOC_MMAP_THRESHOLD_" not in env
