"""Cutting a process group's TCP connections, the one way to unblock a stuck gloo collective.

abort()/destroy of a gloo group do not return while a peer hangs, but shutting its sockets
down makes every pending operation fail at once, here and, through the closed connection,
on every peer. That turns one worker's failure into a fast, world-wide error.
"""
import os
import socket


def socket_fds() -> set:
    fds = set()
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{name}").startswith("socket:"):
                fds.add(int(name))
        except OSError:
            pass  # closed meanwhile
    return fds


def _wrap(fd) -> socket.socket:
    # A duplicate descriptor: closing the wrapper leaves the owner's descriptor alone, while
    # shutdown() acts on the shared socket. Family and type are read from the socket itself.
    return socket.socket(fileno=os.dup(fd))


def tcp_fds(fds, exclude_peer) -> set:
    """The TCP sockets among fds, minus those connected to exclude_peer (host, port)."""
    kept = set()
    for fd in fds:
        try:
            with _wrap(fd) as s:
                if s.type != socket.SOCK_STREAM or s.family not in (socket.AF_INET, socket.AF_INET6):
                    continue
                try:
                    if s.getpeername()[:2] == exclude_peer:
                        continue
                except OSError:
                    pass  # a listening socket has no peer
                kept.add(fd)
        except OSError:
            pass
    return kept


def cut(fds) -> None:
    for fd in fds:
        try:
            with _wrap(fd) as s:
                s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
