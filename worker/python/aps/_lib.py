"""Loading libaps and declaring the C signatures the binding uses (ctypes).

The library is found through APS_LIBRARY, else libaps.so next to this file (the
wheel's copy), else the libdir that `meson install` recorded in aps/_install.py,
else the build tree's build/worker/libaps.so.0, else the system's libaps.so.0.
"""

import ctypes
import os
import pathlib


class Error(Exception):
    """A failure reported by libaps: .code is the negative APS_E* code."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code = code
        self.name = None


class ArgumentError(Error, ValueError):
    """A call refused for its arguments (unknown format, short buffer, value out of
    range): both an aps.Error and a ValueError."""


# Codes that mean the caller's arguments were wrong.
_ARGUMENT_ERRORS = ("APS_EINVAL", "APS_EFORMAT", "APS_ERANGE", "APS_ESHORT")


class FormatInfo(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char * 16),
        ("bits", ctypes.c_uint32),
        ("exp_bits", ctypes.c_uint32),
        ("man_bits", ctypes.c_uint32),
        ("fn", ctypes.c_uint32),
        ("emax", ctypes.c_int32),
        ("max", ctypes.c_float),
        ("min_normal", ctypes.c_float),
        ("min_subnormal", ctypes.c_float),
    ]


class QuantizeOpts(ctypes.Structure):
    _fields_ = [
        ("scale_exp", ctypes.c_int32),
        ("rounding", ctypes.c_int32),
        ("seed", ctypes.c_uint64),
        ("stream", ctypes.c_uint64),
        ("index0", ctypes.c_uint64),
    ]


# The client's diagnostics callback: (ctx, level, line); see aps_log_fn in aps.h.
LogFn = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p)


class ClientOpts(ctypes.Structure):
    """struct aps_client_opts, member for member; fill it with
    aps_client_opts_init. Its size is checked against the library's
    aps_client_opts_size() when the library is loaded."""
    _fields_ = [
        ("endpoint", ctypes.c_char_p),
        ("job", ctypes.c_char_p),
        ("rank", ctypes.c_uint32),
        ("world_size", ctypes.c_uint32),
        ("format", ctypes.c_char_p),
        ("scaling", ctypes.c_int32),
        ("downlink", ctypes.c_char_p),
        ("timeout_ms", ctypes.c_int32),
        ("heartbeat_ms", ctypes.c_int32),
        ("log", LogFn),
        ("log_ctx", ctypes.c_void_p),
        ("trace", ctypes.c_char_p),
        ("policy_auto", ctypes.c_int32),
        ("rules", ctypes.c_char_p),
        ("error_feedback", ctypes.c_int32),
        ("curve_server_key", ctypes.c_char_p),
        ("curve_public_key", ctypes.c_char_p),
        ("curve_secret_key", ctypes.c_char_p),
        ("rejoin", ctypes.c_int32),
        ("partition_bytes", ctypes.c_uint64),
        ("optimizer", ctypes.c_char_p),
        ("job_token", ctypes.c_char_p),
        ("connect_timeout_ms", ctypes.c_int32),
        ("block_size", ctypes.c_uint32),
        ("codec_threads", ctypes.c_uint32),
        ("no_payload_crc", ctypes.c_int32),
    ]


class CodesLayout(ctypes.Structure):
    """struct aps_codes_layout: where a tensor's codes lie, chunk after chunk."""
    _fields_ = [
        ("format", ctypes.c_char * 16),
        ("count", ctypes.c_uint64),
        ("chunk_elems", ctypes.c_uint64),
        ("chunks", ctypes.c_uint32),
        ("block", ctypes.c_uint32),
        ("chunk_bytes", ctypes.c_uint64),
        ("bytes", ctypes.c_uint64),
    ]


class CodesCall(ctypes.Structure):
    """struct aps_codes_call: the buffers of a codes call."""
    _fields_ = [
        ("format", ctypes.c_char_p),
        ("codes", ctypes.c_void_p),
        ("codes_len", ctypes.c_uint64),
        ("scale_exp", ctypes.c_int32),
        ("result", ctypes.c_void_p),
        ("result_len", ctypes.c_uint64),
        ("result_exps", ctypes.c_void_p),
        ("n_result_exps", ctypes.c_uint32),
        ("flushed", ctypes.c_void_p),
        ("n_flushed", ctypes.c_uint32),
    ]


class QuantizeStats(ctypes.Structure):
    _fields_ = [
        ("overflow", ctypes.c_uint64),
        ("nonfinite", ctypes.c_uint64),
        ("flushed", ctypes.c_uint64),
        ("maxabs", ctypes.c_float),
    ]


def _candidates():
    env = os.environ.get("APS_LIBRARY")
    if env:
        return [env]
    here = pathlib.Path(__file__).resolve().parent
    found = [here / "libaps.so"]
    if (here / "_install.py").exists():
        from aps._install import LIBDIR
        found.append(pathlib.Path(LIBDIR) / "libaps.so.0")
    found.append(here.parents[2] / "build" / "worker" / "libaps.so.0")
    return [str(p) for p in found] + ["libaps.so.0"]


def _load():
    errors = []
    for path in _candidates():
        try:
            return ctypes.CDLL(path)
        except OSError as exc:
            errors.append(f"{path}: {exc}")
    raise ImportError("cannot load libaps (set APS_LIBRARY or run 'make build'): "
                      + "; ".join(errors))


lib = _load()

