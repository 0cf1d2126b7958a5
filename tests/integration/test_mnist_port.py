"""The port of PyTorch's MNIST example (worker/examples/mnist_port.py) run as a
user runs it: aps.launch starts 2 ranks against a real apsd for a few steps
of 3 epochs. It finishes, StepLR made on the DistributedOptimizer leaves the
lr at 0.7^N after N epochs on every rank, the loss goes down, both ranks end
with the same model, only rank 0 prints, and both ranks closed their client:
the daemon counted no rank as lost."""

import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT

EXAMPLE = ROOT / "worker" / "examples" / "mnist_port.py"
DATA = "/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz"
ENV = {**os.environ, "PYTHONPATH": str(ROOT / "worker" / "python"),
       "APS_LIBRARY": str(ROOT / "build" / "worker" / "libaps.so.0")}
EPOCHS, STEPS = 3, 8


def mean(values):
    return sum(values) / len(values)


@pytest.mark.skipif(not os.path.exists(DATA), reason="dataset-fashion-mnist is not installed")
def test_mnist_port_trains_on_two_ranks_and_closes_cleanly(daemon, tmp_path):
    out = tmp_path / "rank{rank}.json"
    cmd = [sys.executable, "-m", "aps.launch", "-n", "2", "--endpoint", daemon.endpoint,
           "--no-daemon", "--job", "mnist", str(EXAMPLE), "--epochs", str(EPOCHS),
           "--steps", str(STEPS), "--log-interval", "4", "--train-size", "6000",
           "--test-size", "500", "--out", str(out)]
    run = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.count("[rank 0] Test set: Average loss") == EPOCHS, run.stdout
    assert "[rank 1] Train" not in run.stdout and "[rank 1] Test" not in run.stdout

    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for h in ranks:
        assert h["lr"] == pytest.approx([1.0 * 0.7 ** n for n in range(1, EPOCHS + 1)],
                                        rel=1e-12, abs=0)
        losses = h["train_loss"]
        assert len(losses) == EPOCHS * STEPS
        assert mean(losses[-4:]) < 0.75 * mean(losses[:4]), losses
        assert h["test_loss"][-1] < h["test_loss"][0], h["test_loss"]
        assert h["skipped_steps"] == 0
    assert ranks[0]["test_loss"] == ranks[1]["test_loss"], "the ranks' models differ"

    # a rank without close() would be counted lost 1.5 s after it exited, before the job ends
    daemon.wait_for_log("job ended job=mnist")
    assert daemon.counter("peers_lost") == 0, daemon.log_path.read_text()[-3000:]
    log = daemon.log_path.read_text()
    assert "rank left job=mnist rank=0" in log and "rank left job=mnist rank=1" in log
