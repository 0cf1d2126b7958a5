"""DistributedOptimizer: all-reduce gradients through apsd as backward
produces them, then step the wrapped optimizer.

How a step flows:
- Parameters are grouped into buckets of about bucket_bytes, in reverse order
  of the optimizer's parameters (roughly the order backward finishes them).
- A hook on each parameter's gradient accumulator (torch >= 2.1: the
  tensor's post-accumulate-grad hook; 1.13 has none, and the hook goes on the
  AccumulateGrad node) marks the gradient ready. When every
  gradient of a bucket is ready, the bucket is queued on the client's I/O
  thread, while backward goes on. Buckets are queued strictly in bucket order,
  so every rank makes the same calls in the same order (the I/O thread runs
  one bucket after the other and must not wait for a bucket another rank
  sends later).
- Inside a bucket every tensor is its own all-reduce with its own APS
  exponent (the paper's point is per layer), all started before any is
  waited for; Client.allreduce_many_async is the one place a batched C call
  (one message for many tensors) would replace that loop.
- step() (or synchronize()) queues the buckets not yet sent: a parameter with
  no gradient on this rank (unused branch) contributes zeros and receives the
  mean like the others, so no rank waits and every rank applies the same
  update. Then, with check_finite, one flag (aps._flags) tells every rank
  whether some rank had NaN or inf: such a tensor is sent as zeros and the
  step is skipped on every rank (reported, not raised), as a grad scaler
  expects.
- With device_codec a GPU gradient is coded on the GPU by the torch codec
  and only its codes (a quarter of fp32's bytes in e4m3) cross to pinned
  host memory and back (aps._device_codes, aps.Client.allreduce_codes_async):
  the same bits as the host path.

DistributedOptimizer is a torch.optim.Optimizer whose param_groups, state and
defaults are the wrapped optimizer's own objects, so that lr schedulers,
state_dict()/load_state_dict() and code that reads param_groups see and change
the optimizer that steps.
"""

import contextlib
import logging
import threading

import torch

from aps._flags import AnyRankFlag
from aps._device_codes import DeviceStage, codes_call, use_device_codec
from aps._staging import HostStage

DEFAULT_BUCKET_BYTES = 256 << 10

log = logging.getLogger("aps.torch")


class _Bucket:
    """Parameters whose gradients travel as one queued task."""

    def __init__(self, index):
        self.index = index
        self.entries = []  # (name, param, HostStage)
        self.nbytes = 0
        self.ready = set()  # ids of params whose gradient is ready this step
        self.handle = None  # set when queued

    def add(self, name, param, device_codec):
        self.entries.append((name, param, DeviceStage() if device_codec else HostStage()))
        self.nbytes += param.numel() * 4

    @property
    def complete(self):
        return len(self.ready) == len(self.entries)


def plan_buckets(named_params, bucket_bytes, device_codec=False):
    """Buckets of about bucket_bytes (of fp32), last parameter first."""
    buckets = []
    for name, p in reversed(named_params):
        if not buckets or (buckets[-1].nbytes + p.numel() * 4 > bucket_bytes
                           and buckets[-1].entries):
            buckets.append(_Bucket(len(buckets)))
        buckets[-1].add(name, p, device_codec)
    return buckets



def param_list(params):
    """The parameters of a group's "params" (a tensor or an ordered iterable)
    as a list; a set is refused, as torch does: its order differs by rank."""
    if isinstance(params, torch.Tensor):
        return [params]
    if isinstance(params, set):
        raise TypeError("parameter groups need an ordered collection of parameters, not a set")
    return list(params)


def _parameter_names(named_parameters):
    """{id(param): name} of named_parameters (a shared parameter keeps its
    first name); None stays None (parameters are named by position)."""
    if named_parameters is None:
        return None
    names = {}
    for name, p in named_parameters:
        if id(p) in names and names[id(p)] != name:
            continue
        names[id(p)] = name
    if len(set(names.values())) != len(names):
        raise ValueError("named_parameters has duplicate names")
    return names


def _named_optimizer_params(param_groups, names, prefix, first=0):
    """[(wire name, param)] for every parameter of param_groups that requires
    grad, in the optimizer's order, named from names ({id: name}) or by
    position (counted from first) when names is None."""
    params = [p for g in param_groups for p in g["params"] if p.requires_grad]
    if names is None:
        return [(f"{prefix}{i}", p) for i, p in enumerate(params, first)]
    missing = [i for i, p in enumerate(params) if id(p) not in names]
    if missing:
        raise ValueError(f"{len(missing)} parameters of the optimizer are not in "
                         "named_parameters (pass model.named_parameters())")
    seen, out = set(), []
    for p in params:
        if id(p) not in seen:
            seen.add(id(p))
            out.append((prefix + names[id(p)], p))
    return out


