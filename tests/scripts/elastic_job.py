"""Deterministic elastic training used by the integration tests.

Every rank appends one JSON line per finished step to $LOG_DIR/steps.jsonl: step, world size,
rank, slot, round and the dataset indices it trained on, so a test can replay the run and
check that no committed step was lost or applied twice. Knobs (env): TOTAL_STEPS, STEP_SLEEP,
BATCH, FAILS="slot:step,..." (that worker raises once at that step), RESIZE (resize.py),
RUN (logged: which run of a job resumed from --checkpoint-dir wrote the record),
DIE_CONNECTING=slot (that worker is killed once, right after publishing its gloo address for
its second group, so that its peers are left waiting for it to connect), CONNECT_FAILS=slot
(that worker's groups never connect), HOLD_AT=step (every worker, once, waits at that step
until $LOG_DIR/go exists: a long step, during which a test arranges what happens around it),
HOLD_IN_COMMIT=step (rank 0, once, waits inside the commit that ends that step, after the commit's
collective and save, before its check for host updates: its peers wait there for it, so a test
can kill it inside a commit),
START_SLEEP="slot:seconds,..." (that worker, "*" every one, sleeps before hvd.init: a slow start),
DDP=1 (the model is a DistributedDataParallel with a plain optimizer: DDP averages the gradients),
NOISE=1 (each rank draws one number a step from a generator of its own, seeded 100 + its rank and
registered with the state; the record holds it: a rank's draws go on from its own after a resume).
"""
import json
import os
import signal
import time

import torch

import hvdlite.torch as hvd
from hvdlite.torch import runtime
from hvdlite.worker import env
import resize
from jobdata import batch
from progress import write_progress

LOG_DIR = os.environ["LOG_DIR"]
TOTAL = int(os.environ.get("TOTAL_STEPS", "40"))
SLEEP = float(os.environ.get("STEP_SLEEP", "0.05"))
BATCH = int(os.environ.get("BATCH", "2"))
SLOT = os.environ[env.SLOT]
DATASET = int(os.environ.get("DATASET", "64"))
FAILS = os.environ.get("FAILS", "").split(",")
RUN = int(os.environ.get("RUN", "0"))
HOLD_AT = int(os.environ.get("HOLD_AT", "-1"))
HOLD_IN_COMMIT = int(os.environ.get("HOLD_IN_COMMIT", "-1"))
NOISE = os.environ.get("NOISE") == "1"
HOLD_LIMIT = 120.0  # seconds a held worker waits for the test's go


def log(record):
    with open(os.path.join(LOG_DIR, "steps.jsonl"), "a") as f:
        f.write(json.dumps(record) + "\n")


def once(name):
    """True the first time any worker asks for `name` (a marker file)."""
    try:
        os.close(os.open(os.path.join(LOG_DIR, name), os.O_CREAT | os.O_EXCL))
        return True
    except FileExistsError:
        return False


if os.environ.get("DIE_CONNECTING") == SLOT:
    from hvdlite.torch.store import KVStore
    publish, scopes = KVStore.set, set()

    def publish_then_die(self, key, value):
        publish(self, key, value)
        scopes.add(self.kv.scope)
        if len(scopes) == 2 and once("died-connecting"):
            os.kill(os.getpid(), signal.SIGKILL)
    KVStore.set = publish_then_die

if os.environ.get("CONNECT_FAILS") == SLOT:  # as if a firewall stood between this host and the others
    from hvdlite.torch import basics

    def refuse(info, abandoned, seen):
        raise RuntimeError("Connection refused")
    basics._group = refuse

for entry in filter(None, os.environ.get("START_SLEEP", "").split(",")):
    who, seconds = entry.rsplit(":", 1)
    if who in ("*", SLOT):
        time.sleep(float(seconds))
if HOLD_IN_COMMIT >= 0:
    check_host_updates = hvd.elastic.TorchState.check_host_updates

    def held_check(state):
        if hvd.rank() == 0 and state.step == HOLD_IN_COMMIT and once("held_in_commit"):
            deadline = time.monotonic() + HOLD_LIMIT
            while not os.path.exists(os.path.join(LOG_DIR, "go")) and time.monotonic() < deadline:
                time.sleep(0.05)
        check_host_updates(state)
    hvd.elastic.TorchState.check_host_updates = held_check

hvd.init()
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
if os.environ.get("DDP") == "1":
    model = torch.nn.parallel.DistributedDataParallel(model, init_sync=False)  # run() syncs it
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
else:
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters())
sampler = hvd.elastic.ElasticSampler(list(range(DATASET)), shuffle=True, seed=1)


@hvd.elastic.run
def train(state):
    while state.step < TOTAL:
        resize.hold(state, state.step, hvd.size)
        indices = list(state.sampler)[:BATCH]
        if not indices:  # epoch finished: start the next one
            state.sampler.set_epoch(state.sampler.epoch + 1)
            continue
        if state.step == HOLD_AT and once(f"held.{SLOT.replace('/', '_')}"):
            deadline = time.monotonic() + HOLD_LIMIT
            while not os.path.exists(os.path.join(LOG_DIR, "go")) and time.monotonic() < deadline:
                time.sleep(0.05)
        if f"{SLOT}:{state.step}" in FAILS and once(f"failed.{state.step}"):
            raise ValueError(f"injected failure at step {state.step}")
        drawn = torch.rand(1, generator=state.noise).item() if NOISE else None
        x, y = batch(indices)
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
        log({"step": state.step, "size": hvd.size(), "rank": hvd.rank(), "slot": SLOT,
             "round": runtime.info().round, "run": RUN, "epoch": state.sampler.epoch,
             "indices": indices, "pid": os.getpid(), "noise": drawn,
             # the whole world's batch, so that any one rank's record can replay the step
             "world": [share[state.sampler.local_done:][:BATCH] for share in state.sampler.shares]})
        state.sampler.record_indices(indices)
        state.step += 1
        if hvd.rank() == 0:
            write_progress(LOG_DIR, state.step)
        state.commit()
        time.sleep(SLEEP)
    with open(os.path.join(LOG_DIR, f"final.{SLOT.replace('/', '_')}.json"), "w") as f:
        json.dump({"rank": hvd.rank(), "size": hvd.size(),
                   "params": [p.detach().flatten().tolist() for p in model.parameters()]}, f)


own = {"noise": torch.Generator().manual_seed(100 + hvd.rank())} if NOISE else {}
train(hvd.elastic.TorchState(model, optimizer, sampler=sampler, step=0, **own))
