"""Rank RANK of a 2-rank pygloo group (FileStore in FOLDER): rank 1 waits in a broadcast; rank 0,
the root, has its group's sockets cut by CUTTER (voucher: the helper process's cut; heartbeat:
the heartbeat thread's) while gloo's event loop cannot run yet, then sends. That is the race of a
cut made while the worker is about to send: the loop has not seen the connection end, so the send
meets the cut socket. Rank 0 prints "root done in S s" whether the broadcast succeeds or fails.

    python pygloo_send_after_cut.py RANK FOLDER CUTTER
"""
import os
import sys
import threading
import time

import numpy as np
import pygloo

from hvdlite.numpy import basics
from hvdlite.worker import sockets, vouch

rank, folder, cutter = int(sys.argv[1]), sys.argv[2], sys.argv[3]
before = sockets.open_sockets()
context = pygloo.rendezvous.Context(rank, 2)
device = pygloo.transport.tcp.CreateDevice(pygloo.transport.tcp.attr("127.0.0.1"))
context.connectFullMesh(pygloo.rendezvous.FileStore(folder), device)
held = [os.dup(fd) for fd, _ in sockets.opened_since(before)]  # what Links and the voucher hold
value = np.zeros(1)
if rank == 1:
    try:
        pygloo.broadcast(context, value.ctypes.data, value.ctypes.data, 1, pygloo.glooDataType_t.glooFloat64, 0)
    except RuntimeError:
        pass  # the root's cut may reach this rank first
    time.sleep(1)  # the root's send may still be on its way when the cut fails this rank
    sys.exit(0)

time.sleep(1)  # rank 1's receive is posted and gloo's loop took note: the root's send goes out at once
# gloo's event loop (every thread but this one) may run only when this thread waits: pinned to
# one core at the idle scheduling class, it cannot see the cut before the send below.
cpu = min(os.sched_getaffinity(0))
for task in map(int, os.listdir("/proc/self/task")):
    os.sched_setaffinity(task, {cpu})
    if task != threading.get_native_id():
        os.sched_setscheduler(task, os.SCHED_IDLE, os.sched_param(0))
if cutter == "voucher":
    group = vouch._Held()
    group.round, group.fds = 1, held
    group.cut_if_broken(1, os.getpid())
else:
    basics._links._round, basics._links._fds = 1, held
    basics._links.on_round_broken(1)
start = time.monotonic()
value[0] = 7
try:
    pygloo.broadcast(context, value.ctypes.data, value.ctypes.data, 1, pygloo.glooDataType_t.glooFloat64, 0)
except RuntimeError:
    pass
print(f"root done in {time.monotonic() - start:.2f} s", flush=True)
