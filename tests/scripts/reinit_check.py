"""init() after shutdown() in the same process, as Horovod's API allows (its own tests call
init in every test and shutdown in every tearDown): each time the world is whole again, its
collectives and a process set work. Prints 'OK <rank> <size> <time>' per init."""
import torch

import hvdlite.torch as hvd

for time in range(3):
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
