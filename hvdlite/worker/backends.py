"""Which backend carries a world's data collectives of CUDA tensors: NCCL, or gloo through host
copies (torch-free: hvdlite/torch/backend.py acts on the choice). `hvdlite run --backend`, or
HVDLITE_BACKEND in the workers' environment:
- auto (the default): NCCL when every rank of the world can use it, else gloo;
- nccl: NCCL, and a worker that cannot use it exits at hvd.init(), saying why;
- gloo: gloo, as on a machine without GPUs.
Host tensors and the small control collectives (join's state, agreement checks, shapes) always
take the world's gloo group."""
ENV = "HVDLITE_BACKEND"
CHOICES = ("auto", "nccl", "gloo")
DEFAULT = "auto"

# What a rank can do, as it says so to its peers (a small int in a gloo gather).
READY, NO_NCCL, NO_GPU = range(3)
_WHY = {NO_NCCL: "its torch has no NCCL (a build without CUDA)", NO_GPU: "torch sees no GPU there"}


def requested(environ) -> str:
    """The backend asked for: one of CHOICES (ValueError naming the variable otherwise)."""
    value = environ.get(ENV, "").strip().lower() or DEFAULT
    if value not in CHOICES:
        raise ValueError(f"hvdlite: {ENV}={environ[ENV]!r}: must be one of {', '.join(CHOICES)}")
    return value


def readiness(nccl_available: bool, gpus: int) -> int:
    """What this rank says: READY, or why it cannot use NCCL."""
    if not nccl_available:
        return NO_NCCL
    return READY if gpus > 0 else NO_GPU


def refusal(who: str, said: int) -> str:
    """The one line a job that asked for NCCL ends with when `who` (a rank, a slot) said `said`."""
    return f"hvdlite: {ENV}=nccl (--backend nccl), but {who} cannot use NCCL: {_WHY[said]}; " \
           f"use --backend auto or gloo"


def choose(wanted: str, said) -> str:
    """"nccl" or "gloo" for a world whose ranks said `said` (readiness(), in rank order) when
    `wanted` was asked for; RuntimeError (refusal's line) where NCCL was asked for and a rank
    cannot use it. Every rank decides alike from the same list."""
    if wanted == "gloo":
        return "gloo"
    unready = [(rank, s) for rank, s in enumerate(said) if s != READY]
    if not unready:
        return "nccl"
    if wanted == "auto":
        return "gloo"
    rank, why = unready[0]
    raise RuntimeError(refusal(f"rank {rank}", why))
