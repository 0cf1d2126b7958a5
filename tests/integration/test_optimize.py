"""Optimize mode against the real daemon: apsd holds the weights and steps the
optimizer. In fp32 it matches torch.optim on the same gradients; in low
precision every worker holds, bit for bit, its previous weights plus the
quantized difference to the new master weights, never more than half a
quantization step away from them; checkpoints survive SIGTERM, kill -9,
truncation and corruption."""

import logging
import os
import re
import signal
import subprocess
import threading
import time

import numpy as np
import pytest
import torch

import aps
from conftest import BUILD, Daemon
from peers import EPROTO, ERROR, FLAG_ALIVE, HEARTBEAT, HELLO, REGISTER, WELCOME, Peer
from test_policy import ask

TORCH_OPTIMIZERS = {
    "sgd,momentum=0.9,nesterov=1,weight_decay=0.01":
        lambda p: torch.optim.SGD(p, lr=1, momentum=0.9, nesterov=True, weight_decay=0.01),
    "sgd,momentum=0.5,dampening=0.25": lambda p: torch.optim.SGD(p, lr=1, momentum=0.5,
                                                                 dampening=0.25),
    "sgd": lambda p: torch.optim.SGD(p, lr=1),
    "adam,weight_decay=0.001": lambda p: torch.optim.Adam(p, lr=1, weight_decay=0.001),
    "adamw,beta1=0.8,beta2=0.99": lambda p: torch.optim.AdamW(p, lr=1, betas=(0.8, 0.99)),
}


def clients(d, world, fmt, spec, job="default", **kw):
    return [aps.Client(d.endpoint, r, world, format=fmt, optimizer=spec, job=job,
                       timeout_ms=20000, **kw) for r in range(world)]


def broadcast(cs, name, values):
    """Rank 0's values to every rank; returns each rank's copy."""
    held = [values.copy() if r == 0 else np.zeros_like(values) for r in range(len(cs))]
    for h in [c.broadcast_async(name, w) for c, w in zip(cs, held)]:
        h.wait()
    return held


def step_all(cs, name, grads, held, lr):
    for h in [c.step_async(name, g, w, lr) for c, g, w in zip(cs, grads, held)]:
        h.wait()


def gradients(rng, world, n, step):
    return [(rng.standard_normal(n) * (1 + r) * 0.5 ** (step % 4)).astype(np.float32)
            for r in range(world)]


@pytest.mark.parametrize("spec", sorted(TORCH_OPTIMIZERS))
def test_fp32_matches_torch_optimizer(daemon, spec):
    world, n, rng = 3, 1001, np.random.default_rng(1)
    cs = clients(daemon, world, "fp32", spec)
    w0 = rng.standard_normal(n).astype(np.float32)
    held = broadcast(cs, "w", w0)
    ref = torch.nn.Parameter(torch.from_numpy(w0.copy()))
    opt = TORCH_OPTIMIZERS[spec]([ref])
    for step in range(25):
        lr = 0.05 * (1 + step % 3)  # a learning rate the client sets each step
        grads = gradients(rng, world, n, step)
        step_all(cs, "w", grads, held, lr)
        # torch on the mean gradient, summed in the daemon's order
        mean = grads[0].copy()
        for g in grads[1:]:
            mean += g
        ref.grad = torch.from_numpy(mean / np.float32(world))
        for group in opt.param_groups:
            group["lr"] = float(np.float32(lr))
        opt.step()
        want = ref.detach().numpy()
        for w in held:
            np.testing.assert_allclose(w, want, rtol=2e-5, atol=2e-6,
                                       err_msg=f"{spec} step {step}")
    master = np.empty(n, np.float32)
    assert cs[1].pull("w", master) == 25
    np.testing.assert_allclose(master, want, rtol=2e-5, atol=2e-6)
    for c in cs:
        c.close()


def half_step_bound(delta, fmt, chunk):
    """Per element: half the largest quantization step of the update's chunk at
    its APS scale, plus the fp32 rounding of adding it to the weights."""
    info = aps.format_info(fmt)
    bound = np.empty_like(delta)
    for off in range(0, delta.size, chunk):
        d = delta[off:off + chunk]
        k = aps.aps_exponent(d, fmt, mode="local")
        bound[off:off + chunk] = 0.5 * 2.0 ** (info["emax"] - info["man_bits"] - k)
    return bound


def expected_update(prev, delta, fmt, chunk):
    """What the daemon sends and the worker adds, recomputed here: prev plus the
    quantized difference, chunk by chunk, with the chunk's local APS exponent."""
    out = prev.copy()
    for off in range(0, delta.size, chunk):
        d = np.ascontiguousarray(delta[off:off + chunk])
        k = aps.aps_exponent(d, fmt, mode="local")
        codes = aps.quantize(d, fmt, scale_exp=k)
        part = np.ascontiguousarray(out[off:off + chunk])
        aps.accumulate(codes, fmt, part, scale_exp=k)
        out[off:off + chunk] = part
    return out


