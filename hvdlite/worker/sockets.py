"""Cutting a process group's TCP connections, the one way to unblock a stuck gloo collective.

abort()/destroy of a gloo group do not return while a peer hangs, but shutting its sockets
down makes every pending operation fail at once, here and, through the closed connection,
on every peer. That turns one worker's failure into a fast, world-wide error.
"""
import os
import select
import socket
import struct
import time

KNOCK_WAIT = 0.5  # seconds knocks may take to connect


def open_sockets(pid="self") -> set:
    """(fd, socket inode) of the sockets of this process (or of `pid`, one of this user's). The
    inode tells a new socket apart from an old one whose descriptor number was closed and
    reused meanwhile."""
    found = set()
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:  # `pid` is gone
        return found
    for name in names:
        try:
            link = os.readlink(f"/proc/{pid}/fd/{name}")
        except OSError:
            continue  # closed meanwhile
        if link.startswith("socket:"):
            found.add((int(name), link))
    return found


def inodes(found) -> set:
    """The socket inode numbers of an open_sockets() result."""
    return {int(link[len("socket:["):-1]) for _, link in found}


def opened_since(before: set) -> set:
    """(fd, link) of the sockets opened since `before` (an open_sockets() result)."""
    return open_sockets() - before


def _wrap(fd) -> socket.socket:
    # A duplicate descriptor: closing the wrapper leaves the owner's descriptor alone, while
    # shutdown() acts on the shared socket. Family and type are read from the socket itself.
    return socket.socket(fileno=os.dup(fd))


def hold_gloo(opened, published) -> list:
    """Duplicates of the connected TCP sockets among `opened` (open_sockets() entries) with an
    end at an address gloo published (in `published`, the values its rendezvous exchanged: each
    holds a sockaddr, the port then the host's address): connected to a peer's listener, or
    accepted on this worker's. Another thread's connection opened meanwhile has neither.
    Listening sockets are left out: collectives never wait on them, and gloo's listener aborts
    the process when accept() fails on a socket shut down under it.

    The caller owns the duplicates (close them with release()). A duplicate stays the socket
    gloo connected: gloo closes its own descriptor when a peer hangs up, and that number is
    then free for any socket opened next, which a descriptor number kept instead would name
    (and passing a closed one to the voucher fails with EBADF)."""
    held = []
    for fd, link in opened:
        try:
            copy = os.dup(fd)
        except OSError:
            continue  # closed meanwhile
        if os.fstat(copy).st_ino == int(link[len("socket:["):-1]) and _is_gloo(copy, published):
            held.append(copy)
        else:  # closed and reused meanwhile, or not gloo's
            os.close(copy)
    return held


def _is_gloo(fd, published) -> bool:
    try:
        with _wrap(fd) as s:
            return s.type == socket.SOCK_STREAM and s.family in (socket.AF_INET, socket.AF_INET6) \
                and any(_published(s.family, end, published) for end in (s.getsockname(), s.getpeername()))
    except OSError:  # not connected (a listening socket has no peer)
        return False


def peers(fds) -> dict:
    """{fd: the peer's address} of connected sockets."""
    found = {}
    for fd in fds:
        try:
            with _wrap(fd) as s:
                found[fd] = s.getpeername()[0]
        except OSError:
            pass
    return found


def ended(fds) -> list:
    """The sockets whose peer closed or reset the connection, found without reading."""
    poll = select.poll()
    for fd in fds:
        poll.register(fd, select.POLLIN | select.POLLRDHUP)
    return [fd for fd, events in poll.poll(0) if events & (select.POLLRDHUP | select.POLLHUP | select.POLLERR)]


def release(fds) -> None:
    for fd in fds:
        os.close(fd)


def _published(family, end, published) -> bool:
    port, host = struct.pack(">H", end[1]), socket.inet_pton(family, end[0])
    # sockaddr_in: port, address; sockaddr_in6: port, 4 bytes of flow information, address
    gap = 0 if family == socket.AF_INET else 4
    return any(_holds(value, port, gap, host) for value in published)


