"""Elastic jobs (apsd --elastic yes): a rank killed mid-run shrinks the job
instead of failing it, and a rank that comes back takes part again from the
job's next barrier. Real apsd, real worker processes (aps.Client)."""

import concurrent.futures
import json
import os
import signal
import subprocess
import sys
import time

from conftest import ROOT

WORKER = ROOT / "tests" / "integration" / "elastic_worker.py"
ENV = {**os.environ, "PYTHONPATH": str(ROOT / "worker" / "python"),
       "APS_LIBRARY": str(ROOT / "build" / "worker" / "libaps.so.0")}


def start(endpoint, rank, *extra):
    return subprocess.Popen([sys.executable, str(WORKER), "--endpoint", endpoint, "--rank",
                             str(rank), "--world", "3", *extra], env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def read_lines(proc, until, timeout=30):
    """Lines of proc's output until one satisfies until(line)."""
    lines, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if until(line):
            return lines
    raise AssertionError("worker output: " + "".join(lines))


def results(text):
    return {r["step"]: r["values"] for r in map(json.loads, text.splitlines())
            if "step" in r}


def test_lost_rank_shrinks_the_job_and_a_rank_comes_back(daemon_factory, tmp_path):
    daemon = daemon_factory(extra=("--elastic", "yes", "--chunk_bytes", "4k"))  # 3 chunks
    go = tmp_path / "go"
    common = ["--steps", "30", "--barriers", "10,20,30", "--go", str(go)]
    survivors = [start(daemon.endpoint, r, *common) for r in (0, 1)]
    doomed = start(daemon.endpoint, 2, *common)
    read_lines(doomed, lambda line: '"step": 3,' in line)
    doomed.send_signal(signal.SIGKILL)
    doomed.wait()
    daemon.wait_for_log("job shrinks job=elastic members=2")
    back = start(daemon.endpoint, 2, "--steps", "20", "--barriers", "10,20", "--rejoin")
    deadline = time.monotonic() + 30
    while daemon.log_path.read_text().count("hello job=elastic rank=2") < 2:
        assert time.monotonic() < deadline and back.poll() is None, back.stdout.read()
        time.sleep(0.02)
    go.touch()  # the survivors may enter their first barrier: rank 2 is in it too
    outs = [p.communicate(timeout=60)[0] for p in (*survivors, back)]
    for p, out in zip((*survivors, back), outs):
        assert p.returncode == 0, out
    first, second, rejoined = (results(o) for o in outs)
    assert first == second  # every survivor received the same means
    assert sorted(first) == list(range(1, 31))
    # the mean of 1, 2, 3 while rank 2 was there, of 1, 2 once it was gone (one
    # step may mix both across chunks), of 1, 2, 3 again after the barrier
    assert all(first[s] == [2.0] for s in (1, 2, 3))
    shrunk = [s for s in range(4, 11) if first[s] == [1.5]]
    mixed = [s for s in range(4, 11) if first[s] not in ([1.5], [2.0])]
    assert len(shrunk) >= 6 and all(first[s] in ([2.0], [1.5], [1.5, 2.0])
                                    for s in range(4, 11)) and len(mixed) <= 1, first
    assert all(first[s] == [2.0] for s in range(11, 31)), first
    # the rank that came back did steps 11..30 of the job, in step with the others
    assert [rejoined[s] for s in sorted(rejoined)] == [first[s] for s in range(11, 31)]
    assert "rank back job=elastic rank=2 members=3" in daemon.log_path.read_text()


def test_without_elastic_a_lost_rank_fails_the_others(daemon):
    procs = [start(daemon.endpoint, r, "--steps", "200", "--sleep", "0.02") for r in range(3)]
    read_lines(procs[2], lambda line: '"step": 3,' in line)
    procs[2].send_signal(signal.SIGKILL)
    for p in procs[:2]:
        out, _ = p.communicate(timeout=30)
        assert p.returncode != 0 and "a peer rank was lost: rank 2" in out, out
    procs[2].wait()


BARRIER_RANK = """
import sys
import aps
c = aps.Client(sys.argv[1], 2, 3, job="e", timeout_ms=5000)
print("joined", flush=True)
c.barrier()
print("barrier ok", flush=True)
"""


def test_a_rank_lost_inside_a_barrier_can_come_back(daemon_factory):
    # rank 2 enters barrier 0 and is killed there; when it is back, the same
    # barrier takes it (its old place was cleared) and completes with all three
    import aps
    daemon = daemon_factory(extra=("--elastic", "yes"))
    clients = [aps.Client(daemon.endpoint, r, 3, job="e", timeout_ms=10000) for r in (0, 1)]
    first = subprocess.Popen([sys.executable, "-c", BARRIER_RANK, daemon.endpoint], env=ENV,
                             stdout=subprocess.PIPE, text=True)
    assert first.stdout.readline().strip() == "joined"
    daemon.wait_for_log("hello job=e rank=2")
    time.sleep(0.3)  # rank 2 waits in barrier 0 for ranks 0 and 1
    first.kill()
    first.wait()
    daemon.wait_for_log("job shrinks job=e members=2")
    back = subprocess.Popen([sys.executable, "-c", BARRIER_RANK, daemon.endpoint], env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert back.stdout.readline().strip() == "joined"
    with concurrent.futures.ThreadPoolExecutor(2) as pool:  # ranks 0 and 1 enter too
        entered = [pool.submit(c.barrier) for c in clients]
        out, _ = back.communicate(timeout=20)
        assert back.returncode == 0 and "barrier ok" in out, out
        for f in entered:
            f.result(timeout=20)
    for c in clients:
        c.close()


def test_a_rank_back_in_a_job_of_many_tensors_is_told_their_steps_unhurried(daemon_factory):
    # Before (helper-38, 2026-12-08): at the barrier that let a rank back in, apsd sent
    # it one REGISTERED per tensor at once; past about 5000 tensors they passed what
    # the bridge holds for a peer (4096 messages) and the rank was dropped as a slow
    # reader at every comeback (6000 tensors: slow_readers 1, 4097 messages dropped, a
    # reconnect and the barrier sent again). Now they go a batch at a time as its
    # pipe takes them, and then its BARRIER.
    import threading

    import numpy as np

    import aps
    d = daemon_factory(extra=["--elastic", "yes"])
    names = [f"layer{i:05d}.w" for i in range(6000)]

    def step(c, rank):
        xs = [np.full(4, rank + 1.0, np.float32) for _ in names]
        c.allreduce_many_async(list(zip(names, xs))).wait()
        return sum(not np.all(x == 1.5) for x in xs)

    def client(rank):
        return aps.Client(d.endpoint, rank, 2, job="wide", format="fp32", timeout_ms=30000)

    back, wrong = threading.Event(), {}

    def rank1():
        with client(1) as c:
            wrong["first"] = step(c, 1)
        d.wait_for_log("job shrinks job=wide members=1")
        with client(1) as c:
            back.set()
            c.barrier()
            wrong["back"] = step(c, 1)

    t = threading.Thread(target=rank1)
    t.start()
    with client(0) as c:
        wrong["rank0 first"] = step(c, 0)
        assert back.wait(60)
        c.barrier()
        wrong["rank0 back"] = step(c, 0)
    t.join(60)
    assert wrong == {"first": 0, "back": 0, "rank0 first": 0, "rank0 back": 0}, wrong
    d.wait_for_log("rank back job=wide rank=1 members=2 tensors=6000")
    assert (d.counter("slow_readers"), d.counter("dropped"), d.counter("reconnects")) == (0, 0, 0)


def test_a_rank_told_its_steps_gets_its_barriers_in_order(daemon_factory):
    # (helper-39, 2026-12-08) A rank back that sent its next barrier while apsd still
    # told it its tensors' steps had that barrier answered before the one that let it
    # in (BARRIERs 1, 0). Now the next barrier is refused until then.
    from peers import BARRIER, BYE, ERROR, REGISTER, REGISTERED, WELCOME, Peer
    d = daemon_factory(extra=["--elastic", "yes"])
    n = 3000  # more than the pipes and a batch hold: the telling waits for rank 1 to read

    def hello(rank, **small):
        p = Peer(d.endpoint, **small)
        assert p.hello("told", rank, 2, version_minor=11, session=bytes([rank + 1]) * 16,
                       )["type"] == WELCOME
        return p

    ps = [hello(0), hello(1)]
    for r, p in enumerate(ps):
        for first in range(0, n, 500):  # 500 at a time, read as it goes: no slow reader
            for i in range(first, first + 500):
                p.send(type=REGISTER, job="told", rank=r, world_size=2, tensor_name=f"t{i}",
                       total_count=16, format="e4m3", version_minor=11)
            for i in range(500):
                assert p.recv_type(REGISTERED) is not None
    ps[1].send(type=BYE, job="told", rank=1, world_size=2, version_minor=11)
    ps[1].close()
    d.wait_for_log("job shrinks job=told members=1")
    # its pipe holds little, so that the telling is still going when it sends barrier 1
    ps[1] = hello(1, rcvhwm=1000, rcvbuf=4096)
    for r, p in enumerate(ps):
        p.send(type=BARRIER, job="told", rank=r, world_size=2, step=0, version_minor=11)
    got = [ps[1].recv()["type"] for _ in range(100)]
    assert set(got) == {REGISTERED}, got
    for r, p in enumerate(ps):
        p.send(type=BARRIER, job="told", rank=r, world_size=2, step=1, version_minor=11)
    registered, barriers, refusals = 100, [], []
    while (m := ps[1].recv(3000)) is not None:
        if m["type"] == REGISTERED:
            assert not barriers, "a REGISTERED after the BARRIER"
            registered += 1
        elif m["type"] == BARRIER:
            barriers.append(m.get("step", 0))
        elif m["type"] == ERROR:
            refusals.append(m["error_text"])
    assert (registered, barriers) == (n, [0]), (registered, barriers)
    assert len(refusals) == 1 and "not had the answer to barrier 0" in refusals[0], refusals
    for p in ps:
        p.close()
