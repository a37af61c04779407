"""Every name of the horovod.torch API checked on every rank against values computed by hand
or by one process; prints 'OK <rank> <size>' after each full pass.

Static (hvdlite run -np N): one pass. Elastic (VICTIM=slot): a pass in the first world, then
the victim kills itself (SIGKILL) and the survivors pass again in the new, smaller world,
process sets included.
"""
import json
import os
import shutil
import signal
import tempfile

import torch

import hvdlite.torch as hvd
from hvdlite.torch import adasum
from hvdlite.worker import env
from hvdlite.worker.errors import MismatchError

SLOT = os.environ[env.SLOT]
VICTIM = os.environ.get("VICTIM")
# Sets added at init: one that excludes rank 0, and one that exists only while the world has
# a rank 2 (in a world of 2 it keeps rank 0 alone).
NOT_ZERO, EVEN = hvd.ProcessSet([1, 2]), hvd.ProcessSet([0, 2])
hvd.init(process_sets=[NOT_ZERO, EVEN])
assert (NOT_ZERO.process_set_id, EVEN.process_set_id) == (1, 2)


def raises(kind, fn, match=""):
    try:
        fn()
    except kind as e:
        assert match in str(e), f"{e!r} does not mention {match!r}"
        return
    raise AssertionError(f"{fn} did not raise {kind.__name__}")


def check_queries():
    # As Horovod 0.28.1 built with gloo only answers, after init().
    assert hvd.gloo_enabled() is True and hvd.gloo_built() is True
    assert hvd.nccl_built() == 0 and type(hvd.nccl_built()) is int
    assert not any(f() for f in (hvd.mpi_enabled, hvd.mpi_built, hvd.cuda_built, hvd.rocm_built,
                                 hvd.ddl_built, hvd.ccl_built))
    raises(ValueError, hvd.mpi_threads_supported, "MPI is not enabled")
    assert hvd.is_homogeneous() == (hvd.size() == hvd.local_size() * hvd.cross_size())
    # Each rank names its own file here: only rank 0 writes one, as in Horovod.
    trace_file = os.path.join(tempfile.mkdtemp(), "trace.json")
    hvd.start_timeline(trace_file)
    hvd.allreduce(torch.ones(4), name="metric")
    hvd.allreduce(torch.ones(4))
    hvd.stop_timeline()
    assert os.path.exists(trace_file) == (hvd.rank() == 0)
    if hvd.rank() == 0:
        with open(trace_file) as f:
            names = [e["name"] for e in json.load(f)["traceEvents"] if e["ph"] in "BE"]
        assert names == ["metric", "metric", "allreduce", "allreduce"], names
    shutil.rmtree(os.path.dirname(trace_file))
    assert hvd.elastic.run and hvd.elastic.State and hvd.elastic.ObjectState
    assert hvd.elastic.TorchState and hvd.elastic.ElasticSampler


def check_allreduce(r, n):
    x = torch.tensor([r + 1.0, 2.0, -r])
    total = torch.tensor([n * (n + 1) / 2, 2.0 * n, -n * (n - 1) / 2])
    assert torch.allclose(hvd.allreduce(x, average=True), total / n)
    assert torch.equal(hvd.allreduce(x, average=False), total)
    assert torch.allclose(hvd.allreduce(x, op=hvd.Sum, prescale_factor=3.0, postscale_factor=0.5), total * 1.5)
    assert torch.allclose(hvd.allreduce(x, prescale_factor=2.0), total * 2 / n)
    product = torch.tensor([float(torch.arange(1, n + 1).prod()), 2.0 ** n, 0.0 if n > 1 else -0.0])
    assert torch.equal(hvd.allreduce(x, op=hvd.Product), product)
    # Adasum, against the formula written out by hand for every rank's vector
    g = torch.Generator().manual_seed(7)
    vectors = [torch.randn(5, generator=g) for _ in range(n)]

    def by_hand(a, b):
        dot = float(a @ b)
        return (1 - dot / (2 * float(a @ a))) * a + (1 - dot / (2 * float(b @ b))) * b
    expected = vectors[0] if n == 1 else by_hand(vectors[0], vectors[1])
    if n == 3:
        expected = by_hand(expected, vectors[2])
    assert torch.allclose(hvd.allreduce(vectors[r], op=hvd.Adasum), expected, atol=1e-6)
    grouped = hvd.grouped_allreduce([vectors[r], vectors[r] * 2], op=hvd.Adasum)
    assert torch.allclose(grouped[1], adasum.reduce([v * 2 for v in vectors]), atol=1e-6)
    # Sparse: every rank's indices and values gathered, as Horovod's (a rank's own rows here).
    sparse = torch.zeros(n + 1, 2)
    sparse[r] = torch.tensor([1.0, float(r)])
    handle = hvd.sparse_allreduce_async(sparse.to_sparse(), "s", hvd.Average)
    assert torch.equal(handle().to_dense(), torch.cat([torch.stack([torch.ones(n), torch.arange(n)], 1) / n,
                                                       torch.zeros(1, 2)]))
    model = torch.nn.Embedding(n + 1, 2, sparse=True)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1.0))
    model(torch.tensor([r, n])).sum().backward()
    opt.step()  # rows 0..n-1 each used by one rank, row n by all: the average of the uses
    expected = torch.tensor([1.0 / n] * n + [1.0])
    assert model.weight.grad.is_sparse and torch.allclose(model.weight.grad.to_dense()[:, 0], expected)


