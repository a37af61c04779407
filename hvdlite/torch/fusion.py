"""Fusion buffers: same-dtype tensors packed into one buffer, so that a collective on many
small tensors costs one round trip, and the buffers kept for reuse."""
import numpy
import torch

# Below this many bytes a tensor is copied through numpy: a numpy copy costs ~1 us a call,
# torch's slicing, view and copy_ ~3 us each, which is most of a small allreduce's overhead.
NUMPY_COPY = 64 * 1024
_NUMPY_DTYPES = {torch.float32, torch.float64, torch.float16, torch.uint8, torch.int8,
                 torch.int16, torch.int32, torch.int64, torch.bool}
# Multiplied by a Python number through numpy: ~6 us a call against torch's ~21 us (it wraps
# the number in a tensor), with the same bits (both round the factor to the dtype first;
# float16 is left out, as torch multiplies it in float32 with the factor unrounded).
_NUMPY_SCALED = {torch.float32, torch.float64}
_NUMPY_OF = {torch.float32: numpy.dtype(numpy.float32), torch.float64: numpy.dtype(numpy.float64)}


class Pool:
    """Fusion buffers kept for reuse. A buffer fresh from the OS costs a page fault per 4 KB
    at its first write (2.6 ms for 25 MB here); a kept one does not. A kept buffer is taken
    again once nothing refers to its memory: no view of it (a result, a gradient) is alive.

    A size is kept from its second use on: a one-off, such as broadcast_parameters' buckets
    (the whole model), would otherwise hold its memory for the rest of the job. Only the
    sizes used last are kept: a job whose sizes keep changing would otherwise grow."""

    SMALLEST = 256 * 1024  # bytes; smaller buffers come from malloc's reused memory anyway
    PER_SIZE = 4
    SIZES = 16

    def __init__(self):
        self.kept = {}  # (numel, dtype) -> buffers, the size used last at the end

    def take(self, numel, dtype):
        if numel * dtype.itemsize < self.SMALLEST:
            return torch.empty(numel, dtype=dtype)
        key = (numel, dtype)
        seen = key in self.kept
        kept = self.kept.pop(key, [])
        self.kept[key] = kept
        if len(self.kept) > self.SIZES:
            del self.kept[next(iter(self.kept))]
        for buffer in kept:
            if _unused(buffer):
                return buffer
        buffer = torch.empty(numel, dtype=dtype)
        if seen and len(kept) < self.PER_SIZE:
            kept.append(buffer)
        return buffer


def _unused(buffer) -> bool:
    # References to the memory: the buffer's own, and the storage object made to ask.
    return torch._C._storage_Use_Count(buffer.untyped_storage()._cdata) <= 2


pool = Pool()

# glibc's malloc hands a freed heap top back to the OS once it exceeds twice the largest block
# freed so far from mmap, and takes blocks over that size from mmap anew. A block counts up to
# 32 MiB, its header and alignment included.
MALLOC_LEARNS_UP_TO = 31 * 1024 * 1024


def expect_freed(nbytes) -> None:
    """Tell malloc that `nbytes` at a time will be freed and taken again, by freeing a block
    that size, never touched. DistributedOptimizer frees a step's gradients together (the
    reduced ones replace them); unless malloc has seen such a block freed, it hands their
    memory back to the OS, and the next backward faults it in again: ~3,000 pages a step in
    bench/ddp.py's MLP. (DDP frees its first buckets after step 1, which tells malloc the same.)
    Elsewhere than glibc, this is one allocation."""
    torch.empty(min(nbytes, MALLOC_LEARNS_UP_TO), dtype=torch.uint8)


