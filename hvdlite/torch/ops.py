"""Horovod's collectives on the current gloo group, or on a process set's.

Host tensors go on gloo; CUDA ones there too through host copies (devices.py), or, in a world
that took NCCL, on its NCCL group (backend.py: the data there, the control exchanges on gloo).
Non-contiguous tensors are copied to a buffer and back. The
differentiable faces of these (allreduce, allgather, ...) are in hvdlite.torch.autograd; allreduce
and join() are in hvdlite.torch.allreduce, what every collective shares in hvdlite.torch.handles. A
collective that fails because the world broke raises HorovodInternalError, which elastic
training recovers from. Ranks match collectives by their order, not by name; a named one is
issued at the next collective other than a barrier, or at its wait (handles.defer), and a
name still in flight is refused.
"""
import contextlib

import torch
import torch.distributed as dist

from hvdlite.torch import backend, devices, fusion, handles, joinwire, runtime
from hvdlite.torch.allreduce import (  # noqa: F401 - this module is the collectives' one face
    allreduce_, allreduce_async, allreduce_async_, grouped_allreduce_, grouped_allreduce_async,
    grouped_allreduce_async_, join)
from hvdlite.torch.handles import Handle, poll, synchronize  # noqa: F401
from hvdlite.torch.processsets import global_process_set
from hvdlite.worker import objects
from hvdlite.worker.errors import MismatchError
from hvdlite.worker.reduceops import Adasum, Average, Max, Min, Product, Sum, shares  # noqa: F401

_syncing = None  # (the world's root, who syncs) while a state handler syncs (syncing_from)


@contextlib.contextmanager
def syncing_from(root, who):
    """Refuse a broadcast from any rank but `root` inside: a state handler written for Horovod
    syncs from rank 0, which may hold nothing here (ranks stay put; the root holds the commit)."""
    global _syncing
    _syncing = (root, who)
    try:
        yield
    finally:
        _syncing = None


@handles.traced("broadcast")
@devices.staged
def _broadcast_async(tensors, result, root_rank, process_set, checked=True) -> Handle:
    """`checked`: first check that the ranks agree on the root and the tensors (one small
    gather); a disagreeing root would leave gloo waiting out its timeout."""
    pg = process_set.group()
    if not 0 <= root_rank < runtime.info().size:
        raise ValueError(f"root_rank {root_rank} is outside the world of size {runtime.info().size}")
    if _syncing is not None and root_rank != _syncing[0]:  # every rank alike: all refuse here
        raise SystemExit(f"hvdlite: {_syncing[1]} syncs from rank {root_rank}, but the newest commit is at "
                         f"rank {_syncing[0]} (ranks stay put after a failure): broadcast from the "
                         f"handler's self.root_rank")
    if checked:
        _refuse_if_joined(pg, process_set, "broadcast")
        handles.agree(pg, "broadcast", f"root rank {root_rank}, {_described(tensors)}",
                      **{"root rank": root_rank, "tensors' dtypes and shapes": handles.layout_key(tensors)})
    options = dist.BroadcastOptions()
    options.rootRank = process_set.set_rank(root_rank, "root_rank")
    return handles.collective(tensors, result, lambda flat: [backend.data(pg, flat).broadcast([flat], options)])


def _refuse_if_joined(pg, process_set, kind) -> None:
    if process_set is global_process_set:  # (only the global set's allreduces carry join's state)
        joinwire.refuse_if_joined(pg, kind)


def _described(tensors) -> str:
    return ", ".join(f"{t.dtype} {list(t.shape)}" for t in tensors)


def grouped_broadcast_async_(tensors, root_rank, process_set=global_process_set) -> Handle:
    """Overwrite `tensors` with root_rank's, fused into one buffer per dtype."""
    tensors = list(tensors)
    return _broadcast_async(tensors, tensors, root_rank, process_set)


def grouped_broadcast_(tensors, root_rank, process_set=global_process_set):
    return grouped_broadcast_async_(tensors, root_rank, process_set).wait()


def broadcast_async_(tensor, root_rank, name=None, process_set=global_process_set) -> Handle:
    """root_rank is a rank of the world, and must be in the process set."""
    return _broadcast_async([tensor], tensor, root_rank, process_set, name=name)


def broadcast_async(tensor, root_rank, name=None, process_set=global_process_set) -> Handle:
    return broadcast_async_(handles.copies([tensor])[0], root_rank, name, process_set)


def broadcast_(tensor, root_rank, name=None, process_set=global_process_set):
    return broadcast_async_(tensor, root_rank, name, process_set).wait()



