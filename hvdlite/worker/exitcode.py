"""The code this process exits with, as far as an exit hook can know it: for a worker that
must leave by os._exit, past the interpreter's teardown (hvdlite/torch/basics.py).

An exit hook is not told the code. Before it prints an uncaught exception the interpreter sets
sys.last_value: code 1. A SystemExit leaves no trace, so the ones raised by sys.exit() or
passing through @hvd.elastic.run are noted here on their way out. Anything else is a normal
end: 0. (A SystemExit raised by hand outside run() is not seen: it reads as 0.)
"""
import sys

_noted = []  # the code of the last SystemExit seen on its way out


def note(code) -> None:
    _noted[:] = [code]


def _exit(status=None):
    note(status)
    _sys_exit(status)


_sys_exit, sys.exit = sys.exit, _exit


def own() -> int:
    """As the interpreter maps them: an uncaught exception 1; SystemExit(None) 0, an int
    itself, anything else (a message, already printed) 1."""
    if getattr(sys, "last_value", None) is not None and not isinstance(sys.last_value, SystemExit):
        return 1
    code = _noted[0] if _noted else None
    if code is None:
        return 0
    return code if isinstance(code, int) else 1
