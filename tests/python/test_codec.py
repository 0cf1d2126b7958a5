"""The codec through its Python entry points: PyTorch's fp16/bf16 conversions as
the reference, out= and stats=, and the errors a user sees."""

import numpy as np
import pytest
import torch

import aps

N_PATTERNS = 4_000_000


def random_floats(n, seed):
    bits = np.random.default_rng(seed).integers(0, 2**32, size=n, dtype=np.uint64)
    return bits.astype(np.uint32).view(np.float32)


@pytest.mark.parametrize("fmt,dtype,view", [("fp16", torch.float16, np.uint16),
                                            ("bf16", torch.bfloat16, np.uint16)])
def test_matches_torch_on_random_bit_patterns(fmt, dtype, view):
    x = random_floats(N_PATTERNS, seed=1 if fmt == "fp16" else 2)
    # Also every neighbourhood of the format's own grid, where ties live.
    got = aps.quantize(x, fmt).view(view)
    want = torch.from_numpy(x).to(dtype).view(torch.int16).numpy().view(view)
    finite = np.isfinite(x)
    info = aps.format_info(fmt)
    torch_overflow = finite & np.isinf(torch.from_numpy(x).to(dtype).float().numpy())
    ok = finite & ~torch_overflow
    assert np.count_nonzero(ok) > N_PATTERNS // 2
    mismatch = np.flatnonzero(ok & (got != want))
    assert mismatch.size == 0, f"{fmt}: {x[mismatch[:5]]} -> {got[mismatch[:5]]}, " \
                               f"torch {want[mismatch[:5]]}"
    # Where torch overflows to inf, apsd saturates to +-max finite.
    sat = aps.dequantize(got[torch_overflow].view(np.uint8).copy(), fmt,
                         np.count_nonzero(torch_overflow))
    assert np.all(np.abs(sat) == np.float32(info["max"]))
    # NaN becomes the canonical quiet NaN, inf saturates.
    nan_code = 0x7E00 if fmt == "fp16" else 0x7FC0
    assert np.all(got[np.isnan(x)] == nan_code)
    assert np.all(np.abs(aps.dequantize(got[np.isinf(x)].view(np.uint8).copy(), fmt,
                                        np.count_nonzero(np.isinf(x)))) == info["max"])


@pytest.mark.parametrize("fmt", ["fp16", "bf16"])
def test_matches_torch_at_ties(fmt):
    dtype = torch.float16 if fmt == "fp16" else torch.bfloat16
    grid = torch.arange(0, 2**15, dtype=torch.int32).to(torch.int16).view(dtype).float()
    grid = grid[torch.isfinite(grid)].numpy()
    mids = ((grid[:-1].astype(np.float64) + grid[1:]) / 2).astype(np.float32)
    x = np.concatenate([mids, np.nextafter(mids, np.float32(np.inf)),
                        np.nextafter(mids, np.float32(0)), -mids])
    x = x[np.abs(x) <= aps.format_info(fmt)["max"]]
    got = aps.quantize(x, fmt).view(np.uint16)
    want = torch.from_numpy(x).to(dtype).view(torch.int16).numpy().view(np.uint16)
    assert np.array_equal(got, want)


def test_out_is_filled_and_returned():
    x = np.linspace(-1, 1, 1001, dtype=np.float32).reshape(7, 11, 13)
    out = np.zeros(2000, dtype=np.uint8)
    codes = aps.quantize(x, "e4m3", scale_exp=7, out=out)
    assert codes is out
    assert np.array_equal(out[:1001], aps.quantize(x, "e4m3", scale_exp=7))
    assert np.all(out[1001:] == 0)
    y = np.empty(1001, dtype=np.float32)
    assert aps.dequantize(codes, "e4m3", 1001, scale_exp=7, out=y) is y
    assert np.max(np.abs(y - x.ravel())) <= 1 / 16


def test_stats_are_reported():
    x = np.array([1, 300, -250, np.inf, np.nan, 1e-4, 0, 2**-10], dtype=np.float32)
    stats = {}
    aps.quantize(x, "e4m3", stats=stats)
    assert stats == {"overflow": 2, "nonfinite": 2, "flushed": 2, "maxabs": 300.0}


def test_packed_sub_byte_formats_roundtrip():
    x = np.array([1, -2, 4, 0.25, -8, 0, 0.5], dtype=np.float32)
    codes = aps.quantize(x, "e3m0")
    assert codes.nbytes == 4
    assert np.array_equal(aps.dequantize(codes, "e3m0", 7), x)


def test_accumulate_adds_in_place():
    x = np.arange(-20, 20, dtype=np.float32)
    acc = np.ones(40, dtype=np.float32)
    aps.accumulate(aps.quantize(x, "fp16"), "fp16", acc)
    assert np.array_equal(acc, x + 1)


