"""The RESIZE knob of the test jobs (torch or numpy): RESIZE="step:size,..." holds the job at
each listed step until the world has that size, so that a test's host changes happen in a
known order however long a new worker takes to start or discovery takes to notice a change."""
import os
import time

TIMEOUT = 60.0
HOLDS = dict(tuple(map(int, item.split(":"))) for item in os.environ.get("RESIZE", "").split(",") if item)


def hold(state, step, size):
    """At a listed step, poll for host updates until size() is as listed (a reset ends a poll)."""
    wanted = HOLDS.get(step)
    deadline = time.monotonic() + TIMEOUT
    while wanted is not None and size() != wanted:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the world did not reach size {wanted} within {TIMEOUT:g} s")
        state.check_host_updates()
        time.sleep(0.05)
