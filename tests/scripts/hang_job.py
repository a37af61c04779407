"""A training loop whose ranks misbehave on cue, for the hang tests (env knobs):
HANG="rank:step": that rank, at that step, loops in `time.sleep(1)` for good (its heartbeat
thread goes on); once per job in an elastic run (a marker file in $LOG_DIR).
SKIP="rank:step": that rank skips that step's allreduce; after the loop every rank allreduces
once more, then works alone for POST seconds (writing its results): the skipper gets there
while its peers wait in a collective it never enters.
FIRST="rank:seconds": that rank's first step takes that long more (it loads and compiles).
EVAL="seconds,...": rank 0 evaluates alone (no collectives) for each in turn, every EVAL_EVERY steps.
SLOW="rank:from:to,...": that rank sleeps SLOW_SLEEP more a step in steps [from, to) (a straggler).
STEPS, STEP_SLEEP; ELASTIC=1: the loop runs under @hvd.elastic.run with a commit a step.
API=ddp: a torchrun script instead (no hvdlite import: init_process_group("gloo") by env://,
a DDP model whose backward's allreduce is the step's collective); DIST=step: from that step on,
the script's own dist.all_reduce is the step's collective instead.
Every rank appends "rank step size" to $LOG_DIR/steps.txt."""
import os
import time

import torch
import torch.distributed as dist

DDP = os.environ.get("API") == "ddp"
if DDP:
    dist.init_process_group("gloo")
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
else:
    import hvdlite.torch as hvd

LOG_DIR = os.environ["LOG_DIR"]
STEPS = int(os.environ.get("STEPS", "40"))
SLEEP = float(os.environ.get("STEP_SLEEP", "0.05"))
HANG = tuple(int(x) for x in os.environ["HANG"].split(":")) if os.environ.get("HANG") else None
SKIP = tuple(int(x) for x in os.environ["SKIP"].split(":")) if os.environ.get("SKIP") else None
EVALS = [float(x) for x in os.environ.get("EVAL", "").split(",") if x]
EVAL_EVERY = int(os.environ.get("EVAL_EVERY", "10"))
POST = float(os.environ.get("POST", "0"))
SLOW = [tuple(int(x) for x in spec.split(":")) for spec in os.environ.get("SLOW", "").split(",") if spec]
FIRST = tuple(float(x) for x in os.environ["FIRST"].split(":")) if os.environ.get("FIRST") else None
SLOW_SLEEP = float(os.environ.get("SLOW_SLEEP", "0.3"))
JOIN = tuple(int(x) for x in os.environ["JOIN"].split(":")) if os.environ.get("JOIN") else None  # rank:steps it has data for
DIST = int(os.environ.get("DIST", STEPS))


def first_time(name):
    """Once per job: an elastic run's later worlds go on without the hang (one rank asks)."""
    marker = os.path.join(LOG_DIR, name)
    if os.path.exists(marker):
        return False
    open(marker, "w").close()
    return True


def hang_forever():
    while True:
        time.sleep(1)  # the line the driver's stack names


def step(k, weights):
    rank = dist.get_rank() if DDP else hvd.rank()
    if HANG == (rank, k) and first_time("hung"):
        hang_forever()
    if FIRST and FIRST[0] == rank and k == 0:
        time.sleep(FIRST[1])
    if DDP and k >= DIST:
        dist.all_reduce(weights)
    elif DDP:
        model(torch.ones(2, 4)).sum().backward()
    elif SKIP != (rank, k):
        weights.add_(hvd.allreduce(torch.ones(4), name=None if JOIN else "grad"))
    if rank == 0 and EVALS and k and k % EVAL_EVERY == 0 and k // EVAL_EVERY <= len(EVALS):
        time.sleep(EVALS[k // EVAL_EVERY - 1])  # evaluating alone
    time.sleep(SLEEP)
    if any(slow == rank and start <= k < end for slow, start, end in SLOW):
        time.sleep(SLOW_SLEEP)
    with open(os.path.join(LOG_DIR, "steps.txt"), "a") as f:
        f.write(f"{rank} {k} {dist.get_world_size() if DDP else hvd.size()}\n")


weights = torch.zeros(4)
if DDP:
    for k in range(STEPS):
        step(k, weights)
elif os.environ.get("ELASTIC") == "1":
    hvd.init()
    state = hvd.elastic.TorchState(weights=weights, step=0)

    @hvd.elastic.run
    def train(state):
        while state.step < STEPS:
            step(state.step, state.weights)
            state.step += 1
            state.commit()

    train(state)
else:
    hvd.init()
    for k in range(JOIN[1] if JOIN and JOIN[0] == hvd.rank() else STEPS):
        step(k, weights)
    if JOIN:
        hvd.join()  # out of data: answers the others' allreduces until they are out too
    hvd.allreduce(torch.ones(4), name="grad")  # alike, so that only the count tells a skip
    time.sleep(POST)  # after training, alone