def test_exponent_modes():
    x = np.array([0.001, -0.5], dtype=np.float32)
    assert aps.aps_exponent(x, "e4m3", nworkers=4, mode="global") == 7 - 1
    assert aps.aps_exponent(x, "e4m3", mode="local") == 8
    assert aps.aps_exponent(x, "e4m3", mode="none") == 0
    assert aps.aps_exponent(np.zeros(5, np.float32), "e4m3") == 0
    assert aps.maxabs(np.array([np.nan, -3, np.inf], dtype=np.float32)) == 3.0


def test_format_info_fields():
    info = aps.format_info("e4m3fn")
    assert info["bits"] == 8 and info["fn"] and info["max"] == 448.0
    assert aps.format_info("e3m0")["min_subnormal"] == 0.0
    assert aps.format_info("e2m5")["bits"] == 8


@pytest.mark.parametrize("fmt,cases", [
    # OCP MX v1.0 element formats: no inf and no NaN, saturating; ties to even
    ("fp4", [(6.0, 6.0), (6.9, 6.0), (7.0, 6.0), (1e30, 6.0), (2.5, 2.0), (3.5, 4.0),
             (0.25, 0.0), (0.26, 0.5), (0.75, 1.0), (-5.0, -4.0), (float("inf"), 6.0),
             (float("-inf"), -6.0), (float("nan"), 6.0)]),
    ("fp6e2m3", [(7.5, 7.5), (7.75, 7.5), (0.0625, 0.0), (0.07, 0.125), (1.0625, 1.0),
                 (1.1875, 1.25), (float("nan"), 7.5)]),
    ("fp6e3m2", [(28.0, 28.0), (30.0, 28.0), (0.03125, 0.0), (0.04, 0.0625), (4.5, 4.0),
                 (5.5, 6.0), (-float("inf"), -28.0)]),
])
def test_mx_elements_saturate_and_have_no_nan(fmt, cases):
    x = np.array([c[0] for c in cases], dtype=np.float32)
    want = np.array([c[1] for c in cases], dtype=np.float32)
    codes = aps.quantize(x, fmt)
    got = aps.dequantize(codes, fmt, len(x))
    assert np.array_equal(got, want), (fmt, x, got)
    info = aps.format_info(fmt)
    assert info["layout"] == "mx" and not info["fn"] and info["name"] == fmt


def test_unknown_format_raises_with_library_message():
    with pytest.raises(aps.Error) as err:
        aps.quantize(np.zeros(3, np.float32), "e9m2")
    assert err.value.code == -3 and err.value.name == "APS_EFORMAT"
    assert "'e9m2' is not a format" in str(err.value)
    # Bad arguments are also ValueErrors, as a numpy user expects.
    with pytest.raises(ValueError, match="is not a format"):
        aps.format_info("fp8")


@pytest.mark.parametrize("bad,exc", [
    (np.zeros(4, np.float64), TypeError),
    ([1.0, 2.0], TypeError),
    (np.zeros((4, 4), np.float32)[:, 1], ValueError),
])
def test_bad_input_arrays(bad, exc):
    with pytest.raises(exc):
        aps.quantize(bad, "e4m3")


def test_short_out_is_refused_without_writing():
    out = np.full(3, 7, dtype=np.uint8)
    with pytest.raises(ValueError, match="need 4"):
        aps.quantize(np.zeros(4, np.float32), "e4m3", out=out)
    assert np.all(out == 7)
    with pytest.raises(TypeError):
        aps.quantize(np.zeros(4, np.float32), "e4m3", out=np.zeros(4, np.int8))
    with pytest.raises(ValueError):
        aps.dequantize(np.zeros(4, np.uint8), "e4m3", 4, out=np.zeros(3, np.float32))
    with pytest.raises(aps.Error, match="buffer too short"):
        aps.dequantize(np.zeros(3, np.uint8), "e4m3", 4)


def test_bad_options():
    x = np.zeros(4, np.float32)
    with pytest.raises(ValueError):
        aps.quantize(x, "e4m3", rounding="up")
    with pytest.raises(aps.Error, match="scale exponent 999"):
        aps.quantize(x, "e4m3", scale_exp=999)
    with pytest.raises(ValueError):
        aps.aps_exponent(x, "e4m3", mode="paper")
    with pytest.raises(TypeError):
        aps.quantize(x, 8)


def test_stochastic_rounding_is_reproducible():
    x = np.full(10000, 1.1, dtype=np.float32)
    a = aps.quantize(x, "e4m3", rounding="stochastic", seed=1, stream=2)
    b = aps.quantize(x, "e4m3", rounding="stochastic", seed=1, stream=2)
    c = aps.quantize(x, "e4m3", rounding="stochastic", seed=1, stream=3)
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    assert abs(aps.dequantize(a, "e4m3", x.size).mean() - 1.1) < 0.003
