"""aps.torch's device codec (aps/_torch_codec.py) against libaps, bit for bit,
on CPU tensors: every fp32 bit-pattern class, each format's ties and limits,
random bit patterns, the extreme scale exponents, every code of the small
formats, the packing of every width at odd lengths and chunk seams, the APS
exponent, non-contiguous and fp16/bf16 inputs, out= and the errors."""

import numpy as np
import pytest
import torch

import aps
import aps.torch
from aps import _torch_codec

FORMATS = ["fp32", "bf16", "fp16", "e5m2", "e4m3", "e4m3fn", "e3m0",
           "e2m1", "e2m5", "e6m9", "e3m4", "e2m0", "e3m2fn", "e8m7", "e5m10fn",
           "fp4", "fp6e2m3", "fp6e3m2", "e4m2mx"]
SMALL = [f for f in FORMATS if aps.format_info(f)["bits"] <= 8]
SCALES = [-320, -150, -9, 0, 5, 130, 320]
N_RANDOM = 1 << 16  # random fp32 patterns per format and scale (plus N_RANDOM_K0 at k = 0)
N_RANDOM_K0 = 1 << 18

F32 = np.float32


def bits_of(x):
    return np.asarray(x, dtype=F32).view(np.uint32)


def floats(u):
    return np.asarray(u, dtype=np.uint64).astype(np.uint32).view(F32)


def same_bits(a, b):
    return np.array_equal(np.asarray(a).view(np.uint8), np.asarray(b).view(np.uint8))


def fp32_classes():
    """Zeros, subnormals, normals of every binade (a few mantissas each), the
    largest finite, inf and NaNs with payloads, in both signs."""
    exps = np.arange(0, 255, dtype=np.uint64) << 23
    mans = np.array([0, 1, 2, 3, 0x400000, 0x3FFFFF, 0x400001, 0x7FFFFE, 0x7FFFFF, 0x155555,
                     0x2AAAAA, 0x000100, 0x0000FF], dtype=np.uint64)
    pos = (exps[:, None] | mans[None, :]).ravel()
    special = np.array([0x7F800000, 0x7F800001, 0x7FBFFFFF, 0x7FC00000, 0x7FC00001, 0x7FFFFFFF,
                        0x7FD23456], dtype=np.uint64)
    pos = np.concatenate([pos, special])
    return floats(np.concatenate([pos, pos | 0x80000000]))


def format_grid(fmt, k):
    """The format's every finite value (a sample of them for fp32) at scale k
    as fp32 inputs, with the midpoints between neighbours (the ties), one fp32
    step either side of each, and the neighbourhood of max finite and of the
    smallest subnormal."""
    info = aps.format_info(fmt)
    if info["bits"] == 32:
        codes = floats(np.random.default_rng(7).integers(0, 0x7F800000, 4096, dtype=np.uint64))
        vals = np.sort(codes.astype(np.float64))
    else:
        codes = np.arange(1 << (info["bits"] - 1), dtype=np.uint32)
        vals = aps.dequantize(pack(codes, info["bits"]), fmt, codes.size).astype(np.float64)
        vals = vals[np.isfinite(vals)]
    mids = (vals[:-1] + vals[1:]) / 2
    if vals.size > 8192:  # 16-bit formats: both ends of the range and a sample between
        rng = np.random.default_rng([info["bits"], k + 400])
        pick = lambda v: np.concatenate([v[:1024], v[-1024:],  # noqa: E731
                                         rng.choice(v[1024:-1024], 4096, replace=False)])
        vals, mids = pick(vals), pick(mids)
    top, sub = float(info["max"]), float(info["min_subnormal"] or info["min_normal"])
    edges = np.array([top, top * (1 + 2.0 ** -(info["man_bits"] + 1)), top * 1.5, top * 2,
                      sub, sub / 2, sub * 0.75, sub * 1.5, sub / 4, float(info["min_normal"])])
    x = np.ldexp(np.concatenate([vals, mids, edges]), -k)
    with np.errstate(over="ignore"):  # beyond fp32: inf, dropped
        x = x.astype(F32)
        x = x[np.isfinite(x)]
        x = np.concatenate([x, np.nextafter(x, F32(np.inf)), np.nextafter(x, F32(0))])
    return np.concatenate([x, -x])


