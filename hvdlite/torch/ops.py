"""Horovod's collectives on the current gloo group.

Tensors must live on the CPU; non-contiguous ones are copied to a buffer and back. Results do
not carry gradients (Horovod's ops are differentiable; hvdlite's are not). A collective that
fails because the world broke raises HorovodInternalError, which elastic training recovers from.
"""
import torch
import torch.distributed as dist
from torch._C._distributed_c10d import AllgatherOptions  # not re-exported by torch.distributed

from hvdlite.torch import runtime
from hvdlite.torch.compression import Compression
from hvdlite.worker import objects
from hvdlite.worker.errors import HorovodInternalError
from hvdlite.worker.reduceops import Adasum, Average, Max, Min, Product, Sum, resolve  # noqa: F401

_GLOO_OPS = {Average: dist.ReduceOp.SUM, Sum: dist.ReduceOp.SUM, Min: dist.ReduceOp.MIN,
             Max: dist.ReduceOp.MAX, Product: dist.ReduceOp.PRODUCT}


class Handle:
    """A collective in flight: synchronize(handle) waits and returns its result."""

    def __init__(self, works, finish):
        self._works, self._finish = works, finish
        self._done, self._result = False, None

    def poll(self) -> bool:
        return all(work.is_completed() for work in self._works)

    def wait(self):
        if not self._done:
            for work in self._works:
                _wait(work)
            self._result, self._done = self._finish(), True
        return self._result


def _wait(work) -> None:
    try:
        work.wait()
    except RuntimeError as e:
        # gloo reports a dead, hung or cut-off peer as a plain RuntimeError.
        raise HorovodInternalError(str(e)) from e


def synchronize(handle: Handle):
    return handle.wait()


def poll(handle: Handle) -> bool:
    return handle.poll()


class _Pack:
    """Same-dtype tensors as one contiguous buffer: collectives on many small tensors cost
    one round trip. A lone contiguous tensor is used as is, without a copy."""

    def __init__(self, tensors):
        self.tensors = tensors
        self.in_place = len(tensors) == 1 and tensors[0].is_contiguous()
        if self.in_place:
            self.flat = tensors[0]
        elif len(tensors) == 1:
            self.flat = tensors[0].contiguous().view(-1)
        else:
            self.flat = torch.cat([t.reshape(-1) for t in tensors])

    def unpack(self) -> None:
        if self.in_place:
            return
        parts = self.flat.split([t.numel() for t in self.tensors])
        for tensor, part in zip(self.tensors, parts):
            tensor.copy_(part.view(tensor.shape))


def _check_cpu(tensor) -> None:
    if tensor.device.type != "cpu":
        raise ValueError(f"hvdlite collectives need CPU tensors, got one on {tensor.device}")


def _collective(tensors, result, start, finish=None) -> Handle:
    """Issue start(buffer) -> Work on one packed buffer per dtype (in first-seen dtype order,
    the same on every rank); waiting runs finish(buffer), copies the buffers back into
    `tensors` and returns `result`."""
    by_dtype = {}
    for tensor in tensors:
        _check_cpu(tensor)
        by_dtype.setdefault(tensor.dtype, []).append(tensor.detach())
    packs = [_Pack(group) for group in by_dtype.values()]
    works = [start(pack.flat) for pack in packs]

    def done():
        for pack in packs:
            if finish:
                finish(pack.flat)
            pack.unpack()
        return result
    return Handle(works, done)


def _scale(tensor, factor) -> None:
    if factor == 1:
        return
    if tensor.is_floating_point():
        tensor.mul_(factor)
    else:  # like Horovod: scale in double, truncate back to the integer type
        tensor.copy_(tensor.double().mul_(factor))


def _allreduce_async(tensors, result, average, op, prescale_factor, postscale_factor) -> Handle:
    op = resolve(op, average)
    pg = runtime.process_group()
    divisor = pg.size() if op == Average else 1
    options = dist.AllreduceOptions()
    options.reduceOp = _GLOO_OPS[op]

    def start(flat):
        _scale(flat, prescale_factor)
        return pg.allreduce([flat], options)

    # Average divides after the sum: work before a collective delays every rank, work after
    # it overlaps with the peers'. Floats fold it into the postscale pass; integers divide
    # exactly, rounding toward zero as Horovod's integer scaling does.
    def finish(flat):
        if flat.is_floating_point():
            _scale(flat, postscale_factor / divisor)
        else:
            _scale(flat, postscale_factor)
            if divisor != 1:
                flat.div_(divisor, rounding_mode="trunc")
    return _collective(tensors, result, start, finish)


def grouped_allreduce_async_(tensors, average=None, name=None, op=None,
                             prescale_factor=1.0, postscale_factor=1.0) -> Handle:
    """Reduce `tensors` in place, fused into one buffer per dtype."""
    tensors = list(tensors)
    return _allreduce_async(tensors, tensors, average, op, prescale_factor, postscale_factor)


def _copies(tensors):
    return [t.detach().clone(memory_format=torch.contiguous_format) for t in tensors]


def grouped_allreduce_async(tensors, average=None, name=None, op=None,
                            prescale_factor=1.0, postscale_factor=1.0) -> Handle:
    return grouped_allreduce_async_(_copies(tensors), average, name, op,
                                    prescale_factor, postscale_factor)


def grouped_allreduce_(tensors, average=None, name=None, op=None,
                       prescale_factor=1.0, postscale_factor=1.0):
    return grouped_allreduce_async_(tensors, average, name, op,
                                    prescale_factor, postscale_factor).wait()