_P = ctypes.c_void_p
_U64 = ctypes.c_uint64
_I32 = ctypes.c_int32
_SIGNATURES = {
    "aps_version": (ctypes.c_char_p, []),
    "aps_last_error": (ctypes.c_char_p, []),
    "aps_strerror": (ctypes.c_char_p, [ctypes.c_int]),
    "aps_err_name": (ctypes.c_char_p, [ctypes.c_int]),
    "aps_format_info": (ctypes.c_int, [ctypes.c_char_p, ctypes.POINTER(FormatInfo)]),
    "aps_packed_size": (ctypes.c_int64, [ctypes.c_char_p, _U64]),
    "aps_quantize": (ctypes.c_int, [ctypes.c_char_p, _P, _U64, ctypes.POINTER(QuantizeOpts),
                                    _P, _U64, ctypes.POINTER(QuantizeStats)]),
    "aps_dequantize": (ctypes.c_int, [ctypes.c_char_p, _P, _U64, _U64, _I32, _P]),
    "aps_accumulate": (ctypes.c_int, [ctypes.c_char_p, _P, _U64, _U64, _I32, _P]),
    "aps_maxabs": (ctypes.c_float, [_P, _U64]),
    "aps_block_count": (_U64, [_U64, ctypes.c_uint32]),
    "aps_quantize_blocks": (ctypes.c_int, [ctypes.c_char_p, _P, _U64, ctypes.c_uint32,
                                           ctypes.POINTER(QuantizeOpts), _P, _U64, _P, _U64,
                                           ctypes.POINTER(QuantizeStats)]),
    "aps_dequantize_blocks": (ctypes.c_int, [ctypes.c_char_p, _P, _U64, _P, _U64, _U64,
                                             ctypes.c_uint32, _P]),
    "aps_accumulate_blocks": (ctypes.c_int, [ctypes.c_char_p, _P, _U64, _P, _U64, _U64,
                                             ctypes.c_uint32, _P]),
    "aps_exponent": (ctypes.c_int, [ctypes.c_char_p, _P, _U64, _I32, _I32,
                                    ctypes.POINTER(_I32)]),
    "aps_client_opts_init": (None, [ctypes.POINTER(ClientOpts)]),
    "aps_client_new": (ctypes.c_int, [ctypes.POINTER(_P), ctypes.POINTER(ClientOpts)]),
    "aps_client_register": (ctypes.c_int, [_P, ctypes.c_char_p, _U64,
                                           ctypes.POINTER(ctypes.c_uint32)]),
    "aps_client_allreduce": (ctypes.c_int, [_P, ctypes.c_uint32, _P, _U64, _I32]),
    "aps_client_allreduce_start": (ctypes.c_int, [_P, ctypes.c_uint32, _P, _U64, _I32,
                                                  ctypes.POINTER(_P)]),
    "aps_request_wait": (ctypes.c_int, [_P]),
    "aps_request_done": (ctypes.c_int, [_P]),
    "aps_client_broadcast": (ctypes.c_int, [_P, ctypes.c_uint32, _P, _U64, _I32]),
    "aps_client_barrier": (ctypes.c_int, [_P, _I32]),
    "aps_client_close": (ctypes.c_int, [_P]),
}
_SIGNATURES["aps_client_opts_size"] = (ctypes.c_size_t, [])
_SIGNATURES["aps_client_step_start"] = (ctypes.c_int, [_P, ctypes.c_uint32, _P, _P, _U64,
                                                       ctypes.c_float, _I32, ctypes.POINTER(_P)])
_SIGNATURES["aps_client_pull"] = (ctypes.c_int, [_P, ctypes.c_uint32, _P, _U64, _I32,
                                                 ctypes.POINTER(_U64)])
_SIGNATURES["aps_client_tensor_updates"] = (ctypes.c_int, [_P, ctypes.c_uint32,
                                                           ctypes.POINTER(_U64)])
_SIGNATURES["aps_client_codes_layout"] = (ctypes.c_int, [_P, ctypes.c_uint32,
                                                         ctypes.POINTER(CodesLayout),
                                                         ctypes.POINTER(CodesLayout)])
_SIGNATURES["aps_client_allreduce_codes_start"] = (ctypes.c_int, [_P, ctypes.c_uint32,
                                                                  ctypes.POINTER(CodesCall), _I32,
                                                                  ctypes.POINTER(_P)])
_SIGNATURES["aps_client_step_codes_start"] = (ctypes.c_int, [_P, ctypes.c_uint32,
                                                             ctypes.POINTER(CodesCall),
                                                             ctypes.c_float, _I32,
                                                             ctypes.POINTER(_P)])
_SIGNATURES["aps_curve_keypair"] = (ctypes.c_int, [ctypes.c_char_p, ctypes.c_char_p])
for _name, (_restype, _argtypes) in _SIGNATURES.items():
    _fn = getattr(lib, _name)
    _fn.restype = _restype
    _fn.argtypes = _argtypes


def error_for(ret, detail):
    """The exception for the negative APS_E* code ret with the message detail."""
    name = lib.aps_err_name(ret)
    name = name.decode() if name else None
    err = (ArgumentError if name in _ARGUMENT_ERRORS else Error)(ret, detail)
    err.name = name
    return err


def last_error(ret):
    """The exception for the call that just failed with ret on this thread
    (aps_last_error is per thread: call it on the thread that failed)."""
    detail = lib.aps_last_error().decode() or lib.aps_strerror(ret).decode()
    return error_for(ret, detail)


def check(ret):
    """Raises Error for a negative return code, else returns ret."""
    if ret < 0:
        raise last_error(ret)
    return ret

if lib.aps_client_opts_size() != ctypes.sizeof(ClientOpts):
    raise ImportError(f"libaps has a struct aps_client_opts of {lib.aps_client_opts_size()} "
                      f"bytes, this binding {ctypes.sizeof(ClientOpts)}: they are from "
                      "different versions")
