"""A helper process that stands in for a worker whose collectives hold the GIL (pygloo).

While pygloo waits in a collective the worker's own threads cannot run: its heartbeat falls
silent, so the driver would take a rank waiting for a slow peer for a hung one, and nobody
acts on the driver's word that the round broke, so a survivor of a partitioned peer would wait
out gloo's 30 s timeout. This process does both in the worker's place:
- it heartbeats as long as the worker exists and is not stopped (SIGSTOP), so a frozen worker
  is still evicted after the liveness timeout; its beats carry the time corrected by the
  worker's offset to the driver's clock (told with every message), or the driver would drop
  them all on a host whose clock is off by more than the signatures' skew; they name the
  round of the group the worker is in or connecting: heard while the worker's own beats are
  silent, they tell the driver the worker is held in a collective of that round (a send that
  gloo does not wake when the round breaks waits out gloo's 30 s), so it re-forms without it;
- it holds copies of the worker's gloo sockets (passed over a Unix socket with SCM_RIGHTS) and
  shuts their reading side down once the driver says their round broke, which fails the
  pending collective (see sockets.PYGLOO_BROKEN_CUT);
- while the worker connects a group (pygloo holds the GIL for all of it), it knocks on the
  sockets that group's pairs listen on once the driver says that round broke: a pair waiting
  for a peer that died would otherwise wait out gloo's 30 s. It knocks on the ones the worker
  named (those at the addresses it published for that round), on every beat until the worker
  is done connecting: never on a later round's, never too early to reach them.
It dies with the worker (PR_SET_PDEATHSIG), so its socket copies never keep a dead worker's
connections open. The worker's own heartbeat thread keeps beating too. Between drivers
(--checkpoint-dir) it goes over to the one that took the job over as the worker does, by the
beacon (session.py), and on its own: a worker held in a collective cannot tell it.

Run as `python -m hvdlite.worker.vouch PID FD` with the worker's environment.
"""
import array
import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import time

from hvdlite import procstat
from hvdlite.worker import beacon, env, sockets
from hvdlite.worker.kvclient import Heartbeats, KVClient
from hvdlite.worker.links import broken
from hvdlite.worker.session import GAP_BEAT_TIMEOUT, HEARTBEAT_INTERVAL, HEARTBEAT_TIMEOUT, between_drivers

MAX_FDS = 250  # per message: the kernel passes at most 253 descriptors at once
PR_SET_PDEATHSIG = 1
NO_ROUND = -1  # "hold nothing": the worker left its group


class Voucher:
    """The worker's end: starts the helper and hands it the current group's sockets."""

    def __init__(self, environ, offset):
        """`offset()`: the worker's clock offset to the driver's (KVClient.offset), as of now."""
        self._offset = offset
        self._channel, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        with theirs:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "hvdlite.worker.vouch", str(os.getpid()), str(theirs.fileno())],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, env=environ,
                pass_fds=[theirs.fileno()])

    def watch(self, round_number: int, fds) -> None:
        """From now on the helper cuts these sockets when `round_number` breaks."""
        fds = sorted(fds)
        for start in range(0, len(fds), MAX_FDS) if fds else [0]:
            chunk = array.array("i", fds[start:start + MAX_FDS])
            ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, chunk)] if chunk else []
            self._channel.sendmsg([f"{round_number} {self._offset()!r}".encode()], ancillary)

    def release(self) -> None:
        try:
            self.watch(NO_ROUND, [])
        except OSError:
            pass  # the helper is gone already (a TERM to the worker's process group): it holds nothing

    def listening(self, round_number: int, listeners) -> None:
        """The group of `round_number` the worker connects listens on these sockets
        ({inode: (host, port)}, see sockets.published_listeners)."""
        words = " ".join(f"{inode},{host},{port}" for inode, (host, port) in sorted(listeners.items()))
        self._channel.sendmsg([f"listening {round_number} {self._offset()!r} {words}".encode()])


