"""hvdlite.numpy: rank 1 loops in `time.sleep(1)` at step 10 while its peers wait in the next
allreduce, where pygloo holds their GIL (their own heartbeats fall silent; their stand-ins beat)."""
import time

import numpy as np

import hvdlite.numpy as hvd

hvd.init()
for k in range(40):
    if hvd.rank() == 1 and k == 10:
        while True:
            time.sleep(1)  # the line the driver's stack names
    hvd.allreduce(np.ones(4, dtype=np.float32), name="grad")
    time.sleep(0.05)
