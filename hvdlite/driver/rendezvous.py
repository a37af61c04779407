"""The driver's rendezvous endpoints on the KV server, at the edge of the elastic core.

- GET /rdzv/assign?worker=ID&after=R&commit=C&kept=K: the worker waits for its place in a world
  formed after round R (the barrier), K=1 when it left its last world at a commit (nothing
  rolled back); becomes a Ready event, answered by an Answer action.
- heartbeat datagrams (worker, commit, vouched) (signed UDP on the server's port): liveness,
  answered at once with what the core published (host updates announced, newest broken round).
  Heartbeats reach the core in batches, not one event each; a worker's own beats apart from
  those its stand-in process sends for it (vouched: the round it holds, see worker/vouch.py).
- PUT /rdzv/exiting?worker=ID&commit=C&calls=N&code=X: the worker is exiting, having entered N
  collectives in its world, with code X as far as it knows; becomes an Exiting event (the code is
  kept for a worker this driver took over and cannot wait for: said_code).
- PUT /rdzv/leaving?worker=ID: the worker got SIGTERM while holding training state; becomes a
  Leaving event.
- PUT /rdzv/written?worker=ID&commit=C: rank 0's writer renamed commit C into --checkpoint-dir;
  becomes a Written event.
- PUT /rdzv/stop?worker=ID: a worker got SIGUSR1 (the allocation ends); becomes the job's
  graceful stop, as a SIGUSR1 to the driver would.
- PUT /rdzv/load_failed?worker=ID, the reason as the body (one line naming the file and the
  cause): the worker cannot load the commit it reported; becomes a LoadFailed event.
- PUT /rdzv/write_failed?worker=ID, the reason as the body (one line): rank 0 could not write
  a checkpoint; becomes a WriteFailed event.
- PUT /rdzv/stack?worker=ID, the main thread's stack as the body: the worker answers the
  driver's request for it (ask_stack, carried in heartbeat answers); becomes a StackDump event.
"""
import json
import signal
import threading
from concurrent.futures import Future, InvalidStateError

from hvdlite.driver.decisions.messages import (
    Exiting, Heartbeats, Leaving, LoadFailed, Ready, StackDump, StopRequested, WriteFailed, Written)

MAX_REASON = 1000  # characters of a load or write failure's reason kept
MAX_STACK = 20000  # characters of a stack kept (its innermost frames, at the end)

