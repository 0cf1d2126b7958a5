"""DiLoCo (Douillard et al., arXiv 2311.08105) on apsd: each worker takes
sync_every inner steps with its own optimizer, then the workers average their
pseudo-gradients (the weights at the last sync minus the weights now) and the
daemon applies the outer step, SGD with Nesterov momentum, to its fp32 master
weights; every worker then starts from the new master weights.

    spec = aps.torch.optimizer_spec("sgd", momentum=0.9, nesterov=True)
    client = aps.Client.from_env(format="fp4", scaling="block", optimizer=spec)
    inner = torch.optim.AdamW(model.parameters(), lr=1e-3)
    diloco = aps.torch.DiLoCo(model, inner, client, sync_every=50, outer_lr=0.7)
    for x, y in batches:
        inner.zero_grad()
        loss_fn(model(x), y).backward()
        inner.step()
        diloco.step()                  # every sync_every calls: the outer step

fragments=P is Streaming DiLoCo's schedule (arXiv 2501.18512): the
parameters are cut into P fragments of about equal size, in model order, and
fragment j synchronises every sync_every steps, j * sync_every / P steps
after fragment 0, so that each sync moves 1/P of the bytes. overlap=T lets
a sync run while the next T inner steps do (Streaming DiLoCo's overlap):
its pseudo-gradient leaves at the due step, and T steps later, when the
outer step's answer is in, the fragment's parameters become mix * local +
(1 - mix) * master (Streaming DiLoCo's merge; mix=0 restarts from the master
weights, T steps late). overlap=0 (the default) blocks at each sync. Call
finish() after the last step: it lands the syncs still in flight.

Restarts: the outer state (master weights, Nesterov momentum, the count of
outer steps) is the daemon's, so apsd's checkpoints (checkpoint_dir) hold it.
A DiLoCo built against a job apsd resumed starts every rank from the resumed
master weights, whatever rank 0 holds, and resumed_syncs says how many outer
steps they have had; each worker's inner optimizer starts afresh.

Elastic jobs (apsd --elastic yes): with elastic=True every rank enters a
barrier after each outer step of fragment 0, so a rank that comes back can
join there: built with rejoin=True it waits in that barrier, then takes the
master weights (pull) instead of broadcasting, and counts its inner steps
from there, in step with the others. The outer means are over the ranks that
sent a pseudo-gradient.

It is optimize mode (docs/PROTOCOL.md) with the pseudo-gradient as the
gradient: the pseudo-gradients go up in the client's format with APS (block
scaling where chosen) and the daemon's error feedback keeps what the workers
hold within half a quantization step of the master weights (the updates come
down in the same format); the protocol gains nothing. The inner optimizer's
state stays each worker's own, as in the paper.

The outer step: the defaults (lr 0.7, Nesterov momentum 0.9) are the paper's,
tuned for H = 500 on large models. At H = 10 and 50 in short runs plain
averaging did better on both of docs/RESULTS.md's workloads (a transformer
with AdamW, a CNN with SGD): outer_lr=1.0, outer_momentum=0 (the client's spec
optimizer_spec("sgd", momentum=0)) makes every sync the mean of the workers'
weights; 0.7 with Nesterov 0.9 moves up to 7x the mean pseudo-gradient when
successive ones agree and diverged on the CNN at H = 10.
"""

import math

import torch

from aps._args import ANY_INT, check_float, check_int, check_str
from aps._server_optimizer import _parse_spec, _same, _settings, optimizer_spec


