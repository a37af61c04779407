"""Prints '<rank> <host> <repr of CUDA_VISIBLE_DEVICES> | <the slot's GPU line>': the GPUs the
launch left this worker, and the one its slot picks among them (as many as listed)."""
import os
import socket

import hvdlite.torch as hvd
from hvdlite.worker import gpus

hvd.init()
visible = os.environ.get(gpus.VISIBLE)
count = len([d for d in (visible or "").split(",") if d])
print(hvd.rank(), socket.gethostname(), repr(visible), "|", gpus.line(count))
