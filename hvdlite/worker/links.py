"""The TCP connections of the current collective group, and cutting them (torch-free).

Cutting is the one way to unblock a stuck gloo collective (see sockets.py). It happens on
abort() after a failed collective, and from the heartbeat thread as soon as the driver says
the group's round fell apart, so that no survivor waits for a gloo timeout.
"""
import socket
import sys
import threading
import time

from hvdlite import defaults
from hvdlite.errors import first_line
from hvdlite.worker import probed, sockets

CONNECT_POLL = 0.2  # seconds between checks whether the round being connected was given up
CONNECT_ATTEMPTS = 3  # worlds in a row whose group failed to connect before the worker gives up
# Seconds an exiting worker waits for what gloo still runs (connects given up, and on torch
# released groups): within the driver's grace for a worker that said it is exiting, with room
# for the rest of its teardown.
EXIT_WAIT = defaults.EXIT_GRACE - 5.0


class RoundAbandoned(RuntimeError):
    """The driver gave the round up while its group connected (a peer died): try the next."""


def broken(round_number, newest_broken) -> bool:
    # Elastic rounds count from 1; a static job's world (round 0) is never given up.
    return round_number is not None and 0 < round_number <= newest_broken


def told(abandoned, seconds: float) -> bool:
    """Whether the driver says, within `seconds`, that the round fell apart. A peer that died
    while the group connected fails the connect at once (connection refused or closed), before
    the driver's word reaches this worker: sooner still with pygloo, whose held GIL kept the
    heartbeat thread from hearing it. Judged then, each such death would count against this
    survivor as if its own group could not connect. The driver knows of a gone worker within
    the liveness timeout, so a failure nobody explains by then is this worker's."""
    deadline = time.monotonic() + seconds
    while not abandoned():
        if time.monotonic() >= deadline:
            return False
        time.sleep(CONNECT_POLL)
    return True


