"""The API's decisions as pure functions: Adasum arithmetic, reducescatter shares, optimizer
groups, what a joined rank contributes, how often a rank heartbeats,
where gloo binds on loopback, knocking on a stuck connect's sockets, how a group is
released."""
import ipaddress
import time

import pytest
import torch
from hypothesis import given, strategies as st

from hvdlite.torch import adasum, handles, joinwire, ops
from hvdlite.torch.optimizer import _fusion_buckets, _groups_as_buckets
from hvdlite.worker.reduceops import shares


def test_adasum_adds_orthogonal_and_keeps_parallel_gradients():
    a, b = torch.tensor([1.0, 0.0]), torch.tensor([0.0, 2.0])
    assert torch.equal(adasum.combine(a, b), torch.tensor([1.0, 2.0]))
    assert torch.allclose(adasum.combine(a * 3, a * 3), a * 3)  # equal: kept, not doubled
    assert torch.equal(adasum.combine(a, torch.zeros(2)), a)  # a zero vector changes nothing
    c, d = torch.tensor([1.0, 1.0]), torch.tensor([1.0, 0.0])
    # dot 1, |c|^2 2, |d|^2 1: (1 - 1/4) c + (1 - 1/2) d
    assert torch.allclose(adasum.combine(c, d), torch.tensor([1.25, 0.75]))
    assert adasum.combine(c.half(), d.half()).dtype == torch.float16


def test_adasum_tree_pairs_neighbours_first():
    v = [torch.tensor([float(i + 1), float(i % 2)]) for i in range(4)]
    c = adasum.combine
    assert torch.allclose(adasum.reduce(v), c(c(v[0], v[1]), c(v[2], v[3])))
    assert torch.allclose(adasum.reduce(v[:3]), c(c(v[0], v[1]), v[2]))
    assert torch.equal(adasum.reduce(v[:1]), v[0])


@pytest.mark.parametrize("rows, size, counts", [(7, 3, [3, 2, 2]), (6, 3, [2, 2, 2]), (1, 3, [1, 0, 0]),
                                                (0, 2, [0, 0])])
def test_reducescatter_shares_give_the_first_ranks_one_row_more(rows, size, counts):
    assert shares(rows, size) == counts


def test_optimizer_groups_become_buckets():
    params = [torch.nn.Parameter(torch.zeros(1)) for _ in range(5)]
    assert _groups_as_buckets(params, 0, None) is None
    assert _groups_as_buckets(params, 2, None) == [params[:3], params[3:]]
    assert _groups_as_buckets(params, 0, 5) == [[p] for p in params]
    buckets = _groups_as_buckets(params, 0, [[params[4], params[0]]])
    assert buckets == [[params[4], params[0]], [params[1]], [params[2]], [params[3]]]
    with pytest.raises(ValueError, match="does not hold"):
        _groups_as_buckets(params, 0, [[torch.nn.Parameter(torch.zeros(1))]])


def test_the_first_bucket_closes_at_its_size_so_reducing_starts_early():
    # Backward order: a head (8 KB), then two 12.8 MB embeddings. DDP-like: the first bucket
    # takes the head and the first embedding, the rest fuse up to the threshold.
    head_bias, head, tags, words = (torch.zeros(n) for n in (16, 2048, 3_200_000, 3_200_000))
    sizes = lambda buckets: [[t.numel() for t in b] for b in buckets]
    tensors = [head_bias, head, tags, words]
    assert sizes(_fusion_buckets(tensors, 64 << 20, first=1 << 20)) == [[16, 2048, 3_200_000], [3_200_000]]
    assert sizes(_fusion_buckets(tensors, 64 << 20)) == [[16, 2048, 3_200_000, 3_200_000]]
    assert sizes(_fusion_buckets(tensors, 0, first=1 << 20)) == [[16], [2048], [3_200_000], [3_200_000]]


@pytest.mark.parametrize("dtype", [torch.float32, torch.int32, torch.uint8, torch.bool])
def test_a_joined_rank_contributes_the_identity_of_the_op(dtype):
    x = torch.tensor([0, 1, 1], dtype=dtype)
    for op, reduce in ((ops.Sum, torch.add), (ops.Min, torch.minimum), (ops.Max, torch.maximum),
                       (ops.Product, torch.mul)):
        if dtype == torch.bool and op == ops.Sum:
            reduce = torch.logical_or
        assert torch.equal(reduce(x, joinwire.identity(op, dtype, 3)), x)


def test_rank0_heartbeats_faster_than_the_others():
    # Rank 0's view of host updates is the one every rank acts on at commit().
    from hvdlite.worker import session
    assert session.heartbeat_interval(0) == session.RANK0_HEARTBEAT_INTERVAL < session.HEARTBEAT_INTERVAL
    assert session.heartbeat_interval(1) == session.heartbeat_interval(7) == session.HEARTBEAT_INTERVAL


