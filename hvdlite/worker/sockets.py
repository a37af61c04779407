"""Cutting a process group's TCP connections, the one way to unblock a stuck gloo collective.

abort()/destroy of a gloo group do not return while a peer hangs, but shutting its sockets
down makes every pending operation fail at once, here and, through the closed connection,
on every peer. That turns one worker's failure into a fast, world-wide error.
"""
import os
import socket


def open_sockets() -> set:
    """(fd, socket inode) of this process's sockets. The inode tells a new socket apart from
    an old one whose descriptor number was closed and reused meanwhile."""
    found = set()
    for name in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue  # closed meanwhile
        if link.startswith("socket:"):
            found.add((int(name), link))
    return found


def opened_since(before: set) -> set:
    """Descriptors of the sockets opened since `before` (an open_sockets() result)."""
    return {fd for fd, _ in open_sockets() - before}


def _wrap(fd) -> socket.socket:
    # A duplicate descriptor: closing the wrapper leaves the owner's descriptor alone, while
    # shutdown() acts on the shared socket. Family and type are read from the socket itself.
    return socket.socket(fileno=os.dup(fd))


def tcp_fds(fds, exclude_peer) -> set:
    """The connected TCP sockets among fds, minus those connected to exclude_peer (host, port).
    Listening sockets are left out: collectives never wait on them, and gloo's listener
    aborts the process when accept() fails on a socket shut down under it."""
    kept = set()
    for fd in fds:
        try:
            with _wrap(fd) as s:
                if s.type == socket.SOCK_STREAM and s.family in (socket.AF_INET, socket.AF_INET6) \
                        and s.getpeername()[:2] != exclude_peer:
                    kept.add(fd)
        except OSError:
            pass  # closed meanwhile, or not connected (a listening socket has no peer)
    return kept


def cut(fds) -> None:
    for fd in fds:
        try:
            with _wrap(fd) as s:
                s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
