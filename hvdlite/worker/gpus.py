"""Which GPU a slot uses. The GPUs a worker sees are the ones its launch left visible: the
user's CUDA_VISIBLE_DEVICES (kept, local and over SSH), the step's under Slurm (slurmd sets it),
the actor's under Ray (what Ray reserved for it, --gpus-per-slot). Among them the slot's local
rank picks one, as a Horovod script does with torch.cuda.set_device(hvd.local_rank()); more
slots than GPUs share them in turn. Torch-free: the caller says how many GPUs it sees."""
import os

from hvdlite.worker import env

VISIBLE = "CUDA_VISIBLE_DEVICES"


def local_rank(environ=os.environ) -> int:
    """This worker's local rank as its launch gave it (0 outside `hvdlite run`)."""
    return int(environ.get(env.LOCAL_RANK, 0))


def slot_index(count: int, environ=os.environ) -> int:
    """The index, among the `count` GPUs this worker sees, of its slot's GPU."""
    return local_rank(environ) % count


def physical(index: int, environ=os.environ) -> str:
    """What the GPU at `index` of those visible is called outside this process: its entry in
    CUDA_VISIBLE_DEVICES (an index or a UUID), or the index itself where that is unset."""
    listed = [d.strip() for d in environ.get(VISIBLE, "").split(",") if d.strip()]
    return listed[index] if VISIBLE in environ and index < len(listed) else str(index)


def line(count: int, environ=os.environ) -> str:
    """The line a worker says at start: which GPU its slot got, or that it sees none."""
    slot = environ.get(env.SLOT, "this worker")
    if count == 0:
        return f"hvdlite: slot {slot} sees no GPU"
    index = slot_index(count, environ)
    return f"hvdlite: slot {slot} (local rank {local_rank(environ)}) uses GPU {physical(index, environ)}: " \
           f"cuda:{index} of the {count} it sees"