class Plan:
    """The fixed layout of a bucket packed step after step (DistributedOptimizer's): one free
    element in front (join's state), then the tensors. Its buffers are kept
    with their numpy views, whatever their size: at np 2 the transfer leaves the caches cold,
    and then each C call made anew (a numpy view, torch.empty, a slice) costs several us."""

    KEPT = Pool.PER_SIZE  # buffers kept; a step's gradients hold one while the next is packed

    def __init__(self, tensors):
        self.shapes = [tuple(t.shape) for t in tensors]
        self.dtype = tensors[0].dtype
        # Shaped as the buffer's pieces, the state element first: pieces() cuts them in one
        # C call (split and a view per piece cost ~50 us cold, a view each).
        self._templates = [torch.empty(shape, device="meta") for shape in [(1,), *self.shapes]]
        self.cuts = [1, *(t.numel() for t in tensors)]  # the buffer's pieces
        self.numel = sum(self.cuts) - 1
        self.scaled = self.dtype in _NUMPY_SCALED
        self.kept = []

    def arrays(self, tensors):
        """The tensors' numpy views when they are plain dense CPU ones of the plan's dtype and
        shapes, so that pack() may take them; else None. numpy() refuses the others (sparse,
        requiring grad, a negative view, off the CPU): one C call a tensor checks all that."""
        if not self.scaled or any(t is None for t in tensors):
            return None
        try:
            arrays = [t.numpy() for t in tensors]
        except (TypeError, RuntimeError):
            return None
        dtype = _NUMPY_OF[self.dtype]
        if any(a.dtype != dtype or a.shape != shape for a, shape in zip(arrays, self.shapes)):
            return None
        return arrays

    def pack(self, arrays, factor):
        """A free buffer (Packed) holding the arrays multiplied by `factor` (numpy's float32/64
        product, as _multiply's) after its first element."""
        packed = self._take()
        for array, out in zip(arrays, packed.outs):
            if factor == 1:
                numpy.copyto(out, array)
            else:
                numpy.multiply(array, factor, out=out)
        return packed

    def _take(self):
        for packed in self.kept:
            if packed.unused():
                return packed
        packed = Packed(torch.empty(1 + self.numel, dtype=self.dtype), self.cuts, self.shapes)
        if len(self.kept) < self.KEPT:
            self.kept.append(packed)
        return packed

    def pieces(self, buffer):
        """The tensors' parts of `buffer`, shaped as they are (views, no copy)."""
        return torch._C._nn.unflatten_dense_tensors(buffer, self._templates)[1:]


class Packed:
    """A Plan's buffer with its numpy views made once: `array` the whole, `outs` the tensors'
    parts shaped as they are."""

    def __init__(self, buffer, cuts, shapes):
        self.buffer, self.array = buffer, buffer.numpy()
        starts = numpy.cumsum(cuts).tolist()
        self.outs = [self.array[start - size:start].reshape(shape)
                     for start, size, shape in zip(starts[1:], cuts[1:], shapes)]
        # Free while only the buffer, these views and the storage kept to ask refer to its
        # memory: no piece of it (a gradient, a result, a handle's) is alive.
        self._storage = buffer.untyped_storage()
        self._free = torch._C._storage_Use_Count(self._storage._cdata)

    def unused(self) -> bool:
        return torch._C._storage_Use_Count(self._storage._cdata) <= self._free


