"""TorchState with two models, two optimizers and a scheduler in an elastic job.

Every rank starts from different weights (seed rank + 1); every entry into train() checks that
all ranks hold rank 0's state, the objects the script holds included. VICTIM="slot:step" kills
that worker (SIGKILL) between the generator's and the discriminator's step, so survivors must
roll the generator, its optimizer and the scheduler back. Writes $LOG_DIR/entries.jsonl (one
line per entry into train) and final.<slot>.json.
"""
import json
import os
import signal

import torch

import hvdlite.torch as hvd
from hvdlite.torch import runtime
from hvdlite.worker import env
from api_gan import build, data, flat, step_discriminator, step_generator

LOG_DIR = os.environ["LOG_DIR"]
TOTAL = int(os.environ.get("TOTAL_STEPS", "20"))
SLOT = os.environ[env.SLOT]
VICTIM, _, KILL_AT = os.environ.get("VICTIM", "").partition(":")

hvd.init()
gen, disc, opt_g, opt_d, sched = build(hvd.rank() + 1, lambda opt, model: hvd.DistributedOptimizer(
    opt, named_parameters=model.named_parameters()))
rank0_start = flat(*build(1)[:2])


@hvd.elastic.run
def train(state):
    assert (state.model, state.optimizer, state.disc, state.opt_d, state.sched) == \
        (gen, opt_g, disc, opt_d, sched), "TorchState replaced the script's objects"
    mine = flat(gen, disc, opt_g, opt_d)
    everyone = hvd.allgather(mine.unsqueeze(0))
    assert all(torch.equal(everyone[0], other) for other in everyone), "ranks differ after sync"
    if state.step == 0:
        assert torch.equal(flat(gen, disc), rank0_start), "not synced from rank 0"
    if hvd.rank() == 0:
        with open(os.path.join(LOG_DIR, "entries.jsonl"), "a") as f:
            f.write(json.dumps({"step": state.step, "size": hvd.size(),
                                "round": runtime.info().round}) + "\n")
    while state.step < TOTAL:
        x, y, z = data(state.step, hvd.rank(), hvd.size())
        step_generator(gen, opt_g, x, y)
        sched.step()
        if SLOT == VICTIM and state.step == int(KILL_AT):
            os.kill(os.getpid(), signal.SIGKILL)
        step_discriminator(gen, disc, opt_d, x, z)
        state.step += 1
        state.commit()
    with open(os.path.join(LOG_DIR, f"final.{SLOT.replace('/', '_')}.json"), "w") as f:
        json.dump({"size": hvd.size(), "state": flat(gen, disc, opt_g, opt_d).tolist()}, f)


train(hvd.elastic.TorchState(model=gen, optimizer=opt_g, disc=disc, opt_d=opt_d, sched=sched, step=0))
