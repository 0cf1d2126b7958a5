"""The low-precision codec: numpy arrays in, packed codes out, and back.

Thin wrappers over libaps: argument checks here raise TypeError/ValueError
before anything reaches C; what C refuses raises aps.Error with its message.
"""

import ctypes

import numpy as np

from aps._args import POSITIVE_INT32, UINT64, check_int, check_str, check_writable
from aps._lib import FormatInfo, QuantizeOpts, QuantizeStats, check, lib

_ROUNDING = {"nearest": 0, "stochastic": 1}
_SCALING = {"none": 0, "local": 1, "global": 2}


def _fmt(fmt):
    return check_str(fmt, "format")


def _as_float32(x, what="x"):
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{what} must be a numpy.ndarray, not {type(x).__name__}")
    if x.dtype != np.float32:
        raise TypeError(f"{what} must have dtype float32, not {x.dtype}")
    if not x.flags.c_contiguous:
        raise ValueError(f"{what} must be C-contiguous")
    return x


def _ptr(a):
    return a.ctypes.data_as(ctypes.c_void_p)


def format_info(fmt):
    """Describes a format: bits, exp_bits, man_bits, layout ("ieee": inf and
    NaN; "fn": one NaN, no inf, as e4m3fn; "mx": neither, as the OCP MX element
    formats fp4, fp6e2m3, fp6e3m2), fn (layout == "fn"), emax, max,
    min_normal, min_subnormal."""
    info = FormatInfo()
    check(lib.aps_format_info(_fmt(fmt), ctypes.byref(info)))
    return {
        "name": info.name.decode(),
        "bits": info.bits,
        "exp_bits": info.exp_bits,
        "man_bits": info.man_bits,
        "layout": ("ieee", "fn", "mx")[info.fn],
        "fn": info.fn == 1,
        "emax": info.emax,
        "max": float(info.max),
        "min_normal": float(info.min_normal),
        "min_subnormal": float(info.min_subnormal),
    }


def packed_size(fmt, count):
    """Bytes that count codes of fmt occupy when packed."""
    return check(lib.aps_packed_size(_fmt(fmt), check_int(count, "count", UINT64)))


def quantize(x, fmt, scale_exp=0, rounding="nearest", seed=0, stream=0, out=None,
             stats=None):
    """Quantizes the float32 array x (read flat) times 2**scale_exp into packed
    codes of fmt; returns a uint8 array (out if given). If stats is a dict it
    receives overflow, nonfinite, flushed and maxabs."""
    x = _as_float32(x)
    if rounding not in _ROUNDING:
        raise ValueError(f"rounding must be one of {sorted(_ROUNDING)}, not {rounding!r}")
    need = packed_size(fmt, x.size)
    if out is None:
        out = np.empty(need, dtype=np.uint8)
    elif not isinstance(out, np.ndarray) or out.dtype != np.uint8:
        raise TypeError("out must be a numpy uint8 array")
    elif not out.flags.c_contiguous:
        raise ValueError("out must be C-contiguous")
    elif not out.flags.writeable:
        check_writable(out, "out")
    elif out.nbytes < need:
        raise ValueError(f"out holds {out.nbytes} bytes, {x.size} {fmt} codes need {need}")
    if stats is not None and not isinstance(stats, dict):
        raise TypeError("stats must be a dict or None")
    opts = QuantizeOpts(check_int(scale_exp, "scale_exp"), _ROUNDING[rounding],
                        check_int(seed, "seed", UINT64), check_int(stream, "stream", UINT64), 0)
    st = QuantizeStats()
    check(lib.aps_quantize(_fmt(fmt), _ptr(x), x.size, ctypes.byref(opts), _ptr(out),
                           out.nbytes, ctypes.byref(st)))
    if stats is not None:
        stats.update(overflow=st.overflow, nonfinite=st.nonfinite, flushed=st.flushed,
                     maxabs=float(st.maxabs))
    return out


def _codes(codes):
    if not isinstance(codes, np.ndarray) or codes.dtype != np.uint8:
        raise TypeError("codes must be a numpy uint8 array")
    if not codes.flags.c_contiguous:
        raise ValueError("codes must be C-contiguous")
    return codes


def _decoded(out, count):
    """Where count decoded values go: out (float32, read flat), or a new array."""
    if count < 0:
        raise ValueError("count must not be negative")
    if out is None:
        return np.empty(count, dtype=np.float32)
    check_writable(_as_float32(out, "out"), "out")
    if out.size < count:
        raise ValueError(f"out holds {out.size} elements, count is {count}")
    return out


