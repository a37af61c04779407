"""The environment a worker starts with: the driver's, minus host-specific names, plus ours.
The user's CUDA_VISIBLE_DEVICES travels with it: the slots share those GPUs (worker/gpus.py)."""
from hvdlite.driver.store import etcd
from hvdlite.driver.torchrunenv import torchrun_env
from hvdlite.worker import backends, env

# The driver store's password is the drivers' alone.
_DROPPED = {"OLDPWD", "PWD", "SHLVL", "_", *env.IDENTITY, *etcd.SECRET}


def forwarded(driver_env: dict) -> dict:
    return {k: v for k, v in driver_env.items()
            if k not in _DROPPED and not k.startswith("BASH_FUNC_")}


def worker_env(settings, rendezvous: tuple, secret: str, worker: str, slot: str,
               workers_on_host: int, world, elastic: bool) -> dict:
    """`world` is the worker's place (WorldInfo) as known at launch: the static job's, or for an
    elastic worker the world the current hosts would form, as Horovod announces it."""
    base = forwarded(settings.env)
    addr, port = rendezvous
    # Several workers on one host, each with torch's default thread count, spin on each
    # other's cores and starve gloo; one thread each, as torchrun does, unless the user chose.
    threads = {"OMP_NUM_THREADS": "1"} if workers_on_host > 1 and "OMP_NUM_THREADS" not in base else {}
    mode = {env.ELASTIC: "1", env.HOROVOD_ELASTIC: "1"} if elastic else {}
    durable = {env.CHECKPOINT_DIR: settings.checkpoint_dir,
               env.CHECKPOINT_INTERVAL: str(settings.checkpoint_interval),
               env.CHECKPOINT_KEEP: str(settings.checkpoint_keep),
               **({env.CHECKPOINT_LINEAGE: settings.checkpoint_lineage} if settings.checkpoint_lineage else {}),
               env.DRIVER_GRACE: str(settings.driver_grace),
               } if settings.checkpoint_dir else {}
    return {
        **base, **torchrun_env(rendezvous, base), **threads, **(world.env() if world is not None else {}), **mode, **durable,
        env.RENDEZVOUS_ADDR: addr, env.RENDEZVOUS_PORT: str(port), env.SECRET: secret,
        env.SLOT: slot, env.WORKER: worker,
        env.START_TIMEOUT: str(settings.start_timeout),
        env.LIVENESS_TIMEOUT: str(settings.liveness_timeout),
        env.COLLECTIVE_TIMEOUT: str(settings.collective_timeout),
        **({env.TIMELINE: settings.timeline_filename} if settings.timeline_filename else {}),
        **({backends.ENV: settings.backend} if settings.backend else {}),
        "PYTHONUNBUFFERED": "1",
    }
