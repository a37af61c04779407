"""An elastic Lightning fit (HvdliteStrategy) whose worker in slot $VICTIM kills itself (kill -9)
once, in epoch $KILL_EPOCH. Rank 0 of each world appends "epoch size pid" to
$LOG_DIR/epochs at each epoch's end; each finishing worker writes $LOG_DIR/final.<pid>.json."""
import hashlib
import json
import os
import signal

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

from hvdlite.lightning import HvdliteStrategy

LOG_DIR = os.environ["LOG_DIR"]
EPOCHS = int(os.environ.get("EPOCHS", "4"))


class Model(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        if (self.current_epoch == int(os.environ["KILL_EPOCH"]) and batch_idx == 2
                and os.environ["HVDLITE_SLOT"] == os.environ["VICTIM"]):
            os.kill(os.getpid(), signal.SIGKILL)
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def on_train_epoch_end(self):
        if self.trainer.global_rank == 0:
            with open(os.path.join(LOG_DIR, "epochs"), "a") as f:
                f.write(f"{self.current_epoch} {self.trainer.world_size} {os.getpid()}\n")

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


torch.manual_seed(0)
data = TensorDataset(torch.randn(96, 4), torch.randn(96, 1))
model = Model()
trainer = pl.Trainer(strategy=HvdliteStrategy(commit_every=int(os.environ.get("COMMIT_EVERY", "0"))),
                     accelerator="cpu", max_epochs=EPOCHS, logger=False, enable_progress_bar=False,
                     enable_checkpointing=False, enable_model_summary=False)
trainer.fit(model, DataLoader(data, batch_size=8))
digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()
with open(os.path.join(LOG_DIR, f"final.{os.getpid()}.json"), "w") as f:
    json.dump({"epoch": trainer.current_epoch, "size": trainer.world_size, "params": digest}, f)
