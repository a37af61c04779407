"""A job whose own thread holds a TCP connection to an echo server ($ECHO_PORT), opened while
hvdlite connects the first world's gloo group; at the end it checks the connection still
echoes (socket cutting must spare it when a world breaks). Runs on either backend (BACKEND=
torch|numpy). Prints `USER_SOCKET <slot> inside=<bool> reply=<bytes> gloo=some|none`; knobs TOTAL_STEPS,
STEP_SLEEP, LOG_DIR (rank 0 writes its step to $LOG_DIR/progress)."""
import os
import socket
import threading
import time

if os.environ.get("BACKEND") == "numpy":
    import numpy as np
    import hvdlite.numpy as hvd

    def one():
        return np.ones(1)
else:
    import torch
    import hvdlite.torch as hvd

    def one():
        return torch.ones(1)

TOTAL = int(os.environ.get("TOTAL_STEPS", "30"))
SLEEP = float(os.environ.get("STEP_SLEEP", "0.05"))
user = {}


def connecting() -> bool:
    return any(t.name == "hvdlite-connect" for t in threading.enumerate())


def open_while_connecting():
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not connecting():
        time.sleep(0.0002)
    user["sock"] = socket.create_connection(("127.0.0.1", int(os.environ["ECHO_PORT"])), timeout=10)
    user["inside"] = connecting()  # still connecting: the socket opened within the window


threading.Thread(target=open_while_connecting, daemon=True).start()
hvd.init()


@hvd.elastic.run
def train(state):
    while state.step < TOTAL:
        hvd.allreduce(one())
        state.step += 1
        if hvd.rank() == 0:
            with open(os.path.join(os.environ["LOG_DIR"], "progress"), "w") as f:
                f.write(str(state.step))
        state.commit()
        time.sleep(SLEEP)


train(hvd.elastic.ObjectState(step=0))
try:
    user["sock"].sendall(b"ping")
    reply = user["sock"].recv(4)
except OSError as e:
    reply = repr(e).encode()
held = len(hvd.basics._links.current()[1])  # the sockets hvdlite would cut: gloo's, to the one peer left
print(f"USER_SOCKET {os.environ['HVDLITE_SLOT']} inside={user.get('inside')} reply={reply!r} "
      f"gloo={'some' if held else 'none'}", flush=True)