@given(st.integers(0, (1 << 24) - 3), st.integers(0, (1 << 24) - 3))
def test_on_loopback_gloo_addresses_rise_with_the_rank(a, b):
    # pygloo's gloo lets the lower address listen: rising addresses keep its mesh from chaining.
    from hvdlite.worker.session import loopback_by_rank
    first, second = (ipaddress.IPv4Address(loopback_by_rank("127.0.0.1", k)) for k in (a, b))
    assert first.is_loopback and second.is_loopback and (first < second) == (a < b)
    assert loopback_by_rank("10.1.2.3", a) == "10.1.2.3" and loopback_by_rank("::1", a) == "::1"


def test_knocking_reaches_the_named_listening_sockets_only():
    # What the voucher does for a worker stuck connecting, here on this process's own sockets.
    import os
    import socket
    from hvdlite.worker import sockets
    other = socket.create_server(("127.0.0.1", 0))
    new4, new6 = socket.create_server(("127.0.0.7", 0)), socket.create_server(("::1", 0), family=socket.AF_INET6)
    named = {os.fstat(s.fileno()).st_ino: s.getsockname()[:2] for s in (new4, new6)}
    for server in (other, new4, new6):
        server.settimeout(0)
    assert sockets.knock(os.getpid(), named) == set(named)
    assert new4.accept() and new6.accept()
    with pytest.raises(BlockingIOError):
        other.accept()
    for server in (other, new4, new6):
        server.close()


def test_releasing_a_voucher_whose_helper_is_gone_is_quiet():
    # A stop signals the worker's process group: the helper dies first, then the worker's
    # exit releases it (atexit), which once printed a ConnectionRefusedError traceback.
    import os
    from hvdlite.worker import env, vouch
    environ = {**os.environ, env.RENDEZVOUS_ADDR: "127.0.0.1", env.RENDEZVOUS_PORT: "9", env.SECRET: "x"}
    voucher = vouch.Voucher(environ, lambda: 0.0)
    voucher.proc.terminate()
    voucher.proc.wait(10)
    voucher.release()


def test_a_released_group_is_destroyed_off_the_calling_thread():
    # A gloo group's destructor waits for its peers (and forever for a hung one's pending op):
    # shutdown() hands it to a thread and keeps no reference that would run it here.
    import threading
    from hvdlite.torch import basics, gloo, runtime
    destroyed = []

    class Group:
        def __del__(self):
            destroyed.append(threading.current_thread())

    def released():
        deadline = time.monotonic() + 5
        while not destroyed and time.monotonic() < deadline:
            time.sleep(0.01)
        return destroyed.pop() if destroyed else None

    gloo.release([Group()])
    assert released() not in (None, threading.current_thread())
    runtime.activate(Group(), None)
    basics.shutdown()
    assert released() not in (None, threading.current_thread())
    assert not runtime.is_initialized()


def test_a_collective_of_a_world_the_driver_says_broke_ends_at_once(monkeypatch):
    # gloo can leave a survivor's collective pending for its whole timeout after the peers it
    # waits on left the world (bench/stall.py: 5 of 18 kills at 16 ranks, 20-30 s each).
    import threading
    from datetime import timedelta
    import torch.distributed as dist
    from hvdlite.torch import runtime
    from hvdlite.worker.errors import HorovodInternalError
    from hvdlite.worker.world import WorldInfo
    store, groups = dist.HashStore(), {}

    def connect(rank):
        options = dist.ProcessGroupGloo._Options()
        options._devices = [dist.ProcessGroupGloo.create_device(hostname="127.0.0.1")]
        options._timeout = timedelta(seconds=20)
        groups[rank] = dist.ProcessGroupGloo(store, rank, 2, options)
    threads = [threading.Thread(target=connect, args=(rank,)) for rank in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)

    class Session:
        broken = 0
    said = Session()
    monkeypatch.setattr(handles, "session", lambda: said, raising=False)
    runtime.activate(groups[0], WorldInfo(rank=0, size=2, local_rank=0, local_size=2, cross_rank=0,
                                          cross_size=1, hostname="localhost", round=7))
    try:
        work = groups[0].allreduce([torch.ones(1)])  # rank 1 has left: never matched
        threading.Timer(0.5, setattr, (said, "broken", 7)).start()
        start = time.monotonic()
        with pytest.raises(HorovodInternalError):
            handles.wait_work(work)
        assert time.monotonic() - start < 5
    finally:
        runtime.deactivate()
        groups[1].allreduce([torch.ones(1)]).wait()  # lets rank 0's pending one end
