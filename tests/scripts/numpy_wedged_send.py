"""Three ranks train; at step 2 they broadcast from the last rank, whose sends are wedged there
(up to TRIES tries, counted in WEDGE_MARK: under load the race is sometimes lost, and the
broadcast fails at once, which re-forms the world at step 2): its group's connections are shut while gloo's event loop cannot run (every
other thread pinned beside this one at the idle class), so the sends meet EPIPE, which pygloo's
gloo leaves queued, as it does a peer's reset: that rank waits out gloo's 30 s in waitSend, its
own heartbeat silenced, while the peers' receives fail at once. Steps are logged to $STEPS."""
import os
import threading
import time

import numpy as np

import hvdlite.numpy as hvd
from hvdlite.numpy import basics


def wedged_broadcast(value, root):
    # The peers' receives are posted and gloo's loop took note: the sends go out at once, from
    # this thread (without the wait, the broadcast failed at once: no wedge).
    time.sleep(1)
    me, allowed = threading.get_native_id(), os.sched_getaffinity(0)
    cpu = min(allowed)
    tasks = [int(t) for t in os.listdir("/proc/self/task")]
    for task in tasks:
        os.sched_setaffinity(task, {cpu})
        if task != me:
            os.sched_setscheduler(task, os.SCHED_IDLE, os.sched_param(0))
    try:
        basics.abort()  # shuts the group's connections both ways
        return hvd.broadcast(value, root)
    finally:
        for task in tasks:
            try:
                os.sched_setscheduler(task, os.SCHED_OTHER, os.sched_param(0))
                os.sched_setaffinity(task, allowed)
            except OSError:
                pass  # that thread ended


TRIES = 8


def tries():
    try:
        with open(os.environ["WEDGE_MARK"]) as f:
            return len(f.readlines())
    except FileNotFoundError:
        return 0


@hvd.elastic.run
def train(state):
    while state.step < 8:
        root = hvd.size() - 1
        # Only in a world of all three: the one formed without the wedged rank just trains.
        if state.step == 2 and hvd.size() == 3 and hvd.rank() == root and tries() < TRIES:
            with open(os.environ["WEDGE_MARK"], "a") as f:
                f.write("try\n")
            wedged_broadcast(np.ones(1), root)
        else:
            hvd.broadcast(np.ones(1), root) if state.step == 2 else hvd.allreduce(np.ones(1))
        with open(os.environ["STEPS"], "a") as f:
            f.write(f"{time.time()} {hvd.rank()} {state.step}\n")
        time.sleep(0.3)
        state.step += 1
        state.commit()


hvd.init()
train(hvd.elastic.ObjectState(step=0))
print(f"DONE rank {hvd.rank()}", flush=True)
