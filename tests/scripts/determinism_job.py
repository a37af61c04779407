"""A Horovod-style elastic job whose result shows whether a recovery changed what it computed.

Dropout, SGD with momentum, a DataLoader with worker processes over an ElasticSampler, and
only Horovod's API: TorchState(model, optimizer, sampler=...). Two checks fail loudly:
- every sample of an epoch trained exactly once: each step all-reduces a one-hot of its
  batch's sample ids into a counter kept in the state (so a rollback undoes it with the
  rest); at each epoch's end rank 0 prints `EPOCH e exactly-once` or `EPOCH e NOT exactly-once`;
- the final parameters and momentum buffers, hashed: rank 0 prints `HASH <sha256>`.
Rank 0 writes $LOG_DIR/final.json (hash, epochs checked) and appends each committed step's
world-mean loss to $LOG_DIR/losses.jsonl. Knobs (env): EPOCHS, BATCH, WORKERS (loader worker
processes), STEP_SLEEP, DATA=digits (scikit-learn's 8x8 digits instead of synthetic data),
LOADER=stateful (torchdata's StatefulDataLoader over its StatefulDistributedSampler, held in the
state as `loader`, instead of a DataLoader over an ElasticSampler: a fixed world size only),
HOLD_AT=24 (before the commit of step 24) or HOLD_AT=epoch1 (before the commit that ends epoch 1):
every worker waits there until $LOG_DIR/go exists or it heard that the job stops, so that a test
lands a fault at that very commit; rank 0 makes $LOG_DIR/held when it waits. RESIZE (resize.py):
the job waits after the commit of each listed step until the world has the listed size.

STYLE (env, comma-separated; empty: zero_grad() before backward, one SGD) writes the loop as
other scripts do, each thing it names held in the state: `after` zeroes the gradients after
step(); `accumulate` steps every second batch (backward_passes_per_step=2, or no_sync() with
`ddp`), committing between the two backward passes; `scaler` a GradScaler whose scale grows
every step until it overflows (steps skipped, backoff); `scheduler` an ExponentialLR per
optimizer; `two-optimizers` SGD for the first layer, Adam for the last; `generators` input noise
and a loss weight drawn from a torch.Generator (the loader's generator too), a numpy Generator
and a random.Random of the script's; `ddp` a DistributedDataParallel model with plain
optimizers; `rank0-handler` a StateHandler of the script's that syncs from rank 0 (refused when
the root is another rank). final.json then holds every rank's loss scale too.
"""
import contextlib
import hashlib
import json
import os
import random
import time

import numpy as np
import torch

import hvdlite.torch as hvd
from hvdlite.worker.session import session
import resize
from progress import write_progress

LOG_DIR = os.environ["LOG_DIR"]
EPOCHS = int(os.environ.get("EPOCHS", "3"))
BATCH = int(os.environ.get("BATCH", "4"))
WORKERS = int(os.environ.get("WORKERS", "2"))
SLEEP = float(os.environ.get("STEP_SLEEP", "0.02"))
HOLD_AT = os.environ.get("HOLD_AT")
HOLD_LIMIT = 60.0  # seconds a held worker waits for the test
STYLE = set(filter(None, os.environ.get("STYLE", "").split(",")))


def data():
    if os.environ.get("DATA") == "digits":
        from sklearn.datasets import load_digits
        digits = load_digits()
        x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
        return x, torch.tensor(digits.target), 10
    g = torch.Generator().manual_seed(1)
    x = torch.randn(96, 8, generator=g)
    return x, (x.sum(1) > 0).long(), 2


class Samples(torch.utils.data.Dataset):
    """(id, x, y); x gets a little noise drawn in the loader's worker process."""

    def __init__(self, x, y):
        self.x, self.y = x, y

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        # seeded by the sample: what a worker draws does not depend on which worker it is
        noise = torch.randn(self.x.shape[1], generator=torch.Generator().manual_seed(i)) * 0.01
        return i, self.x[i] + noise, self.y[i]


