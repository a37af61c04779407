"""A training loop whose state is ~STATE_MB of model (SGD, no optimizer state): every step
trains one batch and commits. Rank 0 appends to $LOG_DIR/steps.txt a line per step: its
seconds (commit included), the commit's seconds, and the minor page faults of the step.
Knobs (env): STATE_MB, STEPS, WIDTH, BATCH."""
import os
import resource
import time

import torch

import hvdlite.torch as hvd

STATE_MB = int(os.environ.get("STATE_MB", "100"))
STEPS = int(os.environ.get("STEPS", "20"))
WIDTH = int(os.environ.get("WIDTH", "2048"))
BATCH = int(os.environ.get("BATCH", "64"))

hvd.init()
torch.manual_seed(0)
layers = max(1, STATE_MB * (1 << 20) // (4 * WIDTH * (WIDTH + 1)))
model = torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH) for _ in range(layers)])
optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1e-4),
                                     named_parameters=model.named_parameters())
x = torch.randn(BATCH, WIDTH)


@hvd.elastic.run
def train(state):
    while state.step < STEPS:
        faults, start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.perf_counter()
        optimizer.zero_grad()
        model(x).pow(2).mean().backward()
        optimizer.step()
        state.step += 1
        committing = time.perf_counter()
        state.commit()
        end = time.perf_counter()
        if hvd.rank() == 0:
            faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
            with open(os.path.join(os.environ["LOG_DIR"], "steps.txt"), "a") as f:
                f.write(f"{end - start} {end - committing} {faults}\n")


train(hvd.elastic.TorchState(model, optimizer, step=0))