@pytest.mark.parametrize("fmt", ["e4m3", "e3m0", "e5m2"])
def test_drift_bound_every_step(daemon_factory, fmt):
    d = daemon_factory(extra=["--chunk_bytes", "4k"])  # 1024-element chunks
    world, n, chunk, rng = 2, 2600, 1024, np.random.default_rng(7)
    cs = clients(d, world, fmt, "sgd,momentum=0.9,weight_decay=0.001")
    held = broadcast(cs, "w", rng.standard_normal(n).astype(np.float32))
    master = np.empty(n, np.float32)
    worst = beyond_half = 0.0
    for step in range(150):
        prev = held[0].copy()
        step_all(cs, "w", gradients(rng, world, n, step), held, 0.02)
        assert cs[0].pull("w", master) == step + 1
        delta = master - prev  # the daemon's difference: it held prev as the workers' view
        np.testing.assert_array_equal(held[0], held[1])  # one downlink for every rank
        np.testing.assert_array_equal(held[0], expected_update(prev, delta, fmt, chunk))
        drift = np.abs(held[0] - master)
        half = half_step_bound(delta, fmt, chunk)
        bound = half + np.spacing(np.abs(master))
        assert (drift <= bound).all(), (step, float((drift - bound).max()))
        worst = max(worst, float((drift / bound).max()))
        beyond_half = max(beyond_half, float((drift - half).max()))
    print(f"{fmt}: 150 steps, worst |worker - master| / bound = {worst:.3f}, "
          f"largest excess over half a step alone {beyond_half:.3g}")
    assert worst > 0.1  # the bound is tight enough to mean something
    for c in cs:
        c.close()


def test_optimize_mode_errors(daemon_factory, tmp_path):
    stats = str(tmp_path / "stats.sock")
    daemon = daemon_factory(extra=["--stats", stats])
    rng = np.random.default_rng(3)
    w = rng.standard_normal(16).astype(np.float32)
    with pytest.raises(aps.ArgumentError, match="rmsprop"):
        aps.Client(daemon.endpoint, 0, 2, optimizer="rmsprop")
    with pytest.raises(aps.ArgumentError, match="rejoin does not apply to optimize mode"):
        aps.Client(daemon.endpoint, 0, 2, optimizer="sgd", rejoin=True)
    with pytest.raises(aps.ArgumentError, match="not several shards"):
        aps.Client([daemon.endpoint, daemon.endpoint], 0, 2, optimizer="sgd")
    c0 = aps.Client(daemon.endpoint, 0, 2, optimizer="sgd,momentum=0.9")
    with pytest.raises(aps.Error, match="runs optimizer 'sgd,momentum=0.899999976"):
        aps.Client(daemon.endpoint, 1, 2, optimizer="adam")
    with pytest.raises(aps.Error, match="all-reduce"):
        aps.Client(daemon.endpoint, 1, 2)  # no optimizer: all-reduce mode
    c1 = aps.Client(daemon.endpoint, 1, 2, optimizer="sgd,momentum=0.9")
    with pytest.raises(aps.ArgumentError, match="optimize mode"):
        c0.allreduce("w", w.copy())
    with pytest.raises(aps.Error, match="no weights yet"):
        c0.step("w", w, w.copy(), 0.1)
    with pytest.raises(aps.Error, match="no weights yet"):
        c1.pull("w", np.empty(16, np.float32))
    with pytest.raises(ValueError, match="learning rate"):
        c0.step("w", w, w.copy(), float("nan"))
    with pytest.raises(TypeError, match="learning rate must be a number, not str"):
        c0.step("w", w, w.copy(), "0.1")  # before: float("0.1"), taken
    plain = aps.Client(daemon.endpoint, 0, 1, job="plain")
    with pytest.raises(aps.ArgumentError, match="all-reduce mode"):
        plain.step("w", w, w.copy(), 0.1)
    with pytest.raises(aps.ArgumentError, match="all-reduce mode"):
        plain.pull("w", w.copy())
    held = broadcast([c0, c1], "w", w)
    step_all([c0, c1], "w", [w, w], held, 0.5)
    jobs = {j["name"]: j for j in ask(stats, "jobs")["jobs"]}
    assert jobs["default"]["mode"] == "optimize" and jobs["plain"]["mode"] == "allreduce"
    assert jobs["default"]["optimizer"].startswith("sgd,momentum=0.899999976,dampening=0")
    tensors = {(t["job"], t["name"]): t for t in ask(stats, "tensors")["tensors"]}
    assert tensors[("default", "w")]["updates"] == 1
    counters = ask(stats, "stats")["counters"]
    assert counters["updates"] == 1 and counters["bad_state"] == 2  # no weights yet, twice
    assert counters["refused_hello"] == 3
    for c in (c0, c1, plain):
        c.close()


def wait_for(d, text, after=0, timeout=20):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        log = d.log_path.read_text()
        if log.count(text) > after:
            return log
        time.sleep(0.005)
    raise TimeoutError(f"apsd never logged {text!r} more than {after} times")


