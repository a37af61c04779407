"""A tiny GPT-2 trained by Hugging Face's Trainer and then by a plain Accelerate loop
(TRAINER=plain), or by hvdlite's ElasticTrainer (TRAINER=elastic), on token data made here (no
hub). Each rank writes $OUT_DIR/rank<r>.<pid>.json: its world, global step, losses and hashes
of the final parameters. Knobs: EPOCHS, COMMIT_EVERY, SAVE_DIR (trainer.save_model there),
SAVE_STRATEGY (the Trainer's checkpoints, every 3 steps).

Every micro-batch trained appends "round step rank size sample..." to $OUT_DIR/samples: the
world's round (a step replayed after a rollback has a later one) and the optimizer step it
counts for. Faults, at the beginning of an optimizer step: KILL_STEP (the worker in slot
$VICTIM kills itself, kill -9), HOLD_STEP (every worker waits until the job stops: the test
sends SIGTERM), GROW_STEP (every worker waits until the driver announced a host update)."""
import hashlib
import json
import os
import signal
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
TRAINER = os.environ.get("TRAINER", "plain")
if TRAINER == "elastic":
    from hvdlite.transformers import ElasticTrainer as Trainer  # the one changed line
else:
    from transformers import Trainer
import torch  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel, TrainerCallback, TrainingArguments  # noqa: E402

OUT_DIR = os.environ["OUT_DIR"]
SAMPLES, LENGTH, VOCAB = 48, 8, 64


class Tokens(torch.utils.data.Dataset):
    """Sample i: tokens drawn from a generator seeded once; its first two tokens say i."""

    def __init__(self):
        self.ids = torch.randint(0, VOCAB, (SAMPLES, LENGTH), generator=torch.Generator().manual_seed(1))
        self.ids[:, 0], self.ids[:, 1] = torch.arange(SAMPLES) // VOCAB, torch.arange(SAMPLES) % VOCAB

    def __len__(self):
        return SAMPLES

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def digest(model):
    return hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()


def world():
    import torch.distributed as dist
    return dist.get_rank(), dist.get_world_size()


def record(model, step_of):
    """Append each micro-batch's samples, with the step they count for, to $OUT_DIR/samples."""
    def hook(module, args, kwargs):
        ids = kwargs["input_ids"]
        rank, size = world()
        hvd = sys.modules.get("hvdlite.torch")  # a world's round: a step replayed after a rollback has a later one
        stamp = hvd.runtime.info().round if hvd is not None and hvd.is_initialized() else 0
        with open(os.path.join(OUT_DIR, "samples"), "a") as f:
            f.write(f"{stamp} {step_of()} {rank} {size} "
                    + " ".join(str(int(a) * VOCAB + int(b)) for a, b in ids[:, :2].tolist()) + "\n")
    model.register_forward_pre_hook(hook, with_kwargs=True)


def wait_for(what, condition):
    import time
    deadline = time.monotonic() + 120
    while not condition():
        if time.monotonic() > deadline:
            sys.exit(f"hf_train.py: no {what} within 120 s")
        time.sleep(0.05)


class Faults(TrainerCallback):
    """Rank 0 writes the step it begins to $OUT_DIR/progress (discover.py reads it)."""

    def on_step_begin(self, args, state, control, **kwargs):
        step = state.global_step + 1
        if state.is_world_process_zero:
            with open(os.path.join(OUT_DIR, "progress"), "w") as f:
                f.write(str(step))
        if step == int(os.environ.get("KILL_STEP", 0)) and os.environ.get("HVDLITE_SLOT") == os.environ.get("VICTIM"):
            os.kill(os.getpid(), signal.SIGKILL)
        if step == int(os.environ.get("HOLD_STEP", 0)):  # until the test stopped the job (SIGTERM)
            from hvdlite.worker.session import session
            open(os.path.join(OUT_DIR, "held"), "w").close()
            wait_for("stop", lambda: session().stopping)
        if step == int(os.environ.get("GROW_STEP", 0)):  # until the driver told of the new host
            import hvdlite.torch as hvd
            from hvdlite.worker.session import session
            wait_for("host update", lambda: session().updates > hvd.runtime.info().updates)


def accelerate_loop():
    """A plain Accelerate loop, unchanged: its final parameters' hash."""
    from accelerate import Accelerator
    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(CONFIG)
    loader = torch.utils.data.DataLoader(Tokens(), batch_size=4, shuffle=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    prepared, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for epoch in range(2):
        for batch in loader:
            optimizer.zero_grad()
            accelerator.backward(prepared(**batch).loss)
            optimizer.step()
    return {"accelerate": digest(model), "accelerate_size": accelerator.num_processes}


CONFIG = GPT2Config(n_layer=2, n_embd=32, n_head=2, n_positions=LENGTH, vocab_size=VOCAB)
torch.manual_seed(0)
model = GPT2LMHeadModel(CONFIG)
data = Tokens()
args = TrainingArguments(output_dir=os.path.join(OUT_DIR, "trainer"), per_device_train_batch_size=4,
                         num_train_epochs=int(os.environ.get("EPOCHS", "2")), learning_rate=1e-3,
                         logging_steps=1, save_strategy=os.environ.get("SAVE_STRATEGY", "no"), save_steps=3,
                         report_to=[], seed=0, disable_tqdm=True, use_cpu=True)
extra = {"commit_every": int(os.environ["COMMIT_EVERY"])} if "COMMIT_EVERY" in os.environ else {}
trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[Faults()], **extra)
record(model, lambda: trainer.state.global_step + 1)
trainer.train()
if os.environ.get("SAVE_DIR"):
    trainer.save_model(os.environ["SAVE_DIR"])
rank, size = world()
out = {"steps": trainer.state.global_step, "epoch": trainer.state.epoch,
       "log": [e.get("loss") for e in trainer.state.log_history], "rank": rank, "size": size,
       "seen_by_accelerate": [trainer.accelerator.num_processes, trainer.args.world_size, trainer.args.process_index],
       "params": digest(model), **(accelerate_loop() if TRAINER == "plain" else {})}
with open(os.path.join(OUT_DIR, f"rank{rank}.{os.getpid()}.json"), "w") as f:
    json.dump(out, f)
if "HVDLITE_RANK" not in os.environ and torch.distributed.is_initialized():
    # torchrun's run: as torch asks of every script (hvdlite does it at exit for its own), else
    # the gloo group left to the interpreter's end can abort it (pytorch#190489).
    torch.distributed.destroy_process_group()