class Links:
    def __init__(self, also_cut=lambda: None, broken_how=socket.SHUT_RDWR):
        """`also_cut()` runs wherever the sockets are cut: it fails what else the group has
        pending (an NCCL communicator's works, torch/backend.py). `broken_how`: how the
        heartbeat thread shuts the group's sockets down when the driver says the round broke
        (see sockets.cut); cut() shuts both sides."""
        self._also_cut = also_cut
        self._broken_how = broken_how
        self._round, self._fds = None, []  # the fds: this object's duplicates of gloo's sockets
        self._peers = {}  # fd -> the address of its peer
        self._told = False  # the driver said the round broke: it knows, nothing to report
        self._session = None
        self._lock = threading.Lock()
        self._given_up = []  # helper threads of connects given up, which gloo may still run

    def join(self, session, connect, after_round=None, commit=0):
        """Join the next world assigned to this worker (see Session.assignment): returns its
        WorldInfo and connect(info, abandoned, seen), the group; `abandoned()` tells the group's
        store that the driver gave the round up, and the store appends to the list `seen` every
        value gloo set or read (see ScopeStore). From now on the driver's word that a round
        broke cuts the group's connections. An elastic worker whose world fails while its group
        connects (a peer died) moves on to the next world; one whose group cannot connect for
        another reason (a firewall between hosts, say) says why on stderr, tries the next world,
        and fails after CONNECT_ATTEMPTS such worlds in a row."""
        session.on_round_broken = self.on_round_broken
        self._session = session
        failures = 0
        while True:
            info = session.assignment(after_round, commit)
            try:
                return info, self._connect(info, session, connect)
            except RoundAbandoned:
                if not session.elastic:
                    raise
            except RuntimeError as e:
                failures += 1
                why = f"the group of round {info.round} (rank {info.rank} of {info.size}) could " \
                      f"not connect: {first_line(e)}"
                if not session.elastic or failures >= CONNECT_ATTEMPTS:
                    raise RuntimeError(f"hvdlite: {why}") from e
                sys.stderr.write(f"hvdlite: {why}; trying the next world\n")
                sys.stderr.flush()
            after_round = info.round

    def _connect(self, info, session, connect):
        """connect(info, abandoned, seen), which forms the group's connections; hold duplicates
        of the sockets it opened: those with an end whose address gloo published through the
        store (see sockets.hold_gloo). Other threads' sockets opened meanwhile (a data loader's,
        a tracker's) are not gloo's.

        It runs on a helper thread so that the caller gives up (RuntimeError) as soon as the
        round is abandoned: a gloo rank waiting for a peer that died while connecting waits five
        times the group's timeout. A given-up helper ends on that timeout, or sooner when the
        group's store sees the round abandoned too; until then it is kept (see finish_given_up).
        """
        def abandoned():
            return broken(info.round, session.broken)
        before = sockets.open_sockets()
        outcome, seen = {}, []

        def run():
            try:
                outcome["group"] = connect(info, abandoned, seen)
            except BaseException as e:  # noqa: BLE001 - handed to the caller
                # Without its traceback: the frames would keep the half-connected group and
                # its sockets (this frame's `outcome` holding the error makes a cycle that
                # only the garbage collector breaks), its peers' ends open meanwhile.
                outcome["error"] = e.with_traceback(None)
            finally:
                # The KV connection this thread opened: left to the thread's end, its socket is
                # closed by the finalizer, whose unclosed-socket warning makes CPython give the
                # dying thread a new state dict that is never freed (one per round).
                session.client.close()
        helper = threading.Thread(target=run, daemon=True, name="hvdlite-connect")
        helper.start()
        while helper.is_alive():
            helper.join(CONNECT_POLL)
            if helper.is_alive() and abandoned():
                self._given_up = [t for t in self._given_up if t.is_alive()] + [helper]
                raise RoundAbandoned(f"hvdlite: round {info.round} fell apart while its group connected")
        if "error" in outcome:
            if not abandoned():  # what the heartbeat thread heard may be old: ask the driver
                session.hear()
            if session.elastic and told(abandoned, session.liveness_timeout):
                raise RoundAbandoned(f"hvdlite: round {info.round} fell apart while its group "
                                     f"connected") from outcome["error"]
            raise outcome["error"]
        held = sockets.hold_gloo(sockets.opened_since(before), seen)
        with self._lock:
            sockets.release(self._fds)
            self._round, self._fds = info.round, held
            self._peers, self._told = sockets.peers(held), False
        return outcome["group"]

    def current(self):
        """(round, socket fds) of the group, for a helper process that watches them (vouch);
        the fds stay open until forget()."""
        with self._lock:
            return self._round, list(self._fds)

    def cut(self) -> None:
        """Fail every pending and future collective of the group, here and on its peers; when
        the group broke on connections a peer closed, tell the driver which (probed.py)."""
        with self._lock:
            lost = set() if self._told or self._session is None or not self._session.elastic \
                else {self._peers[fd] for fd in sockets.ended(self._fds) if fd in self._peers}
            self._told = True
            sockets.cut(self._fds)
            self._also_cut()
        if lost:
            probed.report_broken(self._session, lost)

    def on_round_broken(self, newest_broken: int) -> None:
        with self._lock:
            if broken(self._round, newest_broken):
                self._told = True
                sockets.cut(self._fds, self._broken_how)
                self._also_cut()

    def finish_given_up(self, timeout: float) -> bool:
        """Wait (at most `timeout` seconds) for connects given up that gloo still runs: a peer
        that refused one is retried until the group's timeout, and an interpreter that tears
        down meanwhile aborts the process (std::terminate, SIGABRT or SIGSEGV), so a worker
        that finished right after giving a connect up would look failed. True if all ended."""
        return join_all(self._given_up, timeout)

    def forget(self) -> None:
        with self._lock:
            sockets.release(self._fds)
            self._round, self._fds, self._peers = None, [], {}


def join_all(threads, timeout: float) -> bool:
    """Join `threads`, all of them within `timeout` seconds; True if all ended."""
    deadline = time.monotonic() + timeout
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    return not any(thread.is_alive() for thread in threads)
