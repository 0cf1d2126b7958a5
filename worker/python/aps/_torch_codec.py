"""The codec on torch tensors: quantize, dequantize and aps_exponent written
with tensor operations alone, so that they run where the tensor lives (CPU,
CUDA, any device torch runs on) and give libaps's bits (aps.quantize,
aps.dequantize, aps.aps_exponent) on every input.

Every step is an integer operation on fp32 bit patterns (t.view(torch.int32)),
the steps of common/codec_scalar.c: a finite x is m * 2^E with an integer
m < 2^24, the scale 2^k is added to E (never an fp32 multiply), and m is
shifted right with round-half-even. Decoding rounds the exact value of a code
times 2^-k to fp32 the same way, so no float multiply, float conversion or
flush-to-zero mode takes part. Formats and scale exponents are checked by
libaps itself (the same errors and messages as aps.quantize).

Codes are packed as libaps packs them (common/pack.h): a little-endian bit
stream, code i in bits [i*w, (i+1)*w): one byte per 8-bit code, two bytes
little-endian per 16-bit code, two 4-bit codes a byte (low nibble first),
fp32 as its four bytes.
"""

import collections
import functools
import math
import struct

import numpy as np
import torch

from aps import codec
from aps._args import POSITIVE_INT32, check_has_data, check_int

__all__ = ["aps_exponent", "dequantize", "dequantize_blocks", "quantize", "quantize_blocks"]

F32_ABS = 0x7FFFFFFF
F32_INF = 0x7F800000
F32_QNAN = 0x7FC00000  # the NaN libaps decodes every NaN code to
F32_MAX = 0x7F7FFFFF

# Elements per pass: on the CPU temporaries that stay in cache; elsewhere
# large enough that a pass is not dominated by kernel launches.
CPU_CHUNK = 1 << 18
DEVICE_CHUNK = 1 << 24

# A rounding target: man stored mantissa bits, emin/emax the exponents of the
# smallest normal and largest binade, max_code the largest finite magnitude code.
_Target = collections.namedtuple("_Target", "man emin emax max_code")

_Format = collections.namedtuple(
    "_Format", "name bits man emin emax bias sign_bit max_code nan_code inf_code layout")

# fp32 itself: what decoding rounds to.
_FP32 = _Target(man=23, emin=-126, emax=127, max_code=F32_MAX)


def _i32(u):
    """The int32 value of the 32-bit pattern u."""
    return u - (1 << 32) if u >= 1 << 31 else u


@functools.lru_cache(maxsize=None)
def _format_of(name):
    info = codec.format_info(name)
    man, exp_bits, layout = info["man_bits"], info["exp_bits"], info["layout"]
    bias = (1 << (exp_bits - 1)) - 1
    exp_ones, man_ones = (1 << exp_bits) - 1, (1 << man) - 1
    if layout == "fn":
        inf_code, nan_code = 0, (exp_ones << man) | man_ones
        max_code = nan_code - 1
    elif layout == "mx":  # no inf, no NaN: a NaN input becomes +max
        inf_code, max_code = 0, (exp_ones << man) | man_ones
        nan_code = max_code
    else:
        inf_code = exp_ones << man
        # Y = 0 has no NaN code: NaN is encoded as inf (APS.md 1).
        nan_code = inf_code | (1 << (man - 1)) if man else inf_code
        max_code = inf_code - 1
    return _Format(name=info["name"], bits=info["bits"], man=man, emin=1 - bias,
                   emax=info["emax"], bias=bias, sign_bit=1 << (info["bits"] - 1),
                   max_code=max_code, nan_code=nan_code, inf_code=inf_code, layout=layout)


@functools.lru_cache(maxsize=4096)
def _checked(fmt, k):
    # libaps's own checks, on no data: an unknown format or |k| > 320 raises
    # the aps.ArgumentError aps.quantize would.
    codec.quantize(np.empty(0, dtype=np.float32), fmt, scale_exp=k)
    return _format_of(fmt)


