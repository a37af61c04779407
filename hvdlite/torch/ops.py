"""Horovod's collectives on the current gloo group, or on a process set's.

Tensors must live on the CPU; non-contiguous ones are copied to a buffer and back. Results do
not carry gradients (Horovod's ops are differentiable; hvdlite's are not). A collective that
fails because the world broke raises HorovodInternalError, which elastic training recovers from.
`name=` is accepted everywhere and unused: ranks match collectives by their order.
"""
import functools
import os

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import AllgatherOptions  # not re-exported by torch.distributed

from hvdlite.torch import adasum, runtime
from hvdlite.torch.compression import Compression
from hvdlite.torch.processsets import global_process_set
from hvdlite.worker import objects, trace
from hvdlite.worker.errors import HorovodInternalError
from hvdlite.worker.reduceops import Adasum, Average, Max, Min, Product, Sum, resolve, shares  # noqa: F401

_GLOO_OPS = {Average: dist.ReduceOp.SUM, Sum: dist.ReduceOp.SUM, Min: dist.ReduceOp.MIN,
             Max: dist.ReduceOp.MAX, Product: dist.ReduceOp.PRODUCT}
_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.uint8, torch.int8,
           torch.int16, torch.int32, torch.int64, torch.bool]


class Handle:
    """A collective in flight: synchronize(handle) waits and returns its result."""

    def __init__(self, works, finish):
        self._works, self._finish = works, finish
        self._done, self._result = False, None
        self.ended = None  # ends its span in the collective trace, when one is recorded

    def poll(self) -> bool:
        return all(work.is_completed() for work in self._works)

    is_completed = poll  # a Handle can wait on other Handles

    def wait(self):
        if not self._done:
            try:
                for work in self._works:
                    _wait(work)
                self._result, self._done = self._finish(), True
            finally:
                if self.ended is not None:
                    self.ended(**({} if self._done else {"failed": True}))
                    self.ended = None
        return self._result


def _done(result) -> Handle:
    """A Handle for a result computed already."""
    return Handle([], lambda: result)


def _wait(work) -> None:
    try:
        work.wait()
    except RuntimeError as e:
        # gloo reports a dead, hung or cut-off peer as a plain RuntimeError.
        raise HorovodInternalError(str(e)) from e


def _traced(name):
    """Record each call as a span of the collective trace, from issue to the handle's wait
    (only while hvdlite.worker.trace records)."""
    def wrap(issue):
        @functools.wraps(issue)
        def traced(*args, **kwargs):
            if trace.recorder() is None:
                return issue(*args, **kwargs)
            info = runtime.info()
            end = trace.span(name, bytes=_nbytes(args), rank=info.rank, size=info.size, round=info.round)
            try:
                out = issue(*args, **kwargs)
            except BaseException:
                end(failed=True)
                raise
            if isinstance(out, Handle):
                out.ended = end
            else:
                end()
            return out
        return traced
    return wrap


def _nbytes(args) -> int:
    """Bytes of the tensors a collective was given (its first tensor or list of tensors)."""
    for arg in args:
        tensors = [arg] if torch.is_tensor(arg) else arg if isinstance(arg, (list, tuple)) else []
        if tensors and all(torch.is_tensor(t) for t in tensors):
            return sum(t.numel() * t.element_size() for t in tensors)
    return 0


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


def _packs(tensors):
    """One _Pack per dtype, in first-seen dtype order (the same on every rank)."""
    by_dtype = {}
    for tensor in tensors:
        _check_cpu(tensor)
        by_dtype.setdefault(tensor.dtype, []).append(tensor.detach())
    return [_Pack(group) for group in by_dtype.values()]


def _collective(tensors, result, start, finish=None) -> Handle:
    """Issue start(buffer) -> list of Works on one packed buffer per dtype; waiting runs
    finish(buffer), copies the buffers back into `tensors` and returns `result`."""
    packs = _packs(tensors)
    works = [work for pack in packs for work in start(pack.flat)]

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


def _average(flat, postscale_factor, divisor) -> None:
    """Postscale, and divide for Average: floats in one pass; integers exactly, rounding
    toward zero as Horovod's integer scaling does."""
    if flat.is_floating_point():
        _scale(flat, postscale_factor / divisor)
    else:
        _scale(flat, postscale_factor)
        if divisor != 1:
            flat.div_(divisor, rounding_mode="trunc")