def pack(codes, bits):
    """Codes packed as libaps's bit stream (numpy's own little-endian bit order)."""
    codes = np.asarray(codes, dtype=np.uint64)
    stream = ((codes[:, None] >> np.arange(bits, dtype=np.uint64)) & 1).astype(np.uint8)
    return np.packbits(stream.ravel(), bitorder="little")


def format_random(fmt, k, n, seed):
    """n fp32 patterns around the format's range at scale k: random sign and
    mantissa, exponent from below the smallest subnormal to above the largest
    finite (some of them subnormal or out of the fp32 range, clipped)."""
    info = aps.format_info(fmt)
    rng = np.random.default_rng(seed)
    emin = 1 - info["emax"] if info["layout"] == "ieee" else 2 - info["emax"]
    lo = 127 + emin - info["man_bits"] - 3
    e = rng.integers(lo - k, 127 + info["emax"] + 3 - k, n).clip(0, 255).astype(np.uint64)
    sign = rng.integers(0, 2, n, dtype=np.uint64) << 31
    u = sign | (e << 23) | rng.integers(0, 1 << 23, n, dtype=np.uint64)
    u = np.where(e == 255, u & 0xFF800000, u)  # inf rather than NaN here: random_bits has NaNs
    return floats(u)


def random_bits(n, seed):
    return floats(np.random.default_rng(seed).integers(0, 1 << 32, n, dtype=np.uint64))


def check_quantize(x, fmt, k):
    want_stats, got_stats = {}, {}
    want = aps.quantize(x, fmt, scale_exp=k, stats=want_stats)
    got = aps.torch.quantize(torch.from_numpy(x), fmt, scale_exp=k, stats=got_stats)
    assert got.dtype == torch.uint8 and got.shape == want.shape
    bad = np.flatnonzero(got.numpy() != want)
    assert bad.size == 0, f"{fmt} k={k}: bytes {bad[:5]} differ"
    assert got_stats == want_stats, (fmt, k)
    return want


def check_dequantize(codes, fmt, n, k):
    want = aps.dequantize(codes, fmt, n, scale_exp=k)
    got = aps.torch.dequantize(torch.from_numpy(codes), fmt, n, scale_exp=k)
    assert got.dtype == torch.float32 and got.shape == (n,)
    bad = np.flatnonzero(got.numpy().view(np.uint32) != want.view(np.uint32))
    assert bad.size == 0, f"{fmt} k={k}: {want[bad[:5]]} decoded as {got.numpy()[bad[:5]]}"


@pytest.mark.parametrize("fmt", FORMATS)
def test_quantize_matches_libaps(fmt):
    """Bit-pattern classes, ties and limits of the format and random patterns at
    every scale, then the codes decoded back at that scale."""
    for i, k in enumerate(SCALES):
        x = np.concatenate([fp32_classes(), format_grid(fmt, k),
                            format_random(fmt, k, N_RANDOM, seed=i), random_bits(N_RANDOM, i)])
        codes = check_quantize(x, fmt, k)
        check_dequantize(codes, fmt, x.size, k)
    x = random_bits(N_RANDOM_K0, seed=99)
    check_dequantize(check_quantize(x, fmt, 0), fmt, x.size, 0)


@pytest.mark.parametrize("fmt", FORMATS)
def test_documented_values(fmt):
    """APS.md 1: signed zeros, NaN to the positive canonical NaN (the inf code
    for Y = 0, +max for the MX formats, which have neither), inf and overflow
    saturating to max finite."""
    info = aps.format_info(fmt)
    x = torch.tensor([0.0, -0.0, float("nan"), -float("nan"), float("inf"), -float("inf"),
                      info["max"] * 4, -info["max"] * 4])
    back = aps.torch.dequantize(aps.torch.quantize(x, fmt), fmt, x.numel()).tolist()
    assert back[0] == 0.0 and np.signbit(back[1]) and back[1] == 0.0
    if info["layout"] == "mx":
        assert back[2] == back[3] == info["max"]
    elif info["man_bits"] == 0:
        assert back[2] == back[3] == float("inf")
    else:
        assert np.isnan(back[2]) and np.isnan(back[3])
        assert bits_of(back[2:4]).tolist() == [0x7FC00000] * 2
    assert back[4:] == [info["max"], -info["max"]] * 2


