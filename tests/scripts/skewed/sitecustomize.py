"""On PYTHONPATH, makes a worker's clock (and its helper processes') run $CLOCK_SKEW seconds
ahead of the driver's: only a process with a worker id in its environment is skewed, so the
driver that starts them keeps the true time. The id is looked up at each call, not at start:
a worker forked from a kept template (which has none) gets its environment after this ran,
and must run on the same clock as its stand-in process (worker/vouch.py, started plain)."""
import os
import time

_true_time = time.time


def _time() -> float:
    skew = os.environ.get("CLOCK_SKEW") if os.environ.get("HVDLITE_WORKER_ID") else None
    return _true_time() + float(skew) if skew else _true_time()


time.time = _time
