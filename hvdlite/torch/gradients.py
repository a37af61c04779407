"""The gradients a TorchState's commit holds: every parameter's `.grad` (of the models and
optimizers in the state, each parameter once) and each DistributedOptimizer's count of the
backward passes still to accumulate before it reduces.

A script that zeroes after optimizer.step(), or accumulates across a commit (no_sync, or
backward_passes_per_step > 1), holds gradients at the commit that the next step adds to; a
rollback that kept the failed step's (Horovod sets them to None instead) would add the next
step's to them on the survivors and to nothing on a replacement. So the commit keeps them as
they are, None included, and a rollback, a sync and a resume put them back in place (a DDP
bucket view or a script's reference to a .grad stays valid).

Reduced gradients are the same on every rank, and a new process taking a rank gets the root's.
Gradients accumulated locally and not reduced yet (a commit between backward passes) are each
rank's own: a commit whose ranks' gradients differ (a checksum of each rank's, in the commit's
allgather of the ranks' parts) gathers them too, so that a process taking a rank gets that
rank's. A commit after DistributedOptimizers reduced every gradient pays only the copy; one
with gradients reduced otherwise (DDP) the checksum too.
"""
import torch

from hvdlite.torch import ops, runtime
from hvdlite.torch.optimizer import _DistributedOptimizer, broadcast_parameters
from hvdlite.torch.processsets import global_process_set


def parameters(values) -> list:
    """Every parameter of the modules and optimizers among `values`, once each, in order."""
    seen, params = set(), []
    for value in values:
        if isinstance(value, torch.nn.Module):
            found = value.parameters()
        elif isinstance(value, torch.optim.Optimizer):
            found = (p for group in value.param_groups for p in group["params"])
        else:
            continue
        for p in found:
            if id(p) not in seen:
                seen.add(id(p))
                params.append(p)
    return params


def _checksum(grad) -> int:
    """The sum of a gradient's bytes read as int64s (or bytes), wrapping: gradients computed
    from other data do not come out alike by chance. Exact, at the speed of a copy (summing
    int32s into an int64 converts each, six times slower here)."""
    if grad.is_sparse:  # an embedding's (sparse=True)
        grad = grad.detach().coalesce()
        return _checksum(grad.indices()) + _checksum(grad.values())
    data = grad.detach().contiguous().reshape(-1).view(torch.uint8)
    if data.numel() % 8 == 0:
        if data.storage_offset() % 8:  # a view into a bucket (DDP's, a fused one) may start mid-word
            data = data.clone()
        data = data.view(torch.int64)
    return int(data.sum(dtype=torch.int64))


class Gradients:
    def __init__(self, values):
        self.params = parameters(values)
        self.reducers = [v._hvd_reducer for v in values if isinstance(v, _DistributedOptimizer)]
        self._reduced = {id(p) for r in self.reducers if r.process_set is global_process_set
                         for bucket in r.buckets for p in bucket}
        self.local = False  # whether the commit being taken holds each rank's own gradients
        self._saved = self.current()

    def current(self):
        return {"grads": [None if p.grad is None else p.grad.detach().clone() for p in self.params],
                "pending": [list(r.pending) for r in self.reducers], "local": self.local}

    def checksum(self) -> tuple:
        """This rank's gradients in short, for the commit's allgather of the ranks' parts; ()
        where DistributedOptimizers reduced every gradient there is and none was added since
        (their counts are alike on every rank, so every rank says () alike)."""
        if all(p.grad is None or id(p) in self._reduced for p in self.params) \
                and all(r.pending == [r.passes] * len(r.pending) for r in self.reducers):
            return ()
        return tuple(None if p.grad is None else _checksum(p.grad) for p in self.params)

    def every_rank(self, checksums, allgather_object):
        """Every rank's gradients, by rank, if `checksums` (every rank's) differ; else None."""
        self.local = len(set(checksums)) > 1
        if not self.local:
            return None
        return allgather_object([None if p.grad is None else p.grad.detach().clone() for p in self.params])

    def save(self):
        self._saved = self.current()

    def saved(self):
        return self._saved

    def load_saved(self, saved):
        """A checkpoint's; one written before gradients were kept holds none (None: as Horovod)."""
        self._saved = saved or {"grads": [None] * len(self.params), "pending": None, "local": False}
        self.local = self._saved["local"]

    def put_rank_saved(self, grads):
        """This rank's own gradients of the commit (a process taking the rank, a resume)."""
        self._saved = {**self._saved, "grads": grads}
        self._put({"grads": grads, "pending": None})  # the counts are the root's (sync)

    def restore(self):
        self._put(self._saved)

    def _put(self, saved):
        for p, grad in zip(self.params, saved["grads"]):
            if grad is None:
                p.grad = None
            elif p.grad is not None and p.grad.shape == grad.shape and p.grad.dtype == grad.dtype \
                    and p.grad.layout == grad.layout == torch.strided:
                p.grad.detach().copy_(grad)
            else:
                p.grad = grad.clone()
        for reducer, pending in zip(self.reducers, saved["pending"] or []):
            reducer.put_pending(pending)

    def sync(self, root):
        """The root's counts on every rank, and its gradients where they are the same on every
        rank; each rank's own stay (a rank taken over gets its part: TorchState). A collective."""
        mine = self.current() if runtime.info().rank == root else None
        held, sparse, pending, self.local = ops.broadcast_object(None if mine is None else (
            [g is not None for g in mine["grads"]],
            {i: g for i, g in enumerate(mine["grads"]) if g is not None and g.is_sparse},  # pickled
            mine["pending"], mine["local"]), root_rank=root)
        grads = [p.grad for p in self.params]
        if not self.local:
            grads = [sparse.get(i, torch.zeros_like(p)) if h else None for i, (p, h) in enumerate(zip(self.params, held))]
            if mine is not None:
                grads = mine["grads"]
            broadcast_parameters([g for g in grads if g is not None and not g.is_sparse], root_rank=root)
        self._put({"grads": grads, "pending": pending})
