"""Horovod's collectives on numpy arrays, over the current pygloo context.

Every call is synchronous and returns a new array; inputs are never changed. A collective
that fails because the world broke raises HorovodInternalError, which elastic training
recovers from. pygloo holds the GIL while it waits (hvdlite.worker.vouch stands in meanwhile).
"""
import functools
import inspect
import time

import numpy as np
import pygloo

from hvdlite.numpy.context import runtime
from hvdlite.worker import objects, trace
from hvdlite.worker.errors import HorovodInternalError
from hvdlite.worker.reduceops import Adasum, Average, Max, Min, Product, Sum, resolve, shares  # noqa: F401

_GLOO_OPS = {Average: pygloo.ReduceOp.SUM, Sum: pygloo.ReduceOp.SUM, Min: pygloo.ReduceOp.MIN,
             Max: pygloo.ReduceOp.MAX, Product: pygloo.ReduceOp.PRODUCT}
_TYPES = {np.dtype(name): getattr(pygloo.glooDataType_t, gloo) for name, gloo in (
    ("int8", "glooInt8"), ("uint8", "glooUint8"), ("int32", "glooInt32"), ("uint32", "glooUint32"),
    ("int64", "glooInt64"), ("uint64", "glooUint64"), ("float16", "glooFloat16"),
    ("float32", "glooFloat32"), ("float64", "glooFloat64"))}
_DTYPE_CODES = {dtype: code for code, dtype in enumerate(_TYPES)}


def _array(value) -> np.ndarray:
    """A C-contiguous array of a dtype gloo can carry (a copy when it has to be)."""
    array = np.ascontiguousarray(value)
    if array.dtype not in _TYPES:
        names = ", ".join(str(dtype) for dtype in _TYPES)
        raise ValueError(f"hvdlite.numpy collectives carry {names}; got an array of {array.dtype}")
    return array


def _traced(kind):
    """Record each call as a span of the collective trace (only while one records), named by
    the caller's name= or else by its kind."""
    def wrap(collective):
        signature = inspect.signature(collective)

        @functools.wraps(collective)
        def traced(*args, **kwargs):
            if trace.recorder() is None:
                return collective(*args, **kwargs)
            name = signature.bind(*args, **kwargs).arguments.get("name")
            nbytes = args[0].nbytes if args and isinstance(args[0], np.ndarray) else 0
            end = trace.collective(kind, name, runtime.info(), nbytes)
            try:
                out = collective(*args, **kwargs)
            except BaseException:
                end(failed=True)
                raise
            end()
            return out
        return traced
    return wrap


def _call(collective, *args) -> None:
    started = time.perf_counter()
    try:
        collective(runtime.group(), *args)
    except RuntimeError as e:
        # pygloo reports a dead or cut-off peer as a plain RuntimeError.
        raise HorovodInternalError(str(e)) from e
    finally:  # the straggler rule's measure (driver/decisions/stragglers.py)
        runtime.waited += time.perf_counter() - started


@_traced("allreduce")
def allreduce(array, average=None, name=None, op=None):
    """The element-wise reduction of every rank's array (same shape and dtype on all ranks);
    Average by default, integers averaged rounding toward zero as in Horovod."""
    op = resolve(op, average)
    if op == Adasum:
        raise NotImplementedError("hvdlite.numpy has no Adasum; the torch backend (hvdlite.torch) has")
    array = _array(array)
    out = np.empty_like(array)
    if array.size == 0:  # gloo refuses empty buffers; every rank has the same shape
        return out
    _call(pygloo.allreduce, array.ctypes.data, out.ctypes.data, array.size, _TYPES[array.dtype],
          _GLOO_OPS[op])
    return _average(out, runtime.info().size) if op == Average else out


