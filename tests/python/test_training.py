"""A short real training run (Fashion-MNIST, 2 workers through apsd): with e3m0
gradients, plain quantization flushes nearly everything and does not learn;
APS learns, from the same seed."""

import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT

EXAMPLE = ROOT / "worker" / "examples" / "train_fashion_mnist.py"
DATA = "/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz"


def train(endpoint, tmp_path, scaling):
    out = tmp_path / f"{scaling}.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "worker" / "python")}
    cmd = [sys.executable, "-m", "aps.launch", "-n", "2", "--endpoint", endpoint, "--no-daemon",
           "--job", f"train-{scaling}", str(EXAMPLE), "--format", "e3m0", "--scaling", scaling,
           "--steps", "120", "--hidden", "64", "--eval-every", "120", "--eval-size", "2000",
           "--train-size", "20000", "--seed", "1", "--out", str(out)]
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    return json.loads(out.read_text())


@pytest.mark.skipif(not os.path.exists(DATA), reason="dataset-fashion-mnist is not installed")
def test_e3m0_learns_with_aps_and_not_without(apsd, tmp_path):
    plain, scaled = train(apsd, tmp_path, "none"), train(apsd, tmp_path, "local")
    assert plain["flushed"] > 0.95 and scaled["flushed"] < 0.6
    assert scaled["accuracy"] > 70 and scaled["accuracy"] > plain["accuracy"] + 30, \
        (plain["accuracy"], scaled["accuracy"])
    assert plain["bytes_per_step"] == scaled["bytes_per_step"]


LM = ROOT / "worker" / "examples" / "train_lm.py"
CORPUS = "/usr/share/games/fortunes/fortunes"


def train_lm(endpoint, tmp_path, fmt, scaling):
    out = tmp_path / f"lm-{fmt}-{scaling}.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "worker" / "python")}
    cmd = [sys.executable, "-m", "aps.launch", "-n", "2", "--endpoint", endpoint, "--no-daemon",
           "--job", f"lm-{fmt}-{scaling}", str(LM), "--format", fmt, "--scaling", scaling,
           "--steps", "60", "--eval-every", "60", "--eval-windows", "64", "--warmup", "10",
           "--layers", "1", "--out", str(out)]
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stdout + run.stderr
    return json.loads(out.read_text())


@pytest.mark.skipif(not os.path.exists(CORPUS), reason="Debian's fortunes is not installed")
def test_the_language_model_learns_with_fp4_blocks(apsd, tmp_path):
    """60 AdamW steps of the byte-level transformer: from ln 256 = 5.55 nats per
    byte to well under 4 in fp32, and as far with fp4 block-scaled gradients at
    about 4.25 / 32 of the bytes."""
    full, block = train_lm(apsd, tmp_path, "fp32", "none"), train_lm(apsd, tmp_path, "fp4",
                                                                       "block")
    assert full["history"][0][1] > 5.0
    assert full["test_loss"] < 3.6 and block["test_loss"] < full["test_loss"] + 0.15, \
        (full["test_loss"], block["test_loss"])
    ratio = block["bytes_per_step"] / full["bytes_per_step"]
    assert 0.13 < ratio < 0.14, ratio