def check_named_out_of_order(r, n):
    """Named collectives issued in another order on some ranks raise on every rank, never
    return another tensor's sum (Horovod matches them by name, hvdlite by order)."""
    mine = {"a": torch.tensor([1.0]), "b": torch.tensor([100.0])}
    order = ["a", "b"] if r % 2 == 0 else ["b", "a"]
    for call in (lambda k: hvd.allreduce_async(mine[k], name=f"order.{k}", op=hvd.Sum),
                 lambda k: hvd.broadcast_async(mine[k], 0, name=f"order.{k}")):
        for handle in [call(k) for k in order]:
            raises(MismatchError, lambda: hvd.synchronize(handle), "name")
    assert hvd.allreduce(torch.tensor([1.0]), name="order.a", op=hvd.Sum).item() == n  # in order: fine


def check_join(r, n):
    # Rank k does k + 1 allreduces, then joins: later allreduces get zeros from the joined.
    for step in range(r + 1):
        mine = torch.tensor([float(r + 1), float(step)])
        active = [k for k in range(n) if k >= step]
        expected = torch.tensor([float(sum(k + 1 for k in active)), float(step * len(active))])
        assert torch.equal(hvd.allreduce(mine, op=hvd.Sum), expected)
        assert torch.allclose(hvd.allreduce(mine), expected / n)  # Average over all ranks
        assert torch.equal(hvd.allreduce(torch.tensor([r + 1]), op=hvd.Min), torch.tensor([step + 1]))
    assert hvd.join() == n - 1


def check_alltoall(r, n):
    even = torch.tensor([[100.0 * r + j, j] for j in range(n) for _ in range(2)])  # 2 rows to each rank
    assert torch.equal(hvd.alltoall(even), torch.tensor([[100.0 * k + r, r] for k in range(n) for _ in range(2)]))

    def count(src, dst):  # rows src sends dst: rank-dependent, zero for some pairs
        return (src + 2 * dst) % 3

    rows = [torch.tensor([[r * 10.0 + dst, i]]) for dst in range(n) for i in range(count(r, dst))]
    mine = torch.cat(rows) if rows else torch.zeros(0, 2)
    splits = [count(r, dst) for dst in range(n)]
    out, received = hvd.synchronize(hvd.alltoall_async(even))  # received splits even without splits
    assert received.dtype == torch.int32 and received.tolist() == [2] * n
    out, received = hvd.synchronize(hvd.alltoall_async(mine, splits=splits))
    assert received.tolist() == [count(src, r) for src in range(n)]
    expected = [[src * 10.0 + r, i] for src in range(n) for i in range(count(src, r))]
    assert out.tolist() == expected
    raises(ValueError, lambda: hvd.alltoall(torch.zeros(n * 2 + 1)) if n > 1 else hvd.alltoall(torch.zeros(1), splits=[2]))