def _running(pid: int) -> bool:
    """False once the worker is gone (or a zombie), or while it is stopped."""
    return procstat.state(pid) not in procstat.GONE + procstat.STOPPED


class _Held:
    """Copies of the worker's sockets of one round."""

    def __init__(self):
        self.round, self.fds = NO_ROUND, []
        self.offset = 0.0  # the worker's clock offset to the driver's, as last told
        # While the worker connects: (round, {inode: (host, port)} its pairs listen on, inodes
        # knocked on).
        self.connecting = None

    def receive(self, channel) -> None:
        size = socket.CMSG_SPACE(MAX_FDS * array.array("i").itemsize)
        while True:
            try:
                data, ancillary, _, _ = channel.recvmsg(1 << 16, size, socket.MSG_DONTWAIT)
            except BlockingIOError:
                return
            words = data.split()
            if words[0] == b"listening":
                self.offset = float(words[2])
                round_number = int(words[1])
                if self.connecting is None or self.connecting[0] != round_number:
                    self.connecting = round_number, {}, set()
                for inode, host, port in (word.decode().split(",") for word in words[3:]):
                    self.connecting[1][int(inode)] = host, int(port)
                continue
            self.connecting = None  # connected (or gone): what it holds now is its group
            fds = array.array("i")
            for level, kind, payload in ancillary:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    fds.frombytes(payload[:len(payload) - len(payload) % fds.itemsize])
            round_number, self.offset = int(words[0]), float(words[1])
            if round_number != self.round:
                for fd in self.fds:
                    os.close(fd)
                self.round, self.fds = round_number, []
            self.fds.extend(fds)

    def group(self) -> int:
        """The round of the group the worker is in or connecting, 0 if none."""
        round_number = self.connecting[0] if self.connecting is not None else self.round
        return max(round_number, 0)

    def cut_if_broken(self, newest_broken: int, pid: int) -> None:
        if broken(self.round, newest_broken):
            sockets.cut(self.fds, sockets.PYGLOO_BROKEN_CUT)  # the worker may be sending meanwhile
        if self.connecting is not None and broken(self.connecting[0], newest_broken):
            _, listening, knocked = self.connecting
            knocked |= sockets.knock(pid, {inode: address for inode, address in listening.items()
                                           if inode not in knocked})


def main(pid: int, channel_fd: int) -> None:
    # Die with the worker; it may have died before the line above took effect.
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != pid:
        return
    environ = os.environ
    client = KVClient(environ[env.RENDEZVOUS_ADDR], int(environ[env.RENDEZVOUS_PORT]), environ[env.SECRET])
    beats = Heartbeats(client, timeout=HEARTBEAT_TIMEOUT)
    epoch = int(environ.get(env.DRIVER_EPOCH, "0"))  # the greatest driver lease accepted, as the worker's
    _, watch = between_drivers(environ, environ[env.SECRET])
    worker = environ.get(env.WORKER, "")
    channel = socket.socket(fileno=channel_fd)
    held = _Held()
    answered = True
    while os.getppid() == pid:
        held.receive(channel)
        client.offset = held.offset
        if _running(pid):
            body = beats.beat(worker, vouched=held.group(),
                              timeout=GAP_BEAT_TIMEOUT if watch and not answered else HEARTBEAT_TIMEOUT)
            try:
                answer = json.loads(body) if body is not None else {}
                answered = "broken" in answer and beacon.accepts(answer.get("epoch", 0), epoch)
                if answered:  # else no contact this time; the worker's own liveness check decides
                    epoch = answer.get("epoch", 0)
                    held.cut_if_broken(answer["broken"], pid)
            except (ValueError, TypeError, AttributeError):  # not a driver's answer
                answered = False
            newer = watch.newer(epoch) if watch and not answered else None
            if newer is not None:  # the driver that took the job over
                epoch = newer[0]
                client.move(*newer[1:])
                beats.close()
                beats = Heartbeats(client, timeout=HEARTBEAT_TIMEOUT)
        time.sleep(HEARTBEAT_INTERVAL)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