class DistributedOptimizer(torch.optim.Optimizer):
    """Wraps a torch optimizer so that step() applies the mean gradient over
    every rank of client's job. apsd returns the mean: do not divide the loss
    by the world size.

    named_parameters: model.named_parameters() (names must be the same on
    every rank; default: positions in the optimizer). bucket_bytes: size of
    the groups queued together. check_finite: detect NaN/inf gradients on any
    rank and skip the step on all of them (last_step_skipped, skipped_steps).

    It is a torch.optim.Optimizer that shares param_groups, state and
    defaults with the wrapped optimizer (self.optimizer): an lr scheduler made
    on it changes the wrapped optimizer's lr, state_dict() is the wrapped
    optimizer's, add_param_group() adds to it (on every rank alike). A
    GradScaler(enabled=False) steps it as any optimizer; an enabled one (CUDA)
    is not supported: it would unscale gradients still being all-reduced.

    device_codec: None (default) codes gradients on their GPU when the model
    is on one and the client serves codes calls (local, none or block
    scaling, no error_feedback; with shards, partition_bytes a multiple of
    the daemons' chunk_bytes); True always (CPU tensors too: the same
    results), False never (every gradient is staged to host memory as fp32).
    """

    def __init__(self, optimizer, client, named_parameters=None,
                 bucket_bytes=DEFAULT_BUCKET_BYTES, check_finite=True, prefix="grad.",
                 device_codec=None):
        # torch.optim.Optimizer.__init__ is not called: it would make groups of
        # its own, where these are the wrapped optimizer's.
        self.optimizer = optimizer
        self.client = client
        self.check_finite = check_finite
        self._flag = AnyRankFlag(client, prefix + "@nonfinite") if check_finite else None
        self._prefix = prefix
        self._bucket_bytes = bucket_bytes
        self._names = _parameter_names(named_parameters)
        self._lock = threading.Lock()
        self._next = 0  # the next bucket to queue
        self._sync = True
        self._accumulators = []  # the AccumulateGrad nodes (keeping their hooks alive) or handles
        self._named = []  # (wire name, param) of every parameter sent, in optimizer order
        self.device_codec = use_device_codec(
            device_codec, client, [p for g in optimizer.param_groups for p in g["params"]])
        self._plan(_named_optimizer_params(optimizer.param_groups, self._names, prefix))
        self.skipped_steps = 0
        self.last_step_skipped = False

    # -- the wrapped optimizer --------------------------------------------

    @property
    def param_groups(self):
        return self.optimizer.param_groups

    @param_groups.setter
    def param_groups(self, groups):
        self.optimizer.param_groups = groups

    @property
    def state(self):
        return self.optimizer.state

    @state.setter
    def state(self, state):
        self.optimizer.state = state

    @property
    def defaults(self):
        return self.optimizer.defaults

    @defaults.setter
    def defaults(self, defaults):
        self.optimizer.defaults = defaults

    def state_dict(self):
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict):
        self.optimizer.load_state_dict(state_dict)

    def add_param_group(self, group):
        """Adds group to the wrapped optimizer; its parameters get hooks and
        buckets (every bucket is planned again). Every rank must add the same
        groups at the same step, between two steps."""
        self._check_idle("add_param_group()")
        params = param_list(group["params"])
        new = _named_optimizer_params([{"params": params}], self._names, self._prefix,
                                      first=len(self._named))
        self.optimizer.add_param_group({**group, "params": params})
        self._plan(self._named + new)

    def zero_grad(self, set_to_none=None):
        """The wrapped optimizer's zero_grad (set_to_none: its default if None)."""
        self._check_idle("zero_grad()")
        if set_to_none is None:
            self.optimizer.zero_grad()
        else:
            self.optimizer.zero_grad(set_to_none=set_to_none)

    def __repr__(self):
        return (f"DistributedOptimizer({self.optimizer.__class__.__name__}, "
                f"{len(self._bucket_of)} tensors in {len(self._buckets)} buckets, {self.client})")

    # -- the step ---------------------------------------------------------

    @property
    def buckets(self):
        """[[wire name, ...], ...]: the buckets in the order they are sent."""
        return [[name for name, _, _ in b.entries] for b in self._buckets]

    @contextlib.contextmanager
    def no_sync(self):
        """Backward passes inside accumulate gradients locally without
        communication; the first backward after the block sends the sum."""
        self._sync = False
        try:
            yield
        finally:
            self._sync = True

    def synchronize(self):
        """Waits until every gradient holds the mean over ranks (sending those
        not sent yet). Returns False if some rank had NaN or inf, in which case
        every rank must skip the step (step() does)."""
        with self._lock:
            while self._next < len(self._buckets):
                self._send(self._buckets[self._next], fill_missing=True)
        try:
            flag = self._flag.reduce_after([b.handle for b in self._buckets]) \
                if self._flag else None
            # Every bucket is waited for, also after one failed: none may write
            # into a gradient once this returns.
            error = None
            for b in self._buckets:
                try:
                    b.handle.wait()
                except Exception as exc:
                    error = error or exc
                    continue
                for _, _, stage in b.entries:
                    stage.store()
            skip = flag is not None and flag.wait()
            if error is not None:
                raise error
            return not skip
        finally:
            self._reset()

    def step(self, closure=None):
        """Synchronizes, then steps the wrapped optimizer unless some rank had
        non-finite gradients (then returns without stepping, sets
        last_step_skipped and counts skipped_steps)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        finite = self.synchronize()
        self.last_step_skipped = not finite
        if not finite:
            self.skipped_steps += 1
            log.warning("step skipped: non-finite gradients on some rank (%d skipped so far)",
                        self.skipped_steps)
            return loss
        result = self.optimizer.step()
        return loss if loss is not None else result

    # -- internals --------------------------------------------------------

    def _check_idle(self, what):
        if self._next > 0:
            raise RuntimeError(f"{what} while gradients are being all-reduced: "
                               "call step() or synchronize() first")

    def _plan(self, named):
        """Buckets for named ([(wire name, param)], the ones planned before
        first), and a hook on each parameter that has none yet."""
        for name, p in named[len(self._named):]:
            self._hook(name, p)
        self._named = named
        self._buckets = plan_buckets(named, self._bucket_bytes, self.device_codec)
        self._bucket_of = {id(p): b for b in self._buckets for _, p, _ in b.entries}

    def _hook(self, name, p):
        if hasattr(p, "register_post_accumulate_grad_hook"):  # torch >= 2.1
            self._accumulators.append(
                p.register_post_accumulate_grad_hook(lambda _: self._on_ready(name, p)))
            return
        # p.expand_as(p) has p's AccumulateGrad as its first next function; a
        # hook on that node runs once the gradient is accumulated into p.grad.
        acc = p.expand_as(p).grad_fn.next_functions[0][0]
        acc.register_hook(lambda *_: self._on_ready(name, p))
        self._accumulators.append(acc)

    def _on_ready(self, name, p):
        if not self._sync:
            return
        with self._lock:
            bucket = self._bucket_of[id(p)]
            if id(p) in bucket.ready or bucket.handle is not None:
                raise RuntimeError(f"gradient of {name!r} computed twice before step(): "
                                   "call step() between backward passes, or accumulate "
                                   "inside no_sync()")
            bucket.ready.add(id(p))
            while self._next < len(self._buckets) and self._buckets[self._next].complete:
                self._send(self._buckets[self._next], fill_missing=False)

    def _send(self, bucket, fill_missing):
        """Queues bucket (lock held); fill_missing gives absent gradients zeros."""
        with torch.no_grad():
            for name, p, _ in bucket.entries:
                if p.grad is None:
                    assert fill_missing
                    p.grad = torch.zeros_like(p, memory_format=torch.contiguous_format)
            if self.device_codec:
                bucket.handle = self._send_codes(bucket)
            else:
                bucket.handle = self.client.allreduce_many_async(
                    [(name, stage.load(p.grad)) for name, p, stage in bucket.entries],
                    nonfinite="zero" if self.check_finite else "raise")
        self._next += 1

    def _send_codes(self, bucket):
        """The bucket's gradients coded on their device, as one codes call."""
        named = [(name, p.grad) for name, p, _ in bucket.entries]
        layouts = self.client.codes_layouts([(name, g.numel()) for name, g in named])
        return codes_call(self.client, named, layouts, [s for _, _, s in bucket.entries],
                          self.check_finite)

    def _reset(self):
        with self._lock:
            for b in self._buckets:
                b.ready.clear()
                b.handle = None
            self._next = 0
