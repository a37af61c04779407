"""An elastic job whose script keeps a static job's top-level broadcast_parameters: fine for
the first world, not for a worker that joins later (its peers are syncing in run()). Rank 0
writes its step to $LOG_DIR/progress; TOTAL_STEPS, STEP_SLEEP."""
import os
import time

import torch

import hvdlite.torch as hvd

TOTAL = int(os.environ.get("TOTAL_STEPS", "30"))
hvd.init()
model = torch.nn.Linear(4, 1)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)  # the static job's habit
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)


@hvd.elastic.run
def train(state):
    while state.step < TOTAL:
        hvd.allreduce(torch.ones(1))
        state.step += 1
        if hvd.rank() == 0:
            with open(os.path.join(os.environ["LOG_DIR"], "progress"), "w") as f:
                f.write(str(state.step))
        state.commit()
        time.sleep(float(os.environ.get("STEP_SLEEP", "0.05")))


train(hvd.elastic.TorchState(model, optimizer, step=0))
