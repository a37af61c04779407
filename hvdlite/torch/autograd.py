"""The differentiable collectives: allreduce, allgather, broadcast, alltoall, reducescatter and
their grouped forms, with the backward Horovod 0.28.1 gives each:
- allreduce: an allreduce of the gradient with the same op and scaling;
- allgather: the gradient averaged over the ranks, then this rank's rows of it;
- broadcast: the gradient averaged over the ranks on the root, zeros elsewhere;
- alltoall: the gradient sent back the way the rows came;
- reducescatter: the gradient (times the set's size for Sum, times both scale factors)
  gathered from every rank.
"""
import torch

from hvdlite.torch import ops, runtime
from hvdlite.torch.compression import Compression
from hvdlite.torch.processsets import global_process_set


class _Allreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, average, name, op, prescale_factor, postscale_factor, process_set):
        ctx.args = average, op, prescale_factor, postscale_factor, process_set
        return ops.allreduce_async(tensor, average, name, op, prescale_factor, postscale_factor,
                                   process_set).wait()

    @staticmethod
    def backward(ctx, grad):
        average, op, prescale, postscale, process_set = ctx.args
        return (allreduce(grad, average=average, op=op, prescale_factor=prescale,
                          postscale_factor=postscale, process_set=process_set),
                None, None, None, None, None, None)


def allreduce(tensor, average=None, name=None, compression=Compression.none, op=None,
              prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set):
    """The reduction of every rank's tensor, as a new tensor (differentiable)."""
    compressed, ctx = compression.compress(tensor)
    if compressed.requires_grad and torch.is_grad_enabled():
        reduced = _Allreduce.apply(compressed, average, name, op, prescale_factor,
                                   postscale_factor, process_set)
    else:  # nothing to differentiate: skip autograd's ~10 us a call
        reduced = ops.allreduce_async(compressed, average, name, op, prescale_factor,
                                      postscale_factor, process_set).wait()
    return compression.decompress(reduced, ctx)


class _GroupedAllreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, average, name, op, prescale_factor, postscale_factor, process_set, *tensors):
        ctx.args = average, op, prescale_factor, postscale_factor, process_set
        return tuple(ops.grouped_allreduce_async(list(tensors), average, name, op, prescale_factor,
                                                 postscale_factor, process_set).wait())

    @staticmethod
    def backward(ctx, *grads):
        average, op, prescale, postscale, process_set = ctx.args
        reduced = grouped_allreduce(list(grads), average=average, op=op, prescale_factor=prescale,
                                    postscale_factor=postscale, process_set=process_set)
        return (None,) * 6 + tuple(reduced)


def grouped_allreduce(tensors, average=None, name=None, compression=Compression.none, op=None,
                      prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set):
    """allreduce of each tensor, fused into one buffer per dtype (differentiable)."""
    compressed = [compression.compress(t) for t in tensors]
    reduced = _GroupedAllreduce.apply(average, name, op, prescale_factor, postscale_factor,
                                      process_set, *[t for t, _ in compressed])
    return [compression.decompress(t, ctx) for t, (_, ctx) in zip(reduced, compressed)]


def _my_rows(grads, rows, process_set):
    """This rank's rows of each averaged gradient of an allgather whose inputs had `rows`."""
    averaged = grouped_allreduce(list(grads), op=ops.Average, process_set=process_set)
    everyone = ops.grouped_allgather_async([torch.tensor([n]) for n in rows],
                                           process_set=process_set).wait()
    me = process_set.rank()
    return [grad.narrow(0, int(counts[:me].sum()), n)
            for grad, counts, n in zip(averaged, everyone, rows)]


class _Allgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, process_set):
        out = ops.allgather_async(tensor, name, process_set).wait()  # raises for a 0-d tensor
        ctx.rows, ctx.process_set = tensor.shape[0], process_set
        return out

    @staticmethod
    def backward(ctx, grad):
        return _my_rows([grad], [ctx.rows], ctx.process_set)[0], None, None


def allgather(tensor, name=None, process_set=global_process_set):
    """Every rank's tensor concatenated along the first dimension, in rank order
    (differentiable)."""
    return _Allgather.apply(tensor, name, process_set)


