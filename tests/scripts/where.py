"""Prints '<rank> <hostname> <allreduce sum>' for the multi-host tests."""
import socket

import torch

import hvdlite.torch as hvd

hvd.init()
total = hvd.allreduce(torch.tensor([float(hvd.rank())]), op=hvd.Sum).item()
assert total == sum(range(hvd.size()))
print(hvd.rank(), socket.gethostname(), hvd.local_rank(), hvd.cross_rank())
