"""aps.Client: one rank of a job on apsd, over libaps's blocking C client.

    with aps.Client("tcp://127.0.0.1:5555", rank, world_size, format="e4m3") as c:
        c.allreduce("fc.weight", grad)          # grad becomes the mean over ranks
        h = c.allreduce_async("fc.bias", g2)    # runs on the client's I/O thread
        ...                                     # compute meanwhile
        h.wait()

Every call starts on the client's I/O thread, in the order the calls were
made (the C client is not thread-safe: one thread at a time), and the GIL is
released while a call waits on the network. All-reduces overlap: the tensors
of one allreduce_many_async are all in flight at once, and the next batch
starts as soon as they are sent, while a second thread waits for their
results; barrier, broadcast and close first wait for every earlier call to
complete. Every rank must make its calls in the same order. A tensor is
passed by address and reduced in place: it must stay alive and untouched
until its handle is done.
"""

import collections
import ctypes
import logging
import math
import threading

import numpy as np

from aps import _env
from aps._args import (ANY_INT, INT32, POSITIVE_INT32, UINT32, UINT64, check_bool,
                       check_float, check_int, check_str)
from aps._buffers import float32_buffer, raw_buffer
from aps._io import Deferred, IOThread
from aps import _lib
from aps._codes import CodesLayout
from aps._lib import ClientOpts, CodesCall, LogFn, check, error_for, last_error, lib

_SCALING = {"none": 0, "local": 1, "global": 2, "block": 3}
_LOG_LEVELS = {0: logging.ERROR, 1: logging.WARNING, 2: logging.INFO, 3: logging.DEBUG}
_NAME_MAX = 255  # bytes of a tensor name (APS_MSG_NAME_MAX)
_APS_ECLOSED = -11
NONFINITE_POLICIES = ("raise", "zero")

log = logging.getLogger("aps.client")


def _log_line(_ctx, level, line):
    log.log(_LOG_LEVELS.get(level, logging.DEBUG), "%s", line.decode(errors="replace"))


_LOG_CALLBACK = LogFn(_log_line)  # one object for the life of the process


