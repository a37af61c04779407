"""A worker that writes the job's secret it holds to DIR/secret.RANK, waits for DIR/go (60 s at
most), then sums its rank with the others': the tests that watch a job's traffic for the secret."""
import os
import sys
import time

import torch

import hvdlite.torch as hvd
from hvdlite.worker import env

folder = sys.argv[1]
hvd.init()
with open(os.path.join(folder, f"secret.{hvd.rank()}"), "w") as f:
    f.write(os.environ[env.SECRET])
deadline = time.monotonic() + 60
while not os.path.exists(os.path.join(folder, "go")) and time.monotonic() < deadline:
    time.sleep(0.1)
assert hvd.allreduce(torch.tensor([float(hvd.rank())]), op=hvd.Sum).item() == sum(range(hvd.size()))
print("OK", hvd.rank())