@pytest.mark.parametrize("fmt,x,want", [
    ("e5m2", [57344, 61439, 61440, 1.125, 1.375, 17.5, 2**-16, 2**-17, 1.5 * 2**-16],
     [57344, 57344, 57344, 1.0, 1.5, 16, 2**-16, 0, 2**-15]),
    ("e4m3", [247, 2**-10, 1.5 * 2**-10, 1.0625, 1.1875], [240, 0, 2**-9, 1.0, 1.25]),
    ("e3m0", [3, 6, 0.125, 0.1251, 0.75], [4, 8, 0, 0.25, 1]),
    ("e4m3fn", [448, 464, 465], [448, 448, 448]),
])
def test_aps_md_test_values(fmt, x, want):
    t = torch.tensor(x, dtype=torch.float32)
    got = aps.torch.dequantize(aps.torch.quantize(t, fmt), fmt, len(x))
    assert got.tolist() == [float(F32(w)) for w in want]


@pytest.mark.parametrize("fmt", SMALL + ["fp16", "bf16", "e6m9"])
def test_every_code_decodes_as_libaps(fmt):
    bits = aps.format_info(fmt)["bits"]
    codes = pack(np.arange(1 << bits), bits)
    for k in SCALES + [-1, 1, 100]:
        check_dequantize(codes, fmt, 1 << bits, k)


def test_fp32_codes_decode_as_libaps():
    """fp32 codes are any 32-bit word: NaN payloads decode to the canonical NaN,
    and scaling rounds into the subnormals or out to inf."""
    x = np.concatenate([fp32_classes(), random_bits(N_RANDOM, 5)])
    for k in SCALES + [-1, 1, 126, 127, -127, 149, 150]:
        check_dequantize(x.view(np.uint8).copy(), "fp32", x.size, k)


@pytest.mark.parametrize("fmt", ["e2m0", "e3m0", "e2m1", "e3m2fn", "e2m5", "e3m4", "e6m9"])
def test_odd_lengths_and_chunk_seams(fmt, monkeypatch):
    """Every length up to three blocks past a chunk, with chunks of 8 and 16
    codes (the packed bytes of one chunk end where the next begin)."""
    x = format_random(fmt, 0, 64, seed=3)
    for chunk in (8, 16, 1 << 16):
        monkeypatch.setattr(_torch_codec, "CPU_CHUNK", chunk)
        for n in list(range(0, 26)) + [31, 33, 47, 49, 63]:
            codes = check_quantize(x[:n], fmt, 0)
            check_dequantize(codes, fmt, n, 0)
            # a longer code buffer: only the first n codes are read
            check_dequantize(np.concatenate([codes, np.full(3, 0xFF, np.uint8)]), fmt, n, 0)


def test_extra_bits_of_the_last_byte_are_zero():
    got = aps.torch.quantize(torch.tensor([-8.0, -8.0, -8.0]), "e3m0")
    assert got.tolist() == [0xEE, 0x0E]  # 3 codes of 0xE: the last byte's high nibble 0


def test_non_contiguous_and_half_inputs():
    base = torch.from_numpy(format_random("e4m3", 0, 12 * 35, seed=4)).view(12, 35)
    for t in (base.t(), base[:, ::3], base.t()[1:, 2:]):
        assert not t.is_contiguous()
        want = aps.quantize(t.contiguous().numpy().ravel(), "e4m3", scale_exp=2)
        assert np.array_equal(aps.torch.quantize(t, "e4m3", scale_exp=2).numpy(), want)
        assert aps.torch.aps_exponent(t, "e4m3", mode="local") == \
            aps.aps_exponent(t.contiguous().numpy().ravel(), "e4m3", mode="local")
    for dtype in (torch.float16, torch.bfloat16):
        t = base.to(dtype).t()
        x = t.float().contiguous().numpy().ravel()
        assert np.array_equal(aps.torch.quantize(t, "e5m2", scale_exp=-1).numpy(),
                              aps.quantize(x, "e5m2", scale_exp=-1))
        for mode in ("local", "global"):
            assert aps.torch.aps_exponent(t, "e5m2", 3, mode) == aps.aps_exponent(x, "e5m2", 3,
                                                                                  mode)
    grad = torch.ones(3, requires_grad=True)
    assert aps.torch.quantize(grad * 2, "e4m3").tolist() == [0x40] * 3


