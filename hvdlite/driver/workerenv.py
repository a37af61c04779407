"""The environment a worker starts with: the driver's, minus host-specific names, plus ours."""
from hvdlite.worker import env

_DROPPED = {"OLDPWD", "PWD", "SHLVL", "_", *env.IDENTITY}


def forwarded(driver_env: dict) -> dict:
    return {k: v for k, v in driver_env.items()
            if k not in _DROPPED and not k.startswith("BASH_FUNC_")
            and not k.endswith("CUDA_VISIBLE_DEVICES")}


def worker_env(base: dict, rendezvous: tuple, secret: str, settings, slot_key: str,
               workers_on_host: int) -> dict:
    addr, port = rendezvous
    # Several workers on one host, each with torch's default thread count, spin on each
    # other's cores and starve gloo; one thread each, as torchrun does, unless the user chose.
    threads = {"OMP_NUM_THREADS": "1"} if workers_on_host > 1 and "OMP_NUM_THREADS" not in base else {}
    return {
        **base, **threads,
        env.RENDEZVOUS_ADDR: addr, env.RENDEZVOUS_PORT: str(port), env.SECRET: secret,
        env.SLOT: slot_key,
        env.START_TIMEOUT: str(settings.start_timeout),
        env.LIVENESS_TIMEOUT: str(settings.liveness_timeout),
        "PYTHONUNBUFFERED": "1",
    }
