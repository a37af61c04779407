"""The torch backend's global random generators: the plain ones (hvdlite.worker.generators),
torch's CPU generator, and every CUDA device's once the script has used CUDA (capturing them
would otherwise start CUDA in a job that never uses it). Kept as bytes: a few KB a rank.
"""
import torch

from hvdlite.worker import generators as plain


def _cuda_in_use() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_initialized()


def capture() -> dict:
    states = plain.capture()
    states["torch"] = torch.get_rng_state().numpy().tobytes()
    if _cuda_in_use():
        states["cuda"] = [state.numpy().tobytes() for state in torch.cuda.get_rng_state_all()]
    return states


def _tensor(data: bytes):
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def state_of(generator: torch.Generator) -> bytes:
    """A script's own generator's state (its get_state() is on the CPU whatever its device)."""
    return generator.get_state().numpy().tobytes()


def put_state(generator: torch.Generator, state: bytes) -> None:
    generator.set_state(_tensor(state))


def put(states: dict) -> None:
    plain.put(states)
    torch.set_rng_state(_tensor(states["torch"]))
    if "cuda" in states and torch.cuda.is_available():
        devices = states["cuda"][:torch.cuda.device_count()]  # a machine with fewer devices
        torch.cuda.set_rng_state_all([_tensor(state) for state in devices])