def _average(out, n):
    """out / n; integers rounding toward zero, as in Horovod."""
    if np.issubdtype(out.dtype, np.floating):
        return out / out.dtype.type(n)
    return (np.abs(out) // n * np.sign(out)).astype(out.dtype)


def _scale(array, factor):
    """array * factor in its own dtype (integers scaled in double and truncated, as Horovod)."""
    if factor == 1:
        return array
    return (array * factor).astype(array.dtype)


@_traced("reducescatter")
def reducescatter(array, name=None, op=Average, prescale_factor=1.0, postscale_factor=1.0):
    """Reduce every rank's array and return this rank's share of the first dimension (as even
    as possible, the first ranks one row more); Average or Sum."""
    if op not in (Average, Sum):
        raise ValueError("reducescatter reduces with op=Average or op=Sum only")
    array = _array(array)
    if array.ndim == 0:
        raise ValueError("reducescatter needs an array with at least one dimension")
    info = runtime.info()
    counts, row = shares(array.shape[0], info.size), int(np.prod(array.shape[1:]))
    send = np.ascontiguousarray(_scale(array, prescale_factor))
    out = np.empty_like(send)  # gloo writes this rank's share at the start
    if array.size:
        _call(pygloo.reduce_scatter, send.ctypes.data, out.ctypes.data, send.size,
              [c * row for c in counts], _TYPES[send.dtype], pygloo.ReduceOp.SUM)
    mine = _scale(out[:counts[info.rank]], postscale_factor)
    return _average(mine, info.size) if op == Average else mine


def _torch_only(name):
    def unsupported(*args, **kwargs):
        raise NotImplementedError(f"hvdlite.numpy has no {name} (pygloo lacks it); the torch "
                                  f"backend (hvdlite.torch) has")
    unsupported.__name__ = name
    return unsupported


alltoall = _torch_only("alltoall")
join = _torch_only("join")
add_process_set = _torch_only("process sets")


@_traced("broadcast")
def broadcast(array, root_rank, name=None):
    """root_rank's array on every rank (same shape and dtype on all ranks)."""
    size = runtime.info().size
    if not 0 <= root_rank < size:
        raise ValueError(f"root_rank {root_rank} is outside the world of size {size}")
    out = _array(array).copy()
    if out.size:
        _call(pygloo.broadcast, out.ctypes.data, out.ctypes.data, out.size, _TYPES[out.dtype], root_rank)
    return out


def _gather_equal(array) -> np.ndarray:
    """Same-shaped arrays of every rank, concatenated along the first dimension."""
    out = np.empty((runtime.info().size * array.shape[0],) + array.shape[1:], dtype=array.dtype)
    if array.size:
        _call(pygloo.allgather, array.ctypes.data, out.ctypes.data, array.size, _TYPES[array.dtype])
    return out


def _allgather_parts(array):
    """Every rank's array, in rank order; first dimensions may differ between ranks."""
    array = _array(array)
    if array.ndim == 0:
        raise ValueError("allgather needs an array with at least one dimension")
    size, rest = runtime.info().size, array.shape[1:]
    # One small gather of (first dim, dtype, rest of the shape) lets every rank size its
    # buffer and lets all ranks agree to fail when the arrays are incompatible.
    meta = np.array([array.shape[0], _DTYPE_CODES[array.dtype], array.ndim, int(np.prod(rest))],
                    dtype=np.int64)
    metas = _gather_equal(meta).reshape(size, len(meta)).tolist()
    if any(m[1:] != metas[0][1:] for m in metas):
        raise ValueError("allgather: ranks disagree on the dtype or on all but the first "
                         f"dimension: {metas}")
    firsts = [m[0] for m in metas]
    longest = max(firsts)
    padded = np.zeros((longest,) + rest, dtype=array.dtype)
    padded[:array.shape[0]] = array
    gathered = _gather_equal(padded)
    return [gathered[r * longest: r * longest + n] for r, n in enumerate(firsts)]


@_traced("allgather")
def allgather(array, name=None):
    """Every rank's array concatenated along the first dimension, in rank order."""
    return np.concatenate(_allgather_parts(array))


def broadcast_object(obj, root_rank=0, name=None):
    """root_rank's `obj` on every rank (the root gets its own object back)."""
    is_root = runtime.info().rank == root_rank
    payload = np.frombuffer(objects.dumps(obj), dtype=np.uint8) if is_root else None
    length = broadcast(np.array([payload.size if is_root else 0], dtype=np.int64), root_rank)
    payload = broadcast(payload if is_root else np.empty(int(length[0]), dtype=np.uint8), root_rank)
    return obj if is_root else objects.loads(payload)


def allgather_object(obj, name=None):
    """Every rank's `obj`, as a list in rank order."""
    mine = np.frombuffer(objects.dumps(obj), dtype=np.uint8)
    return [objects.loads(part) for part in _allgather_parts(mine)]


@_traced("barrier")
def barrier():
    _call(pygloo.barrier)