class Client:
    """A connection to apsd as rank `rank` of `world_size` in job `job`.

    format is the uplink format of every tensor ("fp32", "e4m3", "e3m0", ...),
    scaling "local" (APS, the default), "global" (the paper), "none", or
    "block" (an APS exponent per block of block_size elements, 16, 32 by
    default or 64: one int8 more per block on the wire, for formats of 4-6
    bits; fp32 travels as it is), downlink the format of results (None: the
    uplink format). timeout_ms bounds each call without progress.
    connect_timeout_ms bounds how long joining tries to connect (again every
    second at most while nothing listens, so that a daemon started a little
    later is joined; default 10000,
    $APS_CONNECT_TIMEOUT_MS with from_env; 0: timeout_ms alone); a daemon that
    took the connection is waited for up to timeout_ms. codec_threads (0-64):
    threads that scan and encode a tensor of several chunks together, the
    caller's included (None, 0 or 1: the caller's alone; the same codes).
    payload_crc=False sends the job's payloads without CRC32C both ways (every
    rank says the same; lengths and inf/NaN codes are still checked): about 9 %
    of a worker's CPU on large tensors.

    Hybrid precision (opt-in; a plain format= pins every tensor): policy="auto"
    lets the daemon move tensors that lose too much to a wider format and send
    small tensors in fp32; rules="fc.*=fp32,*.bias=fp16" asks formats by name;
    error_feedback=True carries what quantization lost into the next step.
    trace="file.json" writes a Chrome-trace timeline of every call. CURVE keys
    (Z85 strings, see `apsctl keygen`) encrypt and authenticate the connection.
    rejoin=True: when apsd restarts, the client joins the job again at the
    steps it is at and sends the calls in flight again, so they complete;
    ranks at different steps (a result reached some only) get aps.Error
    APS_EMISMATCH (docs/RELIABILITY.md).

    Shards: endpoint may be a list of endpoints, or one string with commas
    ("tcp://a:5555,tcp://b:5555"), each an independent apsd. Tensors larger
    than partition_bytes (fp32 bytes, default 4 MiB) are cut into partitions;
    partitions and smaller tensors go to the shard with the fewest bytes so far,
    in the order tensors are first used, which must be the same on every rank.
    Results are the bits one daemon would give when partition_bytes is a
    multiple of the daemons' chunk_bytes.

    optimizer="sgd,momentum=0.9" (or "adam,beta2=0.99", "adamw,...") joins the
    job in optimize mode: the daemon holds the fp32 weights, initialised by
    rank 0's broadcast of each tensor, and steps that optimizer; use step(),
    pull() and updates() instead of allreduce() (aps.torch.ServerOptimizer
    does it for a model).

    job_token="..." (1..128 visible ASCII characters, the same on every rank;
    default $APS_JOB_TOKEN with from_env): the job's first HELLO fixes it, and
    apsd refuses a HELLO with another token or none (aps.Error APS_EACCES), so
    that a stranger cannot take a free rank of the job.

    Raises aps.Error (e.g. APS_ECONN when no connection could be made, saying
    whether it was refused or nothing answered, APS_ETIMEDOUT when the daemon
    took the connection but did not answer, APS_EBUSY when the rank is taken,
    APS_EMISMATCH when the job's world size or options differ, APS_EACCES when
    the job token differs or CURVE refused the key). A limit of the daemon's
    (max_jobs, max_jobs_per_address, a checkpoint larger than the memory left
    to resume it) is APS_ERANGE, raised as aps.ArgumentError (an aps.Error and
    a ValueError). A bad option raises TypeError or ValueError before anything
    connects.
    """

    def __init__(self, endpoint, rank, world_size, format="e4m3", scaling="local",
                 job="default", downlink=None, timeout_ms=60000, policy=None, rules=None,
                 error_feedback=False, trace=None, curve_server_key=None,
                 curve_public_key=None, curve_secret_key=None, rejoin=False,
                 partition_bytes=None, optimizer=None, job_token=None,
                 connect_timeout_ms=10000, block_size=None, codec_threads=None,
                 payload_crc=True):
        if scaling not in _SCALING:
            raise ValueError(f"scaling must be one of {sorted(_SCALING)}, not {scaling!r}")
        if policy not in (None, "auto"):
            raise ValueError(f"policy must be None or 'auto', not {policy!r}")
        endpoint = _endpoint_list(endpoint)
        self._strings = [check_str(endpoint, "endpoint"), check_str(job, "job"),
                         check_str(format, "format"),
                         check_str(downlink, "downlink", allow_none=True),
                         check_str(rules, "rules", allow_none=True),
                         check_str(trace, "trace", allow_none=True),
                         check_str(curve_server_key, "curve_server_key", allow_none=True),
                         check_str(curve_public_key, "curve_public_key", allow_none=True),
                         check_str(curve_secret_key, "curve_secret_key", allow_none=True),
                         check_str(optimizer, "optimizer", allow_none=True),
                         check_str(job_token, "job_token", allow_none=True)]
        opts = ClientOpts()
        lib.aps_client_opts_init(ctypes.byref(opts))
        (opts.endpoint, opts.job, opts.format, opts.downlink, opts.rules, opts.trace,
         opts.curve_server_key, opts.curve_public_key, opts.curve_secret_key,
         opts.optimizer, opts.job_token) = self._strings
        opts.policy_auto = 1 if policy == "auto" else 0
        opts.error_feedback = 1 if check_bool(error_feedback, "error_feedback") else 0
        opts.rejoin = 1 if check_bool(rejoin, "rejoin") else 0
        opts.no_payload_crc = 0 if check_bool(payload_crc, "payload_crc") else 1
        rank = check_int(rank, "rank", ANY_INT)
        world_size = check_int(world_size, "world_size", ANY_INT)
        if not 0 <= rank < world_size <= UINT32[1]:
            raise ValueError(f"rank {rank} is not in a world of {world_size}")
        opts.rank, opts.world_size = rank, world_size
        opts.scaling = _SCALING[scaling]
        if block_size is not None:
            if (scaling != "block"
                    or check_int(block_size, "block_size", ANY_INT) not in (16, 32, 64)):
                raise ValueError(f"block_size {block_size}: 16, 32 or 64, with scaling='block'")
            opts.block_size = block_size
        self.block_size = (block_size or 32) if scaling == "block" else 0
        if codec_threads is not None:
            if not 0 <= check_int(codec_threads, "codec_threads", ANY_INT) <= 64:
                raise ValueError(f"codec_threads {codec_threads}: 0 to 64")
            opts.codec_threads = codec_threads
        opts.timeout_ms = check_int(timeout_ms, "timeout_ms", POSITIVE_INT32)
        # negative: libaps says "connect_timeout_ms must be 0 (none) or positive"
        opts.connect_timeout_ms = check_int(connect_timeout_ms, "connect_timeout_ms", INT32)
        if partition_bytes is not None:
            if check_int(partition_bytes, "partition_bytes", ANY_INT) < 32:
                raise ValueError(f"partition_bytes must be at least 32, not {partition_bytes}")
            opts.partition_bytes = check_int(partition_bytes, "partition_bytes", UINT64)
        opts.log = _LOG_CALLBACK
        self.endpoint, self.job, self.rank, self.world_size = endpoint, job, rank, world_size
        self.format, self.scaling, self.downlink = format, scaling, downlink
        self.optimizer = optimizer
        self.error_feedback = bool(error_feedback)
        self.timeout_ms = timeout_ms
        self.bytes_pushed = 0  # packed uplink bytes of every all-reduce so far
        self._lock = threading.Lock()
        self._counts = {}  # name -> element count, as first used (calling side)
        self._ids = {}  # name -> (tensor id, packed bytes), once registered (I/O thread)
        self._in_flight = set()  # names of the tensors started and not yet waited for
        self._queued = collections.Counter()  # names of codes calls queued, not started
        self._c = None  # the C client, used on the I/O thread only
        self._closed = False
        self._io = IOThread(f"aps-io-rank{rank}")
        try:
            self._c = self._io.submit(lambda: self._connect(opts), "joining").wait()
        except BaseException:
            self._closed = True
            self._io.stop()
            raise

    @classmethod
    def from_env(cls, environ=None, **kwargs):
        """A client configured by the environment (see aps._env: APS_ENDPOINT,
        APS_JOB, APS_RANK/APS_WORLD_SIZE, RANK/WORLD_SIZE, SLURM_PROCID/
        SLURM_NTASKS); keyword arguments override it and set the other options."""
        return cls(**{**_env.client_config(environ), **kwargs})

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        state = "closed" if self.closed else "open"
        return (f"<aps.Client {self.endpoint} job={self.job!r} rank {self.rank}/"
                f"{self.world_size} {self.format} scaling={self.scaling} {state}>")

    @property
    def closed(self):
        return self._closed

    # -- collectives ------------------------------------------------------

    def allreduce(self, name, x, timeout_ms=None):
        """Replaces x (contiguous float32 numpy array or CPU torch tensor, any
        shape) with the mean of x over every rank, in place, and returns x. The
        first call with a name registers it with x's size; later calls must pass
        the same size."""
        return self.allreduce_async(name, x, timeout_ms).wait()

    def allreduce_async(self, name, x, timeout_ms=None):
        """As allreduce, queued on the I/O thread; returns a Handle whose wait()
        returns x once it holds the mean."""
        call = self._prepare(name, x)
        return self._queue_reduce([call], False, timeout_ms, f"all-reduce of {name!r}",
                                  lambda _bad: x)

    def allreduce_many_async(self, items, nonfinite="raise", timeout_ms=None):
        """All-reduces each (name, x) of items, each tensor with its own APS
        exponent, all in flight together, as one queued call. nonfinite="raise"
        fails on a tensor holding NaN or inf (nothing of it is sent, aps.Error
        APS_ENONFINITE); "zero" sends such a tensor as zeros instead, so that no
        rank waits, and the handle's wait() returns the names of those tensors."""
        if nonfinite not in NONFINITE_POLICIES:
            raise ValueError(f"nonfinite must be one of {NONFINITE_POLICIES}, not {nonfinite!r}")
        calls = [self._prepare(name, x) for name, x in _once_each(items)]
        what = f"all-reduce of {', '.join(repr(c[0]) for c in calls[:3])}" + \
            (f" and {len(calls) - 3} more" if len(calls) > 3 else "")
        return self._queue_reduce(calls, nonfinite == "zero", timeout_ms, what, lambda bad: bad)

    def broadcast(self, name, x, root=0, timeout_ms=None):
        """Replaces x on every rank with rank root's x, in place; returns x.
        Only root 0 is served today."""
        return self.broadcast_async(name, x, root, timeout_ms).wait()

    def broadcast_async(self, name, x, root=0, timeout_ms=None):
        """As broadcast, queued on the I/O thread; returns a Handle."""
        if check_int(root, "root", ANY_INT) != 0:
            raise ValueError(f"broadcast from root {root}: apsd serves broadcasts from "
                             "rank 0 only (copy the data to rank 0 first)")
        _, addr, n = self._prepare(name, x)
        timeout = self._call_timeout(timeout_ms)

        def run():
            tid = self._tensor_id(name, n)
            check(lib.aps_client_broadcast(self._c, tid, addr, n, timeout))
            return x
        return self._submit(run, f"broadcast of {name!r}")

    # -- codes the caller made (a device codec: aps.torch on a GPU) ----------

    def codes_layouts(self, items):
        """The layouts of the next call of each (name, count) of items, as a
        list of (send, result) CodesLayout pairs (registering a tensor on first
        use): the caller encodes the tensor in send's layout (aps.quantize's
        codes chunk after chunk; block scaling: each chunk's codes, then its
        int8 exponents) and finds the result in result's. A tensor's format
        can change between steps (the daemon's policy or schedule): ask before
        each call. Answered on the calling thread when every tensor is
        registered and has no call queued or in flight, else once the I/O
        thread has finished those."""
        calls = [self._prepare_count(name, n) for name, n in items]
        with self._lock:
            if self._closed:
                raise error_for(_APS_ECLOSED, "codes layouts: the client is closed")
            if all(name in self._ids and name not in self._in_flight and
                   not self._queued[name] for name, _ in calls):
                return [self._layout_of(self._ids[name][0]) for name, _ in calls]

        def run():
            with self._lock:
                busy = not self._in_flight.isdisjoint(name for name, _ in calls)
            if busy:
                self._io.drain()
            return [self._layout_of(self._tensor_id(name, n)) for name, n in calls]
        return self._submit(run, "codes layouts", overlap=True).wait()

    def _layout_of(self, tensor_id):
        """(send, result) CodesLayout of a registered tensor (any thread: the C
        call only reads the client's table under its lock)."""
        send, result = _lib.CodesLayout(), _lib.CodesLayout()
        check(lib.aps_client_codes_layout(self._c, tensor_id, ctypes.byref(send),
                                          ctypes.byref(result)))
        return CodesLayout.from_c(send), CodesLayout.from_c(result)

    def allreduce_codes_async(self, items, timeout_ms=None, before=None):
        """All-reduces tensors whose codes the caller made, all in flight
        together, as one queued call. items: (name, format, codes, scale_exp,
        result, result_exps) with codes (uint8) in the send layout of
        codes_layouts (format its format, scale_exp their APS exponent),
        result (uint8, writable) and result_exps (int32, one per chunk) of the
        result layout: chunk i of the mean is its codes times
        2^-result_exps[i]; a seventh element, if there, counts the finite
        values the encoding flushed to zero (an int, or one count per chunk;
        the daemon's policy reads them).
        Buffers are numpy arrays or CPU torch tensors and must stay alive until
        the handle is done; the codes are copied when the call starts
        (handle.started() returns), and may change after that. Codes of NaN
        or inf are refused (aps.Error APS_ENONFINITE).

        before(), if given, runs on the I/O thread just before the calls
        start, once the caller's device has made the codes: it returns a
        (scale exponent, flushed counts) pair per item (or None: as given) and the
        names the caller sent as zeros because they held NaN or inf, which
        the handle's started() and wait() return (as allreduce_many_async's
        with nonfinite="zero"); an exception it raises fails the call."""
        return self._codes_calls(items, None, timeout_ms, before)

    def step_codes_async(self, items, lr, timeout_ms=None, before=None):
        """Optimize mode: an optimizer step of each (name, format, codes,
        scale_exp, result, result_exps) of items, whose results are the
        updates as codes (see allreduce_codes_async)."""
        lr = check_float(lr, "learning rate", (0.0, math.inf))
        return self._codes_calls(items, lr, timeout_ms, before)

    # -- optimize mode --------------------------------------------------------

    def step(self, name, grad, weights, lr, timeout_ms=None):
        """Optimize mode: sends grad (float32, any shape) as this rank's gradient
        of tensor name with learning rate lr; the daemon averages every rank's,
        steps its optimizer and the update is added to weights in place
        (weights must hold what this tensor's broadcast and earlier steps made
        of it). Returns weights."""
        return self.step_async(name, grad, weights, lr, timeout_ms).wait()

    def step_async(self, name, grad, weights, lr, timeout_ms=None):
        """As step, queued on the I/O thread; returns a Handle."""
        return self.step_many_async([(name, grad, weights)], lr, timeout_ms)

    def step_many_async(self, items, lr, timeout_ms=None):
        """Steps each (name, grad, weights) of items, all in flight together, as
        one queued call; returns a Handle whose wait() returns None."""
        lr = check_float(lr, "learning rate", (0.0, math.inf))
        calls = []
        for name, grad, weights in _once_each(items):
            name, gaddr, n = self._prepare(name, grad, writable=False)
            waddr, wn = float32_buffer(weights, f"weights of {name!r}")
            if wn != n:
                raise ValueError(f"tensor {name!r}: gradient of {n} elements, weights of {wn}")
            calls.append((name, gaddr, waddr, n))
        timeout = self._call_timeout(timeout_ms)
        return self._submit(lambda: self._step_batch(calls, lr, timeout),
                            f"optimizer step of {len(calls)} tensors")

    def pull(self, name, out, timeout_ms=None):
        """Optimize mode: copies the daemon's fp32 master weights of tensor name
        into out (float32, in place); returns the number of optimizer updates
        they have had."""
        name, addr, n = self._prepare(name, out)
        timeout = self._call_timeout(timeout_ms)

        def run():
            updates = ctypes.c_uint64()
            check(lib.aps_client_pull(self._c, self._tensor_id(name, n), addr, n, timeout,
                                      ctypes.byref(updates)))
            return updates.value
        return self._submit(run, f"pull of {name!r}").wait()

    def updates(self, name, like):
        """Optimize mode: the optimizer updates tensor name had when it was
        registered (0 for a new job, the checkpoint's count when the daemon
        resumed it). like: a float32 array of the tensor's size (registers it)."""
        name, _, n = self._prepare(name, like, writable=False)

        def run():
            value = ctypes.c_uint64()
            check(lib.aps_client_tensor_updates(self._c, self._tensor_id(name, n),
                                                ctypes.byref(value)))
            return value.value
        return self._submit(run, f"updates of {name!r}").wait()

    def barrier(self, timeout_ms=None):
        """Returns once every rank of the job has entered the barrier."""
        timeout = self._call_timeout(timeout_ms)
        self._submit(lambda: check(lib.aps_client_barrier(self._c, timeout)),
                     "barrier").wait()

    def close(self):
        """Lets queued calls finish, says BYE and frees the C client. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._io.submit(self._free, "closing")
        self._io.stop()

    # -- internals --------------------------------------------------------

    def _free(self):
        with self._lock:  # codes_layouts may use the C client on another thread
            c, self._c = self._c, None
        lib.aps_client_close(c)

    def _connect(self, opts):
        ptr = ctypes.c_void_p()
        check(lib.aps_client_new(ctypes.byref(ptr), ctypes.byref(opts)))
        return ptr

    def _submit(self, fn, what, overlap=False):
        with self._lock:
            if self._closed:
                raise error_for(_APS_ECLOSED, f"{what}: the client is closed")
            return self._io.submit(fn, what, overlap)

    def _queue_reduce(self, calls, zero_nonfinite, timeout_ms, what, result, before=None):
        """Queues the all-reduce of calls; the handle's wait() returns
        result(names sent as zeros). before(), if given, runs on the I/O thread
        just before the calls start."""
        timeout = self._call_timeout(timeout_ms)

        def start():
            if before is not None:
                before()
            started = self._reduce_batch(calls, zero_nonfinite, timeout)
            finish = started.finish
            return Deferred(started.early, lambda: result(finish()))
        return self._submit(start, what, overlap=True)

    def _call_timeout(self, timeout_ms):
        # <= 0: the client's own (aps.h)
        return 0 if timeout_ms is None else check_int(timeout_ms, "timeout_ms", INT32)

    def _prepare(self, name, x, writable=True):
        """Checks name and x (written into if writable) on the calling thread:
        (name, address, count)."""
        _check_name(name)
        addr, n = float32_buffer(x, f"tensor {name!r}", writable)
        name, n = self._prepare_count(name, n)
        return name, addr, n

    def _prepare_count(self, name, n):
        """Checks name and the count n of its tensor (registered with the count
        it was first used with): (name, n)."""
        _check_name(name)
        if check_int(n, f"count of {name!r}", ANY_INT) <= 0:
            raise ValueError(f"tensor {name!r} is empty")
        check_int(n, f"count of {name!r}", UINT64)  # libaps says what apsd takes
        with self._lock:
            known = self._counts.setdefault(name, n)
        if known != n:
            raise ValueError(f"tensor {name!r} has {n} elements but was registered with "
                             f"{known}")
        return name, n

    def _codes_calls(self, items, lr, timeout_ms, before):
        """Queues the codes calls of items (lr: None for all-reduces, else steps)."""
        calls = []
        for name, fmt, codes, scale_exp, result, result_exps, *flushed in _once_each(items):
            call = CodesCall()
            counts = _flushed_counts(call, flushed[0] if flushed else (), name)
            call.format = check_str(fmt, f"format of {name!r}")
            call.codes, call.codes_len = raw_buffer(codes, np.uint8, f"codes of {name!r}",
                                                    writable=False)
            call.scale_exp = check_int(scale_exp, f"scale exponent of {name!r}", INT32)
            call.result, call.result_len = raw_buffer(result, np.uint8,
                                                      f"result of {name!r}")
            call.result_exps, call.n_result_exps = raw_buffer(
                result_exps, np.int32, f"result exponents of {name!r}")
            with self._lock:
                if name not in self._ids:
                    raise ValueError(f"tensor {name!r}: ask codes_layouts first")
            calls.append((name, call, [codes, result, result_exps, counts]))
        timeout = self._call_timeout(timeout_ms)

        def start():
            with self._lock:
                busy = not self._in_flight.isdisjoint(name for name, _, _ in calls)
                self._queued.subtract(name for name, _, _ in calls)
            if busy:
                self._io.drain()
            settings, zeroed = before() if before is not None else (None, [])
            for (name, call, keep), (k, flushed) in zip(calls, settings or ()):
                call.scale_exp = check_int(k, f"scale exponent of {name!r}", INT32)
                keep[3] = _flushed_counts(call, flushed, name)
            requests, error = [], None
            for name, call, _ in calls:
                req = ctypes.c_void_p()
                tid = self._ids[name][0]
                if lr is None:
                    ret = lib.aps_client_allreduce_codes_start(self._c, tid, ctypes.byref(call),
                                                               timeout, ctypes.byref(req))
                else:
                    ret = lib.aps_client_step_codes_start(self._c, tid, ctypes.byref(call),
                                                          lr, timeout, ctypes.byref(req))
                if ret < 0:
                    error = last_error(ret)
                    break
                requests.append((name, req))
                self.bytes_pushed += call.codes_len
            with self._lock:
                self._in_flight.update(name for name, _ in requests)
            return Deferred(zeroed, lambda: self._wait_all(requests, error, calls) or zeroed)
        what = f"codes call of {', '.join(repr(c[0]) for c in calls[:3])}" + \
            (f" and {len(calls) - 3} more" if len(calls) > 3 else "")
        with self._lock:
            self._queued.update(name for name, _, _ in calls)
        try:
            return self._submit(start, what, overlap=True)
        except BaseException:
            with self._lock:
                self._queued.subtract(name for name, _, _ in calls)
            raise

    def _wait_all(self, requests, error, _buffers=None):
        """Waits for every started request, (name, request), of one batch (the
        buffers they use are kept alive until then); raises error, or the first
        request's error when error is None."""
        for name, req in requests:  # every started request must be waited for
            ret = lib.aps_request_wait(req)
            with self._lock:
                self._in_flight.discard(name)
            if ret < 0 and error is None:
                error = last_error(ret)
        if error is not None:
            raise error

    def _tensor_id(self, name, n):
        """The id of name, registering it on first use (I/O thread)."""
        entry = self._ids.get(name)
        if entry is None:
            tid = ctypes.c_uint32()
            ret = lib.aps_client_register(self._c, check_str(name, "tensor name"), n,
                                          ctypes.byref(tid))
            if ret < 0:  # not registered: its next use may give another count
                with self._lock:
                    self._counts.pop(name, None)
                check(ret)
            entry = self._ids[name] = (tid.value, _packed_bytes(self.format, n,
                                                                self.block_size))
        return entry[0]

    def _reduce_batch(self, calls, zero_nonfinite, timeout):
        """Starts an all-reduce of each (name, address, count) of calls (I/O
        thread), each with its own APS exponent, and returns a Deferred: early
        and the final result are the names of the tensors that held NaN or inf
        and were sent as zeros; finish() waits for every started call and
        raises the first error. A tensor still in flight from an earlier call
        is waited for first."""
        names = [name for name, _, _ in calls]
        with self._lock:
            busy = not self._in_flight.isdisjoint(names)
        if busy:
            self._io.drain()
        ids = [self._tensor_id(name, n) for name, _, n in calls]
        bad, requests, error = [], [], None
        for (name, addr, n), tid in zip(calls, ids):
            if zero_nonfinite and _zero_if_nonfinite(addr, n):
                bad.append(name)
            req = ctypes.c_void_p()
            ret = lib.aps_client_allreduce_start(self._c, tid, addr, n, timeout,
                                                 ctypes.byref(req))
            if ret < 0:
                error = last_error(ret)
                break
            requests.append((name, req))
            self.bytes_pushed += self._ids[name][1]
        with self._lock:
            self._in_flight.update(name for name, _ in requests)

        def finish():
            self._wait_all(requests, error)
            return bad
        return Deferred(bad, finish)

    def _step_batch(self, calls, lr, timeout):
        ids = [self._tensor_id(name, n) for name, _, _, n in calls]
        requests, error = [], None
        for (name, gaddr, waddr, n), tid in zip(calls, ids):
            req = ctypes.c_void_p()
            ret = lib.aps_client_step_start(self._c, tid, gaddr, waddr, n, lr, timeout,
                                            ctypes.byref(req))
            if ret < 0:
                error = last_error(ret)
                break
            requests.append(req)
            self.bytes_pushed += self._ids[name][1]
        for req in requests:  # every started request must be waited for
            ret = lib.aps_request_wait(req)
            if ret < 0 and error is None:
                error = last_error(ret)
        if error is not None:
            raise error