class Rendezvous:
    def __init__(self, post):
        self._post = post  # hands an event to the decision thread
        self._lock = threading.Lock()
        self._waiting = {}  # worker -> Future of its pending assign request
        self._beats = {}  # worker -> commits, heard since the last drain
        self._vouched = {}  # worker -> round its stand-in holds, heard since the last drain
        self._calls = {}  # worker -> (collectives it entered, seconds it waited, idle), since the last drain
        self._state = {"updates": 0, "broken": 0, "stop": False, "epoch": 0}
        self._codes = {}  # worker -> the exit code it said as it exited
        self._published = json.dumps(self._state).encode()

    def route(self, method, subpath, query, body):
        worker = query.get("worker")
        if not worker:
            return 400, b"expected worker=<id>"
        if subpath == "assign" and method == "GET":
            try:
                after, commit = int(query["after"]), int(query.get("commit", 0))
            except (KeyError, ValueError):
                return 400, b"expected after and commit as integers"
            return self._assign(worker, after, commit, query.get("kept") != "1")
        if subpath in ("exiting", "written") and method == "PUT":
            try:
                commit, calls = int(query.get("commit", 0)), query.get("calls")
                calls = None if calls is None else int(calls)
            except ValueError:
                return 400, b"expected commit and calls as integers"
            if subpath == "exiting" and query.get("code", "").lstrip("-").isdigit():
                with self._lock:
                    self._codes[worker] = int(query["code"])
            self._post(Exiting(worker, commit, calls, query.get("echo") == "1") if subpath == "exiting"
                       else Written(commit, worker))
            return 200, b""
        if subpath == "leaving" and method == "PUT":
            self._post(Leaving(worker))
            return 200, b""
        if subpath in ("load_failed", "write_failed") and method == "PUT":
            reason = " ".join(bytes(body).decode("utf-8", "replace").split())[:MAX_REASON]
            self._post((LoadFailed if subpath == "load_failed" else WriteFailed)(worker, reason or "no reason given"))
            return 200, b""
        if subpath == "stack" and method == "PUT":
            self._post(StackDump(worker, bytes(body)[-MAX_STACK:].decode("utf-8", "replace")))
            return 200, b""
        if subpath == "stop" and method == "PUT":
            self._post(StopRequested(signal.SIGUSR1))  # a worker was told the allocation ends
            return 200, b""
        return 404, b"unknown rendezvous endpoint"

    def heartbeat(self, beats) -> bytes:
        """Heartbeat datagrams that came in together, (worker, commit, vouched, (calls, waited, idle))
        each (the server checked their signatures): note them, answer at once. One lock for the
        batch, not one a beat."""
        with self._lock:
            for worker, commit, vouched, calls in beats:
                if vouched is None:
                    self._beats[worker], self._calls[worker] = commit, calls
                else:
                    self._vouched[worker] = vouched
            return self._published

    def _assign(self, worker, after, commit, rolled_back=True):
        answer = Future()
        with self._lock:
            earlier = self._waiting.get(worker)
            self._waiting[worker] = answer
        if earlier is not None:
            _settle(earlier, (408, b"superseded by a newer request"))
        # Forgotten once settled or cancelled (its worker went away, or its wait timed out).
        answer.add_done_callback(lambda done: self._forget(worker, done))
        self._post(Ready(worker, after, commit, rolled_back))
        return answer

    def _forget(self, worker, answer):
        with self._lock:
            if self._waiting.get(worker) is answer:
                del self._waiting[worker]

    def said_code(self, worker):
        """The exit code `worker` said it exits with, or None."""
        with self._lock:
            return self._codes.get(worker)

    def set_epoch(self, epoch: int) -> None:
        """The lease this driver holds: in every answer, so that a worker that went over to a
        newer driver refuses this one's (worker/session.py)."""
        with self._lock:
            self._state["epoch"] = epoch
            self._published = json.dumps(self._state).encode()

    def waiting(self) -> int:
        with self._lock:
            return len(self._waiting)  # the server answers when it is settled, or 408 at its long-poll cap

    def answer(self, worker, status, body: dict):
        """Answer the worker's pending request; without one the core answers its next."""
        with self._lock:
            pending = self._waiting.pop(worker, None)
        if pending is not None:
            _settle(pending, (status, json.dumps({**body, "epoch": self._state["epoch"]}).encode()))

    def publish(self, updates, broken, stop=False):
        with self._lock:
            self._state.update(updates=updates, broken=broken, stop=stop)
            self._published = json.dumps(self._state).encode()

    def ask_stack(self, worker):
        """Heartbeat answers ask `worker` for its stack from now on (it sends it once)."""
        with self._lock:
            self._state["stacks"] = sorted(set(self._state.get("stacks", ())) | {worker})
            self._published = json.dumps(self._state).encode()

    def drain_heartbeats(self):
        """The beats heard since the last drain, as a Heartbeats event, or None if there were none."""
        with self._lock:
            (beats, self._beats), (vouched, self._vouched) = (self._beats, {}), (self._vouched, {})
            calls, self._calls = self._calls, {}
        return Heartbeats(tuple(beats.items()), tuple(vouched.items()),
                          tuple((w, n) for w, (n, _, _) in calls.items()),
                          tuple((w, s) for w, (_, s, _) in calls.items()),
                          tuple(w for w, (_, _, idle) in calls.items() if idle)) if beats or vouched else None

    def close(self):
        with self._lock:
            pending, self._waiting = list(self._waiting.values()), {}
        for future in pending:
            _settle(future, (503, b"the job is over"))


def _settle(future, answer):
    try:
        future.set_result(answer)
    except InvalidStateError:  # cancelled or answered meanwhile
        pass