def test_codes_may_be_non_contiguous():
    x = format_random("fp16", 0, 100, seed=6)
    codes = torch.from_numpy(aps.quantize(x, "fp16")).view(2, 100).t()  # byte pairs, by column
    flat = codes.contiguous().numpy().ravel()
    want = aps.dequantize(flat, "fp16", 100)
    assert same_bits(aps.torch.dequantize(codes, "fp16", 100).numpy(), want)
    # fp32 codes from a byte offset that is not a multiple of 4
    raw = torch.from_numpy(np.concatenate([[7], x.view(np.uint8)]).astype(np.uint8))
    assert same_bits(aps.torch.dequantize(raw[1:], "fp32", 100).numpy(), x)


def test_out_is_written_in_place():
    x = torch.linspace(-3, 3, 101)
    out = torch.full((80,), 0xAB, dtype=torch.uint8)
    ptr = out.data_ptr()
    assert aps.torch.quantize(x, "e2m1", out=out) is out and out.data_ptr() == ptr
    assert np.array_equal(out[:51].numpy(), aps.quantize(x.numpy(), "e2m1"))
    assert (out[51:] == 0xAB).all()

    codes = out[:51]
    want = aps.dequantize(codes.numpy().copy(), "e2m1", 101, scale_exp=1)
    flat = torch.full((120,), 5.0)
    assert aps.torch.dequantize(codes, "e2m1", 101, scale_exp=1, out=flat) is flat
    assert same_bits(flat[:101].numpy(), want) and (flat[101:] == 5.0).all()
    shaped = torch.zeros(101, 3)[:, 1]  # a column: stride 3
    assert not shaped.is_contiguous()
    assert aps.torch.dequantize(codes, "e2m1", 101, scale_exp=1, out=shaped) is shaped
    assert same_bits(shaped.numpy().copy(), want)
    grid = torch.zeros(101, 2)[:, 0].view(101, 1)
    aps.torch.dequantize(codes, "e2m1", 101, scale_exp=1, out=grid)
    assert same_bits(grid.numpy().ravel().copy(), want)


def test_exponent_matches_libaps():
    rng = np.random.default_rng(11)
    cases = [np.zeros(5, F32), np.array([-0.0], F32), np.array([], F32),
             floats([1]), floats([0x7FFFFF]), floats([0x800000]), floats([0x7F7FFFFF]),
             floats([0xFF7FFFFF, 3]), np.array([np.nan, 2.0, -np.inf], F32),
             np.array([np.nan, np.inf], F32), np.array([np.inf, -3e38], F32),
             np.array([247.0, 1.0], F32), np.array([240.0, 8.0, 2**-20], F32),
             np.array([-0.5, 0.25], F32), np.array([57344.0, 61440.0], F32),
             np.array([448.0, 465.0], F32), np.array([1.0 - 2**-24], F32)]
    cases += [(rng.standard_normal(1000) * 10.0 ** rng.integers(-40, 38)).astype(F32)
              for _ in range(40)]
    cases += [random_bits(257, seed=s) for s in range(5)]
    for fmt in FORMATS:
        for x in cases:
            t = torch.from_numpy(x)
            for nworkers in (1, 3, 4, 1000, 2**31 - 1):
                for mode in ("none", "local", "global"):
                    want = aps.aps_exponent(x, fmt, nworkers, mode)
                    assert aps.torch.aps_exponent(t, fmt, nworkers, mode) == want, \
                        (fmt, x[:4], nworkers, mode)
            assert aps.torch.aps_exponent(t, fmt) == aps.aps_exponent(x, fmt)


def test_local_exponent_quantizes_without_overflow():
    for fmt in FORMATS:
        for x in (np.array([247.0], F32), np.array([2**-149], F32), floats([0x7F7FFFFF])):
            k = aps.torch.aps_exponent(torch.from_numpy(x), fmt, mode="local")
            stats = {}
            aps.torch.quantize(torch.from_numpy(x), fmt, scale_exp=k, stats=stats)
            assert stats["overflow"] == 0, (fmt, x, k)


