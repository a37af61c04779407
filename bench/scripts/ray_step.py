"""The model and step bench/ray.py runs on both sides (hvdlite on Ray, Ray Train), and hvdlite's
side of it: `python ray_step.py` under `hvdlite run --ray`.

Rank 0 appends {"t", "step", "size"} to $STEP_LOG after every step; the bench reads it.
"""
import json
import os
import time

import torch

STEPS = int(os.environ.get("TOTAL_STEPS", "100000"))
PACE = float(os.environ.get("STEP_SLEEP", "0.05"))  # the rest of a real step, per step


def model_and_optimizer():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
    return model, torch.optim.SGD(model.parameters(), lr=0.01)


def step(model, optimizer, n):
    g = torch.Generator().manual_seed(n)
    x, y = torch.randn(32, 256, generator=g), torch.randn(32, 1, generator=g)
    optimizer.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    optimizer.step()
    time.sleep(PACE)


def record(n, size):
    with open(os.environ["STEP_LOG"], "a") as f:
        f.write(json.dumps({"t": time.time(), "step": n, "size": size}) + "\n")


def main():
    import hvdlite.torch as hvd
    hvd.init()
    model, optimizer = model_and_optimizer()
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(model=model, optimizer=optimizer, step=0)

    @hvd.elastic.run
    def train(state):
        while state.step < STEPS:
            step(model, optimizer, state.step)
            state.step += 1
            if hvd.rank() == 0:
                record(state.step, hvd.size())
            state.commit()

    train(state)


if __name__ == "__main__":
    main()