def dequantize(codes, fmt, count, scale_exp=0, out=None):
    """Decodes count packed codes of fmt times 2**-scale_exp; returns a float32
    array of count elements (out, read flat, if given)."""
    codes = _codes(codes)
    count = check_int(count, "count", (-1, UINT64[1]))  # negative: _decoded says so
    scale_exp = check_int(scale_exp, "scale_exp")
    out = _decoded(out, count)
    check(lib.aps_dequantize(_fmt(fmt), _ptr(codes), codes.nbytes, count, scale_exp,
                             _ptr(out)))
    return out


def accumulate(codes, fmt, acc, scale_exp=0):
    """acc += dequantize(codes, fmt, acc.size, scale_exp), in place; returns acc."""
    codes = _codes(codes)
    check_writable(_as_float32(acc, "acc"), "acc")
    check(lib.aps_accumulate(_fmt(fmt), _ptr(codes), codes.nbytes, acc.size,
                             check_int(scale_exp, "scale_exp"), _ptr(acc)))
    return acc


def _block(block):
    if isinstance(block, bool) or not isinstance(block, (int, np.integer)):
        raise TypeError(f"block must be an int, not {type(block).__name__}")
    if int(block) not in (16, 32, 64):
        raise ValueError(f"block must be 16, 32 or 64, not {block}")
    return int(block)


def _exps(exps, count, block):
    if not isinstance(exps, np.ndarray) or exps.dtype != np.int8:
        raise TypeError("exps must be a numpy int8 array")
    if not exps.flags.c_contiguous:
        raise ValueError("exps must be C-contiguous")
    need = -(-count // block)
    if exps.size < need:
        raise ValueError(f"exps holds {exps.size} exponents, {count} elements in blocks of "
                         f"{block} need {need}")
    return exps


def quantize_blocks(x, fmt, block=32, rounding="nearest", seed=0, stream=0, stats=None):
    """Block scaling: x (float32, read flat) in blocks of block elements (16,
    32 or 64; the last may be short), each quantized with its own APS exponent
    (the largest k at which the block does not saturate). Returns (codes,
    exps): packed codes as aps.quantize gives each block with its exponent, and
    one int8 exponent per block. stats as for quantize."""
    x = _as_float32(x)
    block = _block(block)
    if rounding not in _ROUNDING:
        raise ValueError(f"rounding must be one of {sorted(_ROUNDING)}, not {rounding!r}")
    if stats is not None and not isinstance(stats, dict):
        raise TypeError("stats must be a dict or None")
    codes = np.empty(packed_size(fmt, x.size), dtype=np.uint8)
    exps = np.empty(-(-x.size // block), dtype=np.int8)
    opts = QuantizeOpts(0, _ROUNDING[rounding], check_int(seed, "seed", UINT64),
                        check_int(stream, "stream", UINT64), 0)
    st = QuantizeStats()
    check(lib.aps_quantize_blocks(_fmt(fmt), _ptr(x), x.size, block, ctypes.byref(opts),
                                  _ptr(codes), codes.nbytes, _ptr(exps), exps.size,
                                  ctypes.byref(st)))
    if stats is not None:
        stats.update(overflow=st.overflow, nonfinite=st.nonfinite, flushed=st.flushed,
                     maxabs=float(st.maxabs))
    return codes, exps


def dequantize_blocks(codes, exps, fmt, count, block=32, out=None):
    """Decodes count block-scaled codes of fmt: element i is code i times
    2**-exps[i // block]; returns a float32 array (out, read flat, if given)."""
    codes = _codes(codes)
    count, block = check_int(count, "count", (-1, UINT64[1])), _block(block)
    out = _decoded(out, count)
    exps = _exps(exps, count, block)
    check(lib.aps_dequantize_blocks(_fmt(fmt), _ptr(codes), codes.nbytes, _ptr(exps),
                                    exps.size, count, block, _ptr(out)))
    return out


def maxabs(x):
    """Largest |x| over the finite elements of a float32 array."""
    x = _as_float32(x)
    return float(lib.aps_maxabs(_ptr(x), x.size))


def aps_exponent(x, fmt, nworkers=1, mode="global"):
    """The APS scale exponent k of x for fmt: mode "global" (the paper,
    emax - ceil(log2(nworkers * max|x|))), "local" (largest k without
    overflow) or "none" (0)."""
    x = _as_float32(x)
    if mode not in _SCALING:
        raise ValueError(f"mode must be one of {sorted(_SCALING)}, not {mode!r}")
    nworkers = check_int(nworkers, "nworkers", POSITIVE_INT32)
    k = ctypes.c_int32()
    check(lib.aps_exponent(_fmt(fmt), _ptr(x), x.size, nworkers, _SCALING[mode],
                           ctypes.byref(k)))
    return k.value