@handles.traced("allgather")
@devices.staged
def _allgather_async(tensor, process_set) -> Handle:
    """A Handle whose result is every rank's tensor, in rank order; first dimensions may
    differ between ranks. The shapes are exchanged at the call, the data in the background."""
    if tensor.dim() == 0:
        raise ValueError("allgather needs a tensor with at least one dimension")
    pg = process_set.group()
    _refuse_if_joined(pg, process_set, "allgather")
    size, rest = pg.size(), tuple(tensor.shape[1:])
    # One small gather of (first dim, rest of the shape) lets every rank size its buffer and
    # lets all ranks agree to fail when the shapes are incompatible.
    meta = torch.tensor([tensor.shape[0], handles.layout_key([tensor], skip=1)])
    metas = handles.gather_equal(pg, meta).view(size, len(meta)).tolist()
    if any(m[1] != metas[0][1] for m in metas):
        raise MismatchError(f"allgather: the ranks disagree on the dtype or on all but the first "
                            f"dimension (this rank: {_described([tensor])})")
    firsts = [m[0] for m in metas]
    longest = max(firsts)
    if longest == 0:
        return handles.done([tensor.new_empty((0,) + rest)] * size)
    padded = tensor.detach()
    if tensor.shape[0] < longest:
        padded = torch.cat([padded, padded.new_empty((longest - tensor.shape[0],) + rest)])
    work, gathered = handles.gather_equal_async(backend.data(pg, padded), padded)
    return Handle([work], lambda: [gathered[r * longest: r * longest + n] for r, n in enumerate(firsts)])


def allgather_async(tensor, name=None, process_set=global_process_set) -> Handle:
    """Concatenate every rank's tensor along the first dimension, in rank order."""
    parts = _allgather_async(tensor, process_set, name=name)
    return Handle([parts], lambda: torch.cat(parts.wait()))


class SparseHandle(Handle):
    """Horovod's sparse handle is a function returning the result: so is this one."""
    __call__ = Handle.wait


def sparse_allreduce_async(tensor, name, op, process_set=global_process_set) -> SparseHandle:
    """Reduce a sparse COO tensor as Horovod does: gather every rank's indices and values
    (Average divides the values by the set's size); the result is sparse, uncoalesced, with
    every rank's entries."""
    indices = allgather_async(tensor._indices().t().contiguous(), _part(name, "indices"), process_set)
    values = allgather_async(tensor._values(), _part(name, "values"), process_set)

    def finish():
        summed = values.wait()
        if op == Average:
            summed = summed / process_set.size()
        return torch.sparse_coo_tensor(indices.wait().t(), summed, tensor.shape, check_invariants=False)
    return SparseHandle([indices, values], finish)


def grouped_allgather_async(tensors, name=None, process_set=global_process_set) -> Handle:
    handles = [allgather_async(t, _part(name, i), process_set) for i, t in enumerate(tensors)]
    return Handle(handles, lambda: [h.wait() for h in handles])


def _part(name, part):
    """The name of one of a named call's collectives: each name in flight must be its own."""
    return None if name is None else f"{name}.{part}"


def alltoall_async(tensor, splits=None, name=None, process_set=global_process_set) -> Handle:
    """Send rows splits[i] (in order) of `tensor` to rank i of the set; the result is the rows
    received from every rank, in rank order, and how many came from each rank (int32, or the
    dtype of `splits` when a tensor), as Horovod's. Without splits the first dimension is
    split evenly."""
    return _alltoall_async(tensor, splits, process_set, name=name)


