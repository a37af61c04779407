"""Worker of bench/stall.py: one small allreduce + commit per step, forever, on the backend named
by $STALL_BACKEND (torch or numpy). Appends "time pid round rank size" per step to $LOG_DIR/steps
and, on SIGUSR2, every thread's Python stack to $LOG_DIR/stacks.<pid> (faulthandler needs no GIL:
it works while pygloo holds it; SIGUSR1 is hvdlite's: it stops the job)."""
import faulthandler
import os
import signal
import time

LOG_DIR = os.environ["LOG_DIR"]
STEPS = os.open(os.path.join(LOG_DIR, "steps"), os.O_WRONLY | os.O_APPEND | os.O_CREAT)
faulthandler.register(signal.SIGUSR2, open(os.path.join(LOG_DIR, f"stacks.{os.getpid()}"), "w"),
                      all_threads=True)
SLEEP = float(os.environ.get("STEP_SLEEP", "0.02"))

if os.environ.get("STALL_BACKEND") == "torch":
    import torch
    import hvdlite.torch as hvd
    one = torch.ones(1)
else:
    import numpy as np
    import hvdlite.numpy as hvd
    one = np.ones(1)


@hvd.elastic.run
def train(state):
    while True:
        hvd.allreduce(one, op=hvd.Sum)
        os.write(STEPS, f"{time.time():.6f} {os.getpid()} {hvd.elastic.BACKEND.info().round} "
                        f"{hvd.rank()} {hvd.size()}\n".encode())
        state.step += 1
        state.commit()
        time.sleep(SLEEP)


hvd.init()
train(hvd.elastic.ObjectState(step=0))
