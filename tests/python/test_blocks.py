"""Block scaling in Python (issue 18): aps.quantize_blocks and
aps.dequantize_blocks against aps.quantize / aps.dequantize block by block."""
import numpy as np
import pytest

import aps

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
