"""Benchmark worker: a tiny GPT-2 trained by hvdlite's ElasticTrainer (or, with
BASELINE=torchrun, by transformers' Trainer under torchrun) until $STOP_FILE exists.

Appends "time round rank size" for every optimizer step to $LOG_DIR/<pid>.log: the world's
round under hvdlite, torchrun's restart count under torchrun.
"""
import os
import time

import torch

if os.environ.get("BASELINE") == "torchrun":
    from transformers import Trainer

    def world_round():
        return int(os.environ["TORCHELASTIC_RESTART_COUNT"])
else:
    from hvdlite.transformers import ElasticTrainer as Trainer
    import hvdlite.torch as hvd

    def world_round():
        return hvd.runtime.info().round
from transformers import GPT2Config, GPT2LMHeadModel, TrainerCallback, TrainingArguments  # noqa: E402

LOG = open(os.path.join(os.environ["LOG_DIR"], f"{os.getpid()}.log"), "a", buffering=1)
STOP = os.environ["STOP_FILE"]


class Steps(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        import torch.distributed as dist
        LOG.write(f"{time.time():.6f} {world_round()} {dist.get_rank()} {dist.get_world_size()}\n")
        control.should_training_stop = os.path.exists(STOP)


class Tokens(torch.utils.data.Dataset):
    def __init__(self):
        self.ids = torch.randint(0, 64, (48, 8), generator=torch.Generator().manual_seed(1))

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, n_positions=8, vocab_size=64))
args = TrainingArguments(output_dir=os.path.join(os.environ["LOG_DIR"], "trainer"), per_device_train_batch_size=4,
                         max_steps=10 ** 6, save_strategy="no", report_to=[], disable_tqdm=True, use_cpu=True)
Trainer(model=model, args=args, train_dataset=Tokens(), callbacks=[Steps()]).train()
