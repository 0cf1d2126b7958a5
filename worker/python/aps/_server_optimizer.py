"""ServerOptimizer: apsd as a classic parameter server. The daemon holds the
fp32 master weights and the optimizer state; workers push gradients and
receive APS-quantized updates that they add to their parameters.

    client = aps.Client.from_env(format="e4m3", optimizer="sgd,momentum=0.9")
    opt = aps.torch.ServerOptimizer(model, client, "sgd", lr=0.1, momentum=0.9)
    for x, y in batches:
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()                          # or opt.step(lr=schedule(step))

The optimizer is a property of the whole job and is named in the client's
HELLO, so the client must be opened with it (optimizer_spec() builds the
string from torch-style arguments); ServerOptimizer checks that its own
arguments say the same. At construction every parameter is broadcast from
rank 0: the daemon takes rank 0's values as the master weights, or, when it
resumed the job from a checkpoint, sends its own to every rank
(resumed_step says how many updates they have had).

The parameters must change only through step(): the daemon keeps what each
worker holds and sends the difference to the new weights, so that what a
worker holds is never more than half a quantization step of the last update
away from the master weights. pull() fetches the exact master weights.
"""

import math

import torch

from aps._staging import is_direct

_DEFAULTS = {
    "sgd": {"momentum": 0.0, "dampening": 0.0, "nesterov": 0, "weight_decay": 0.0},
    "adam": {"beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.0},
    "adamw": {"beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.01},
}


def _settings(name, hyper):
    """{key: float} of optimizer name with torch-style arguments (betas=(b1, b2))."""
    if name not in _DEFAULTS:
        raise ValueError(f"optimizer {name!r} is not one of {sorted(_DEFAULTS)}")
    hyper = dict(hyper)
    if "betas" in hyper:
        hyper["beta1"], hyper["beta2"] = hyper.pop("betas")
    unknown = set(hyper) - set(_DEFAULTS[name])
    if unknown:
        raise ValueError(f"optimizer {name!r} has no setting {sorted(unknown)}")
    return {**_DEFAULTS[name], **{k: float(v) for k, v in hyper.items()}}


def optimizer_spec(name, **hyper):
    """The spec string of aps.Client(optimizer=...) for optimizer name ("sgd",
    "adam", "adamw") with torch.optim-style settings (momentum, dampening,
    nesterov, weight_decay; betas or beta1/beta2, eps); lr is per step."""
    hyper.pop("lr", None)
    settings = _settings(name, hyper)
    return ",".join([name] + [f"{k}={v:.9g}" for k, v in settings.items()])


def _parse_spec(spec):
    name, *pairs = spec.split(",")
    return name, _settings(name, dict(p.split("=", 1) for p in pairs))


def _same(a, b):
    """Two settings dicts agree once rounded to the float32 the daemon keeps."""
    f32 = lambda v: torch.tensor(v, dtype=torch.float32).item()  # noqa: E731
    return a.keys() == b.keys() and all(f32(a[k]) == f32(b[k]) for k in a)


class ServerOptimizer:
    """Steps model's parameters with the optimizer the daemon runs for client's
    job. optimizer and the keyword settings (momentum=..., betas=..., ...)
    must agree with the spec the client was opened with; None takes the
    client's. lr is the learning rate sent with every step (step(lr=...) or
    the lr attribute change it). Parameter names travel with prefix."""

    def __init__(self, model, client, optimizer=None, lr=0.01, prefix="param.", **hyper):
        if not client.optimizer:
            raise ValueError("the client is in all-reduce mode: open it with "
                             "optimizer=aps.torch.optimizer_spec(...), e.g. "
                             f"aps.Client.from_env(optimizer={optimizer_spec(optimizer or 'sgd', **hyper)!r})")
        job_name, job_settings = _parse_spec(client.optimizer)
        if optimizer is not None:
            if optimizer != job_name or not _same(_settings(optimizer, hyper), job_settings):
                raise ValueError(f"ServerOptimizer says {optimizer_spec(optimizer, **hyper)!r} "
                                 f"but the client's job runs {client.optimizer!r}")
        elif hyper:
            raise ValueError("settings without an optimizer name: pass both or neither")
        if not (math.isfinite(lr) and lr >= 0):
            raise ValueError(f"learning rate {lr} is not finite and >= 0")
        self.client = client
        self.lr = float(lr)
        self.spec = client.optimizer
        self._prefix = prefix
        self._params = [(prefix + name, p) for name, p in model.named_parameters()
                        if p.requires_grad]
        self._weights = {}  # wire name -> the float32 CPU memory the updates go to
        self._grads = {}  # wire name -> a host buffer for staged gradients
        self.resumed_step = self._broadcast()
        self.steps = 0

    @property
    def param_groups(self):
        """One group, for code that reads param_groups[0]["lr"]."""
        return [{"params": [p for _, p in self._params], "lr": self.lr}]

    def zero_grad(self, set_to_none=False):
        for _, p in self._params:
            if p.grad is None:
                continue
            if set_to_none:
                p.grad = None
            else:
                p.grad.detach_()
                p.grad.zero_()

    def step(self, closure=None, lr=None):
        """Sends every gradient (zeros for a parameter without one) with the
        learning rate, and adds the daemon's updates to the parameters."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if lr is not None:
            self.lr = float(lr)
        items = []
        with torch.no_grad():
            for name, p in self._params:
                items.append((name, self._grad_memory(name, p), self._weights[name]))
            self.client.step_many_async(items, self.lr).wait()
            for name, p in self._params:
                if self._weights[name] is not p.data:
                    p.data.copy_(self._weights[name].view_as(p))
        self.steps += 1
        return loss

    def pull(self):
        """{name: float32 CPU tensor} of the daemon's master weights (names as
        in model.named_parameters())."""
        out = {}
        for name, p in self._params:
            buf = torch.empty(p.shape, dtype=torch.float32)
            self.client.pull(name, buf)
            out[name[len(self._prefix):]] = buf
        return out

    def state_dict(self):
        return {"lr": self.lr, "spec": self.spec, "steps": self.steps}

    def __repr__(self):
        return (f"ServerOptimizer({self.spec!r}, lr={self.lr}, {len(self._params)} tensors, "
                f"{self.client})")

    # -- internals --------------------------------------------------------

    def _broadcast(self):
        """Rank 0's values become the master weights (or the daemon's resumed
        ones come back); returns the fewest updates any tensor has had."""
        handles = []
        with torch.no_grad():
            for name, p in self._params:
                w = p.data if is_direct(p.data) else \
                    p.detach().to(device="cpu", dtype=torch.float32).contiguous()
                self._weights[name] = w
                handles.append(self.client.broadcast_async(name, w))
            for h in handles:
                h.wait()
            for name, p in self._params:
                if self._weights[name] is not p.data:
                    p.data.copy_(self._weights[name].view_as(p))
        return min((self.client.updates(name, self._weights[name])
                    for name, _ in self._params), default=0)

    def _grad_memory(self, name, p):
        g = p.grad
        if g is not None and is_direct(g):
            return g
        buf = self._grads.get(name)
        if buf is None:
            buf = self._grads[name] = torch.zeros(p.shape, dtype=torch.float32)
        if g is None:
            buf.zero_()
        else:
            buf.copy_(g)
        return buf