def _flushed_counts(call, flushed, name):
    """Sets call's flushed counts from flushed (an int: the whole tensor's,
    counted with its first chunk; or one count per chunk) and returns the
    array that holds them (to keep alive with the call)."""
    what = f"flushed counts of {name!r}"
    try:
        given = np.asarray(flushed)
    except (TypeError, ValueError) as e:
        raise TypeError(f"{what} must be an int or a sequence of ints: {e}") from None
    if given.ndim > 1:
        raise ValueError(f"{what} must be an int or one count per chunk, not {given.ndim}-d")
    if given.size == 0:  # none given
        given = np.zeros(0, np.uint64)
    elif given.dtype.kind in "iu":
        if given.size and given.min() < 0:
            raise ValueError(f"{what} must be non-negative, not {given.min()}")
    elif given.dtype == object:  # Python ints past int64, or a mix: one by one
        given = np.array([check_int(v, what, UINT64) for v in given.reshape(-1)],
                         dtype=np.uint64)
    else:
        raise TypeError(f"{what} must be ints, not {given.dtype}")
    counts = np.ascontiguousarray(np.atleast_1d(given).astype(np.uint64))
    call.flushed = counts.ctypes.data if counts.size else None
    call.n_flushed = counts.size
    return counts


def _once_each(items):
    """items (tuples led by a tensor name) as a list, or ValueError when a name
    comes twice: one call of a batch a tensor."""
    items = list(items)
    seen = set()
    for item in items:
        _check_name(item[0])
        if item[0] in seen:
            raise ValueError(f"tensor {item[0]!r} comes twice in one batch: a tensor "
                             "has one call in flight")
        seen.add(item[0])
    return items