def _spec(fmt, scale_exp):
    codec._fmt(fmt)  # a TypeError for a format that is not a str, ValueError for a NUL
    k = check_int(scale_exp, "scale exponent")  # ctypes would wrap it into int32's range
    return _checked(fmt, k)


def _flat_float32(t, what="t"):
    """t read flat as contiguous float32: float16 and bfloat16 widen exactly;
    float64 would round twice and is refused, as aps.quantize refuses it."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{what} must be a torch.Tensor, not {type(t).__name__}")
    check_has_data(t, what)
    if t.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise TypeError(f"{what} must have dtype float32, float16 or bfloat16, not {t.dtype}")
    return t.detach().reshape(-1).to(torch.float32).contiguous()


def _chunk(device):
    return CPU_CHUNK if device.type == "cpu" else DEVICE_CHUNK


# -- rounding -------------------------------------------------------------------


def _round(m, E, f):
    """m * 2^E rounded to nearest even in the target f (m: int32 tensor of
    integers in [1, 2^24), E: int32 tensor): (magnitude code, overflow mask,
    the rounded significand, 0 where the value flushes to zero).
    encode_finite() of codec_scalar.c; m = 0 gives a meaningless code, which
    callers replace."""
    lg = (m.float().view(torch.int32) >> 23) - 127  # floor(log2(m)), exact below 2^24
    e = E + lg
    over = e > f.emax
    s = e.clamp_(f.emin, f.emax).sub_(f.man)  # exponent of the spacing (e clamped for range)
    d = s - E  # > 0: shift m right by d and round; <= 0: shift left by -d (at most 23)
    right = d.clamp(1, 25)  # from 25 on every m < 2^24 rounds to 0, as a shift of 25 does
    # half to even: add half - 1 and the lowest kept bit, then shift
    q = ((m >> right) & 1).add_(m).add_((1 << (right - 1)).sub_(1)).bitwise_right_shift_(right)
    q = torch.where(d > 0, q, m << d.neg_().clamp_(0, 23))
    # s + man - emin is the biased exponent minus one: q's leading bit adds the one
    # (and a carry out of the mantissa moves to the next binade).
    code = s.add_(f.man - f.emin).bitwise_left_shift_(f.man).add_(q)
    over |= code > f.max_code
    return code, over, q


def _encode(bits, f, k):
    """Codes (int32, sign bit included) of the fp32 patterns bits times 2^k in
    format f, with what stats need (|bits|, the overflow mask, the rounded
    significand): encode() of codec_scalar.c."""
    xa = bits & F32_ABS
    exp_field = xa >> 23
    normal = exp_field > 0
    m = torch.where(normal, (xa & 0x7FFFFF) | 0x800000, xa)
    E = exp_field.clamp_(min=1).add_(k - 150)
    code, over, q = _round(m, E, f)
    inf = xa == F32_INF
    # overflow and inf saturate to max finite; +-0 keeps only its sign
    code.masked_fill_(over | inf, f.max_code).masked_fill_(xa == 0, 0)
    code |= (bits >> 31) & _i32(f.sign_bit)
    nan = xa > F32_INF
    code.masked_fill_(nan, f.nan_code)  # NaN of either sign: the positive canonical NaN
    return code, xa, over, q


def _decode(code, f, k):
    """fp32 patterns (int32) of the int32 codes of format f times 2^-k, each
    rounded once to nearest even (inf beyond fp32): aps_format_decode, then
    ldexp, then the conversion to float, of format.c and codec_scalar.c."""
    mag = code & (f.sign_bit - 1)
    exp_field = mag >> f.man
    m = mag & ((1 << f.man) - 1)
    m = torch.where(exp_field > 0, m | (1 << f.man), m)
    E = exp_field.clamp(min=1).add_(-f.bias - f.man - k)
    out, over, _ = _round(m, E, _FP32)
    out.masked_fill_(over, F32_INF).masked_fill_(m == 0, 0)
    if f.layout == "mx":
        nan = torch.zeros_like(mag, dtype=torch.bool)
    elif f.layout == "fn":
        nan = mag == f.nan_code
    else:
        out.masked_fill_(mag == f.inf_code, F32_INF)
        nan = mag > f.inf_code
    out |= (code << (32 - f.bits)) & _i32(1 << 31)  # the code's sign bit to fp32's
    return out.masked_fill_(nan, F32_QNAN)


@functools.lru_cache(maxsize=256)
def _table(fmt, k, device):
    """Every code's decoded fp32 value, for a format of at most 16 bits."""
    f = _format_of(fmt)
    codes = torch.arange(1 << f.bits, dtype=torch.int32, device=device)
    return _decode(codes, f, k).view(torch.float32)


