"""On PYTHONPATH, makes a worker's clock (and its helper processes') run $CLOCK_SKEW seconds
ahead of the driver's: only processes with a worker id are skewed, so the driver that starts
them keeps the true time."""
import os
import time

if os.environ.get("CLOCK_SKEW") and os.environ.get("HVDLITE_WORKER_ID"):
    _true_time, _skew = time.time, float(os.environ["CLOCK_SKEW"])
    time.time = lambda: _true_time() + _skew