# join(): a rank that finished early answers the others' allreduces on the global set. So
# that it knows what to answer, every such allreduce is announced by a small header,
# reduced (summed) just before it: [ranks taking part, numel, dtype, op] per active rank,
# then one "joined just now" flag per rank, set by ranks entering join().
# The header costs a small allreduce per allreduce (~0.3 ms here); HVDLITE_JOIN=0 drops it
# for scripts that never call join().
_HEADER = 4
JOIN_ENV = "HVDLITE_JOIN"


def _announcing() -> bool:
    return os.environ.get(JOIN_ENV, "1") != "0"


def _header(pg, numel=0, dtype=None, op=Sum, active=True, joining=False):
    header = torch.zeros(_HEADER + pg.size(), dtype=torch.int64)
    if active:
        header[:_HEADER] = torch.tensor([1, numel, _DTYPES.index(dtype), op])
    if joining:
        header[_HEADER + pg.rank()] = 1
    return header, pg.allreduce([header], _allreduce_options(Sum))


def _check_header(header, numel, dtype, op) -> None:
    active = int(header[0])
    if header[1:_HEADER].tolist() != [active * numel, active * _DTYPES.index(dtype), active * op]:
        raise ValueError(f"allreduce: ranks disagree on the tensors' size, dtype or op "
                         f"(this rank: {numel} elements of {dtype}, op {op})")


def _allreduce_options(op):
    options = dist.AllreduceOptions()
    options.reduceOp = _GLOO_OPS[op]
    return options


@_traced("allreduce")
def _allreduce_async(tensors, result, average, op, prescale_factor, postscale_factor,
                     process_set) -> Handle:
    op = resolve(op, average)
    pg = process_set.group()
    if op == Adasum:
        return _adasum(pg, tensors, result, prescale_factor, postscale_factor)
    divisor = pg.size() if op == Average else 1
    options = _allreduce_options(op)
    announced = process_set is global_process_set and _announcing()
    headers = []

    def start(flat):
        _scale(flat, prescale_factor)
        works = []
        if announced:
            header, work = _header(pg, flat.numel(), flat.dtype, op)
            headers.append((header, flat.numel(), flat.dtype))
            works.append(work)
        return works + [pg.allreduce([flat], options)]

    # Average divides after the sum: work before a collective delays every rank, work after
    # it overlaps with the peers'.
    def finish(flat):
        while headers:
            _check_header(*headers.pop(0), op)
        _average(flat, postscale_factor, divisor)
    return _collective(tensors, result, start, finish)


def _adasum(pg, tensors, result, prescale_factor, postscale_factor) -> Handle:
    """Adasum needs every rank's whole tensor (its dot products are per tensor): gather them,
    then combine them on every rank alike. Runs at the call; the handle is complete."""
    announced = pg is runtime.process_group() and _announcing()
    for tensor in tensors:
        _check_cpu(tensor)
        if not tensor.is_floating_point():
            raise ValueError(f"Adasum needs floating point tensors, got {tensor.dtype}")
        mine = tensor.detach().contiguous().view(1, -1).clone()
        _scale(mine, prescale_factor)
        if announced:  # joined ranks take part with zeros, which Adasum leaves out
            header, work = _header(pg, mine.numel(), mine.dtype, Adasum)
            _wait(work)
            _check_header(header, mine.numel(), mine.dtype, Adasum)
        combined = adasum.reduce(_gather_equal(pg, mine))
        _scale(combined, postscale_factor)
        tensor.detach().copy_(combined.view(tensor.shape))
    return _done(result)


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                             postscale_factor=1.0, process_set=global_process_set) -> Handle:
    """Reduce `tensors` in place, fused into one buffer per dtype."""
    tensors = list(tensors)
    return _allreduce_async(tensors, tensors, average, op, prescale_factor, postscale_factor,
                            process_set)


def _copies(tensors):
    return [t.detach().clone(memory_format=torch.contiguous_format) for t in tensors]


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                            postscale_factor=1.0, process_set=global_process_set) -> Handle:
    return grouped_allreduce_async_(_copies(tensors), average, name, op, prescale_factor,
                                    postscale_factor, process_set)


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                       postscale_factor=1.0, process_set=global_process_set):
    return grouped_allreduce_async_(tensors, average, name, op, prescale_factor,
                                    postscale_factor, process_set).wait()