hvd.init()
torch.manual_seed(0)
random.seed(0)
np.random.seed(0)
x, y, classes = data()
dataset = Samples(x, y)
net = torch.nn.Sequential(torch.nn.Linear(x.shape[1], 32), torch.nn.ReLU(), torch.nn.Dropout(0.3),
                          torch.nn.Linear(32, classes))
model = torch.nn.parallel.DistributedDataParallel(net, init_sync=False) if "ddp" in STYLE else net  # run() syncs it
groups = [list(net[0].parameters()), list(net[3].parameters())] if "two-optimizers" in STYLE \
    else [list(net.parameters())]
optimizers = [torch.optim.SGD(groups[0], lr=0.05, momentum=0.9)] + [torch.optim.Adam(g, lr=0.01) for g in groups[1:]]
if "ddp" not in STYLE:
    optimizers = [hvd.DistributedOptimizer(
        o, named_parameters=[(n, p) for n, p in net.named_parameters() if any(p is q for q in g)],
        backward_passes_per_step=2 if "accumulate" in STYLE else 1) for o, g in zip(optimizers, groups)]
optimizer = optimizers[0]
own = {}
if "scaler" in STYLE:
    own["scaler"] = torch.amp.GradScaler("cpu", init_scale=2.0 ** 110, growth_interval=1)
if "scheduler" in STYLE:
    own.update({f"scheduler{i}": torch.optim.lr_scheduler.ExponentialLR(o, 0.98) for i, o in enumerate(optimizers)})
if len(optimizers) > 1:
    own["second"] = optimizers[1]
if "rank0-handler" in STYLE:  # a handler written for Horovod, which syncs from rank 0: refused
    class Tally:
        n = 0

    class TallyHandler(hvd.elastic.StateHandler):
        def save(self):
            self._saved = self.value.n

        def restore(self):
            self.value.n = self._saved

        def sync(self):
            self.value.n = hvd.broadcast_object(self.value.n, root_rank=0)
    hvd.elastic.register_handler(Tally, TallyHandler)
    own["tally"] = Tally()
if "generators" in STYLE:
    own.update(noise=torch.Generator().manual_seed(5), weights=np.random.default_rng(6), pick=random.Random(7))
if os.environ.get("LOADER") == "stateful":
    from torchdata.stateful_dataloader import StatefulDataLoader
    from torchdata.stateful_dataloader.sampler import StatefulDistributedSampler
    sampler = StatefulDistributedSampler(dataset, num_replicas=hvd.size(), rank=hvd.rank(), seed=0)
    loader = StatefulDataLoader(dataset, batch_size=BATCH, sampler=sampler, num_workers=WORKERS)
    held = {"loader": loader}
else:
    sampler = hvd.elastic.ElasticSampler(dataset, shuffle=True, seed=0)
    loader = torch.utils.data.DataLoader(dataset, batch_size=BATCH, sampler=sampler, num_workers=WORKERS,
                                         generator=own.get("noise"))
    held = {"sampler": sampler}
held.update(own)


def not_padding(batch_idx, count):
    """Which of the batch's samples are not the padding that evens out the split (repeats)."""
    if not isinstance(sampler, hvd.elastic.ElasticSampler):
        return torch.ones(count, dtype=torch.bool)  # the sizes here divide the data
    first = batch_idx * BATCH
    return torch.tensor([(first + i) * sampler.size + sampler.rank < len(sampler.remaining)
                         for i in range(count)])


def log(name, record):
    with open(os.path.join(LOG_DIR, name), "a") as f:
        f.write(json.dumps(record) + "\n")


def hold(point):
    """Wait at `point` (HOLD_AT) for the test's go or the job's stop, once in the job."""
    go = os.path.join(LOG_DIR, "go")
    if point != HOLD_AT or os.path.exists(go):
        return
    if hvd.rank() == 0:
        open(os.path.join(LOG_DIR, "held"), "w").close()
    deadline = time.monotonic() + HOLD_LIMIT
    while not (os.path.exists(go) or session().stopping):
        if time.monotonic() > deadline:
            raise SystemExit(f"held at {point} for {HOLD_LIMIT:g} s: the test never let go")
        time.sleep(0.02)