def test_errors():
    t = torch.ones(4)
    with pytest.raises(aps.ArgumentError, match="is not a format"):
        aps.torch.quantize(t, "e9m1")
    with pytest.raises(TypeError):
        aps.torch.quantize(t, b"e4m3")
    with pytest.raises(aps.ArgumentError, match="scale exponent 321"):
        aps.torch.quantize(t, "e4m3", scale_exp=321)
    with pytest.raises(aps.ArgumentError, match="scale exponent -321"):
        aps.torch.dequantize(torch.zeros(4, dtype=torch.uint8), "e4m3", 4, scale_exp=-321)
    with pytest.raises(ValueError):
        aps.torch.quantize(t, "e4m3", scale_exp=2**32)  # not wrapped to 0 on the way to C
    with pytest.raises(TypeError):
        aps.torch.quantize(t.double(), "e4m3")
    with pytest.raises(TypeError):
        aps.torch.quantize(t.numpy(), "e4m3")
    with pytest.raises(ValueError, match="nearest"):
        aps.torch.quantize(t, "e4m3", rounding="stochastic")
    with pytest.raises(ValueError, match="need 4"):
        aps.torch.quantize(t, "e4m3", out=torch.zeros(3, dtype=torch.uint8))
    with pytest.raises(TypeError):
        aps.torch.quantize(t, "e4m3", out=torch.zeros(4))
    with pytest.raises(ValueError, match="need 2 bytes"):
        aps.torch.dequantize(torch.zeros(1, dtype=torch.uint8), "e2m1", 3)
    with pytest.raises(TypeError):
        aps.torch.dequantize(torch.zeros(4, dtype=torch.int8), "e4m3", 4)
    with pytest.raises(ValueError):
        aps.torch.dequantize(torch.zeros(4, dtype=torch.uint8), "e4m3", 4, out=torch.zeros(3))
    with pytest.raises(ValueError):
        aps.torch.dequantize(torch.zeros(4, dtype=torch.uint8), "e4m3", 2,
                             out=torch.zeros(2, 2).t())
    with pytest.raises(ValueError, match="mode"):
        aps.torch.aps_exponent(t, "e4m3", mode="paper")
    with pytest.raises(ValueError, match="nworkers"):
        aps.torch.aps_exponent(t, "e4m3", nworkers=0)
    with pytest.raises(aps.ArgumentError):
        aps.torch.aps_exponent(t, "x")


# -- block scaling ----------------------------------------------------------------

def block_inputs(block, seed):
    """Blocks whose sizes differ by up to 2^±120, an all-zero block, a block of
    subnormals, blocks with inf and NaN among finite values, every fp32 class
    (the classes run across blocks), random patterns, and a short last block."""
    rng = np.random.default_rng(seed)
    n = 400 * block
    x = rng.standard_normal(n).astype(F32)
    x *= np.repeat(2.0 ** rng.integers(-120, 120, 400), block).astype(F32)
    x[block:2 * block] = 0
    x[2 * block:3 * block] = floats(rng.integers(1, 0x800000, block, dtype=np.uint64))
    x[3 * block + 5] = np.inf
    x[4 * block + 7] = np.nan
    return np.concatenate([x, fp32_classes(), random_bits(20 * block, seed),
                           rng.standard_normal(block // 2 + 3).astype(F32)])


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("block", [16, 32, 64])
def test_blocks_match_libaps(fmt, block):
    x = block_inputs(block, seed=block)
    want_stats, got_stats = {}, {}
    want_codes, want_exps = aps.quantize_blocks(x, fmt, block=block, stats=want_stats)
    codes, exps = aps.torch.quantize_blocks(torch.from_numpy(x), fmt, block=block,
                                            stats=got_stats)
    assert exps.dtype == torch.int8 and np.array_equal(exps.numpy(), want_exps), fmt
    bad = np.flatnonzero(codes.numpy() != want_codes)
    assert bad.size == 0, f"{fmt} blocks of {block}: bytes {bad[:5]} differ"
    assert got_stats == want_stats
    want = aps.dequantize_blocks(want_codes, want_exps, fmt, x.size, block=block)
    got = aps.torch.dequantize_blocks(codes, exps, fmt, x.size, block=block)
    assert same_bits(got.numpy(), want), fmt


def test_block_errors():
    x = torch.ones(100)
    with pytest.raises(ValueError, match="16, 32 or 64"):
        aps.torch.quantize_blocks(x, "fp4", block=24)
    codes, exps = aps.torch.quantize_blocks(x, "fp4")
    with pytest.raises(ValueError, match="need 50 bytes and 4 exponents"):
        aps.torch.dequantize_blocks(codes, exps[:3], "fp4", 100)
    with pytest.raises(TypeError, match="int8"):
        aps.torch.dequantize_blocks(codes, exps.to(torch.int32), "fp4", 100)
    out = torch.empty(100)
    assert aps.torch.dequantize_blocks(codes, exps, "fp4", 100, out=out) is out
    assert torch.equal(out, x)
