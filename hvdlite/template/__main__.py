"""`python -m hvdlite.template --preload torch,torch.optim --control FD`

Preloads the modules, says `ready` (or `unusable`) on the control socket, then forks workers
on request. In a forked child this returns into the worker's own code.
"""
import argparse
import os
import socket
import sys

from hvdlite.template import server, wire


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m hvdlite.template")
    p.add_argument("--preload", default="", help="comma-separated modules to import first")
    p.add_argument("--control", type=int, required=True,
                   help="file descriptor of a connected unix socket to the driver")
    args = p.parse_args(argv)
    try:
        control = socket.socket(fileno=args.control)
    except OSError as e:
        print(f"hvdlite.template: --control {args.control}: {e.strerror}", file=sys.stderr)
        return 2
    modules = [m for m in args.preload.split(",") if m]
    try:
        loaded, skipped = server.preload(modules)
        reason = server.fork_safe()
    except Exception as e:  # a module that fails to import: the driver launches plainly
        loaded, skipped, reason = [], [], f"preloading failed: {type(e).__name__}: {e}"
    if reason:
        wire.send(control, {"op": "unusable", "reason": reason})
        return 1
    wire.send(control, {"op": "ready", "pid": os.getpid(), "python": sys.executable,
                        "preloaded": loaded, "skipped": skipped})
    job = server.Template(control).serve()
    if job is not None:
        job.run()  # the worker: its exceptions and exit code are the process's own
    return 0


if __name__ == "__main__":
    code = main()
    if code:
        sys.exit(code)
