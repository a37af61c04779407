"""hvdlite.numpy's part of the Horovod API on every rank (torch-free); prints 'OK <rank>'."""
import json
import os
import sys

import numpy as np

import hvdlite.numpy as hvd

hvd.init()
r, n = hvd.rank(), hvd.size()
rows = 2 * n + 1  # uneven: rank 0 gets one row more
counts = [2 + (1 if k == 0 else 0) for k in range(n)]
start = sum(counts[:r])
t = np.arange(rows * 2, dtype=np.float32).reshape(rows, 2) * (r + 1)
total = np.arange(rows * 2, dtype=np.float32).reshape(rows, 2) * (n * (n + 1) / 2)
mine = total[start:start + counts[r]]
assert np.array_equal(hvd.reducescatter(t, op=hvd.Sum), mine)
assert np.allclose(hvd.reducescatter(t), mine / n)
assert np.allclose(hvd.reducescatter(t, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.25), mine / 2)
ints = np.full((n, 3), r + 1, dtype=np.int64)
assert np.array_equal(hvd.reducescatter(ints, op=hvd.Sum), np.full((1, 3), n * (n + 1) // 2))
assert np.array_equal(t, np.arange(rows * 2, dtype=np.float32).reshape(rows, 2) * (r + 1)), "input changed"
for name, call in (("alltoall", lambda: hvd.alltoall(t)), ("join", hvd.join),
                   ("process sets", lambda: hvd.add_process_set([0])),
                   ("Adasum", lambda: hvd.allreduce(t, op=hvd.Adasum))):
    try:
        call()
        raise AssertionError(f"{name} did not raise")
    except NotImplementedError as e:
        assert name in str(e) and "hvdlite.torch" in str(e), e
try:
    hvd.reducescatter(t, op=hvd.Max)
    raise AssertionError("reducescatter Max did not raise")
except ValueError:
    pass
# The collectives are traced, named by name= where given, into the file at rank 0's path.
timeline = os.path.join(os.environ["TIMELINE_DIR"], "timeline.json")
hvd.start_timeline(timeline)
hvd.allreduce(np.ones(3), name="grad")
hvd.barrier()
hvd.stop_timeline()
hvd.barrier()
if r == 0:
    with open(timeline) as f:
        spans = [(e["name"], e["args"].get("op"), e["pid"]) for e in json.load(f)["traceEvents"] if e["ph"] == "B"]
    assert {name for name, _, _ in spans} == {"grad", "barrier"}, spans
    assert all(op == "allreduce" for name, op, _ in spans if name == "grad"), spans
    assert len({pid for _, _, pid in spans}) == n, spans  # every rank's part, on this host
assert "torch" not in sys.modules
print(f"OK {r}", flush=True)