class Pack:
    """Same-dtype tensors as one contiguous buffer: collectives on many small tensors cost
    one round trip. `room` elements are left free in front of the data (for join's state);
    a lone contiguous tensor is used as is, without a copy, unless room or a copy is asked."""

    def __init__(self, tensors, room=0, copy=False, scale=None):
        self.tensors = tensors
        self._parts = None
        self.in_place = not room and not copy and len(tensors) == 1 and tensors[0].is_contiguous()
        self.scaled = scale is not None and not self.in_place  # multiplied by `scale` as copied
        if self.in_place:  # (a view costs ~1 us; a 1-D tensor needs none)
            self.buffer = self.flat = tensors[0] if tensors[0].dim() == 1 else tensors[0].view(-1)
            return
        numel, first = room + sum(t.numel() for t in tensors), tensors[0]
        # (a CUDA tensor's, on NCCL: the caching allocator keeps its memory already)
        self.buffer = pool.take(numel, first.dtype) if first.is_cpu else first.new_empty(numel)
        self.flat = self.buffer[room:]
        if self.scaled and scale != 1:
            for tensor, part in zip(tensors, self.parts()):
                _multiply(tensor, scale, part)
        elif self._small():
            numpy.copyto(self.buffer.numpy()[room:].reshape(tensors[0].shape), tensors[0].numpy())
        elif len(tensors) == 1:
            self.flat.view(tensors[0].shape).copy_(tensors[0])
        else:
            torch.cat([t.reshape(-1) for t in tensors], out=self.flat)

    def parts(self):
        """The buffer's pieces, shaped as the tensors (views, no copy; made once)."""
        if self._parts is None:
            if self.in_place:
                self._parts = [self.tensors[0]]
            elif len(self.tensors) == 1:
                self._parts = [self.flat.view(self.tensors[0].shape)]
            else:
                # (split_with_sizes skips split's Python wrapper; a 1-D piece needs no view:
                # each costs several us, and a bucket has dozens of pieces)
                pieces = self.flat.split_with_sizes([t.numel() for t in self.tensors])
                self._parts = [piece if t.dim() == 1 else piece.view(t.shape)
                               for t, piece in zip(self.tensors, pieces)]
        return self._parts

    def _small(self) -> bool:
        """A lone tensor small enough to copy through numpy (see NUMPY_COPY)."""
        tensor = self.tensors[0]
        return (len(self.tensors) == 1 and tensor.dtype in _NUMPY_DTYPES and tensor.is_cpu
                and tensor.numel() * tensor.dtype.itemsize <= NUMPY_COPY)

    def unpack(self) -> None:
        if self.in_place:
            return
        if self._small():
            numpy.copyto(self.tensors[0].numpy(), self.flat.numpy().reshape(self.tensors[0].shape))
        else:
            for tensor, part in zip(self.tensors, self.parts()):
                tensor.copy_(part)


def _multiply(tensor, factor, out) -> None:
    if tensor.dtype in _NUMPY_SCALED and tensor.is_cpu and not tensor.is_neg():  # (numpy() refuses a negative view)
        numpy.multiply(tensor.numpy(), factor, out=out.numpy())
    else:
        torch.mul(tensor, factor, out=out)


def by_dtype(tensors):
    """The tensors in same-dtype groups, in first-seen dtype order (the same on every rank),
    and where each tensor went: (group, index in it)."""
    if len(tensors) == 1:  # the common case, quickly
        return [[plain(tensors[0])]], [(0, 0)]
    groups, where = {}, []
    for tensor in tensors:
        group = groups.setdefault(tensor.dtype, [])
        where.append((list(groups).index(tensor.dtype), len(group)))
        group.append(plain(tensor))
    return list(groups.values()), where


def carried(tensor):
    """`tensor` as gloo can carry it when the collective only moves its bits: gloo has no
    int16 ("Invalid scalar type"), so int16 travels as float16, the same two bytes, copied
    untouched."""
    return tensor.view(torch.float16) if tensor.dtype == torch.int16 else tensor


def plain(tensor):
    """The tensor outside autograd (detach() costs ~2 us; a gradient needs none)."""
    return tensor.detach() if tensor.requires_grad else tensor


def scale(tensor, factor) -> None:
    if factor == 1:
        return
    if tensor.is_floating_point():
        tensor.mul_(factor)
    else:  # like Horovod: scale in double, truncate back to the integer type
        tensor.copy_(tensor.double().mul_(factor))


def average(flat, postscale_factor, divisor) -> None:
    """Postscale, and divide for Average, as Horovod does: floats postscaled then divided
    (a product by 1/divisor rounds differently); integers exactly, rounding toward zero as
    Horovod's integer scaling does."""
    if postscale_factor == 1 and divisor == 1:  # (no C call: see joinwire.front)
        return
    if flat.is_floating_point():
        scale(flat, postscale_factor)
        if divisor != 1:
            flat.div_(divisor)
    else:
        scale(flat, postscale_factor)
        if divisor != 1:
            flat.div_(divisor, rounding_mode="trunc")
