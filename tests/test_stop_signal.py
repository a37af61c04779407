"""The driver's stop signal handler posts to the event queue from inside the decision thread,
maybe while that thread is inside the queue's own get()."""
import os
import subprocess
import sys

from jobs import SCRIPTS


def test_a_stop_signal_inside_the_event_queues_get_does_not_deadlock():
    # Posting with queue.Queue deadlocked in every 3-second run (its lock is not reentrant).
    try:
        out = subprocess.run([sys.executable, os.path.join(SCRIPTS, "signal_in_get.py"), "3"],
                             capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        raise AssertionError("the signal handler deadlocked inside the event queue's get()") from None
    assert out.returncode == 0, out.stderr[-2000:]
    assert int(out.stdout.split()[-1]) > 50
