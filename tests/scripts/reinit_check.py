"""init() again in the same process, as Horovod's API allows: first in a static world whose
collective failed (Horovod's test file, run in one pytest, calls init() in every test, also
after a tearDown whose barrier raised and so never called shutdown(); here rank 0 abort()s the
first world and each rank's next collective fails), then twice after shutdown() (its own tests
call shutdown in every tearDown). Each time the world is whole again, its collectives and a
process set work. Prints 'OK <rank> <size> <time>' per init after the first."""
import torch

import hvdlite.torch as hvd
from hvdlite.worker.errors import HorovodInternalError

hvd.init()
hvd.barrier()  # every rank is connected before rank 0 breaks the world
if hvd.rank() == 0:
    hvd.abort()
try:
    hvd.allreduce(torch.ones(1))
except HorovodInternalError:
    pass
else:
    raise SystemExit("the allreduce in the aborted world did not fail")
for time in range(3):  # 0: on the failed world, 1 and 2: after shutdown()
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    assert torch.equal(hvd.allreduce(torch.tensor([float(r)]), op=hvd.Sum), torch.tensor([n * (n - 1) / 2]))
    assert hvd.allgather_object(r) == list(range(n))
    evens = hvd.add_process_set(list(range(0, n, 2)))
    if r % 2 == 0:
        assert hvd.allreduce(torch.ones(1), op=hvd.Sum, process_set=evens).item() == len(range(0, n, 2))
    hvd.barrier()
    print(f"OK {r} {n} {time}", flush=True)
    hvd.shutdown()
    assert not hvd.is_initialized()
