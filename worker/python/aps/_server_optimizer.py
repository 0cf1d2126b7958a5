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

ServerOptimizer is a torch.optim.Optimizer: each parameter group's "lr" is the
learning rate sent with its parameters every step, so that an lr scheduler
(torch.optim.lr_scheduler.StepLR(opt, ...)) schedules what the daemon
applies. The other settings are the job's, in the client's spec.
"""

import math

import torch

from aps._device_codes import DeviceStage, codes_call, use_device_codec
from aps._optimizer import param_list
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


# Settings of a parameter group that the job's spec fixes for every tensor.
_JOB_SETTINGS = {k for d in _DEFAULTS.values() for k in d} | {"betas"}


def _same(a, b):
    """Two settings dicts agree once rounded to the float32 the daemon keeps."""
    f32 = lambda v: torch.tensor(v, dtype=torch.float32).item()  # noqa: E731
    return a.keys() == b.keys() and all(f32(a[k]) == f32(b[k]) for k in a)


def _wait_every(handles):
    """Waits for every handle, also after one fails: each call the daemon took
    is applied there, and its update must reach the weights here. Returns
    (whether each succeeded, the first error or None)."""
    done, error = [], None
    for h in handles:
        try:
            h.wait()
            done.append(True)
        except Exception as exc:
            done.append(False)
            error = error or exc
    return done, error


class ServerOptimizer(torch.optim.Optimizer):
    """Steps model's parameters with the optimizer the daemon runs for client's
    job. optimizer and the keyword settings (momentum=..., betas=..., ...)
    must agree with the spec the client was opened with; None takes the
    client's. lr is the learning rate sent with every step: param_groups[i]
    ["lr"] for the parameters of group i (an lr scheduler changes it;
    step(lr=...) and the lr attribute set every group's). Parameter names
    travel with prefix.

    device_codec: None (default) codes gradients on their GPU when the model
    is on one and the client serves codes calls (aps._device_codes): only
    codes cross to host memory, and the update's codes come back and are
    added on the GPU; True always (CPU tensors too: the same weights), False
    never (gradients staged to host memory as fp32, weights copied back)."""

    def __init__(self, model, client, optimizer=None, lr=0.01, prefix="param.",
                 device_codec=None, **hyper):
        if not client.optimizer:
            spec = optimizer_spec(optimizer or 'sgd', **hyper)
            raise ValueError("the client is in all-reduce mode: open it with "
                             "optimizer=aps.torch.optimizer_spec(...), e.g. "
                             f"aps.Client.from_env(optimizer={spec!r})")
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
        self.spec = client.optimizer
        self._prefix = prefix
        named = list(model.named_parameters())
        self._names = {id(p): prefix + name for name, p in named}
        self._params = []  # (wire name, param) of every parameter stepped, in group order
        self._weights = {}  # wire name -> the float32 CPU memory the updates go to
        self._grads = {}  # wire name -> a host buffer for staged gradients
        self._started = False
        self.device_codec = use_device_codec(device_codec, client, list(model.parameters()))
        self._stages = {}  # wire name -> DeviceStage (device_codec)
        self._device_weights = {}  # wire name -> fp32 weights on p's device (device_codec)
        super().__init__([p for _, p in named if p.requires_grad], {"lr": float(lr)})
        self.resumed_step = self._broadcast(self._params)
        self._started = True
        self.steps = 0

    @property
    def lr(self):
        """The first parameter group's lr; setting it sets every group's."""
        return self.param_groups[0]["lr"]

    @lr.setter
    def lr(self, value):
        for group in self.param_groups:
            group["lr"] = float(value)

    def add_param_group(self, group):
        """Adds group (parameters of the model, and an lr of its own if
        wanted); after construction its parameters are broadcast from rank 0,
        so every rank must add the same groups between the same steps."""
        fixed = sorted(set(group) & _JOB_SETTINGS)
        if fixed:
            raise ValueError(f"{fixed} are the job's settings ({self.spec!r}), the same "
                             "for every parameter: only lr can differ by group")
        params = param_list(group["params"])
        alien = [p for p in params if id(p) not in self._names]
        if alien:
            raise ValueError(f"{len(alien)} parameters of the group are not the model's")
        super().add_param_group({**group, "params": params})
        new = [(self._names[id(p)], p) for p in params if p.requires_grad]
        self._params += new
        if self._started:
            self._broadcast(new)

    def step(self, closure=None, lr=None):
        """Sends every gradient (zeros for a parameter without one) with its
        group's learning rate (or lr, which becomes every group's), and adds
        the daemon's updates to the parameters."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if lr is not None:
            self.lr = lr
        with torch.no_grad():
            (self._step_codes if self.device_codec else self._step_host)()
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
        """torch's optimizer state dict (the groups and their lr; the
        optimizer's state is the daemon's), with the job's spec and the steps
        taken."""
        return {**super().state_dict(), "spec": self.spec, "steps": self.steps}

    def load_state_dict(self, state_dict):
        """Takes back the groups' lr and the steps of state_dict(); the
        weights and the optimizer's state are the daemon's (its checkpoints)."""
        spec = state_dict.get("spec", self.spec)
        if spec != self.spec:
            raise ValueError(f"the state dict is of a job that runs {spec!r}, "
                             f"this one runs {self.spec!r}")
        super().load_state_dict(state_dict)
        self.steps = state_dict.get("steps", self.steps)

    def __repr__(self):
        return (f"ServerOptimizer({self.spec!r}, lr={self.lr}, {len(self._params)} tensors, "
                f"{self.client})")

    # -- internals --------------------------------------------------------

    def _step_host(self):
        """step() with gradients staged to host memory as fp32; the updates
        land in self._weights, which the parameters then take."""
        handles = []
        try:
            for group in self.param_groups:
                items = [(name, self._grad_memory(name, p), self._weights[name])
                         for name, p in self._group_params(group)]
                if items:
                    handles.append(self.client.step_many_async(items, group["lr"]))
        finally:
            _, error = _wait_every(handles)
            for name, p in self._params:
                if self._weights[name] is not p.data:
                    p.data.copy_(self._weights[name].view_as(p))
        if error is not None:
            raise error

    def _step_codes(self):
        """step() with gradients coded on their device, one codes call per
        group; each group's update is added once its call is done."""
        handles = []
        try:
            for group in self.param_groups:
                params = list(self._group_params(group))
                if not params:
                    continue
                named = [(name, p.grad if p.grad is not None else torch.zeros_like(p))
                         for name, p in params]
                layouts = self.client.codes_layouts([(name, g.numel()) for name, g in named])
                stages = [self._stages.setdefault(name, DeviceStage()) for name, _ in params]
                handles.append((params, codes_call(self.client, named, layouts, stages, False,
                                                   lr=group["lr"])))
        finally:
            done, error = _wait_every([h for _, h in handles])
            for (params, _), ok in zip(handles, done):
                for name, p in params if ok else ():
                    self._apply_update(name, p)
        if error is not None:
            raise error

    def _apply_update(self, name, p):
        """Adds the update of p's last codes call to p, in fp32 as the C client
        adds it to its weights: on p itself when p is float32, else on an fp32
        copy of the weights on p's device, which p then takes."""
        if p.dtype == torch.float32:
            self._stages[name].store(into=p.data, add=True)
            return
        master = self._device_weights.get(name)
        if master is None:  # what the daemon believes this worker holds, in fp32
            master = self._device_weights[name] = \
                self._weights[name].to(device=p.device, dtype=torch.float32).view_as(p)
        self._stages[name].store(into=master, add=True)
        p.data.copy_(master)

    def _group_params(self, group):
        """(wire name, param) of group's parameters that are stepped."""
        for p in group["params"]:
            name = self._names[id(p)]
            if name in self._weights:
                yield name, p

    def _broadcast(self, params):
        """Rank 0's values of params ([(wire name, param)]) become the master
        weights (or the daemon's resumed ones come back); returns the fewest
        updates any of them has had."""
        handles = []
        with torch.no_grad():
            for name, p in params:
                w = p.data if is_direct(p.data) else \
                    p.detach().to(device="cpu", dtype=torch.float32).contiguous()
                self._weights[name] = w
                handles.append(self.client.broadcast_async(name, w))
            for h in handles:
                h.wait()
            for name, p in params:
                if self._weights[name] is not p.data:
                    p.data.copy_(self._weights[name].view_as(p))
        return min((self.client.updates(name, self._weights[name])
                    for name, _ in params), default=0)

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