def grouped_allreduce(tensors, average=None, name=None, compression=Compression.none, op=None,
                      prescale_factor=1.0, postscale_factor=1.0):
    compressed = [compression.compress(t) for t in tensors]
    reduced = grouped_allreduce_async([t for t, _ in compressed], average, name, op,
                                      prescale_factor, postscale_factor).wait()
    return [compression.decompress(t, ctx) for t, (_, ctx) in zip(reduced, compressed)]


def allreduce_async_(tensor, average=None, name=None, op=None,
                     prescale_factor=1.0, postscale_factor=1.0) -> Handle:
    return _allreduce_async([tensor], tensor, average, op, prescale_factor, postscale_factor)


def allreduce_async(tensor, average=None, name=None, op=None,
                    prescale_factor=1.0, postscale_factor=1.0) -> Handle:
    return allreduce_async_(_copies([tensor])[0], average, name, op, prescale_factor, postscale_factor)


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0):
    return allreduce_async_(tensor, average, name, op, prescale_factor, postscale_factor).wait()


def allreduce(tensor, average=None, name=None, compression=Compression.none, op=None,
              prescale_factor=1.0, postscale_factor=1.0):
    compressed, ctx = compression.compress(tensor)
    reduced = allreduce_async(compressed, average, name, op, prescale_factor, postscale_factor).wait()
    return compression.decompress(reduced, ctx)


def _broadcast_async(tensors, result, root_rank) -> Handle:
    pg = runtime.process_group()
    if not 0 <= root_rank < pg.size():
        raise ValueError(f"root_rank {root_rank} is outside the world of size {pg.size()}")
    options = dist.BroadcastOptions()
    options.rootRank = root_rank
    return _collective(tensors, result, lambda flat: pg.broadcast([flat], options))


def grouped_broadcast_async_(tensors, root_rank) -> Handle:
    """Overwrite `tensors` with root_rank's, fused into one buffer per dtype."""
    tensors = list(tensors)
    return _broadcast_async(tensors, tensors, root_rank)


def grouped_broadcast_(tensors, root_rank):
    return grouped_broadcast_async_(tensors, root_rank).wait()


def broadcast_async_(tensor, root_rank, name=None) -> Handle:
    return _broadcast_async([tensor], tensor, root_rank)


def broadcast_async(tensor, root_rank, name=None) -> Handle:
    return broadcast_async_(_copies([tensor])[0], root_rank)


def broadcast_(tensor, root_rank, name=None):
    return broadcast_async_(tensor, root_rank).wait()


def broadcast(tensor, root_rank, name=None):
    return broadcast_async(tensor, root_rank).wait()


def _allgather_parts(tensor):
    """Every rank's tensor, in rank order; first dimensions may differ between ranks."""
    if tensor.dim() == 0:
        raise ValueError("allgather needs a tensor with at least one dimension")
    pg = runtime.process_group()
    size, rest = pg.size(), tuple(tensor.shape[1:])
    # One small gather of (first dim, rest of the shape) lets every rank size its buffer and
    # lets all ranks agree to fail when the shapes are incompatible.
    meta = torch.tensor([tensor.shape[0], tensor.dim(), torch.Size(rest).numel()])
    metas = _gather_equal(pg, meta).view(size, 3).tolist()
    if any(m[1:] != metas[0][1:] for m in metas):
        raise ValueError(f"allgather: ranks disagree on all but the first dimension: {metas}")
    firsts = [m[0] for m in metas]
    longest = max(firsts)
    if longest == 0:
        return [tensor.new_empty((0,) + rest)] * size
    padded = tensor.detach()
    if tensor.shape[0] < longest:
        padded = torch.cat([padded, padded.new_empty((longest - tensor.shape[0],) + rest)])
    gathered = _gather_equal(pg, padded)
    return [gathered[r * longest: r * longest + n] for r, n in enumerate(firsts)]


def _gather_equal(pg, tensor):
    """Gather same-shaped tensors, concatenated along the first dimension."""
    _check_cpu(tensor)
    tensor = tensor.contiguous()
    out = tensor.new_empty((pg.size() * tensor.shape[0],) + tuple(tensor.shape[1:]))
    _wait(pg.allgather([list(out.chunk(pg.size()))], [tensor], AllgatherOptions()))
    return out


def allgather(tensor, name=None):
    """Concatenate every rank's tensor along the first dimension, in rank order."""
    return torch.cat(_allgather_parts(tensor))


def _to_bytes_tensor(obj):
    return torch.frombuffer(bytearray(objects.dumps(obj)), dtype=torch.uint8)


def _from_bytes_tensor(tensor):
    return objects.loads(tensor.numpy())


def broadcast_object(obj, root_rank=0, name=None):
    """root_rank's `obj` on every rank (the root gets its own object back)."""
    is_root = runtime.process_group().rank() == root_rank
    payload = _to_bytes_tensor(obj) if is_root else None
    length = broadcast_(torch.tensor([len(payload) if is_root else 0]), root_rank)
    if not is_root:
        payload = torch.empty(int(length), dtype=torch.uint8)
    broadcast_(payload, root_rank)
    return obj if is_root else _from_bytes_tensor(payload)


def allgather_object(obj, name=None):
    """Every rank's `obj`, as a list in rank order."""
    return [_from_bytes_tensor(part) for part in _allgather_parts(_to_bytes_tensor(obj))]


def barrier():
    _wait(runtime.process_group().barrier(dist.BarrierOptions()))