def _check_name(name):
    """A tensor name of 1 to _NAME_MAX bytes, or ValueError (TypeError: not a str)."""
    raw = check_str(name, "tensor name")
    if not 0 < len(raw) <= _NAME_MAX:
        raise ValueError(f"tensor name must have 1 to {_NAME_MAX} bytes, {name!r} has "
                         f"{len(raw)}")


def _endpoint_list(endpoint):
    """One endpoint string for the C client: a list or tuple is joined by commas."""
    if isinstance(endpoint, (list, tuple)):
        if not endpoint:
            raise ValueError("endpoint list is empty")
        for e in endpoint:
            check_str(e, "endpoint")
            if "," in e:
                raise ValueError(f"endpoint {e!r} holds a comma")
        return ",".join(endpoint)
    return endpoint


def _packed_bytes(fmt, n, block=0):
    """Uplink bytes of n elements in fmt: the codes, and the block exponents."""
    codes = check(lib.aps_packed_size(fmt.encode(), n))
    if block and fmt != "fp32":
        codes += -(-n // block)
    return codes


def _zero_if_nonfinite(addr, n):
    """Zeroes the n floats at addr if any is NaN or inf; True if it did."""
    view = np.ctypeslib.as_array((ctypes.c_float * n).from_address(addr))
    if math.isfinite(float(view.sum(dtype=np.float64))):
        return False  # a sum of finite float32 values cannot overflow a double
    view[...] = 0
    return True
