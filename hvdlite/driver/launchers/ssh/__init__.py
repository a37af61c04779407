"""Remote workers over SSH (paramiko): host configuration, connections, remote processes.

Its names are loaded on first use: a job on this machine alone imports ssh.config (is a host
this one?) and must run where paramiko is not installed."""
import importlib

_WHERE = {"SSHError": "config", "SSHSettings": "config", "host_config": "config", "SSHHost": "connection",
          "LOST": "remote", "RemoteWorker": "remote", "launch": "remote"}


def __getattr__(name):
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
