"""Block scaling in Python (issue 18): aps.quantize_blocks and
aps.dequantize_blocks against aps.quantize / aps.dequantize block by block."""
import time

import numpy as np
import pytest

import aps
import aps.daemon
from conftest import APSD, run_ranks

FORMATS = ["fp4", "fp6e2m3", "fp6e3m2", "e4m3", "e5m2", "e3m0", "fp16"]


def blocky(n, block, seed):
    """Blocks whose magnitudes differ by up to 2^40: what block scaling is for."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(n).astype(np.float32)
    scale = np.repeat(2.0 ** rng.integers(-20, 20, -(-n // block)), block)[:n]
    x = (x * scale).astype(np.float32)
    x[block:2 * block] = 0  # an all-zero block
    return x


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("block", [16, 32, 64])
def test_each_block_is_aps_quantize_with_its_exponent(fmt, block):
    n = 50 * block + 7  # a short last block
    x = blocky(n, block, seed=block)
    stats = {}
    codes, exps = aps.quantize_blocks(x, fmt, block=block, stats=stats)
    assert exps.dtype == np.int8 and exps.size == -(-n // block)
    assert stats["overflow"] == 0  # a block's exponent never saturates it
    bits = aps.format_info(fmt)["bits"]
    back = aps.dequantize_blocks(codes, exps, fmt, n, block=block)
    for b in range(exps.size):
        part = x[b * block:(b + 1) * block]
        k = aps.aps_exponent(part, fmt, mode="local") if np.any(part) else 0
        assert exps[b] == max(-127, min(127, k)), (b, exps[b], k)
        want = aps.quantize(part, fmt, scale_exp=int(exps[b]))
        at = b * block * bits // 8
        assert np.array_equal(codes[at:at + want.size], want), b
        np.testing.assert_array_equal(
            back[b * block:(b + 1) * block],
            aps.dequantize(want, fmt, part.size, scale_exp=int(exps[b])))


def test_block_scaling_beats_one_exponent_on_blocky_data():
    """The point of it: with magnitudes that differ between blocks, fp4 with a
    block exponent keeps what one per-tensor exponent flushes to zero."""
    x = blocky(32 * 1000, 32, seed=7)
    k = aps.aps_exponent(x, "fp4", mode="local")
    tensor = aps.dequantize(aps.quantize(x, "fp4", scale_exp=k), "fp4", x.size, scale_exp=k)
    codes, exps = aps.quantize_blocks(x, "fp4", block=32)
    blocks = aps.dequantize_blocks(codes, exps, "fp4", x.size, block=32)
    err_tensor = np.linalg.norm(tensor - x) / np.linalg.norm(x)
    err_blocks = np.linalg.norm(blocks - x) / np.linalg.norm(x)
    rel = np.abs(blocks - x) / np.maximum(np.abs(x), 1e-38)
    assert err_blocks < 0.25 and np.median(rel[x != 0]) < 0.15, err_blocks
    assert np.mean(tensor[x != 0] == 0) > 0.5  # most of it flushed with one exponent
    assert np.mean(blocks[x != 0] == 0) < 0.15  # a gaussian block: |x| < max/24
    assert err_blocks <= err_tensor


def test_bad_arguments_raise_with_reasons():
    x = np.ones(100, dtype=np.float32)
    with pytest.raises(ValueError, match="16, 32 or 64"):
        aps.quantize_blocks(x, "fp4", block=48)
    with pytest.raises(TypeError):
        aps.quantize_blocks(x, "fp4", block=32.0)
    codes, exps = aps.quantize_blocks(x, "fp4", block=32)
    with pytest.raises(ValueError, match="need 4"):
        aps.dequantize_blocks(codes, exps[:3], "fp4", 100, block=32)
    with pytest.raises(TypeError, match="int8"):
        aps.dequantize_blocks(codes, exps.astype(np.int16), "fp4", 100, block=32)
    with pytest.raises(aps.ArgumentError, match="not a format"):
        aps.quantize_blocks(x, "fp5", block=32)
    out = np.full(100, 7, dtype=np.float32)
    assert aps.dequantize_blocks(codes, exps, "fp4", 100, block=32, out=out) is out
    assert np.all(out == 1.0)


# -- through apsd -------------------------------------------------------------

def block_data(rank, step, n, block):
    return blocky(n, block, seed=100 * rank + step) * np.float32(1.5 ** rank)


def expected_mean(world, step, n, fmt, block):
    """What apsd must answer: each rank's blocks decoded exactly, summed in rank
    order in fp32, divided, and the mean block-scaled again (chunks start on a
    block, so the whole tensor's blocks are the chunks' blocks)."""
    acc = np.zeros(n, np.float32)
    for r in range(world):
        codes, exps = aps.quantize_blocks(block_data(r, step, n, block), fmt, block=block)
        acc += aps.dequantize_blocks(codes, exps, fmt, n, block=block)
    mean = acc / np.float32(world)
    codes, exps = aps.quantize_blocks(mean, fmt, block=block)
    return aps.dequantize_blocks(codes, exps, fmt, n, block=block)


@pytest.fixture
def apsd_small_chunks():
    """apsd with 64 KiB chunks, so that a tensor of 300,000 elements has several."""
    d = aps.daemon.LocalDaemon(binary=str(APSD), extra_args=["--chunk_bytes", "65536"]).start()
    try:
        yield d.endpoint
    finally:
        assert d.stop() == 0, "apsd did not exit cleanly"


def rank_blocks(rank, world, endpoint, fmt, block, n):
    kw = {} if block == 32 else {"block_size": block}
    with aps.Client(endpoint, rank, world, format=fmt, scaling="block", job=f"b{fmt}{block}",
                    **kw) as c:
        out = []
        for step in range(2):
            x = block_data(rank, step, n, block)
            c.allreduce("g", x)
            out.append(x)
        return out, c.bytes_pushed


@pytest.mark.parametrize("fmt,block,n", [("fp4", 32, 1000), ("e4m3", 16, 777),
                                         ("fp6e3m2", 64, 300_000)])
def test_apsd_sums_block_scaled_pushes_exactly(apsd_small_chunks, fmt, block, n):
    """300,000 elements span several 64 KiB chunks of the daemon."""
    world = 3
    results = run_ranks(rank_blocks, world, apsd_small_chunks, fmt, block, n)
    bits = aps.format_info(fmt)["bits"]
    for rank, (got, pushed) in enumerate(results):
        for step in range(2):
            want = expected_mean(world, step, n, fmt, block)
            assert np.array_equal(got[step], want), (rank, step)
        # Codes and one exponent per block, each step.
        assert pushed == 2 * (-(-n * bits // 8) + -(-n // block)), pushed


def rank_block_size(rank, world, endpoint, block):
    try:
        with aps.Client(endpoint, rank, world, format="fp4", scaling="block",
                        block_size=block, job="sizes", timeout_ms=5000):
            time.sleep(1.0)  # hold the rank until the other one tried
            return "joined"
    except aps.Error as e:
        return e.code


def test_ranks_with_other_blocks_are_refused(apsd):
    got = run_ranks(rank_block_size, 2, apsd, 16)
    assert got == ["joined", "joined"]
    one = aps.Client(apsd, 0, 2, format="fp4", scaling="block", block_size=16, job="mixed")
    try:
        with pytest.raises(aps.Error, match="blocks of 16 elements, rank 1 asks for 64"):
            aps.Client(apsd, 1, 2, format="fp4", scaling="block", block_size=64, job="mixed")
        with pytest.raises(aps.Error, match="uses scaling 'block', rank 1 asks for 'local'"):
            aps.Client(apsd, 1, 2, format="fp4", job="mixed")
    finally:
        one.close()


@pytest.mark.parametrize("kwargs,match", [
    ({"scaling": "local", "block_size": 32}, "block_size"),
    ({"scaling": "block", "block_size": 24}, "block_size"),
])
def test_bad_block_options_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        aps.Client("tcp://127.0.0.1:9", 0, 1, **kwargs)


def test_optimize_mode_sends_block_scaled_updates(apsd):
    """SGD on apsd with fp4 block-scaled gradients up and updates down: every
    worker holds its previous weights plus the block-quantized difference to
    the daemon's new master weights, bit for bit (the daemon keeps that view)."""
    world, n = 2, 1000
    cs = [aps.Client(apsd, r, world, format="fp4", scaling="block", optimizer="sgd,momentum=0.9",
                     job="opt-blocks", timeout_ms=20000) for r in range(world)]
    try:
        w0 = blocky(n, 32, seed=5)
        held = [w0.copy() if r == 0 else np.zeros(n, np.float32) for r in range(world)]
        for h in [c.broadcast_async("w", w) for c, w in zip(cs, held)]:
            h.wait()
        master = np.empty(n, np.float32)
        for step in range(20):
            prev = held[0].copy()
            grads = [blocky(n, 32, seed=10 * step + r) for r in range(world)]
            for h in [c.step_async("w", g, w, 0.01) for c, g, w in zip(cs, grads, held)]:
                h.wait()
            assert cs[0].pull("w", master) == step + 1
            np.testing.assert_array_equal(held[0], held[1])
            codes, exps = aps.quantize_blocks(master - prev, "fp4")
            want = prev + aps.dequantize_blocks(codes, exps, "fp4", n)
            np.testing.assert_array_equal(held[0], want)
    finally:
        for c in cs:
            c.close()