def grouped_allreduce(tensors, average=None, name=None, compression=Compression.none, op=None,
                      prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set):
    compressed = [compression.compress(t) for t in tensors]
    reduced = grouped_allreduce_async([t for t, _ in compressed], average, name, op,
                                      prescale_factor, postscale_factor, process_set).wait()
    return [compression.decompress(t, ctx) for t, (_, ctx) in zip(reduced, compressed)]


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                     postscale_factor=1.0, process_set=global_process_set) -> Handle:
    return _allreduce_async([tensor], tensor, average, op, prescale_factor, postscale_factor,
                            process_set)


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                    postscale_factor=1.0, process_set=global_process_set) -> Handle:
    return allreduce_async_(_copies([tensor])[0], average, name, op, prescale_factor,
                            postscale_factor, process_set)


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
               postscale_factor=1.0, process_set=global_process_set):
    return allreduce_async_(tensor, average, name, op, prescale_factor, postscale_factor,
                            process_set).wait()


def allreduce(tensor, average=None, name=None, compression=Compression.none, op=None,
              prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set):
    compressed, ctx = compression.compress(tensor)
    reduced = allreduce_async(compressed, average, name, op, prescale_factor, postscale_factor,
                              process_set).wait()
    return compression.decompress(reduced, ctx)


def sparse_allreduce_async(tensor, name=None, op=Average, process_set=global_process_set):
    raise NotImplementedError(
        "hvdlite has no sparse allreduce: reduce tensor.to_dense() with allreduce, or pass "
        "sparse_as_dense=True to DistributedOptimizer")


