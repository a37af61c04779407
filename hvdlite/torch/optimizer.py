"""Horovod's DistributedOptimizer, and the broadcasts that start every rank from one state."""
import contextlib
import functools
import os
import warnings
import weakref

import torch

from hvdlite.torch import fusion, ops, runtime
from hvdlite.torch.allreduce import prepacked, prepacked_async
from hvdlite.torch.compression import Compression
from hvdlite.torch.handles import Handle
from hvdlite.torch.processsets import global_process_set

FUSION_THRESHOLD_ENV = "HVDLITE_FUSION_THRESHOLD"
DEFAULT_FUSION_THRESHOLD = 64 * 1024 * 1024  # bytes, as Horovod's HOROVOD_FUSION_THRESHOLD
FIRST_BUCKET = 1024 * 1024  # bytes: the gradients of a step's first bucket, reduced early


def fusion_threshold() -> int:
    return int(os.environ.get(FUSION_THRESHOLD_ENV, DEFAULT_FUSION_THRESHOLD))


def _nbytes(tensor) -> int:
    return tensor.numel() * tensor.element_size()


def _fusion_buckets(tensors, threshold, first=None):
    """Split tensors, in order, into same-dtype buckets of at most `threshold` bytes (a tensor
    larger than that gets a bucket of its own; threshold 0 gives every tensor its own). With
    `first`, the first bucket closes as soon as it holds that many bytes: the gradients that
    backward computes first start reducing while it computes the others (as DDP's first
    bucket does)."""
    buckets, open_buckets = [], {}  # open_buckets: dtype -> (bucket, bytes in it)
    for tensor in tensors:
        bucket, used = open_buckets.get(tensor.dtype, (None, 0))
        if bucket is None or used + _nbytes(tensor) > threshold:
            bucket, used = [], 0
            buckets.append(bucket)
        bucket.append(tensor)
        used += _nbytes(tensor)
        closing = first is not None and len(buckets) == 1 and used >= min(first, threshold)
        open_buckets[tensor.dtype] = (None, 0) if closing else (bucket, used)
    return buckets