@pytest.fixture
def two_shards():
    ds = [aps.daemon.LocalDaemon(binary=str(APSD), extra_args=["--chunk_bytes", "4096"]).start()
          for _ in range(2)]
    try:
        yield [d.endpoint for d in ds]
    finally:
        for d in ds:
            assert d.stop() == 0, "apsd did not exit cleanly"


def rank_sharded(rank, world, endpoints, n):
    # 1000 bytes: rounded down to 768 (192 elements), so partitions start on blocks
    with aps.Client(endpoints, rank, world, format="fp4", scaling="block", job="sharded",
                    partition_bytes=1000) as c:
        x = block_data(rank, 0, n, 32)
        c.allreduce("g", x)
        return x


def test_shards_give_the_blocks_of_one_daemon(two_shards):
    n, world = 5000, 2
    results = run_ranks(rank_sharded, world, two_shards, n)
    want = expected_mean(world, 0, n, "fp4", 32)
    for got in results:
        assert np.array_equal(got, want)


def rank_feedback(rank, world, endpoint, n, steps):
    with aps.Client(endpoint, rank, world, format="fp4", scaling="block", job="feedback",
                    error_feedback=True) as c:
        out = []
        for step in range(steps):
            x = block_data(rank, step, n, 32)
            c.allreduce("g", x)
            out.append(x)
        return out


def test_error_feedback_carries_what_blocks_lost(apsd):
    """Each rank sends its gradient plus what the last step's block quantization
    lost; the daemon's mean of what was sent comes back by blocks."""
    n, world, steps = 3000, 2, 3
    results = run_ranks(rank_feedback, world, apsd, n, steps)
    residual = [np.zeros(n, np.float32) for _ in range(world)]
    for step in range(steps):
        acc = np.zeros(n, np.float32)
        for r in range(world):
            corrected = block_data(r, step, n, 32) + residual[r]
            sent = aps.dequantize_blocks(*aps.quantize_blocks(corrected, "fp4"), "fp4", n)
            residual[r] = corrected - sent
            acc += sent
        want = aps.dequantize_blocks(*aps.quantize_blocks(acc / np.float32(world), "fp4"),
                                     "fp4", n)
        for r in range(world):
            assert np.array_equal(results[r][step], want), (r, step)
    assert any(np.any(res) for res in residual)  # there was something to carry