@handles.traced("alltoall")
@devices.staged
def _alltoall_async(tensor, splits, process_set) -> Handle:
    pg = process_set.group()
    size = pg.size()
    if tensor.dim() == 0:
        raise ValueError("alltoall needs a tensor with at least one dimension")
    _refuse_if_joined(pg, process_set, "alltoall")
    if torch.is_tensor(splits) and (splits.is_floating_point() or splits.dtype == torch.bool):
        raise ValueError(f"alltoall: splits must be integers, got {splits.dtype}")
    if splits is None:
        if tensor.shape[0] % size:
            raise ValueError(f"alltoall: the first dimension ({tensor.shape[0]}) is not divisible "
                             f"by the number of ranks ({size}); pass splits")
        send = [tensor.shape[0] // size] * size
    else:
        send = [int(s) for s in (splits.tolist() if torch.is_tensor(splits) else splits)]
        if len(send) != size or any(s < 0 for s in send) or sum(send) != tensor.shape[0]:
            raise ValueError(f"alltoall: splits {send} must be {size} non-negative counts "
                             f"summing to the first dimension ({tensor.shape[0]})")
    # One gather tells every rank what it receives and whether the ranks agree on the rest.
    meta = torch.tensor([handles.layout_key([tensor], skip=1), *send], dtype=torch.int64)
    metas = handles.gather_equal(pg, meta).view(size, 1 + size)
    if len(set(metas[:, 0].tolist())) > 1:
        raise MismatchError(f"alltoall: the ranks disagree on the dtype or on all but the first "
                            f"dimension (this rank: {_described([tensor])})")
    received = metas[:, 1 + pg.rank()].contiguous()
    recv = received.tolist()
    rest = tuple(tensor.shape[1:])
    out = tensor.new_empty((sum(recv),) + rest)
    row = torch.Size(rest).numel()
    if row == 0 or (sum(recv) == 0 and sum(send) == 0):
        works = []
    else:
        works = [backend.data(pg, out).alltoall_base(fusion.carried(out), fusion.carried(tensor.detach().contiguous()),
                                  recv, send, dist.AllToAllOptions())]
    kind = splits.dtype if torch.is_tensor(splits) else torch.int32
    return Handle(works, lambda: (out, received.to(kind)))


@handles.traced("reducescatter")
@devices.staged
def _reducescatter_async(tensors, op, prescale_factor, postscale_factor, process_set) -> Handle:
    op = Average if op is None else op
    if op not in (Average, Sum):  # (a RuntimeError, as Horovod's)
        raise NotImplementedError("reducescatter reduces with op=Average or op=Sum only")
    pg = process_set.group()
    size, me = pg.size(), pg.rank()
    if any(tensor.dim() == 0 for tensor in tensors):
        raise ValueError("reducescatter needs tensors with at least one dimension")
    _refuse_if_joined(pg, process_set, "reducescatter")
    handles.agree(pg, "reducescatter", _described(tensors), **{"tensors' dtypes and shapes": handles.layout_key(tensors)})
    works, finishers = [], []
    for tensor in tensors:
        counts, rest = shares(tensor.shape[0], size), tuple(tensor.shape[1:])
        longest = counts[0]
        # Every rank's rows padded to the longest share, so that gloo scatters equal parts.
        padded = tensor.new_zeros((size * longest,) + rest)
        for r, part in enumerate(tensor.detach().split(counts)):
            padded[r * longest: r * longest + counts[r]] = part
        fusion.scale(padded, prescale_factor)
        out = tensor.new_empty((longest,) + rest)
        if out.numel():
            options = dist.ReduceScatterOptions()
            options.reduceOp = dist.ReduceOp.SUM
            works.append(backend.data(pg, out)._reduce_scatter_base(out, padded, options))
        finishers.append((out, counts[me]))

    def finish():
        results = []
        for out, rows in finishers:
            out = out[:rows]
            fusion.average(out, postscale_factor, size if op == Average else 1)
            results.append(out)
        return results
    return Handle(works, finish)


def grouped_reducescatter_async(tensors, name=None, op=Average, process_set=global_process_set,
                                prescale_factor=1.0, postscale_factor=1.0) -> Handle:
    return _reducescatter_async(list(tensors), op, prescale_factor, postscale_factor, process_set,
                                name=name)


def reducescatter_async(tensor, name=None, op=Average, process_set=global_process_set,
                        prescale_factor=1.0, postscale_factor=1.0) -> Handle:
    """Reduce every rank's tensor and give rank i its i-th share of the first dimension
    (as even as possible, the first ranks one row more)."""
    handle = _reducescatter_async([tensor], op, prescale_factor, postscale_factor, process_set,
                                  name=name)
    return Handle([handle], lambda: handle.wait()[0])


def _to_bytes_tensor(obj):
    return torch.frombuffer(bytearray(objects.dumps(obj)), dtype=torch.uint8)


def _from_bytes_tensor(tensor):
    return objects.loads(tensor.numpy())


# broadcast_object sends the length and the first bytes of the pickle in one collective of
# this size, and the rest (if any) in a second: the small objects of a state sync (optimizer
# layout, plain attributes) cost one collective, not two.
_OBJECT_HEAD = 4096
_LENGTH = 8


def broadcast_object(obj, root_rank=0, name=None, process_set=global_process_set):
    """root_rank's `obj` on every rank of the set (the root gets its own object back)."""
    is_root = runtime.info().rank == root_rank
    head = torch.zeros(_OBJECT_HEAD, dtype=torch.uint8)
    if is_root:
        payload = _to_bytes_tensor(obj)
        head[:_LENGTH] = torch.tensor(list(len(payload).to_bytes(_LENGTH, "little")), dtype=torch.uint8)
        first = payload[:_OBJECT_HEAD - _LENGTH]
        head[_LENGTH:_LENGTH + len(first)] = first
    _broadcast_async([head], head, root_rank, process_set, False).wait()
    length = int.from_bytes(head[:_LENGTH].numpy().tobytes(), "little")
    if length > _OBJECT_HEAD - _LENGTH:
        rest = payload[_OBJECT_HEAD - _LENGTH:] if is_root \
            else torch.empty(length - (_OBJECT_HEAD - _LENGTH), dtype=torch.uint8)
        _broadcast_async([rest], rest, root_rank, process_set, False).wait()
        if not is_root:
            payload = torch.cat([head[_LENGTH:], rest])
    elif not is_root:
        payload = head[_LENGTH:_LENGTH + length]
    return obj if is_root else _from_bytes_tensor(payload)


def allgather_object(obj, name=None, process_set=global_process_set):
    """Every rank's `obj`, as a list in rank order."""
    parts = _allgather_async(_to_bytes_tensor(obj), process_set).wait()
    return [_from_bytes_tensor(part) for part in parts]


@handles.traced("barrier")
def barrier(process_set=global_process_set):
    handles.wait_work(process_set.group(barrier=True).barrier(dist.BarrierOptions()))