# -- packing --------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def _layout(bits):
    """(codes per block, bytes per block, [(byte, code, shift)]): a block of
    codes fills whole bytes; byte j takes code i shifted left by shift (right
    by -shift) wherever their bits meet in the stream."""
    group = 8 // math.gcd(bits, 8)
    nbytes = group * bits // 8
    parts = []
    for i in range(group):
        lo, hi = i * bits, (i + 1) * bits
        for j in range(lo // 8, (hi - 1) // 8 + 1):
            parts.append((j, i, lo - 8 * j))
    return group, nbytes, parts


def _pack(code, bits):
    """The int32 codes (a multiple of the block in number) as packed bytes."""
    if bits == 8:
        return code.to(torch.uint8)
    if bits == 32:
        return code.view(torch.uint8)  # little-endian, as the bit stream
    group, nbytes, parts = _layout(bits)
    blocks = code.view(-1, group)
    cols = [None] * nbytes
    for j, i, shift in parts:
        c = blocks[:, i]
        part = (c << shift) if shift >= 0 else (c >> -shift)
        cols[j] = part if cols[j] is None else cols[j] | part
    return torch.stack(cols, dim=1).bitwise_and_(0xFF).to(torch.uint8).view(-1)


def _unpack(data, count, bits):
    """count int32 codes from packed bytes (at least the packed size of count,
    read as whole blocks: the last one is padded with zeros)."""
    group, nbytes, parts = _layout(bits)
    nblocks = -(-count // group)
    used = (count * bits + 7) // 8
    if nblocks * nbytes > used:
        data = torch.cat([data[:used], data.new_zeros(nblocks * nbytes - used)])
    data = data[:nblocks * nbytes]
    if bits == 32:
        if data.storage_offset() % 4 or not data.is_contiguous():
            data = data.clone()
        return data.view(torch.int32)
    if bits == 8:
        return data.to(torch.int32)
    blocks = data.view(nblocks, nbytes).to(torch.int32)
    codes = [None] * group
    for j, i, shift in parts:
        b = blocks[:, j]
        part = (b >> shift) if shift >= 0 else (b << -shift)
        codes[i] = part if codes[i] is None else codes[i] | part
    return torch.stack(codes, dim=1).view(-1)[:count].bitwise_and_((1 << bits) - 1)


# -- the public functions ---------------------------------------------------------


def _maxabs(x):
    """Largest |x| over the finite values of the float32 tensor x (0 if none),
    as a 0-d tensor."""
    if x.numel() == 0:
        return torch.zeros((), dtype=torch.float32, device=x.device)
    lo, hi = torch.aminmax(torch.nan_to_num(x, nan=0.0, posinf=0.0, neginf=0.0))
    return torch.maximum(-lo, hi)


def _counts(xa, over, q):
    """What stats count of one pass of _encode: overflow, non-finite, flushed."""
    finite = (xa < F32_INF) & (xa != 0)
    return torch.stack([(over & finite).sum(), (xa >= F32_INF).sum(),
                        ((q == 0) & finite & ~over).sum()])


def _report(stats, counts, x):
    overflow, nonfinite, flushed = counts.tolist()
    stats.update(overflow=overflow, nonfinite=nonfinite, flushed=flushed,
                 maxabs=float(_maxabs(x)))


def quantize(t, fmt, scale_exp=0, rounding="nearest", out=None, stats=None):
    """Quantizes the tensor t (read flat; float32, or float16/bfloat16, which
    widen exactly) times 2**scale_exp into packed codes of fmt, on t's device:
    a uint8 tensor (out if given), the bytes aps.quantize returns. If stats is
    a dict it receives overflow, nonfinite, flushed and maxabs (which waits for
    the device). Round to nearest even only."""
    if rounding != "nearest":
        raise ValueError(f"aps.torch.quantize rounds to nearest only, not {rounding!r}")
    f = _spec(fmt, scale_exp)
    k = int(scale_exp)
    x = _flat_float32(t)
    n = x.numel()
    need = (n * f.bits + 7) // 8
    if out is None:
        out = torch.empty(need, dtype=torch.uint8, device=x.device)
    elif not isinstance(out, torch.Tensor) or out.dtype != torch.uint8:
        raise TypeError("out must be a torch uint8 tensor")
    elif out.device != x.device or not out.is_contiguous():
        raise ValueError(f"out must be contiguous and on {x.device}")
    elif out.requires_grad:
        raise ValueError("out requires grad: pass a tensor autograd does not track")
    elif out.numel() < need:
        raise ValueError(f"out holds {out.numel()} bytes, {n} {fmt} codes need {need}")
    if stats is not None and not isinstance(stats, dict):
        raise TypeError("stats must be a dict or None")
    counts = quantize_into(x, f, k, out.view(-1), stats is not None)
    if stats is not None:
        _report(stats, counts, x)
    return out


def quantize_into(x, f, k, flat, count=False):
    """The packed codes of x (flat float32) times 2^k in format f (a _Format)
    into flat (uint8, room for them), on x's device: k an int or an int32
    tensor of one element (an exponent computed on the device, not waited
    for). Returns the stats' counts (a tensor) when count, else None."""
    n = x.numel()
    need = (n * f.bits + 7) // 8
    bits = x.view(torch.int32)
    group = _layout(f.bits)[0]
    counts = torch.zeros(3, dtype=torch.int64, device=x.device) if count else None
    step = _chunk(x.device)
    for start in range(0, n, step):
        chunk = bits[start:start + step]
        code, xa, over, q = _encode(chunk, f, k)
        if count:
            counts += _counts(xa, over, q)
        if code.numel() % group:
            code = torch.cat([code, code.new_zeros(group - code.numel() % group)])
        packed = _pack(code, f.bits)
        lo = start * f.bits // 8
        hi = min(lo + packed.numel(), need)
        flat[lo:hi].copy_(packed[:hi - lo])
    return counts


def dequantize(codes, fmt, count, scale_exp=0, out=None):
    """Decodes count packed codes of fmt (a uint8 tensor, as quantize or
    aps.quantize gives them) times 2**-scale_exp on codes' device; returns a
    float32 tensor of count elements, or out (float32, on the same device)
    written in place: read flat if contiguous, else its every element."""
    f = _spec(fmt, scale_exp)
    k = int(scale_exp)
    if not isinstance(codes, torch.Tensor) or codes.dtype != torch.uint8:
        raise TypeError("codes must be a torch uint8 tensor")
    check_has_data(codes, "codes")
    count = check_int(count, "count", (-1, 1 << 64))
    if count < 0:
        raise ValueError("count must not be negative")
    data = codes.reshape(-1)
    need = (count * f.bits + 7) // 8
    if data.numel() < need:
        raise ValueError(f"{count} {fmt} codes need {need} bytes, codes holds {data.numel()}")
    if out is not None:
        if not isinstance(out, torch.Tensor) or out.dtype != torch.float32:
            raise TypeError("out must be a torch float32 tensor")
        if out.device != codes.device:
            raise ValueError(f"out is on {out.device}, codes on {codes.device}")
        if out.is_contiguous() and out.numel() < count:
            raise ValueError(f"out holds {out.numel()} elements, count is {count}")
        if not out.is_contiguous() and out.numel() != count:
            raise ValueError(f"a non-contiguous out must hold count ({count}) elements, "
                             f"not {out.numel()}")
    dest = out.view(-1)[:count] if out is not None and out.is_contiguous() else \
        torch.empty(count, dtype=torch.float32, device=codes.device)
    table = _table(f.name, k, codes.device) if f.bits <= 16 else None
    step = _chunk(codes.device)  # a multiple of every block
    for start in range(0, count, step):
        n = min(step, count - start)
        lo = start * f.bits // 8
        part = dest[start:start + n]
        if f.bits == 8:
            torch.index_select(table, 0, data[lo:lo + n].long(), out=part)
            continue
        code = _unpack(data[lo:lo + (n * f.bits + 7) // 8], n, f.bits)
        if table is not None:
            torch.index_select(table, 0, code.long(), out=part)
        else:
            part.copy_(_decode(code, f, k).view(torch.float32))
    if out is None:
        return dest
    if not out.is_contiguous():
        out.copy_(dest.view(out.shape))
    return out


# -- block scaling ----------------------------------------------------------------

BLOCK_MAX_EXPONENT = 127  # APS_SCALE_BLOCK_MAX: exponents travel as int8


def local_exponents(f, maxabs):
    """aps_scale_local of every element of maxabs (float32, finite, >= 0) on
    its device, without waiting for it: the top element in the top binade, one
    less if it then rounds past max finite; 0 where maxabs is 0. int32."""
    # ilogb of maxabs from its bits, subnormals included: frexp's exponent minus one
    _, e = torch.frexp(maxabs)
    k = (f.emax - (e.to(torch.int32) - 1)).to(torch.int32)
    _, _, over, _ = _encode(maxabs.view(torch.int32), f, k)
    return (k - over.to(torch.int32)).masked_fill_(maxabs == 0, 0)


def _block_exponents(f, xb):
    """aps_scale_block of every row of xb (float32 [blocks, block]): the local
    rule on the row's largest finite |x|, 0 for a row without one, within
    +-127. An int32 tensor on xb's device."""
    maxabs = torch.nan_to_num(xb, nan=0.0, posinf=0.0, neginf=0.0).abs_().amax(dim=1)
    return local_exponents(f, maxabs).clamp_(-BLOCK_MAX_EXPONENT, BLOCK_MAX_EXPONENT)


def _blocks_of(fmt, block):
    if block not in (16, 32, 64):
        raise ValueError(f"block must be 16, 32 or 64, not {block}")
    return _spec(fmt, 0)


def quantize_blocks(t, fmt, block=32, stats=None):
    """Block scaling on t's device: t (read flat) in blocks of block elements
    (16, 32 or 64; the last may be short), each quantized with its own APS
    exponent. Returns (codes, exps): a uint8 tensor of the packed codes and an
    int8 tensor of one exponent per block, the bits aps.quantize_blocks gives.
    stats as for quantize. Round to nearest even."""
    f = _blocks_of(fmt, block)
    x = _flat_float32(t)
    if stats is not None and not isinstance(stats, dict):
        raise TypeError("stats must be a dict or None")
    codes, exps, counts = quantize_blocks_into(x, f, block, stats is not None)
    if stats is not None:
        _report(stats, counts, x)
    return codes, exps


def quantize_blocks_into(x, f, block, count=False):
    """quantize_blocks of x (flat float32) in format f (a _Format) without
    waiting for the device: (codes, exps, the stats' counts as a tensor when
    count, else None)."""
    n = x.numel()
    nb = -(-n // block)
    if nb * block > n:  # zeros fill the last block: they change neither max nor codes
        x = torch.cat([x, x.new_zeros(nb * block - n)])
    need = (n * f.bits + 7) // 8
    codes = torch.empty(need, dtype=torch.uint8, device=x.device)
    exps = torch.empty(nb, dtype=torch.int8, device=x.device)
    counts = torch.zeros(3, dtype=torch.int64, device=x.device) if count else None
    step = _chunk(x.device) // block  # blocks per pass
    for b0 in range(0, nb, step):
        xb = x[b0 * block:(b0 + step) * block].view(-1, block)
        k = _block_exponents(f, xb)
        code, xa, over, q = _encode(xb.view(torch.int32), f, k[:, None])
        if count:
            counts += _counts(xa, over, q)
        packed = _pack(code.reshape(-1), f.bits)  # a whole block is whole bytes
        lo = b0 * block * f.bits // 8
        hi = min(lo + packed.numel(), need)
        codes[lo:hi].copy_(packed[:hi - lo])
        exps[b0:b0 + k.numel()].copy_(k)
    return codes, exps, counts


def dequantize_blocks(codes, exps, fmt, count, block=32, out=None):
    """Decodes count block-scaled codes of fmt on codes' device: element i is
    code i times 2**-exps[i // block], rounded once to fp32; returns a float32
    tensor of count elements, or out (contiguous float32, written in place)."""
    f = _blocks_of(fmt, block)
    if not isinstance(codes, torch.Tensor) or codes.dtype != torch.uint8:
        raise TypeError("codes must be a torch uint8 tensor")
    if not isinstance(exps, torch.Tensor) or exps.dtype != torch.int8:
        raise TypeError("exps must be a torch int8 tensor")
    check_has_data(codes, "codes")
    check_has_data(exps, "exps")
    count = check_int(count, "count", (-1, 1 << 64))
    if count < 0:
        raise ValueError("count must not be negative")
    need, nb = (count * f.bits + 7) // 8, -(-count // block)
    data, exps = codes.reshape(-1), exps.reshape(-1)
    if data.numel() < need or exps.numel() < nb:
        raise ValueError(f"{count} {fmt} codes in blocks of {block} need {need} bytes and "
                         f"{nb} exponents, not {data.numel()} and {exps.numel()}")
    if out is not None and (not isinstance(out, torch.Tensor) or out.dtype != torch.float32
                            or not out.is_contiguous() or out.numel() < count
                            or out.device != codes.device):
        raise ValueError(f"out must be a contiguous float32 tensor of at least {count} "
                         f"elements on {codes.device}")
    dest = out.view(-1)[:count] if out is not None else \
        torch.empty(count, dtype=torch.float32, device=codes.device)
    step = _chunk(codes.device)  # a multiple of every block
    for start in range(0, count, step):
        n = min(step, count - start)
        lo = start * f.bits // 8
        code = _unpack(data[lo:lo + (n * f.bits + 7) // 8], n, f.bits)
        k = exps[start // block:][:-(-n // block)].to(torch.int32)
        k = k.repeat_interleave(block)[:n]
        dest[start:start + n].copy_(_decode(code, f, k).view(torch.float32))
    return out if out is not None else dest


_SCALING = ("none", "local", "global")


def aps_exponent(t, fmt, nworkers=1, mode="global"):
    """The APS scale exponent k of the tensor t for fmt, as aps.aps_exponent
    computes it: mode "global" (the paper, emax - ceil(log2(nworkers *
    max|t|))), "local" (largest k without overflow) or "none" (0). NaN and inf
    are ignored; an all-zero (or all non-finite) tensor gives 0. Waits for the
    device (k is a Python int)."""
    f = _spec(fmt, 0)
    if mode not in _SCALING:
        raise ValueError(f"mode must be one of {sorted(_SCALING)}, not {mode!r}")
    nworkers = check_int(nworkers, "nworkers", POSITIVE_INT32)  # as libaps's int32
    x = _flat_float32(t)
    if mode == "none":
        return 0
    maxabs = float(_maxabs(x))
    if maxabs == 0.0:
        return 0
    if mode == "local":
        return int(local_exponents(f, torch.tensor([maxabs], dtype=torch.float32))[0])
    return f.emax - _global_exponent(maxabs, nworkers)


def _global_exponent(maxabs, nworkers):
    """aps_scale_global_exponent: ceil(log2(nworkers * maxabs)) in integers."""
    (bits,) = struct.unpack("<I", struct.pack("<f", maxabs))
    e = bits >> 23
    product = ((bits & 0x7FFFFF) | (0x800000 if e else 0)) * nworkers
    return max(e, 1) - 150 + (product - 1).bit_length()  # ceil(log2(p)): bit length of p - 1
