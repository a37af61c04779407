"""Collectives on real gloo groups of 2 and 4 processes, every result checked on every rank."""
import pytest
import torch

import gloo_harness
from hvdlite.torch import autograd, fusion, ops, runtime
from hvdlite.torch.compression import Compression
from hvdlite.worker.errors import HorovodInternalError

BASE = torch.arange(12, dtype=torch.float32).view(3, 4) - 5


def _world():
    info = runtime.info()
    return info.rank, info.size


def check_allreduce():
    rank, size = _world()
    mine = BASE * (rank + 1)
    ranks_plus_one = size * (size + 1) // 2  # sum over ranks of (rank + 1)
    total = BASE * ranks_plus_one
    assert torch.equal(autograd.allreduce(mine, op=ops.Sum), total)
    assert torch.allclose(autograd.allreduce(mine), total / size)
    assert torch.allclose(autograd.allreduce(mine, average=True), total / size)
    assert torch.equal(autograd.allreduce(mine, average=False), total)
    assert torch.equal(mine, BASE * (rank + 1)), "out-of-place allreduce changed its input"
    assert torch.equal(autograd.allreduce(BASE + rank, op=ops.Min), BASE)
    assert torch.equal(autograd.allreduce(BASE + rank, op=ops.Max), BASE + size - 1)
    assert torch.equal(autograd.allreduce(torch.full((2,), 2.0), op=ops.Product), torch.full((2,), 2.0 ** size))
    assert torch.allclose(autograd.allreduce(mine, op=ops.Sum, prescale_factor=2, postscale_factor=0.25), total / 2)
    assert torch.allclose(autograd.allreduce(mine, postscale_factor=3), total * 3 / size)
    assert autograd.allreduce(mine.double()).dtype == torch.float64

    # Integers average by dividing the sum and rounding toward zero, as Horovod does.
    ints = torch.tensor([rank, -rank, 7, 3 * rank + 1])
    int_sum = autograd.allreduce(ints, op=ops.Sum)
    assert torch.equal(int_sum, sum(torch.tensor([r, -r, 7, 3 * r + 1]) for r in range(size)))
    assert torch.equal(autograd.allreduce(ints), torch.div(int_sum, size, rounding_mode="trunc"))
    assert autograd.allreduce(ints).dtype == torch.int64

    in_place = mine.clone()
    assert ops.allreduce_(in_place, op=ops.Sum) is in_place
    assert torch.equal(in_place, total)
    strided = (BASE * (rank + 1)).t()  # non-contiguous: reduced through a buffer and copied back
    assert ops.allreduce_(strided, op=ops.Sum) is strided
    assert torch.equal(strided, total.t())
    assert torch.equal(autograd.allreduce(strided.t(), op=ops.Max), total)
    every_other = torch.arange(8.0) * (rank + 1)
    assert torch.equal(ops.allreduce_(every_other[::2], op=ops.Sum), torch.arange(0.0, 8, 2) * ranks_plus_one)
    assert torch.equal(every_other[1::2], torch.arange(1.0, 8, 2) * (rank + 1)), "wrote outside the view"
    scalar = autograd.allreduce(torch.tensor(float(rank)))  # e.g. a loss to average
    assert scalar.dim() == 0 and scalar.item() == (size - 1) / 2

    half = autograd.allreduce(mine, compression=Compression.fp16)
    assert half.dtype == torch.float32 and torch.allclose(half, total / size, atol=1e-2)
    fine = torch.full((3,), 1 + 2.0 ** -12)  # not representable in float16: proves the wire type
    assert torch.equal(autograd.allreduce(fine, compression=Compression.fp16), torch.ones(3))
    assert torch.equal(autograd.allreduce(fine), fine)
    assert torch.equal(autograd.allreduce(ints, op=ops.Sum, compression=Compression.fp16), int_sum)

    with pytest.raises(ValueError):
        autograd.allreduce(mine, average=True, op=ops.Sum)
    with pytest.raises(ValueError, match="Adasum"):
        autograd.allreduce(ints, op=ops.Adasum)
    with pytest.raises(NotImplementedError, match="meta"):  # off the host, and no data to stage
        autograd.allreduce(torch.empty(2, device="meta"))


