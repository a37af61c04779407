"""An elastic job on NCCL whose slots share one GPU: each slot its own NCCL_HOSTID, and the
socket transport (NCCL refuses two ranks of one host on one device otherwise). At steps 5 and
10 the world's last rank kills itself (-9) while the others wait in an allreduce (once each:
KILL_MARK.<step>); rank 0 goes on in its process and prints 'recovered on <backend> ...' with
how long the failure took to get past. Two slots: one kill; three (bench/gpu_smoke.py): two."""
import os
import signal
import time

os.environ.update(NCCL_HOSTID=f"hvdlite-{os.environ['HVDLITE_SLOT']}", NCCL_P2P_DISABLE="1",
                  NCCL_SHM_DISABLE="1")

import torch  # noqa: E402

import hvdlite.torch as hvd  # noqa: E402
from hvdlite.torch import backend  # noqa: E402
from hvdlite.worker.errors import HorovodInternalError  # noqa: E402

hvd.init()
torch.cuda.set_device(0)
x = torch.ones(1 << 20, device="cuda")
failed = []


@hvd.elastic.run
def train(state):
    while state.step < 20:
        mark = f"{os.environ['KILL_MARK']}.{state.step}"
        if hvd.size() > 1 and hvd.rank() == hvd.size() - 1 and state.step in (5, 10) and not os.path.exists(mark):
            open(mark, "w").close()
            time.sleep(0.5)  # rank 0 is in the allreduce by now
            os.kill(os.getpid(), signal.SIGKILL)
        try:
            hvd.allreduce_(x, op=hvd.Sum)
            torch.cuda.synchronize()
        except HorovodInternalError:
            failed.append(time.perf_counter())
            raise
        if failed:
            print(f"recovered on {'nccl' if backend.active() else 'gloo'}: the new world's first allreduce "
                  f"ended {time.perf_counter() - failed.pop():.3f} s after the failure (world of "
                  f"{hvd.size()}; the CUDA tensor kept on {x.device})", flush=True)
        state.step += 1
        state.commit()


train(hvd.elastic.ObjectState(step=0))