def fingerprint():
    digest = hashlib.sha256()
    for p in net.parameters():
        digest.update(p.detach().numpy().tobytes())
    for o in optimizers:
        for p in (p for group in o.param_groups for p in group["params"]):
            for _, value in sorted(o.state[p].items()):
                digest.update(value.numpy().tobytes())
    return digest.hexdigest()


def train_step(step, inputs, targets):
    """One batch as STYLE writes it; returns its loss."""
    weight = 1.0
    if "generators" in STYLE:
        inputs = inputs + 0.01 * torch.randn(inputs.shape, generator=own["noise"])
        weight = 1.0 + 0.1 * own["weights"].random() + 0.1 * own["pick"].random()
    accumulate = "accumulate" in STYLE
    last = not accumulate or step % 2 == 1  # the second backward pass steps
    if not (accumulate or "after" in STYLE):
        for o in optimizers:
            o.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(inputs), targets) * weight
    scaled = own["scaler"].scale(loss) if "scaler" in STYLE else loss
    with model.no_sync() if "ddp" in STYLE and not last else contextlib.nullcontext():
        scaled.backward()
    if not last:
        return loss
    for o in optimizers:
        if "scaler" not in STYLE:
            o.step()
        elif "ddp" in STYLE:
            own["scaler"].step(o)
        else:  # Horovod's way: the gradients averaged before they are unscaled
            o.synchronize()
            own["scaler"].unscale_(o)
            with o.skip_synchronize():
                own["scaler"].step(o)
    if "scaler" in STYLE:
        own["scaler"].update()
    for i in range(len(optimizers)):
        if f"scheduler{i}" in own:
            own[f"scheduler{i}"].step()
    if accumulate or "after" in STYLE:
        for o in optimizers:
            o.zero_grad()
    return loss


@hvd.elastic.run
def train(state):
    for epoch in range(state.epoch, EPOCHS):
        sampler.set_epoch(epoch)
        net.train()
        for batch_idx, (ids, inputs, targets) in enumerate(loader):
            loss = train_step(state.step, inputs, targets)
            seen = torch.zeros(len(dataset))
            seen.index_add_(0, ids, not_padding(batch_idx, len(ids)).float())
            state.seen += hvd.allreduce(seen, op=hvd.Sum)
            if "sampler" in held:
                sampler.record_batch(batch_idx, BATCH)
            state.step += 1
            mean = hvd.allreduce(loss.detach(), op=hvd.Average).item()
            if hvd.rank() == 0:
                log("losses.jsonl", {"step": state.step, "loss": mean, "size": hvd.size(), "epoch": epoch})
                write_progress(LOG_DIR, state.step)
            hold(str(state.step))
            state.commit()
            resize.hold(state, state.step, hvd.size)
            time.sleep(SLEEP)
        once = bool((state.seen == 1).all())
        if hvd.rank() == 0:
            print(f"EPOCH {epoch} {'exactly-once' if once else 'NOT exactly-once'}"
                  + ("" if once else f": counts {sorted(set(state.seen.int().tolist()))}"), flush=True)
        state.checked.append(once)
        state.seen = torch.zeros(len(dataset))
        state.epoch = epoch + 1
        hold(f"epoch{epoch}")
        state.commit()
    scales = hvd.allgather_object(own["scaler"].get_scale() if "scaler" in own else None)
    if hvd.rank() == 0:
        net.eval()
        accuracy = (net(x).argmax(1) == y).float().mean().item()
        print(f"HASH {fingerprint()}", flush=True)
        with open(os.path.join(LOG_DIR, "final.json"), "w") as f:
            json.dump({"hash": fingerprint(), "epochs": state.checked, "accuracy": accuracy, "scales": scales}, f)


train(hvd.elastic.TorchState(model, optimizer, **held, epoch=0, step=0,
                             seen=torch.zeros(len(dataset)), checked=[]))