def check_grouped_and_async():
    rank, size = _world()
    mixed = [BASE * (rank + 1), torch.tensor([rank], dtype=torch.int32), BASE.double().t() + rank,
             torch.ones(5, 7) * rank, torch.zeros(0)]
    expected = [BASE * (size * (size + 1) // 2), torch.tensor([size * (size - 1) // 2], dtype=torch.int32),
                BASE.double().t() * size + size * (size - 1) // 2, torch.ones(5, 7) * (size * (size - 1) // 2),
                torch.zeros(0)]
    out = autograd.grouped_allreduce(mixed, op=ops.Sum)
    assert all(torch.equal(o, e) and o.dtype == e.dtype for o, e in zip(out, expected))
    assert torch.equal(mixed[0], BASE * (rank + 1)), "out-of-place grouped_allreduce changed its input"
    averaged = autograd.grouped_allreduce(mixed[:1] + mixed[2:], compression=Compression.fp16)
    for got, want in zip(averaged, expected[:1] + expected[2:]):
        assert got.dtype == want.dtype and torch.allclose(got, want / size, atol=1e-2)
    in_place = [t.clone() for t in mixed]
    assert ops.grouped_allreduce_(in_place, op=ops.Sum) == in_place
    assert all(torch.equal(o, e) for o, e in zip(in_place, expected))

    pending = BASE * (rank + 1)
    handle = ops.allreduce_async(pending, op=ops.Sum)
    in_place_handle = ops.allreduce_async_(pending, op=ops.Max)  # second op issued before the first ends
    result = ops.synchronize(handle)
    assert ops.synchronize(in_place_handle) is pending
    assert ops.poll(handle) and ops.poll(in_place_handle)
    assert torch.equal(result, BASE * (size * (size + 1) // 2))
    assert torch.equal(pending, torch.maximum(BASE * size, BASE))
    grouped = ops.synchronize(ops.grouped_allreduce_async([BASE + rank, BASE - rank]))
    assert torch.allclose(grouped[0], BASE + (size - 1) / 2) and torch.allclose(grouped[1], BASE - (size - 1) / 2)


def check_allgather():
    rank, size = _world()
    rows = torch.full((rank + 1, 3), float(rank))  # first dimension differs per rank
    expected = torch.cat([torch.full((r + 1, 3), float(r)) for r in range(size)])
    assert torch.equal(autograd.allgather(rows), expected)
    assert torch.equal(autograd.allgather(rows.t().t()), expected)
    assert torch.equal(autograd.allgather(torch.arange(rank)), torch.cat([torch.arange(r) for r in range(size)]))
    assert torch.equal(autograd.allgather(torch.tensor([rank])), torch.arange(size))
    assert autograd.allgather(torch.zeros(0, 2)).shape == (0, 2)
    with pytest.raises(ValueError, match="disagree"):
        autograd.allgather(torch.zeros(2, rank + 1))  # raised on every rank alike
    with pytest.raises(ValueError):
        autograd.allgather(torch.tensor(1.0))


def check_broadcast():
    rank, size = _world()
    root = size - 1  # a non-zero root
    mine = torch.full((2, 3), float(rank))
    assert torch.equal(autograd.broadcast(mine, root), torch.full((2, 3), float(root)))
    assert torch.equal(mine, torch.full((2, 3), float(rank))), "out-of-place broadcast changed its input"
    strided = torch.full((3, 2), float(rank)).t()
    assert ops.broadcast_(strided, root) is strided
    assert torch.equal(strided, torch.full((2, 3), float(root)))
    assert torch.equal(ops.synchronize(ops.broadcast_async_(torch.tensor([rank]), 1)), torch.tensor([1]))
    with pytest.raises(ValueError, match="root_rank"):
        autograd.broadcast(mine, size)


def check_objects():
    rank, size = _world()
    sent = {"from": rank, "payload": list(range(rank * 100)), "fn": lambda x: x + rank}
    got = ops.broadcast_object(sent, root_rank=1)
    assert got["from"] == 1 and got["payload"] == list(range(100)) and got["fn"](1) == 2
    assert ops.broadcast_object(None if rank else "zero") == "zero"
    # Around the size that still fits the first collective, and well past it.
    for n in list(range(ops._OBJECT_HEAD - 40, ops._OBJECT_HEAD + 8)) + [100000]:
        text = ops.broadcast_object(None if rank else "y" * (n - 1) + "z")
        assert len(text) == n and text[-1] == "z" and set(text[:-1]) == {"y"}
    gathered = ops.allgather_object({"rank": rank, "data": "x" * (rank * 1000)})
    assert gathered == [{"rank": r, "data": "x" * (r * 1000)} for r in range(size)]
    ops.barrier()


def check_fusion_buffers_kept():
    # A fusion buffer is taken again only once no result lives in it.
    rank, size = _world()
    big = [torch.full((300_000,), float(rank)), torch.ones(5)]
    for _ in range(3):  # join's guess learns this allreduce: from now on its buffer's size is one
        autograd.grouped_allreduce(big, op=ops.Sum)
    first = autograd.grouped_allreduce(big, op=ops.Sum)
    second = autograd.grouped_allreduce([t * 2 for t in big], op=ops.Sum)
    total = float(sum(range(size)))
    assert torch.equal(first[0], torch.full((300_000,), total)), "a live result was overwritten"
    assert torch.equal(second[0], torch.full((300_000,), 2 * total))
    assert first[0].data_ptr() != second[0].data_ptr()
    where = first[0].data_ptr()
    del first
    third = autograd.grouped_allreduce(big, op=ops.Sum)
    assert third[0].data_ptr() == where, "the freed buffer was not taken again"
    assert torch.equal(third[0], torch.full((300_000,), total))


def check_all():
    check_fusion_buffers_kept()
    check_allreduce()
    check_grouped_and_async()
    check_allgather()
    check_broadcast()
    check_objects()
    info = runtime.info()
    pg = runtime.deactivate()
    with pytest.raises(runtime.NotInitializedError, match=r"hvd\.init\(\)"):
        autograd.allreduce(BASE)
    runtime.activate(pg, info)
    ops.barrier()


@pytest.mark.parametrize("size", [2, 4])
def test_collectives(size):
    gloo_harness.run(check_all, size)


def check_peer_death():
    rank, _ = _world()
    if rank == 1:
        gloo_harness.leave()
    with pytest.raises(HorovodInternalError):
        autograd.allreduce(torch.ones(1000))


def test_dead_peer_raises_horovod_internal_error():
    gloo_harness.run(check_peer_death, 2)


def test_collectives_before_init_raise_clear_error():
    assert not runtime.is_initialized()
    for call in (lambda: autograd.allreduce(BASE), lambda: autograd.allgather(BASE),
                 lambda: autograd.broadcast(BASE, 0), lambda: ops.broadcast_object(1), ops.barrier):
        with pytest.raises(runtime.NotInitializedError, match=r"hvd\.init\(\)"):
            call()


def test_a_fused_copy_is_scaled_as_torch_scales():
    # Packing scales each tensor on its way into the buffer (through numpy where that gives
    # the same bits); every dtype and layout must come out as torch.mul gives it.
    g = torch.Generator().manual_seed(0)
    base = torch.randn(6, 5, generator=g, dtype=torch.float64)
    tensors = [base.float(), base, base.half(), base.bfloat16(), base.float().t(),
               base.float()._neg_view(), torch.arange(7, dtype=torch.float32)]
    for tensor in tensors:
        for factor in (1 / 3, 0.1, 2.0):
            pack = fusion.Pack([tensor, tensor], room=1, scale=factor)
            for part in pack.parts():
                assert torch.equal(part, torch.mul(tensor, factor)), (tensor.dtype, factor)


def test_the_pool_keeps_sizes_used_again_and_lately():
    pool = fusion.Pool()
    n = fusion.Pool.SMALLEST // 4  # float32 elements
    once = pool.take(n, torch.float32)
    again = pool.take(n, torch.float32)
    assert again is not once and pool.take(n, torch.float32) is again  # kept from its second use
    pool.take(n + 1, torch.float32)  # a one-off (say, broadcast_parameters' bucket)
    assert pool.kept[(n + 1, torch.float32)] == []
    pool.take(n // 2, torch.float32)
    assert (n // 2, torch.float32) not in pool.kept  # below SMALLEST: malloc reuses it anyway
    for extra in range(fusion.Pool.SIZES):
        pool.take(n + 2 + extra, torch.float32)
    assert len(pool.kept) == fusion.Pool.SIZES and (n, torch.float32) not in pool.kept
