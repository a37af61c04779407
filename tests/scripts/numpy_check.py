"""Checks every collective of hvdlite.numpy on every rank, in a venv without torch; prints 'OK <rank>'."""
import os
import sys
import time

import numpy as np

import hvdlite.numpy as hvd

try:
    hvd.rank()
    raise AssertionError("rank() before init() did not raise")
except hvd.NotInitializedError:
    pass
hvd.init()
r, n = hvd.rank(), hvd.size()
assert (r, n) == (int(os.environ["HVDLITE_RANK"]), int(os.environ["HVDLITE_SIZE"]))
assert hvd.local_rank() == int(os.environ["HVDLITE_LOCAL_RANK"]) and hvd.local_size() <= n
if os.environ["HVDLITE_RENDEZVOUS_ADDR"].startswith("127."):  # a job on loopback
    # Each rank listens on 127.0.0.<rank+1>: it connected to the lower ranks' addresses, and
    # the higher ranks connected to its own.
    import socket
    from hvdlite.numpy import basics
    ends = [socket.socket(fileno=os.dup(fd)) for fd in basics._links.current()[1]]
    peers, ours = {e.getpeername()[0] for e in ends}, {e.getsockname()[0] for e in ends}
    assert {f"127.0.0.{k + 1}" for k in range(r)} <= peers, f"rank {r} connected to {peers}"
    assert r == n - 1 or f"127.0.0.{r + 1}" in ours, f"rank {r} was reached on {ours}"
assert 0 <= hvd.cross_rank() < hvd.cross_size()

x = np.array([r + 1.0, -r], dtype=np.float32)
ranks = np.arange(n, dtype=np.float32)
assert np.array_equal(hvd.allreduce(x, op=hvd.Sum), [(ranks + 1).sum(), -ranks.sum()])
average = hvd.allreduce(x)  # Average by default
assert average.dtype == np.float32 and np.allclose(average, [(ranks + 1).mean(), -ranks.mean()])
assert np.array_equal(hvd.allreduce(x, op=hvd.Min), [1.0, -(n - 1.0)])
assert np.array_equal(hvd.allreduce(x, op=hvd.Max), [float(n), 0.0])
assert np.array_equal(x, [r + 1.0, -r]), "allreduce changed its input"
ints = np.array([r, -r, 7, 3 * r + 1], dtype=np.int64)
int_sum = sum(np.array([k, -k, 7, 3 * k + 1]) for k in range(n))
assert np.array_equal(hvd.allreduce(ints, op=hvd.Sum), int_sum)
assert np.array_equal(hvd.allreduce(ints), np.trunc(int_sum / n)), "integers average toward zero"
strided = np.arange(12.0).reshape(3, 4).T * (r + 1)  # non-contiguous
assert np.array_equal(hvd.allreduce(strided, op=hvd.Sum), np.arange(12.0).reshape(3, 4).T * n * (n + 1) / 2)
assert hvd.allreduce(np.zeros((0, 3))).shape == (0, 3)

time.sleep(1.2)  # outlive a few heartbeats: a static world must stay intact

gathered = hvd.allgather(np.full((r + 1, 2), r, dtype=np.float64))  # first dimension differs per rank
assert gathered.shape == (n * (n + 1) // 2, 2)
assert np.array_equal(gathered[:, 0], np.concatenate([np.full(k + 1, k) for k in range(n)]))
root = n - 1
assert np.array_equal(hvd.broadcast(np.array([r], dtype=np.int32), root_rank=root), [root])
assert hvd.broadcast_object({"from": r, "w": np.ones(3) * r}, root_rank=root)["from"] == root
assert hvd.allgather_object(r * 10) == [k * 10 for k in range(n)]
hvd.barrier()

for bad, message in ((lambda: hvd.allreduce(np.array([True])), "carry"),
                     (lambda: hvd.broadcast(x, root_rank=n), "outside the world"),
                     (lambda: hvd.allreduce(x, op=hvd.Adasum), "Adasum")):
    try:
        bad()
        raise AssertionError(f"no error mentioning {message!r}")
    except (ValueError, NotImplementedError) as e:
        assert message in str(e) and "\n" not in str(e), e
assert "torch" not in sys.modules
print(f"OK {r}", flush=True)
