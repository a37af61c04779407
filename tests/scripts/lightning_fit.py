"""A Lightning fit on 2 epochs: STRATEGY=hvdlite (HvdliteStrategy, under hvdlite run) or ddp
(Lightning's own, under torchrun). Each rank writes OUT_DIR/rank<r>.json: the samples it
trained on and a hash of the final parameters. SLOW="rank:seconds": that rank sleeps that long
in each training step before the step's loss is logged with sync_dist (Lightning's own
torch.distributed.all_reduce, where its peers wait for it)."""
import hashlib
import json
import os
import time

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, TensorDataset


class Model(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
        self.samples = 0

    def training_step(self, batch, batch_idx):
        x, y = batch
        self.samples += len(x)
        loss = torch.nn.functional.mse_loss(self.layers(x), y)
        if SLOW and SLOW[0] == self.global_rank:
            time.sleep(SLOW[1])
        self.log("loss", loss, sync_dist=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


SLOW = tuple(float(x) for x in os.environ["SLOW"].split(":")) if os.environ.get("SLOW") else None
if os.environ["STRATEGY"] == "hvdlite":
    from hvdlite.lightning import HvdliteStrategy
    strategy, devices = HvdliteStrategy(), "auto"
else:
    strategy, devices = "ddp", int(os.environ["LOCAL_WORLD_SIZE"])
torch.manual_seed(0)
data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
model = Model()
trainer = pl.Trainer(strategy=strategy, accelerator="cpu", devices=devices, max_epochs=2, logger=False,
                     enable_progress_bar=False, enable_checkpointing=False, enable_model_summary=False)
trainer.fit(model, DataLoader(data, batch_size=8))
digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()
with open(os.path.join(os.environ["OUT_DIR"], f"rank{trainer.global_rank}.json"), "w") as f:
    json.dump({"size": trainer.world_size, "samples": model.samples, "params": digest}, f)
if os.environ["STRATEGY"] == "ddp":
    # As torch asks of every script (hvdlite does it at exit for its own): a gloo group left to the
    # interpreter's end can abort it, "terminate called without an active exception" (pytorch#190489).
    torch.distributed.destroy_process_group()