class DiLoCo:
    """The outer loop of DiLoCo for model's trainable parameters over client
    (opened in optimize mode with SGD: optimizer_spec("sgd", momentum=
    outer_momentum, nesterov=nesterov)). At construction rank 0's parameters
    become the master weights on every rank (or, in a job apsd resumed from
    a checkpoint, the resumed ones: resumed_syncs outer steps). step() counts
    inner steps and each fragment synchronises on its own schedule; step()
    returns the fragments it synchronised (a list, empty most steps)."""

    def __init__(self, model, inner_optimizer, client, sync_every, outer_lr=0.7,
                 outer_momentum=0.9, nesterov=True, fragments=1, prefix="outer.",
                 elastic=False, rejoin=False, overlap=0, mix=0.5):
        sync_every = check_int(sync_every, "sync_every", (1, math.inf))
        fragments = check_int(fragments, "fragments", ANY_INT)
        overlap = check_int(overlap, "overlap", ANY_INT)
        if not 1 <= fragments <= sync_every:
            raise ValueError(f"fragments must be 1..sync_every ({sync_every}), not {fragments}")
        if not 0 <= overlap < sync_every:
            raise ValueError(f"overlap must be 0..sync_every - 1 ({sync_every - 1}), "
                             f"not {overlap}")
        mix = check_float(mix, "mix", (0.0, 1.0))
        # the client's rule for a step's lr, checked here rather than at the first sync
        outer_lr = check_float(outer_lr, "outer_lr", (0.0, math.inf))
        outer_momentum = check_float(outer_momentum, "outer_momentum", (0.0, 1.0))
        check_str(prefix, "prefix")
        if overlap and (elastic or rejoin):
            raise ValueError("elastic DiLoCo blocks at its syncs: overlap must be 0")
        # Nesterov needs momentum: outer_momentum=0 is plain SGD whatever nesterov says.
        want = {"momentum": outer_momentum,
                "nesterov": int(bool(nesterov) and outer_momentum > 0)}
        if not client.optimizer:
            raise ValueError("DiLoCo's outer step runs on apsd: open the client with "
                             f"optimizer={optimizer_spec('sgd', **want)!r}")
        name, settings = _parse_spec(client.optimizer)
        if name != "sgd" or not _same(_settings("sgd", want), settings):
            raise ValueError(f"DiLoCo needs the job to run {optimizer_spec('sgd', **want)!r}, "
                             f"the client's runs {client.optimizer!r}")
        self.inner = inner_optimizer
        self.client = client
        self.elastic = bool(elastic or rejoin)
        self.overlap, self.mix = overlap, mix
        self._flight = {}  # fragment: (handle, step it left at, names)
        self.sync_every = sync_every
        self.outer_lr = outer_lr
        self.steps = 0
        self.syncs = 0
        self._params = [(prefix + n, p) for n, p in model.named_parameters() if p.requires_grad]
        self.fragments = _fragments(self._params, fragments)
        # What every worker holds since the last sync (the daemon keeps the same view).
        self._anchor = {n: p.detach().to(device="cpu", dtype=torch.float32).contiguous().clone()
                        for n, p in self._params}
        self._delta = {n: torch.empty_like(a) for n, a in self._anchor.items()}
        with torch.no_grad():
            if rejoin:  # back in an elastic job: in step with the others' next barrier
                client.barrier()
                for n, _ in self._params:
                    client.pull(n, self._anchor[n])
            else:
                for h in [client.broadcast_async(n, self._anchor[n])
                          for n, _ in self._params]:
                    h.wait()
            self._restart()
        self.resumed_syncs = min((client.updates(n, self._anchor[n]) for n, _ in self._params),
                                 default=0)

    def step(self):
        """One inner step done; the outer step of each fragment that is due.
        Returns the indices of the fragments whose sync started ([] most
        steps; [0] every sync_every steps without fragments)."""
        self.steps += 1
        for j in [j for j, (_, left, _) in self._flight.items()
                  if self.steps - left >= self.overlap]:
            self._land(j)
        due = [j for j in range(len(self.fragments))
               if (self.steps + j * self.sync_every // len(self.fragments)) %
               self.sync_every == 0]
        for j in due:
            self._launch(j, set(self.fragments[j]))
            if self.overlap == 0:
                self._land(j)
        if self.elastic and 0 in due:
            self.client.barrier()  # where a rank that is back joins
        return due

    def sync(self, fragment=None):
        """The outer step now, of every parameter or of one fragment: every
        rank's pseudo-gradient averaged by apsd, Nesterov SGD on the master
        weights, every rank restarts from them. Blocks."""
        if fragment is not None:
            fragment = check_int(fragment, "fragment", (0, len(self.fragments) - 1))
        self.finish()
        key = -1 if fragment is None else fragment
        self._launch(key, None if fragment is None else set(self.fragments[fragment]))
        self._land(key, merge=False)

    def finish(self):
        """Lands every sync still in flight (overlap > 0): call it after the last step."""
        for j in list(self._flight):
            self._land(j)

    def _launch(self, key, names):
        """Sends the pseudo-gradient of names (None: every parameter); the outer
        step's answer moves their anchors to the master weights in flight."""
        with torch.no_grad():
            items = []
            for n, p in self._params:
                if names is not None and n not in names:
                    continue
                d = self._delta[n]
                torch.sub(self._anchor[n], p.detach().to(device="cpu", dtype=torch.float32)
                          .view_as(d), out=d)
                items.append((n, d, self._anchor[n]))
            self._flight[key] = (self.client.step_many_async(items, self.outer_lr),
                                 self.steps, names)

    def _land(self, key, merge=True):
        handle, _, names = self._flight.pop(key)
        handle.wait()
        with torch.no_grad():
            if merge and self.overlap > 0 and self.mix > 0:
                for n, p in self._params:  # Streaming DiLoCo's merge
                    if names is None or n in names:
                        p.data.mul_(self.mix).add_(self._anchor[n].view_as(p).to(p),
                                                   alpha=1.0 - self.mix)
            else:
                self._restart(names)
        self.syncs += 1

    def pull(self):
        """{name: float32 CPU tensor} of the daemon's master weights."""
        out = {}
        for n, p in self._params:
            buf = torch.empty(p.shape, dtype=torch.float32)
            self.client.pull(n, buf)
            out[n] = buf
        return out

    def _restart(self, names=None):
        for n, p in self._params:
            if names is None or n in names:
                p.data.copy_(self._anchor[n].view_as(p))

    def __repr__(self):
        return (f"DiLoCo(sync_every={self.sync_every}, outer_lr={self.outer_lr}, "
                f"overlap={self.overlap}, "
                f"{len(self._params)} tensors, {self.syncs} syncs, {self.client})")


def _fragments(params, count):
    """Wire names of params cut, in order, into count runs of about equal size."""
    total = sum(p.numel() for _, p in params)
    out, size = [[] for _ in range(count)], 0
    for n, p in params:
        j = min(count - 1, size * count // max(total, 1))
        out[j].append(n)
        size += p.numel()
    return [f for f in out if f] or [[]]
