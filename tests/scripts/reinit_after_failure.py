"""init() in a static world whose collective failed starts afresh, as init() after shutdown():
Horovod's test file, run in one pytest, calls init() in every test, also after a tearDown
whose barrier raised and so never called shutdown(). Here rank 0 abort()s the first world;
each rank's next collective fails, and the next init() forms a whole world again. Prints
'OK <rank> <size>'."""
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
hvd.init()
assert hvd.allreduce(torch.ones(1), op=hvd.Sum).item() == hvd.size()
assert hvd.allgather_object(hvd.rank()) == list(range(hvd.size()))
print(f"OK {hvd.rank()} {hvd.size()}", flush=True)