@_traced("join")
def join(device=-1) -> int:
    """This rank has no more data: answer the other ranks' allreduces on the global set with
    zeros (the op's identity for Min, Max and Product) until every rank joined. Returns the
    rank that joined last. While a rank is joined the others may only allreduce."""
    pg = runtime.process_group()
    if not _announcing():
        raise RuntimeError(f"hvd.join() needs the allreduce headers that {JOIN_ENV}=0 turned off")
    joining = True
    while True:
        header, work = _header(pg, active=False, joining=joining)
        _wait(work)
        joining = False
        count = int(header[0])
        if count == 0:
            return max(r for r in range(pg.size()) if header[_HEADER + r])
        numel, dtype, op = (int(v) // count for v in header[1:_HEADER])
        dtype = _DTYPES[dtype]
        if op == Adasum:
            _gather_equal(pg, torch.zeros(1, numel, dtype=dtype))
        else:
            _wait(pg.allreduce([_identity(op, dtype, numel)], _allreduce_options(op)))


def _identity(op, dtype, numel):
    """What a joined rank contributes: a tensor that leaves the others' reduction unchanged."""
    if dtype == torch.bool:
        return torch.full((numel,), op in (Min, Product), dtype=dtype)
    if op in (Min, Max):
        info = torch.finfo(dtype) if dtype.is_floating_point else torch.iinfo(dtype)
        return torch.full((numel,), info.max if op == Min else info.min, dtype=dtype)
    return torch.full((numel,), 1 if op == Product else 0, dtype=dtype)


@_traced("broadcast")
def _broadcast_async(tensors, result, root_rank, process_set) -> Handle:
    pg = process_set.group()
    if not 0 <= root_rank < runtime.info().size:
        raise ValueError(f"root_rank {root_rank} is outside the world of size {runtime.info().size}")
    options = dist.BroadcastOptions()
    options.rootRank = process_set.set_rank(root_rank, "root_rank")
    return _collective(tensors, result, lambda flat: [pg.broadcast([flat], options)])


def grouped_broadcast_async_(tensors, root_rank, process_set=global_process_set) -> Handle:
    """Overwrite `tensors` with root_rank's, fused into one buffer per dtype."""
    tensors = list(tensors)
    return _broadcast_async(tensors, tensors, root_rank, process_set)


def grouped_broadcast_(tensors, root_rank, process_set=global_process_set):
    return grouped_broadcast_async_(tensors, root_rank, process_set).wait()


def broadcast_async_(tensor, root_rank, name=None, process_set=global_process_set) -> Handle:
    """root_rank is a rank of the world, and must be in the process set."""
    return _broadcast_async([tensor], tensor, root_rank, process_set)


def broadcast_async(tensor, root_rank, name=None, process_set=global_process_set) -> Handle:
    return broadcast_async_(_copies([tensor])[0], root_rank, name, process_set)


def broadcast_(tensor, root_rank, name=None, process_set=global_process_set):
    return broadcast_async_(tensor, root_rank, name, process_set).wait()


def broadcast(tensor, root_rank, name=None, process_set=global_process_set):
    return broadcast_async(tensor, root_rank, name, process_set).wait()


def _gather_equal_async(pg, tensor):
    """Start gathering same-shaped tensors; returns (work, their concatenation along dim 0)."""
    _check_cpu(tensor)
    tensor = tensor.contiguous()
    out = tensor.new_empty((pg.size() * tensor.shape[0],) + tuple(tensor.shape[1:]))
    return pg.allgather([list(out.chunk(pg.size()))], [tensor], AllgatherOptions()), out


def _gather_equal(pg, tensor):
    work, out = _gather_equal_async(pg, tensor)
    _wait(work)
    return out


@_traced("allgather")
def _allgather_async(tensor, process_set) -> Handle:
    """A Handle whose result is every rank's tensor, in rank order; first dimensions may
    differ between ranks. The shapes are exchanged at the call, the data in the background."""
    if tensor.dim() == 0:
        raise ValueError("allgather needs a tensor with at least one dimension")
    pg = process_set.group()
    size, rest = pg.size(), tuple(tensor.shape[1:])
    # One small gather of (first dim, rest of the shape) lets every rank size its buffer and
    # lets all ranks agree to fail when the shapes are incompatible.
    meta = torch.tensor([tensor.shape[0], tensor.dim(), torch.Size(rest).numel(),
                         _DTYPES.index(tensor.dtype)])
    metas = _gather_equal(pg, meta).view(size, len(meta)).tolist()
    if any(m[1:] != metas[0][1:] for m in metas):
        raise ValueError(f"allgather: ranks disagree on the dtype or on all but the first "
                         f"dimension: {metas}")
    firsts = [m[0] for m in metas]
    longest = max(firsts)
    if longest == 0:
        return _done([tensor.new_empty((0,) + rest)] * size)
    padded = tensor.detach()
    if tensor.shape[0] < longest:
        padded = torch.cat([padded, padded.new_empty((longest - tensor.shape[0],) + rest)])
    work, gathered = _gather_equal_async(pg, padded)
    return Handle([work], lambda: [gathered[r * longest: r * longest + n] for r, n in enumerate(firsts)])


def allgather_async(tensor, name=None, process_set=global_process_set) -> Handle:
    """Concatenate every rank's tensor along the first dimension, in rank order."""
    parts = _allgather_async(tensor, process_set)
    return Handle([parts], lambda: torch.cat(parts.wait()))


def allgather(tensor, name=None, process_set=global_process_set):
    return allgather_async(tensor, name, process_set).wait()


def grouped_allgather_async(tensors, name=None, process_set=global_process_set) -> Handle:
    handles = [allgather_async(t, process_set=process_set) for t in tensors]
    return Handle(handles, lambda: [h.wait() for h in handles])


def grouped_allgather(tensors, name=None, process_set=global_process_set):
    return grouped_allgather_async(tensors, name, process_set).wait()


@_traced("alltoall")
def alltoall_async(tensor, splits=None, name=None, process_set=global_process_set) -> Handle:
    """Send rows splits[i] (in order) of `tensor` to rank i of the set; the result is the rows
    received from every rank, in rank order, and, when splits are given, how many came from
    each rank. Without splits the first dimension is split evenly."""
    _check_cpu(tensor)
    pg = process_set.group()
    size = pg.size()
    if tensor.dim() == 0:
        raise ValueError("alltoall needs a tensor with at least one dimension")
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
    received = torch.empty(size, dtype=torch.int64)
    _wait(pg.alltoall_base(received, torch.tensor(send, dtype=torch.int64), [], [],
                           dist.AllToAllOptions()))
    recv = received.tolist()
    rest = tuple(tensor.shape[1:])
    out = tensor.new_empty((sum(recv),) + rest)
    row = torch.Size(rest).numel()
    if row == 0 or (sum(recv) == 0 and sum(send) == 0):
        works = []
    else:
        works = [pg.alltoall_base(out, tensor.detach().contiguous(), recv, send,
                                  dist.AllToAllOptions())]
    return Handle(works, lambda: out if splits is None else (out, received.to(torch.int32)))


def alltoall(tensor, splits=None, name=None, process_set=global_process_set):
    return alltoall_async(tensor, splits, name, process_set).wait()


@_traced("reducescatter")
def _reducescatter_async(tensors, op, prescale_factor, postscale_factor, process_set) -> Handle:
    op = Average if op is None else op
    if op not in (Average, Sum):
        raise ValueError("reducescatter reduces with op=Average or op=Sum only")
    pg = process_set.group()
    size, me = pg.size(), pg.rank()
    works, finishers = [], []
    for tensor in tensors:
        _check_cpu(tensor)
        if tensor.dim() == 0:
            raise ValueError("reducescatter needs a tensor with at least one dimension")
        counts, rest = shares(tensor.shape[0], size), tuple(tensor.shape[1:])
        longest = counts[0]
        # Every rank's rows padded to the longest share, so that gloo scatters equal parts.
        padded = tensor.new_zeros((size * longest,) + rest)
        for r, part in enumerate(tensor.detach().split(counts)):
            padded[r * longest: r * longest + counts[r]] = part
        _scale(padded, prescale_factor)
        out = tensor.new_empty((longest,) + rest)
        if out.numel():
            options = dist.ReduceScatterOptions()
            options.reduceOp = dist.ReduceOp.SUM
            works.append(pg._reduce_scatter_base(out, padded, options))
        finishers.append((out, counts[me]))

    def finish():
        results = []
        for out, rows in finishers:
            out = out[:rows]
            _average(out, postscale_factor, size if op == Average else 1)
            results.append(out)
        return results
    return Handle(works, finish)


def grouped_reducescatter_async(tensors, name=None, op=Average, process_set=global_process_set,
                                prescale_factor=1.0, postscale_factor=1.0) -> Handle:
    return _reducescatter_async(list(tensors), op, prescale_factor, postscale_factor, process_set)


def grouped_reducescatter(tensors, name=None, compression=Compression.none, op=Average,
                          process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0):
    compressed = [compression.compress(t) for t in tensors]
    reduced = grouped_reducescatter_async([t for t, _ in compressed], name, op, process_set,
                                          prescale_factor, postscale_factor).wait()
    return [compression.decompress(t, ctx) for t, (_, ctx) in zip(reduced, compressed)]


def reducescatter_async(tensor, name=None, op=Average, process_set=global_process_set,
                        prescale_factor=1.0, postscale_factor=1.0) -> Handle:
    """Reduce every rank's tensor and give rank i its i-th share of the first dimension
    (as even as possible, the first ranks one row more)."""
    handle = _reducescatter_async([tensor], op, prescale_factor, postscale_factor, process_set)
    return Handle([handle], lambda: handle.wait()[0])


def reducescatter(tensor, name=None, compression=Compression.none, op=Average,
                  process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0):
    return grouped_reducescatter([tensor], name, compression, op, process_set,
                                 prescale_factor, postscale_factor)[0]


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
    broadcast_(head, root_rank, process_set=process_set)
    length = int.from_bytes(head[:_LENGTH].numpy().tobytes(), "little")
    if length > _OBJECT_HEAD - _LENGTH:
        rest = payload[_OBJECT_HEAD - _LENGTH:] if is_root \
            else torch.empty(length - (_OBJECT_HEAD - _LENGTH), dtype=torch.uint8)
        broadcast_(rest, root_rank, process_set=process_set)
        if not is_root:
            payload = torch.cat([head[_LENGTH:], rest])
    elif not is_root:
        payload = head[_LENGTH:_LENGTH + length]
    return obj if is_root else _from_bytes_tensor(payload)


def allgather_object(obj, name=None, process_set=global_process_set):
    """Every rank's `obj`, as a list in rank order."""
    parts = _allgather_async(_to_bytes_tensor(obj), process_set).wait()
    return [_from_bytes_tensor(part) for part in parts]


@_traced("barrier")
def barrier(process_set=global_process_set):
    _wait(process_set.group().barrier(dist.BarrierOptions()))