def check_reducescatter(r, n):
    rows = 2 * n + 1  # uneven: rank 0 gets one row more
    t = torch.arange(rows * 2, dtype=torch.float32).view(rows, 2) * (r + 1)
    total = torch.arange(rows * 2, dtype=torch.float32).view(rows, 2) * (n * (n + 1) / 2)
    counts = [2 + (1 if k == 0 else 0) for k in range(n)]
    start = sum(counts[:r])
    mine = total[start:start + counts[r]]
    assert torch.equal(hvd.reducescatter(t, op=hvd.Sum), mine)
    assert torch.allclose(hvd.reducescatter(t), mine / n)
    assert torch.allclose(hvd.synchronize(hvd.reducescatter_async(t, op=hvd.Sum, prescale_factor=2.0,
                                                                  postscale_factor=0.25)), mine / 2)
    ints = torch.ones(n, 3, dtype=torch.int64) * (r + 1)
    small, big = hvd.synchronize(hvd.grouped_reducescatter_async([ints, t], op=hvd.Sum))
    assert torch.equal(small, torch.ones(1, 3, dtype=torch.int64) * n * (n + 1) // 2)
    assert torch.equal(big, mine)
    assert torch.allclose(hvd.grouped_reducescatter([t])[0], mine / n)
    raises(NotImplementedError, lambda: hvd.reducescatter(t, op=hvd.Max), "Average or op=Sum")


def check_allgather(r, n):
    parts = [torch.full((k + 1, 2), float(k)) for k in range(n)]
    handle = hvd.allgather_async(parts[r])
    assert torch.equal(hvd.synchronize(handle), torch.cat(parts))
    assert hvd.synchronize(handle) is None  # Horovod forgets a handle once synchronized
    a, b = hvd.grouped_allgather([parts[r], torch.tensor([r])])
    assert torch.equal(a, torch.cat(parts)) and torch.equal(b, torch.arange(n))
    a, = hvd.synchronize(hvd.grouped_allgather_async([torch.zeros(r, 3)]))
    assert a.shape == (n * (n - 1) // 2, 3)


def check_process_sets(r, n):
    members = [k for k in (1, 2) if k < n]
    assert NOT_ZERO.ranks == [1, 2] and NOT_ZERO.size() == len(members)
    assert NOT_ZERO.included() == (r in members)
    if r in members:
        assert NOT_ZERO.rank() == members.index(r)
    else:  # as Horovod's
        raises(ValueError, NOT_ZERO.rank, "not in the process set")
    loose = hvd.ProcessSet([0])
    assert (loose.size(), loose.rank(), loose.included()) == (None, None, r == 0)
    raises(ValueError, lambda: hvd.allreduce(torch.ones(1), process_set=loose), "has not been added")
    assert hvd.global_process_set.size() == n and hvd.global_process_set.rank() == r
    assert hvd.global_process_set.ranks == list(range(n))
    evens = [k for k in (0, 2) if k < n]
    if r in evens:  # a set every rank may not be in; its first collective builds its group
        assert torch.equal(hvd.allreduce(torch.tensor([r]), op=hvd.Sum, process_set=EVEN),
                           torch.tensor([sum(evens)]))
    if r in members:
        assert torch.equal(hvd.allreduce(torch.tensor([float(r)]), op=hvd.Sum, process_set=NOT_ZERO),
                           torch.tensor([float(sum(members))]))
        assert torch.allclose(hvd.allreduce(torch.tensor([float(r)]), process_set=NOT_ZERO),
                              torch.tensor([sum(members) / len(members)]))
        root = members[-1]
        assert torch.equal(hvd.broadcast(torch.tensor([r]), root, process_set=NOT_ZERO), torch.tensor([root]))
        assert torch.equal(hvd.allgather(torch.tensor([r, r]), process_set=NOT_ZERO),
                           torch.tensor([k for k in members for _ in range(2)]))
        assert hvd.allgather_object(r, process_set=NOT_ZERO) == members
        assert hvd.broadcast_object(f"from {r}", root_rank=root, process_set=NOT_ZERO) == f"from {root}"
        assert torch.equal(hvd.alltoall(torch.tensor([10 * r + k for k in range(len(members))]),
                                        process_set=NOT_ZERO),
                           torch.tensor([10 * k + members.index(r) for k in members]))
        got = hvd.reducescatter(torch.ones(len(members), 2) * r, op=hvd.Sum, process_set=NOT_ZERO)
        assert torch.equal(got, torch.ones(1, 2) * sum(members))
        hvd.barrier(process_set=NOT_ZERO)
        raises(ValueError, lambda: hvd.broadcast(torch.zeros(1), 0, process_set=NOT_ZERO), "not in the process set")
    else:
        raises(ValueError, lambda: hvd.allreduce(torch.zeros(1), process_set=NOT_ZERO), "not in the process set")
    hvd.barrier()
    # remove and add again: a fresh group, every rank agreeing on its id
    again = hvd.add_process_set([0, 1])
    raises(ValueError, lambda: hvd.add_process_set([1, 0]), "exists already")
    assert torch.equal(hvd.allreduce(torch.tensor([1]), op=hvd.Sum, process_set=again) if r < 2
                       else torch.tensor([2]), torch.tensor([min(n, 2)]))
    assert hvd.remove_process_set(again) and not hvd.remove_process_set(again)
    assert not hvd.remove_process_set(hvd.global_process_set)


def check_hosts_updated_hook(r, n):
    state = hvd.elastic.ObjectState(epoch=0)
    if r == n - 1:  # Horovod's notification hook, heard by one rank: every rank is interrupted
        state.on_hosts_updated(5, 1)
    raises(hvd.HostsUpdatedInterrupt, state.check_host_updates)
    state.check_host_updates()  # once
    if r == n - 1:
        state.on_hosts_updated(4, 1)  # older than the update this rank heard: none
    state.check_host_updates()


def check_sync_batch_norm(r, n):
    torch.manual_seed(3)
    batches = [torch.randn(k + 2, 3, 4) for k in range(n)]  # rank-dependent batch sizes
    weights = [torch.randn(k + 2, 3, 4) for k in range(n)]
    sync, ref = hvd.SyncBatchNorm(3, momentum=0.3), torch.nn.BatchNorm1d(3, momentum=0.3)
    with torch.no_grad():
        for m in (sync, ref):
            m.weight.copy_(torch.tensor([1.0, 2.0, 0.5]))
            m.bias.copy_(torch.tensor([0.0, -1.0, 3.0]))
    start = sum(k + 2 for k in range(r))
    for _ in range(2):
        x = batches[r].clone().requires_grad_()
        x_all = torch.cat(batches).requires_grad_()
        out, ref_out = sync(x), ref(x_all)
        assert torch.allclose(out, ref_out[start:start + r + 2], atol=1e-5)
        (out * weights[r]).sum().backward()
        (ref_out * torch.cat(weights)).sum().backward()
        assert torch.allclose(x.grad, x_all.grad[start:start + r + 2], atol=1e-5)
    assert torch.allclose(sync.running_mean, ref.running_mean, atol=1e-6)
    assert torch.allclose(sync.running_var, ref.running_var, atol=1e-5)
    assert torch.allclose(hvd.allreduce(sync.weight.grad, op=hvd.Sum), ref.weight.grad, atol=1e-4)
    sync.eval()
    ref.eval()
    assert torch.allclose(sync(batches[0]), ref(batches[0]), atol=1e-5)


def check_optimizer(r, n):
    def model():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))

    def data(step, k):
        g = torch.Generator().manual_seed(step * 10 + k)
        return torch.randn(4, 3, generator=g), torch.randn(4, 2, generator=g)

    def train_and_compare(ranks, passes=1, process_set=hvd.global_process_set, groups_of=None,
                          **options):
        net, ref = model(), model()
        if groups_of:
            options["groups"] = groups_of(list(net.parameters()))
        opt = hvd.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9),
                                       named_parameters=net.named_parameters(),
                                       process_set=process_set, **options)
        if passes > 1:
            opt.set_backward_passes_per_step(passes)
        ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
        for step in range(3):
            opt.zero_grad()
            ref_opt.zero_grad()
            for micro in range(passes):
                x, y = data(step * passes + micro, r)
                torch.nn.functional.mse_loss(net(x), y).backward()
                for k in ranks:  # the mean of the ranks' losses, on one process
                    xk, yk = data(step * passes + micro, k)
                    (torch.nn.functional.mse_loss(ref(xk), yk) / len(ranks)).backward()
            opt.step()
            ref_opt.step()
        for p, q in zip(net.parameters(), ref.parameters()):
            assert torch.allclose(p, q, atol=1e-5), (p - q).abs().max()

    everyone = list(range(n))
    train_and_compare(everyone, num_groups=2)
    train_and_compare(everyone, groups_of=lambda ps: [[ps[3], ps[0]], [ps[1]]], gradient_predivide_factor=2.0)
    train_and_compare(everyone, passes=2, sparse_as_dense=True)
    if NOT_ZERO.included():
        train_and_compare(NOT_ZERO._members(n), process_set=NOT_ZERO, groups=1)


def check_all():
    r, n = hvd.rank(), hvd.size()
    check_queries()
    check_allreduce(r, n)
    check_named_out_of_order(r, n)
    check_alltoall(r, n)
    check_reducescatter(r, n)
    check_allgather(r, n)
    check_process_sets(r, n)
    check_hosts_updated_hook(r, n)
    check_sync_batch_norm(r, n)
    check_optimizer(r, n)
    check_join(r, n)
    print(f"OK {r} {n}", flush=True)


if VICTIM is None:
    check_all()
else:
    @hvd.elastic.run
    def passes(state):
        while state.passes < 2:
            check_all()
            if SLOT == VICTIM:
                os.kill(os.getpid(), signal.SIGKILL)
            hvd.barrier()  # fails on the survivors: the world broke
            state.passes += 1
            state.commit()
    passes(hvd.elastic.ObjectState(passes=0))