def _groups_as_buckets(params, num_groups, groups):
    """Buckets as Horovod's num_groups (that many contiguous groups of the parameters, in
    backward order) or groups (lists of parameters; the others one bucket each); None when
    neither is given (fusion by size)."""
    if isinstance(groups, int):  # Horovod 0.28 takes a group count here too
        groups, num_groups = None, groups
    if groups is not None:
        listed = [list(group) for group in groups]
        ids = {id(p) for group in listed for p in group}
        known = {id(p) for p in params}
        if not ids <= known:
            raise ValueError("groups lists parameters the optimizer does not hold")
        return [g for g in listed if g] + [[p] for p in params if id(p) not in ids]
    if num_groups:
        per = -(-len(params) // num_groups)
        return [params[i:i + per] for i in range(0, len(params), per)]
    return None


def _broadcast_tensors(tensors, root_rank) -> None:
    # Bucketed so a large model does not need a second copy of itself in one buffer.
    for bucket in _fusion_buckets(tensors, fusion_threshold()):
        ops.grouped_broadcast_(bucket, root_rank)


def broadcast_parameters(params, root_rank) -> None:
    """Overwrite parameters (and buffers) with root_rank's, in place.

    `params`: a state_dict, or an iterable of tensors or (name, tensor) pairs such as
    model.named_parameters(); every rank must list the same tensors (dicts are sorted by name).
    """
    if isinstance(params, dict):
        tensors = [tensor for _, tensor in sorted(params.items())]
    else:
        tensors = [p[1] if isinstance(p, tuple) else p for p in params]
    _broadcast_tensors(tensors, root_rank)


class _TensorSlot:
    """Stands for a tensor in the pickled layout of root's optimizer state."""

    def __init__(self, tensor):
        self.shape, self.dtype = tensor.shape, tensor.dtype


def _replace(obj, kind, fn):
    """obj with every instance of `kind` inside dicts, lists and tuples replaced by fn(it)."""
    if isinstance(obj, kind):
        return fn(obj)
    if isinstance(obj, dict):
        return {key: _replace(value, kind, fn) for key, value in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_replace(value, kind, fn) for value in obj)
    return obj


def broadcast_optimizer_state(optimizer, root_rank, model=None) -> None:
    """Give every rank root_rank's optimizer state (tensors and scalars such as Adam's step
    counts) and param_group options (lr, momentum, ...). An optimizer with no state yet first
    makes one as Horovod's does (_first_state); `model` names its sparse embeddings."""
    if not optimizer.state:
        _first_state(optimizer, model)
    send_optimizer_state(optimizer, root_rank)


def send_optimizer_state(optimizer, root_rank) -> None:
    """root_rank's optimizer state and options on every rank, as they are (an elastic
    state sync's: no rank makes up a state)."""
    is_root = runtime.process_group().rank() == root_rank
    tensors = []

    def collect(tensor):
        tensors.append(tensor)
        return _TensorSlot(tensor)

    def allocate(slot):
        tensors.append(torch.empty(slot.shape, dtype=slot.dtype))
        return tensors[-1]

    # The layout and the scalars travel pickled; the tensors in fused broadcasts.
    layout = ops.broadcast_object(
        _replace(optimizer.state_dict(), torch.Tensor, collect) if is_root else None, root_rank)
    state = None if is_root else _replace(layout, _TensorSlot, allocate)
    _broadcast_tensors(tensors, root_rank)
    if not is_root:
        optimizer.load_state_dict(state)


def _first_state(optimizer, model) -> None:
    """Make a new optimizer's state as Horovod's broadcast_optimizer_state does, so that a
    script trains the same: every parameter that requires grad gets a zero gradient (sparse
    for SparseAdam, and for SGD on a sparse embedding of `model`), and one local step
    without averaging runs (weight decay moves the parameters, momentum buffers appear)."""
    sparse = {id(p) for m in (model.modules() if model is not None else ())
              if isinstance(m, torch.nn.Embedding) and m.sparse for p in m.parameters()}
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.requires_grad:
                p.grad = torch.zeros_like(p)
                if isinstance(optimizer, torch.optim.SparseAdam) or \
                        (isinstance(optimizer, torch.optim.SGD) and id(p) in sparse):
                    p.grad = p.grad.to_sparse()
    step = super(_DistributedOptimizer, optimizer).step if isinstance(optimizer, _DistributedOptimizer) \
        else optimizer.step
    step()


class _GradientReducer:
    """Averages gradients across ranks in fused buckets, started from gradient hooks.

    Every rank must issue the same collectives in the same order, whatever its local
    gradients. So buckets are fixed up front from the parameter order, and started strictly
    in bucket order: a bucket starts when its gradients are all accumulated and every earlier
    bucket has started, or at synchronize(). A gradient missing locally is sent as zeros; one
    no rank computed becomes zeros everywhere, and the step takes it (momentum moves the
    parameter, weight decay shrinks it), as Horovod's optimizer does.
    """

    def __init__(self, params, compression, backward_passes_per_step, op, prescale, postscale,
                 sparse_as_dense, buckets=None, process_set=global_process_set):
        self.compression, self.op = compression, op
        self.prescale, self.postscale = prescale, postscale
        self.passes, self.sparse_as_dense = backward_passes_per_step, sparse_as_dense
        self.process_set = process_set
        # Backward produces gradients roughly from the last parameter to the first.
        self.buckets = buckets or _fusion_buckets(list(reversed(params)), fusion_threshold(),
                                                  first=FIRST_BUCKET)
        # Per parameter, by its index in `params` (which its hook passes: a dict keyed by
        # tensors would call Tensor.__hash__, Python code, at every look-up): its bucket.
        where = {id(p): i for i, bucket in enumerate(self.buckets) for p in bucket}
        self.bucket_of = [where[id(p)] for p in params]
        # Each bucket's layout, for the prepacked path (see _prepacked).
        self.plans = [fusion.Plan(bucket) for bucket in self.buckets]
        fusion.expect_freed(sum(_nbytes(p) for p in params))
        self.skip_synchronize = False
        self.synchronized = False
        # The world this step's buckets run on. Its WorldInfo, not its process group: a group
        # referenced from here would outlive hvdlite's exit handler and be destroyed during
        # interpreter teardown, which can abort the process (SIGABRT) after a clean finish.
        self.world = None
        self._reset()
        # The hooks reach the reducer weakly: an optimizer the script dropped (say, replaced
        # by a new one over the same model) must stop reducing, not trip the next backward.
        ref = weakref.ref(self)
        self._hooks = [p.register_post_accumulate_grad_hook(functools.partial(_on_grad, ref, index))
                       for index, p in enumerate(params)]

    def __del__(self):
        for hook in self._hooks:
            hook.remove()

    def _reset(self):
        self.pending = [self.passes] * len(self.bucket_of)  # backward passes to go, per parameter
        self.ready = [0] * len(self.buckets)  # parameters done, per bucket
        self.started = []  # (bucket, compression contexts, handle), in bucket order

    def put_pending(self, pending):
        """Go on from a commit's count of backward passes to go, per parameter (gradients.py),
        in this world, with nothing in flight."""
        self.pending = list(pending)
        self.ready = [0] * len(self.buckets)
        for index, left in enumerate(self.pending):
            self.ready[self.bucket_of[index]] += left == 0
        self.started = []
        self.world = runtime.info()

    def in_flight(self) -> bool:
        return bool(self.started)

    def _follow_world(self):
        world = runtime.info()
        if world is not self.world:
            self._reset()  # the world was re-formed (elastic reset) in the middle of a step
            self.world = world

    def _outside(self) -> bool:
        """This rank is not in the optimizer's process set: as in Horovod, its gradients
        stay its own."""
        return self.process_set is not global_process_set and not self.process_set.included()

    def on_grad(self, index):
        if self._outside():
            return
        self._follow_world()
        left = self.pending[index]
        if left == 0:
            raise AssertionError(
                "Gradients were computed more than backward_passes_per_step times before call "
                "to step(). Increase backward_passes_per_step to accumulate gradients locally.")
        self.pending[index] = left - 1
        if left == 1:
            self.ready[self.bucket_of[index]] += 1
            self._start(everything=False)

    def _start(self, everything):
        while len(self.started) < len(self.buckets):
            index = len(self.started)
            bucket = self.buckets[index]
            if not everything and self.ready[index] < len(bucket):
                return
            handle = self._prepacked(index)
            if handle is not None:
                self.started.append((bucket, None, handle))
                continue
            grads = [self._local_grad(p) for p in bucket]
            if any(grad.is_sparse for grad in grads):
                self.started.append((bucket, [None] * len(bucket), self._with_sparse(grads)))
                continue
            compressed = [self.compression.compress(grad) for grad in grads]
            # Reduced into a new fused buffer, whose pieces become the gradients: no copy back.
            handle = ops.grouped_allreduce_async(
                [c for c, _ in compressed], op=self.op,
                prescale_factor=self.prescale, postscale_factor=self.postscale,
                process_set=self.process_set)
            self.started.append((bucket, [ctx for _, ctx in compressed], handle))

    def _prepacked(self, index):
        """The common case in short: every gradient of the bucket present and as its plan
        has it (dense, float32/64), not compressed, on the global set, on a layout join's wire
        guessed right. The bucket's Plan packs them as the general path would, into the buffer
        it keeps, and prepacked_async sends it with no more Python. None when the general path
        must take the bucket (a rank may take either: the wire and the sums come out alike)."""
        if self.compression is not Compression.none or self.process_set is not global_process_set:
            return None
        plan, bucket = self.plans[index], self.buckets[index]
        arrays = plan.arrays([p.grad for p in bucket])
        if arrays is None:
            return None
        layout = prepacked(plan.numel, plan.dtype, self.process_set, bucket[0].shape if len(bucket) == 1 else None)
        if layout is None:
            return None
        divisor = self.process_set.size() if self.op == ops.Average else 1
        return prepacked_async(plan.pack(arrays, self.prescale), layout, self.postscale, divisor)

    def _local_grad(self, p):
        if p.grad is None:
            return torch.zeros_like(p, memory_format=torch.contiguous_format)
        if p.grad.is_sparse and self.sparse_as_dense:
            return p.grad.to_dense()
        return p.grad

    def _with_sparse(self, grads):
        """A bucket holding sparse gradients (an embedding's, without sparse_as_dense): each
        reduced as Horovod reduces it, gathering indices and values; the dense ones together.
        The handle's result is every reduced gradient, in the bucket's order."""
        dense = [i for i, grad in enumerate(grads) if not grad.is_sparse]
        compressed = [self.compression.compress(grads[i]) for i in dense]
        together = ops.grouped_allreduce_async(
            [c for c, _ in compressed], op=self.op, prescale_factor=self.prescale,
            postscale_factor=self.postscale, process_set=self.process_set) if dense else None
        alone = {i: ops.sparse_allreduce_async(grad, None, self.op, self.process_set)
                 for i, grad in enumerate(grads) if grad.is_sparse}

        def finish():
            reduced = {i: h.wait() for i, h in alone.items()}
            if together is not None:
                reduced.update((i, self.compression.decompress(grad, ctx))
                               for i, grad, (_, ctx) in zip(dense, together.wait(), compressed))
            return [reduced[i] for i in range(len(grads))]
        return Handle([*alone.values(), *([together] if together else [])], finish)

    def synchronize(self):
        if self._outside():
            self.synchronized = True
            return
        self._follow_world()
        try:
            self._start(everything=True)
            for index, (bucket, contexts, handle) in enumerate(self.started):
                if contexts is None:  # prepacked
                    for p, grad in zip(bucket, self.plans[index].pieces(handle.wait())):
                        p.grad = grad
                    continue
                for p, grad, ctx in zip(bucket, ops.synchronize(handle), contexts):
                    grad = self.compression.decompress(grad, ctx)
                    # sparse_as_dense: sparse again for the step, as Horovod's (SparseAdam
                    # takes no dense gradient)
                    p.grad = grad.to_sparse() if p.grad is not None and p.grad.is_sparse and not grad.is_sparse else grad
        finally:
            self._reset()  # also after a failure, so the next step starts clean
        self.synchronized = True


def _on_grad(reducer_ref, index, _):
    reducer = reducer_ref()
    if reducer is not None:
        reducer.on_grad(index)


class _DistributedOptimizer:
    """Put in front of the wrapped optimizer's class by DistributedOptimizer()."""

    def synchronize(self):
        """Finish averaging the gradients now (e.g. to clip them before step())."""
        self._hvd_reducer.synchronize()

    def set_backward_passes_per_step(self, passes):
        """Change how many backward passes accumulate locally before gradients are reduced."""
        if passes < 1:
            raise ValueError("backward_passes_per_step must be at least 1")
        if self._hvd_reducer.in_flight():
            raise AssertionError("set_backward_passes_per_step() during a step: call step() first")
        self._hvd_reducer.passes = passes
        self._hvd_reducer._reset()

    @contextlib.contextmanager
    def skip_synchronize(self):
        """step() inside this block does not synchronize again (call synchronize() first)."""
        self._hvd_reducer.skip_synchronize = True
        try:
            yield
        finally:
            self._hvd_reducer.skip_synchronize = False

    def step(self, closure=None):
        reducer = self._hvd_reducer
        if not reducer.skip_synchronize:
            if reducer.synchronized:
                warnings.warn("optimizer.step() called without optimizer.skip_synchronize() after "
                              "optimizer.synchronize(): the gradients are averaged twice.")
            reducer.synchronize()
        reducer.synchronized = False
        return super().step(closure)

    def zero_grad(self, *args, **kwargs):
        if self._hvd_reducer.in_flight():
            raise AssertionError(
                "optimizer.zero_grad() was called after loss.backward() but before "
                "optimizer.step() or optimizer.synchronize(); the gradients are still being reduced.")
        return super().zero_grad(*args, **kwargs)


def _names(optimizer, named_parameters, params) -> dict:
    """{parameter: name}, checked, as Horovod's optimizer keeps it (_parameter_names, which
    some scripts read): unnamed parameters are allreduce.noname.<group>.<index>."""
    if named_parameters is None:
        return {p: f"allreduce.noname.{i}.{j}" for i, group in enumerate(optimizer.param_groups)
                for j, p in enumerate(group["params"])}
    named = list(named_parameters)
    if any(not isinstance(item, tuple) for item in named):
        raise ValueError("named_parameters should be (name, parameter) pairs, "
                         "usually from model.named_parameters()")
    names = [name for name, _ in named]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ValueError(f"parameter names in named_parameters must be unique: {duplicates}")
    named_ids = {id(p) for _, p in named}
    if any(id(p) not in named_ids for p in params):
        raise ValueError("named_parameters was given but does not name every optimizer parameter")
    return {p: name for name, p in named}


def DistributedOptimizer(optimizer, named_parameters=None, compression=Compression.none,
                         backward_passes_per_step=1, op=ops.Average, gradient_predivide_factor=1.0,
                         num_groups=0, groups=None, sparse_as_dense=False,
                         process_set=global_process_set):
    """Wrap `optimizer` so step() first averages the gradients across ranks (of process_set).

    The result is `optimizer` itself seen through a subclass of its class, sharing its
    attributes: isinstance checks, param_groups and state_dict() work unchanged. Every rank
    must build its optimizer with the same parameters in the same order. Gradients are reduced
    in fused buckets: `num_groups` or `groups` as in Horovod, else by HVDLITE_FUSION_THRESHOLD.
    """
    if op not in (ops.Average, ops.Sum):
        raise ValueError("DistributedOptimizer reduces gradients with op=Average or op=Sum only "
                         "(Horovod's Adasum optimizer is not implemented)")
    if gradient_predivide_factor != 1.0 and op != ops.Average:
        raise ValueError("gradient_predivide_factor needs op=Average")
    if backward_passes_per_step < 1:
        raise ValueError("backward_passes_per_step must be at least 1")
    params = [p for group in optimizer.param_groups for p in group["params"] if p.requires_grad]
    names = _names(optimizer, named_parameters, params)

    cls = type(optimizer.__class__.__name__, (_DistributedOptimizer, optimizer.__class__), {})
    wrapped = cls.__new__(cls)
    wrapped.__dict__ = optimizer.__dict__
    # An LR scheduler made before wrapping put a `step` on the instance that calls the plain
    # class's step; drop it so ours runs (the scheduler then warns once, which is harmless).
    wrapped.__dict__.pop("step", None)
    wrapped._parameter_names = names
    wrapped._hvd_reducer = _GradientReducer(
        params, compression, backward_passes_per_step, op,
        prescale=1.0 / gradient_predivide_factor, postscale=gradient_predivide_factor,
        sparse_as_dense=sparse_as_dense, process_set=process_set,
        buckets=_groups_as_buckets(list(reversed(params)), num_groups, groups))
    return wrapped