def _holds(value: bytes, port: bytes, gap: int, host: bytes) -> bool:
    """Whether `value` has `port`, then `gap` bytes, then `host`. Not a regular expression:
    each round's addresses would be compiled into re's cache, which the program shares."""
    at = value.find(port)
    while at >= 0:
        start = at + len(port) + gap
        if value[start:start + len(host)] == host:
            return True
        at = value.find(port, at + 1)
    return False


def cut(fds, how=socket.SHUT_RDWR) -> None:
    """Shut the sockets down: SHUT_RDWR also tells the peers at once. SHUT_RD (reading only)
    fails this end alone, and writes still succeed: a cut made while another thread or process
    may be about to send over the sockets must not fail that send (see PYGLOO_BROKEN_CUT)."""
    for fd in fds:
        try:
            with _wrap(fd) as s:
                s.shutdown(how)
        except OSError:
            pass


# pygloo's gloo leaves a send its own socket refused (EPIPE, ECONNRESET) queued and, when the
# connection then fails, never tells that send: its collective waits out the 30 s timeout
# (UnboundBuffer::waitSend). A cut of the writing side made just before the worker sends, and
# before gloo's event loop saw the connection end, did that. So the cuts made while the worker
# may be about to send (by the voucher and the heartbeat thread, once the driver says the round
# broke) shut the reading side only: every pending receive ends (gloo's loop reads the end of
# the stream), and a send still succeeds. abort() runs on the main thread once a collective
# failed, and cuts both sides.
PYGLOO_BROKEN_CUT = socket.SHUT_RD


def published_listeners(published) -> dict:
    """{inode: (host, port)} of this process's listening TCP sockets at an address in
    `published` (see hold_gloo). From the sockets themselves: the host's TCP table can hold
    tens of thousands of rows, and this runs while gloo connects, holding the GIL."""
    found = {}
    for fd, _ in open_sockets():
        try:
            with _wrap(fd) as s:
                if s.type == socket.SOCK_STREAM and s.family in (socket.AF_INET, socket.AF_INET6) \
                        and s.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN) \
                        and _published(s.family, s.getsockname(), published):
                    found[os.fstat(s.fileno()).st_ino] = s.getsockname()[:2]
        except OSError:
            pass  # closed meanwhile
    return found


def knock(pid, wanted) -> set:
    """Connect once to each listening socket in `wanted` ({inode: (host, port)}, as
    published_listeners names them) that `pid` still holds, and hang up: a pair of pygloo's
    gloo waiting for its peer takes any connection, so its wait ends (and the pair fails on
    first use). Held is judged by inode, from `pid`'s descriptors: a closed listener's port may
    be a later one's. Not from the host's TCP table: with tens of thousands of rows (TIME_WAIT
    after many re-forms) reading it took 45 ms of CPU, 0.5 s under load, on every beat of
    every voucher, which kept them from beating. All at once, waiting at most KNOCK_WAIT: a
    pair that does not accept (its listen backlog of 1 full) must not hold the caller, the
    voucher, whose beats keep the worker alive. Returns the inodes knocked on."""
    held = inodes(open_sockets(pid))
    found = [(inode, *address) for inode, address in wanted.items() if inode in held]
    knocks, poller = [], select.poll()
    for _, host, port in found:
        host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
        s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        s.connect_ex((host, port))
        poller.register(s, select.POLLOUT)
        knocks.append(s)
    pending, deadline = len(knocks), time.monotonic() + KNOCK_WAIT
    while pending and time.monotonic() < deadline:  # until each connected (or was refused)
        for fd, _ in poller.poll(max(0, int((deadline - time.monotonic()) * 1000))):
            poller.unregister(fd)
            pending -= 1
    for s in knocks:
        s.close()
    return {inode for inode, _, _ in found}