def test_checkpoint_at_sigterm_resumes_weights_and_state(daemon_factory, tmp_path):
    ckdir = tmp_path / "ck"
    ckdir.mkdir()
    args = ["--checkpoint_dir", str(ckdir), "--checkpoint_steps", "5"]
    world, n, rng = 2, 300, np.random.default_rng(5)
    spec = "adam,weight_decay=0.001"
    ref = torch.nn.Parameter(torch.from_numpy(rng.standard_normal(n).astype(np.float32)))
    opt = torch.optim.Adam([ref], lr=0.01, weight_decay=0.001)

    def run(d, held, steps):
        cs_ = clients(d, world, "fp32", spec, job="resnet/1")
        held = broadcast(cs_, "w", held)
        updates = cs_[1].updates("w", held[1])
        for _ in range(steps):
            grads = gradients(rng, world, n, 0)
            step_all(cs_, "w", grads, held, 0.01)
            ref.grad = torch.from_numpy((grads[0] + grads[1]) / np.float32(2))
            opt.step()
            np.testing.assert_allclose(held[0], ref.detach().numpy(), rtol=2e-5, atol=2e-6)
        for c in cs_:
            c.close()
        return held[0], updates

    d = daemon_factory(extra=args)
    before, updates = run(d, ref.detach().numpy().copy(), 12)
    assert updates == 0
    master = np.empty(n, np.float32)
    assert d.stop() == 0  # SIGTERM: the job ended (checkpoint) and the daemon stopped
    log = d.log_path.read_text()
    assert "checkpoint: written job=resnet/1 step=12" in log
    # a periodic snapshot still queued when a newer one of the job comes is replaced by it
    periodic = [s for s in (5, 10) if f"checkpoint: written job=resnet/1 step={s} " in log]
    assert periodic, log
    files = sorted(p.name for p in ckdir.iterdir())
    assert files == [f"resnet%2F1.{periodic[-1]:020d}.ckpt",
                     "resnet%2F1.00000000000000000012.ckpt"], files
    # A restarted daemon: rank 0 broadcasts garbage, every rank gets the resumed weights,
    # and Adam goes on from its resumed state as torch's own optimizer does.
    d2 = daemon_factory(extra=args)
    garbage = np.full(n, 123.0, np.float32)
    cs = clients(d2, world, "fp32", spec, job="resnet/1")
    held = broadcast(cs, "w", garbage)
    np.testing.assert_array_equal(held[1], before)
    assert cs[0].updates("w", held[0]) == 12
    assert cs[0].pull("w", master) == 12
    for c in cs:
        c.close()
    # No step since the checkpoint it resumed: the job's end writes nothing (it
    # wrote the same file again before 2026-12-07)
    wait_for(d2, "job ended job=resnet/1")
    assert "checkpoint: written job=resnet/1" not in d2.log_path.read_text()
    after, updates = run(d2, garbage, 6)
    assert updates == 12
    assert "resuming job=resnet/1 step=12" in d2.log_path.read_text()