class _GroupedAllgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, process_set, *tensors):
        out = tuple(ops.grouped_allgather_async(list(tensors), name, process_set).wait())
        ctx.rows, ctx.process_set = [t.shape[0] for t in tensors], process_set
        return out

    @staticmethod
    def backward(ctx, *grads):
        return (None, None, *_my_rows(grads, ctx.rows, ctx.process_set))


def grouped_allgather(tensors, name=None, process_set=global_process_set):
    return list(_GroupedAllgather.apply(name, process_set, *tensors))


class _Broadcast(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, root_rank, name, process_set):
        ctx.root_rank, ctx.process_set = root_rank, process_set
        return ops.broadcast_async(tensor, root_rank, name, process_set).wait()

    @staticmethod
    def backward(ctx, grad):
        reduced = allreduce(grad, op=ops.Average, process_set=ctx.process_set)
        if runtime.info().rank != ctx.root_rank:
            reduced = torch.zeros_like(reduced)
        return reduced, None, None, None


def broadcast(tensor, root_rank, name=None, process_set=global_process_set):
    """root_rank's tensor on every rank, as a new tensor (differentiable)."""
    return _Broadcast.apply(tensor, root_rank, name, process_set)


class _Alltoall(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, splits, name, process_set):
        out, received = ops.alltoall_async(tensor, splits, name, process_set).wait()
        ctx.received, ctx.process_set = received, process_set
        if splits is None:
            return out
        ctx.mark_non_differentiable(received)
        return out, received

    @staticmethod
    def backward(ctx, grad, *_):
        back, _ = ops.alltoall_async(grad, ctx.received, process_set=ctx.process_set).wait()
        return back, None, None, None


def alltoall(tensor, splits=None, name=None, process_set=global_process_set):
    """The rows every rank sent this one (see ops.alltoall_async), and how many came from each
    rank when `splits` was given (differentiable)."""
    return _Alltoall.apply(tensor, splits, name, process_set)


def _scaled_back(grads, op, prescale, postscale, process_set):
    factor = (process_set.size() if op == ops.Sum else 1) * prescale * postscale
    return [grad * factor if factor != 1 else grad for grad in grads]


class _Reducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, process_set, prescale_factor, postscale_factor):
        ctx.args = op, prescale_factor, postscale_factor, process_set
        return ops.reducescatter_async(tensor, name, op, process_set, prescale_factor,
                                       postscale_factor).wait()

    @staticmethod
    def backward(ctx, grad):
        op, prescale, postscale, process_set = ctx.args
        (grad,) = _scaled_back([grad], op, prescale, postscale, process_set)
        return allgather(grad, process_set=process_set), None, None, None, None, None


def reducescatter(tensor, name=None, compression=Compression.none, op=ops.Average,
                  process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0):
    """This rank's share of the reduction of every rank's tensor (differentiable)."""
    compressed, ctx = compression.compress(tensor)
    reduced = _Reducescatter.apply(compressed, name, op, process_set, prescale_factor,
                                   postscale_factor)
    return compression.decompress(reduced, ctx)


class _GroupedReducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, op, process_set, prescale_factor, postscale_factor, *tensors):
        ctx.args = op, prescale_factor, postscale_factor, process_set
        return tuple(ops.grouped_reducescatter_async(list(tensors), name, op, process_set,
                                                     prescale_factor, postscale_factor).wait())

    @staticmethod
    def backward(ctx, *grads):
        op, prescale, postscale, process_set = ctx.args
        scaled = _scaled_back(grads, op, prescale, postscale, process_set)
        return (None,) * 5 + tuple(grouped_allgather(scaled, process_set=process_set))


def grouped_reducescatter(tensors, name=None, compression=Compression.none, op=ops.Average,
                          process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0):
    compressed = [compression.compress(t) for t in tensors]
    reduced = _GroupedReducescatter.apply(name, op, process_set, prescale_factor, postscale_factor,
                                          *[t for t, _ in compressed])
    return [compression.decompress(t, ctx) for t, (_, ctx) in zip(reduced, compressed)]
