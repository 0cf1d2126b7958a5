"""Hybrid precision against the real daemon: the automatic policy moves only the
tensor whose data is too wide for the format, small tensors travel in fp32, and
every rank switches at the same step."""

import json
import socket
import time

from conftest import run_workers
from test_daemon import assert_all_ok


def ask(path, command):
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(5)
        s.connect(path)
        s.sendall(command.encode() + b"\n")
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    return json.loads(data)


def tensors_at(stats, steps, timeout=30):
    """The tensor report once every tensor has completed `steps` steps."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            tensors = {t["name"]: t for t in ask(stats, "tensors")["tensors"]}
            if tensors and all(t["steps"] >= steps for t in tensors.values()):
                return tensors
        except (OSError, ValueError):
            pass
        time.sleep(0.05)
    raise TimeoutError(f"the tensors never reached step {steps}")


def test_only_the_wide_tensor_moves_up(daemon_factory, tmp_path):
    stats = str(tmp_path / "stats.sock")
    # strict thresholds: the defaults tolerate what e3m0 and e4m3 always lose
    d = daemon_factory(extra=["--stats", stats, "--flush_up", "0.01", "--flush_down", "0.001",
                              "--error_up", "0.1", "--error_down", "0.02"])
    sizes = [20_000, 20_000, 20_000, 7]
    # ranks sleep before their last step, so that the job is still there to be asked
    procs_results = run_workers(d.endpoint, 3, sizes, steps=9, format="e4m3", policy=1, unchecked=1,
                                wide=1, sleep_ms=1200, timeout_ms=20000, _wait=False)
    tensors = tensors_at(stats, 8)
    assert_all_ok(procs_results(), 9, len(sizes))
    wide = tensors["layer1.weight"]
    assert wide["policy_format"] == "fp16" and wide["reason"] == "flushed", wide
    assert wide["format"] == "fp16", wide  # the workers did switch
    assert wide["format_switches"] == 1
    for name in ("layer0.weight", "layer2.weight"):
        t = tensors[name]
        assert t["policy_format"] == "e4m3" and t["reason"] == "requested", t
        assert t["format"] == "e4m3" and t["flushed_fraction"] < 0.001
    small = tensors["layer3.weight"]
    assert small["policy_format"] == "fp32" and small["reason"] == "small", small
    log = d.log_path.read_text()
    assert "switch job=default tensor=layer1.weight step=3 from=e4m3 to=fp16 reason=flushed" \
        in log, log
    assert log.count("policy: switch") == 1


def test_rules_and_schedule_from_the_config(daemon_factory, tmp_path):
    stats = str(tmp_path / "stats.sock")
    d = daemon_factory(extra=["--stats", stats, "--rules", "layer0.*=fp32",
                              "--schedule_steps", "2", "--schedule_format", "fp16"])
    results = run_workers(d.endpoint, 2, [4097, 4097], steps=4, format="e4m3", unchecked=1,
                          sleep_ms=1000, _wait=False)
    tensors = tensors_at(stats, 3)
    assert_all_ok(results(), 4, 2)
    assert tensors["layer0.weight"]["policy_format"] == "fp32"
    assert tensors["layer0.weight"]["reason"] == "rule"
    assert tensors["layer1.weight"]["policy_format"] == "e4m3"  # after 2 scheduled steps
    assert "tensor=layer1.weight step=2 from=fp16 to=e4m3 reason=requested" in \
        d.log_path.read_text()


def test_error_feedback_delays_what_is_flushed_instead_of_losing_it(daemon):
    """The same gradient every step, in e3m0: without feedback what e3m0 flushes is lost
    every time; with it the residual carries over and the average result converges."""
    drift = {}
    for ef in (0, 1):
        out = run_workers(daemon.endpoint, 1, [4096], steps=64, format="e3m0", mode="drift",
                          ef=ef, job=f"ef{ef}")[0][1]
        drift[ef] = float(out.split("drift=")[1].split()[0])
    assert drift[1] < drift[0] / 4, drift