def test_kill9_during_checkpoint_loses_at_most_the_last_steps(daemon_factory, tmp_path):
    ckdir = tmp_path / "ck"
    ckdir.mkdir()
    k, n, rng = 3, 1 << 20, np.random.default_rng(11)  # 12 MiB of Adam state a file
    args = ["--checkpoint_dir", str(ckdir), "--checkpoint_steps", str(k)]
    d = Daemon(tmp_path, extra=args)  # not the fixture's: it must not exit 0
    cs = clients(d, 1, "e4m3", "adam")
    held = broadcast(cs, "w", rng.standard_normal(n).astype(np.float32))
    master = np.empty(n, np.float32)
    history = {}
    for step in range(1, 2 * k + 2):
        step_all(cs, "w", gradients(rng, 1, n, step), held, 0.001)
        assert cs[0].pull("w", master) == step
        history[step] = master.copy()
    wait_for(d, "checkpoint: written job=default step=6")
    # the checkpoint of step 9 is queued when the step ends: kill -9 while it is written
    step_all(cs, "w", gradients(rng, 1, n, 8), held, 0.001)
    step_all(cs, "w", gradients(rng, 1, n, 9), held, 0.001)
    cs[0].pull("w", master)
    history[9] = master.copy()
    wait_for(d, "checkpoint: queued job=default step=9")
    os.kill(d.proc.pid, signal.SIGKILL)
    d.proc.wait()
    d.log.close()
    cs[0].close()
    completed = [s for s in (6, 9) if f"written job=default step={s}" in d.log_path.read_text()]
    torn = [p.name for p in ckdir.iterdir() if p.name.endswith(".tmp")]
    print(f"killed: completed {completed}, left over {torn}")

    def resume():
        dd = daemon_factory(extra=args)
        c = aps.Client(dd.endpoint, 0, 1, format="e4m3", optimizer="adam", timeout_ms=20000)
        w = np.zeros(n, np.float32)
        c.broadcast("w", w)
        updates = c.updates("w", w)
        c.close()
        assert dd.stop() == 0
        return w, updates, dd.log_path.read_text()

    w, updates, _ = resume()
    # the step-9 file is either whole (written before the kill) or absent: never half
    assert updates in (6, 9) and updates >= max(completed), (updates, completed)
    np.testing.assert_array_equal(w, history[updates])
    # A torn or corrupt newest file is skipped: the one before it is used.
    newest = max(ckdir.glob("*.ckpt"))
    size = newest.stat().st_size
    os.truncate(newest, size // 2)
    w, updates2, log = resume()
    assert updates2 < updates
    np.testing.assert_array_equal(w, history[updates2])
    assert f"skipped path={newest}" in log


def test_corrupt_checkpoint_is_skipped(daemon_factory, tmp_path):
    ckdir = tmp_path / "ck"
    ckdir.mkdir()
    args = ["--checkpoint_dir", str(ckdir), "--checkpoint_steps", "2", "--checkpoint_keep", "3"]
    d = daemon_factory(extra=args)
    cs = clients(d, 1, "fp32", "sgd,momentum=0.9")
    rng = np.random.default_rng(2)
    held = broadcast(cs, "w", rng.standard_normal(100).astype(np.float32))
    history, master = {}, np.empty(100, np.float32)
    for step in range(1, 5):
        step_all(cs, "w", gradients(rng, 1, 100, step), held, 0.1)
        cs[0].pull("w", master)
        history[step] = master.copy()
    wait_for(d, "checkpoint: written job=default step=4")
    # SIGTERM with the job alive: no step since step 4's checkpoint, so none at
    # stop (before 2026-12-07 it wrote step 4 again), then exit
    assert d.stop() == 0
    assert "queued job=default step=4 reason=\"stopping\"" not in d.log_path.read_text()
    assert d.log_path.read_text().count("checkpoint: written job=default step=4") == 1
    cs[0].close()
    newest = ckdir / "default.00000000000000000004.ckpt"
    data = bytearray(newest.read_bytes())
    data[len(data) // 2] ^= 0x40  # one flipped bit in the weights
    newest.write_bytes(bytes(data))
    d2 = daemon_factory(extra=args)
    c = aps.Client(d2.endpoint, 0, 1, format="fp32", optimizer="sgd,momentum=0.9")
    w = np.zeros(100, np.float32)
    c.broadcast("w", w)
    assert c.updates("w", w) == 2
    np.testing.assert_array_equal(w, history[2])
    c.close()
    log = d2.log_path.read_text()
    assert f"skipped path={newest}" in log and "CRC32C" in log


def test_max_job_bytes_counts_weights_and_state(daemon_factory):
    # (no reconnects: no kept results counted, test_daemon.py counts those)
    d = daemon_factory(extra=["--max_job_bytes", "1k", "--reconnect_grace_ms", "0"])
    x = np.zeros(60, np.float32)  # 240 bytes to all-reduce, 1200 with Adam's weights and state
    plain = aps.Client(d.endpoint, 0, 1, job="plain")
    plain.allreduce("x", x)
    adam = aps.Client(d.endpoint, 0, 1, job="adam", optimizer="adam")
    with pytest.raises(aps.Error, match="would hold 1200 fp32 bytes"):
        adam.broadcast("x", x)
    adam.close()
    plain.close()


def test_a_pull_of_many_chunks_is_not_a_slow_reader(daemon_factory):
    # Before: a pull's answer of more chunks than the bridge's queue bound (4096
    # waiting behind the pipe) dropped the puller as a slow reader; its client
    # reconnected and pulled again, 160 times in 15 s, and timed out.
    d = daemon_factory(extra=["--chunk_bytes", "1k"])
    n = 2_000_000  # 7813 chunks of 256 floats
    w = np.arange(n, dtype=np.float32)
    with aps.Client(d.endpoint, 0, 1, format="fp32", optimizer="sgd", timeout_ms=10000) as c:
        c.broadcast("w", w)
        c.step("w", np.ones(n, np.float32), w, 0.5)
        for _ in range(3):
            out = np.zeros(n, np.float32)
            assert c.pull("w", out) == 1
            np.testing.assert_array_equal(out, w)
    assert d.counter("slow_readers") == 0
    assert d.counter("reconnects") == 0


def test_learning_rate_is_rank_0s(daemon):
    cs = clients(daemon, 2, "fp32", "sgd")
    w0 = np.ones(8, np.float32)
    held = broadcast(cs, "w", w0)
    g = np.full(8, 2.0, np.float32)
    # rank 1 pushes first, with another learning rate: rank 0's is the step's
    h1 = cs[1].step_async("w", g, held[1], 5.0)
    time.sleep(0.2)
    cs[0].step("w", g, held[0], 0.25)
    h1.wait()
    np.testing.assert_array_equal(held[0], np.full(8, 0.5, np.float32))
    np.testing.assert_array_equal(held[1], held[0])
    for c in cs:
        c.close()


@pytest.mark.parametrize("fmt", ["fp32", "e4m3"])
def test_diloco_from_c_through_aps_client_step(daemon, fmt):
    """worker/examples/diloco.c: DiLoCo's outer loop on the C ABI alone (optimize mode
    with Nesterov SGD as the outer optimizer, the pseudo-gradient through
    aps_client_step): every rank ends on the same weights, within half a quantization
    step of the daemon's master (exactly in fp32), after steps / every outer steps."""
    exe = BUILD / "tests" / "integration" / "diloco_example"
    procs = [subprocess.Popen([str(exe), "--endpoint", daemon.endpoint, "--rank", str(r),
                               "--world", "3", "--format", fmt, "--steps", "40", "--every",
                               "4"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) for r in range(3)]
    ends = []
    for p in procs:
        out, _ = p.communicate(timeout=60)
        assert p.returncode == 0, out
        start = float(re.search(r"^start loss=(\S+)", out, re.M).group(1))
        end = re.search(r"^end loss=(\S+) updates=(\d+) weights=(\w+) "
                        r"max\|master-weights\|=(\S+)", out, re.M)
        assert len(re.findall(r"^sync step=", out, re.M)) == 10
        assert float(end.group(1)) < start / 4, out
        ends.append(end.groups()[1:])
    assert all(e[:2] == ends[0][:2] for e in ends) and ends[0][0] == "10"
    off = float(ends[0][2])
    assert off == 0 if fmt == "fp32" else 0 < off < 0.01, ends


def test_only_the_job_token_that_wrote_a_checkpoint_resumes_it(daemon_factory, tmp_path):
    # (found by an attack on 2026-12-07) Between two runs of a job with a token,
    # its name is free: a stranger's HELLO to it in optimize mode, with no
    # token or another, resumed the job's checkpoint. Its PULL read the
    # weights, one step with lr 1e6 made them -1e36, and its BYE wrote them as
    # the newest file, which the job's next run resumed. Now the file keeps a
    # salted digest of the token that wrote it: the stranger's HELLO is refused
    # (APS_EACCES, from the file's header, unread), nothing is written, and the
    # job's next run resumes its own weights.
    ckdir = tmp_path / "ck"
    ckdir.mkdir()
    d = daemon_factory(extra=["--checkpoint_dir", str(ckdir), "--checkpoint_steps", "0"])
    w = np.arange(1, 9, dtype=np.float32)
    c = aps.Client(d.endpoint, 0, 1, format="fp32", optimizer="sgd", job="train",
                   job_token="s3cret", timeout_ms=10000)
    c.broadcast("fc.weight", w)
    for _ in range(3):
        c.step("fc.weight", np.full(8, 0.5, np.float32), w, 0.1)
    trained = w.copy()
    c.close()
    wait_for(d, "checkpoint: written job=train step=3")
    files = sorted(os.listdir(ckdir))
    assert b"s3cret" not in (ckdir / files[0]).read_bytes()
    for token in ("", "guess"):
        t0 = time.monotonic()
        with pytest.raises(aps.Error, match="written under another job token") as e:
            aps.Client(d.endpoint, 0, 1, format="fp32", optimizer="sgd", job="train",
                       job_token=token, timeout_ms=10000)
        assert e.value.name == "APS_EACCES" and time.monotonic() - t0 < 2
    assert sorted(os.listdir(ckdir)) == files
    assert d.counter("refused_token") == 2 and d.counter("resumed") == 0
    c = aps.Client(d.endpoint, 0, 1, format="fp32", optimizer="sgd", job="train",
                   job_token="s3cret", timeout_ms=10000)
    back = np.zeros(8, np.float32)
    c.broadcast("fc.weight", back)  # a resumed job hands the daemon's weights back
    np.testing.assert_array_equal(back, trained)
    c.close()


def test_a_checkpoint_counts_against_max_total_bytes_before_it_is_read(daemon_factory,
                                                                       tmp_path):
    # (found by the same attack) A job's checkpoint was read whole at its first
    # HELLO, on the event loop, and what no tensor had taken back yet was held
    # outside max_total_bytes: 8 resumes of 116 MB took apsd to 923 MiB under
    # a bound of 256 MiB. Now a checkpoint larger than what the bounds leave
    # refuses the HELLO from its header (APS_ERANGE), and one that fits counts
    # until its tensors take it (then as their weights and state, once).
    ckdir = tmp_path / "ck"
    ckdir.mkdir()
    args = ["--checkpoint_dir", str(ckdir), "--checkpoint_steps", "0",
            "--reconnect_grace_ms", "0"]
    d = daemon_factory(extra=args)
    n = 1 << 20  # adam: weights and 2 state arrays, 12 MiB in a file
    for job in ("a", "b"):
        c = aps.Client(d.endpoint, 0, 1, format="fp32", optimizer="adam", job=job)
        c.broadcast("w", np.ones(n, np.float32))
        c.step("w", np.ones(n, np.float32), np.ones(n, np.float32), 0.1)
        c.close()
        wait_for(d, f"checkpoint: written job={job} step=1")
    d.stop()
    # one address (127.0.0.1) may hold all of it here
    d = daemon_factory(extra=args + ["--max_total_bytes", "22M", "--max_address_bytes", "22M"])
    a = aps.Client(d.endpoint, 0, 1, format="fp32", optimizer="adam", job="a")
    other = aps.Client(d.endpoint, 0, 1, job="other")
    with pytest.raises(aps.Error, match="max_total_bytes") as e:
        other.allreduce("x", np.zeros(3 << 20, np.float32))  # 12 MiB, and a's 12 held
    assert e.value.name == "APS_ERANGE"
    other.close()
    t0 = time.monotonic()
    with pytest.raises(aps.Error,
                       match="fit max_job_bytes, max_address_bytes and max_total_bytes") as e:
        aps.Client(d.endpoint, 0, 1, format="fp32", optimizer="adam", job="b")
    assert e.value.name == "APS_ERANGE" and time.monotonic() - t0 < 2
    w = np.zeros(n, np.float32)
    a.broadcast("w", w)  # takes its 12 MiB back: 20 MiB with the sum and view, once
    assert a.updates("w", w) == 1 and np.all(w < 1)
    a.close()
    b = aps.Client(d.endpoint, 0, 1, format="fp32", optimizer="adam", job="b")
    b.broadcast("w", w)
    assert b.updates("w", w) == 1
    b.close()
    assert d.counter("resumed") == 2 and d.counter("refused_memory") == 1


def step_once_and_end(d, job, endpoint=None, n=1 << 18):
    """A one-rank job in optimize mode (plain sgd: 1 MiB a file) that steps once
    and ends: its checkpoint is written at its end."""
    c = aps.Client(endpoint or d.endpoint, 0, 1, format="fp32", optimizer="sgd", job=job)
    w = np.ones(n, np.float32)
    c.broadcast("w", w)
    c.step("w", np.ones(n, np.float32), w, 0.1)
    c.close()
    wait_for(d, f"job={job} step=1")


def test_checkpoints_of_every_job_stay_within_checkpoint_max_bytes(daemon_factory, tmp_path):
    # (found by the same attack) One-rank jobs under new names, each stepped
    # once and ended, wrote a file each with no bound: 80 files, 1221 MiB in
    # 15 s, and a full disk fails every job's checkpoints (and the host's
    # logs). Now checkpoint_max_bytes bounds them (a quarter of the
    # filesystem by default), a job that took no step writes nothing, and
    # room for a new file comes from the files of ended jobs, the oldest of
    # their writer's first (one writer here: 127.0.0.1).
    ckdir = tmp_path / "ck"
    ckdir.mkdir()
    d = daemon_factory(extra=["--checkpoint_dir", str(ckdir), "--checkpoint_steps", "0",
                              "--checkpoint_max_bytes", "3M"])
    c = aps.Client(d.endpoint, 0, 1, format="fp32", optimizer="sgd", job="broadcast-only")
    c.broadcast("w", np.ones(1 << 18, np.float32))
    c.close()
    for i in range(4):
        step_once_and_end(d, f"j{i}")
    # "queued" comes first: the write's own line follows from its thread
    log = wait_for(d, "checkpoint: written job=j3 step=1")
    assert re.search(r'checkpoint: evicted job=j0 step=1 bytes=\d+ writer="127.0.0.1" for=j2 ',
                     log), log
    assert "evicted job=j1 step=1" in log and "for=j3" in log
    assert d.counter("checkpoint_failures") == 0 and d.counter("checkpoints") == 4
    assert d.counter("checkpoints_evicted") == 2
    files = sorted(os.listdir(ckdir))
    assert files == ["j2.00000000000000000001.ckpt", "j3.00000000000000000001.ckpt"], files
    assert sum((ckdir / f).stat().st_size for f in files) <= 3 << 20


def test_a_stranger_who_fills_checkpoint_max_bytes_removes_its_own_files(daemon_factory,
                                                                          tmp_path):
    # Before: a stranger whose jobs stepped once each and ended filled
    # checkpoint_max_bytes, and from then on every honest job's checkpoint
    # failed (checkpoint_failures; here honest-new's). Now room comes from the
    # files of jobs that ended, the writer holding the most bytes first (the
    # stranger, 127.0.0.2), its oldest first: the honest ended job's file stays.
    ckdir = tmp_path / "ck"
    ckdir.mkdir()
    d = daemon_factory(extra=["--checkpoint_dir", str(ckdir), "--checkpoint_steps", "0",
                              "--checkpoint_max_bytes", "4M"])  # 3 files of 1 MiB and a header
    stranger = d.endpoint.replace("tcp://", "tcp://127.0.0.2:0;")
    step_once_and_end(d, "honest-old")
    for i in range(6):
        step_once_and_end(d, f"s{i}", stranger)
    step_once_and_end(d, "honest-new")
    log = wait_for(d, "checkpoint: written job=honest-new step=1")
    assert d.counter("checkpoint_failures") == 0, log
    assert d.counter("checkpoints") == 8 and d.counter("checkpoints_evicted") == 5
    assert re.search(r'evicted job=s4 step=1 bytes=\d+ writer="127.0.0.2" for=honest-new ', log)
    assert "evicted job=honest-old" not in log
    files = sorted(f.split(".")[0] for f in os.listdir(ckdir))
    assert files == ["honest-new", "honest-old", "s5"], files
    assert sum((ckdir / f).stat().st_size for f in os.listdir(ckdir)) <= 4 << 20
    # the file resumes: what was evicted is gone, what stayed is whole
    c = aps.Client(d.endpoint, 0, 1, format="fp32", optimizer="sgd", job="honest-old")
    assert c.updates("w", np.zeros(1 << 18, np.float32)) == 1
    c.close()
    assert d.counter("resumed") == 1


def beside_another_job(d, work):
    """Runs work() on a thread while a one-rank job steps a small tensor as fast as
    it can; returns how long work took and the other job's longest step."""
    other = aps.Client(d.endpoint, 0, 1, job="other")
    x = np.ones(1024, np.float32)
    other.allreduce("x", x)
    spans, done = [], threading.Event()

    def timed():
        t0 = time.monotonic()
        try:
            work()
            spans.append(time.monotonic() - t0)
        finally:
            done.set()

    t = threading.Thread(target=timed)
    t.start()
    worst, last = 0.0, time.monotonic()
    while not done.is_set():
        other.allreduce("x", x)
        now = time.monotonic()
        worst, last = max(worst, now - last), now
    t.join()
    other.close()
    assert spans, "the work raised"
    return spans[0], worst


def test_a_resume_reads_its_checkpoint_off_the_loop(daemon_factory, tmp_path, caplog):
    # Before: a job's first HELLO read its checkpoint whole on the event loop,
    # so every other job stood still while it was read: a 384 MiB file held
    # another job's step for the whole 2.9 s of the read. Now it is read on a
    # thread (0.13 s, the longest step, with the machine loaded); the job's
    # ranks are welcomed when it is in.
    ckdir = tmp_path / "ck"
    ckdir.mkdir()
    d = daemon_factory(extra=["--checkpoint_dir", str(ckdir), "--checkpoint_steps", "0",
                              "--reconnect_grace_ms", "0"])
    n = 32 << 20  # adam: weights and 2 state arrays, 384 MiB in the file
    w = np.ones(n, np.float32)
    c = aps.Client(d.endpoint, 0, 1, format="fp32", optimizer="adam", job="big",
                   timeout_ms=60000)
    c.broadcast("w", w)
    c.step("w", w, w, 0.1)
    c.close()
    d.wait_for_log("checkpoint: written job=big step=1", timeout=60)
    del w
    big = []

    def resume():
        big.append(aps.Client(d.endpoint, 0, 1, format="fp32", optimizer="adam", job="big",
                              timeout_ms=60000))

    took, worst = beside_another_job(d, resume)
    big[0].close()
    print(f"resume {took:.3f} s, the other job's longest step meanwhile {worst:.3f} s")
    assert d.counter("resumed") == 1
    assert took > 0.1, took  # a read the loop would notice
    assert worst < took / 4, (worst, took)
    # While it is read, its ranks may say HELLO, HEARTBEAT and BYE only: a
    # REGISTER before the WELCOME would start a tensor without its weights
    wait_for(d, "job ended job=big", after=1, timeout=60)
    assert d.log_path.read_text().count("checkpoint: written job=big") == 1  # no step since
    p = Peer(d.endpoint)
    bad_state, bad_session = d.counter("bad_state"), d.counter("bad_session")
    p.send(type=HELLO, job="big", rank=0, world_size=1, optimizer="adam", format="fp32")
    p.send(type=REGISTER, job="big", rank=0, world_size=1, tensor_name="w", total_count=n,
           format="fp32")
    # (one that claims another job is that, whatever its own job does)
    p.send(type=REGISTER, job="small", rank=0, world_size=1, tensor_name="w", total_count=n,
           format="fp32")
    # (1.11) and hear how far the read is, every 250 ms: HEARTBEAT flagged
    # ALIVE, total_count the file's KiB, chunk_offset those read
    replies, reading = [], None
    while not replies or replies[-1]["type"] != WELCOME:
        replies.append(p.recv(20000))
        assert replies[-1] is not None, replies[:-1]
        if reading is None and replies[-1]["type"] == HEARTBEAT:  # and apsctl jobs says
            reading = [j for j in d.ask("jobs")["jobs"] if j["name"] == "big"][0]
    err = [r for r in replies if r["type"] == ERROR]
    assert len(err) == 2 and all(e["error_code"] == EPROTO for e in err), replies
    assert "REGISTER before the WELCOME: job 'big' is reading its checkpoint" \
        in err[0]["error_text"], err
    assert "REGISTER as rank 0 of job 'small' from rank 0 of job 'big'" in err[1]["error_text"]
    told = [r for r in replies if r["type"] == HEARTBEAT]
    assert len(told) + 3 == len(replies) and len(told) >= 2, replies
    kib = [f.stat().st_size for f in ckdir.glob("big.*.ckpt")][0] / 1024
    assert all(r["flags"] == FLAG_ALIVE and abs(r["total_count"] - kib) < 1 for r in told), told
    read = [r.get("chunk_offset", 0) for r in told]
    assert read == sorted(read) and read[-1] <= told[-1]["total_count"], read
    assert reading["reading_checkpoint"] and reading["checkpoint_bytes"] == kib * 1024, reading
    assert 0 <= reading["checkpoint_read_bytes"] <= reading["checkpoint_bytes"], reading
    assert d.counter("bad_state") == bad_state + 1 and d.counter("resumed") == 2
    assert d.counter("bad_session") == bad_session + 1
    p.close()
    wait_for(d, "job ended job=big", after=2, timeout=60)
    # A client whose timeout_ms is shorter than the read waits for it while it
    # is read. Before: "apsd ... did not answer within timeout_ms = 600 (is it
    # stopped or overloaded ...)", and each try started the read again.
    t0 = time.monotonic()
    with caplog.at_level(logging.INFO, logger="aps.client"):
        late = aps.Client(d.endpoint, 0, 1, format="fp32", optimizer="adam", job="big",
                          timeout_ms=600)
    took = time.monotonic() - t0
    late.close()
    assert took > 0.6, f"the read took {took:.2f} s: not longer than timeout_ms"
    assert d.counter("resumed") == 3
    assert "apsd reads the checkpoint of job 'big' before it lets rank 0 in" in caplog.text


def test_a_checkpoint_is_copied_off_the_loop(daemon_factory, tmp_path):
    # Before: at every checkpoint_steps the job's weights and Adam state (384
    # MiB here) were copied on the event loop, and every other job stood still
    # meanwhile: another job's step waited 4.4 s (14.3 s with the machine
    # loaded). Now a thread copies them; the job's own updates wait for the
    # copy, and the other job steps on (its longest step 0.36 s, loaded).
    ckdir = tmp_path / "ck"
    ckdir.mkdir()
    d = daemon_factory(extra=["--checkpoint_dir", str(ckdir), "--checkpoint_steps", "1"])
    n = 32 << 20
    w = np.ones(n, np.float32)
    c = aps.Client(d.endpoint, 0, 1, format="fp32", optimizer="adam", job="big",
                   timeout_ms=60000)
    c.broadcast("w", w)

    seen = set()

    def steps():
        for _ in range(3):
            c.step("w", w, w, 0.1)

    def watch():  # what `apsctl jobs` says the job's rounds wait for
        while not done.is_set():
            try:
                jobs = d.ask("jobs")["jobs"]
            except (OSError, ValueError):  # an answer late past 5 s (under ASan, loaded)
                continue
            for j in jobs:
                seen.update((s["waiting_for"], bool(s["missing"]))
                            for s in j["stalls"] if j["name"] == "big")
            time.sleep(0.02)

    done = threading.Event()
    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        took, worst = beside_another_job(d, steps)
    finally:
        done.set()
        watcher.join()
    print(f"3 steps with checkpoints {took:.3f} s, the other job's longest step {worst:.3f} s")
    wait_for(d, "checkpoint: written job=big step=3", timeout=60)
    assert worst < took / 4, (worst, took)
    # a step whose finish waits for the copy is said to (before: a stall that
    # waited for ranks [], none)
    assert ("checkpoint_copy", False) in seen and ("ranks", False) not in seen, seen
    c.close()


def test_sigterm_while_a_snapshot_is_copied_writes_it_and_exits_0(daemon_factory, tmp_path):
    # (found by an attack on the copy off the loop, 2026-12-07) Step 2's
    # pushes came while step 1's snapshot was copied, so their finish waited
    # for the copy; SIGTERM then freed the socket, and the copy's end sent
    # step 2's results through it: apsd crashed (SIGSEGV), step 1's file
    # unwritten. Now a stopping daemon sends nothing more, writes the snapshot,
    # and exits 0.
    ckdir = tmp_path / "ck"
    ckdir.mkdir()
    d = daemon_factory(extra=["--checkpoint_dir", str(ckdir), "--checkpoint_steps", "1"])
    n = 32 << 20
    x, g = np.ones(n, np.float32), np.full(n, 0.5, np.float32)
    c = aps.Client(d.endpoint, 0, 1, format="fp32", optimizer="adam", job="B", timeout_ms=60000)
    c.broadcast("x", x)
    c.step("x", g, x, 0.1)
    c.step_async("x", g, x, 0.1)
    time.sleep(0.05)
    assert d.stop() == 0
    assert "checkpoint: written job=B step=1" in d.log_path.read_text()


def test_a_tensor_registered_late_does_not_make_the_newest_file_look_old(daemon_factory,
                                                                         tmp_path):
    # (found by the same attack) A file was named after the smallest update
    # count of its tensors: x stepped twice (file 2), then y came and stepped
    # once with x's third, and the job's last file was named 1, older than 2.
    # The next run resumed file 2: x one step back, y gone. Now a file is
    # named after the largest count, and the newest file is the last written.
    ckdir = tmp_path / "ck"
    ckdir.mkdir()
    args = ["--checkpoint_dir", str(ckdir), "--checkpoint_steps", "1"]
    d = daemon_factory(extra=args)
    c = aps.Client(d.endpoint, 0, 1, format="fp32", optimizer="adam", job="U")
    x, y = np.ones(64, np.float32), np.ones(32, np.float32)
    c.broadcast("x", x)
    for _ in range(2):
        c.step("x", np.full(64, 0.5, np.float32), x, 0.1)
    c.broadcast("y", y)
    c.step("y", np.full(32, 0.25, np.float32), y, 0.1)
    c.step("x", np.full(64, 0.5, np.float32), x, 0.1)
    c.close()
    wait_for(d, "checkpoint: written job=U step=3 tensors=2")
    assert d.stop() == 0
    d2 = daemon_factory(extra=args)
    c = aps.Client(d2.endpoint, 0, 1, format="fp32", optimizer="adam", job="U")
    rx, ry = np.zeros(64, np.float32), np.zeros(32, np.float32)
    assert c.pull("x", rx) == 3 and c.pull("y", ry) == 1
    np.testing.assert_array_equal(rx, x)
    np.testing.assert_array_equal(ry, y)
    c.close()
