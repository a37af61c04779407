"""Frames between a driver and its worker template.

A frame is an 8-byte prefix (header length, payload length, big-endian), a JSON header and
raw payload bytes. That runs over any byte stream (an SSH exec channel as well as a unix
socket); on a unix socket a frame may also carry file descriptors (SCM_RIGHTS), announced in
its header as "fds": N and delivered no later than the frame's first byte.

Messages (header "op"):
  template -> driver  ready {pid, python, preloaded, skipped[, socket]} | unusable {reason}
                      started {id, pid} | refused {id, reason, outdated} | exit {id, pid, code}
  driver -> template  spawn {id, argv, env, cwd, fds: 2[, mark]}  (the worker's stdout, stderr)
On this machine the driver holds the template's control socket. On a remote host the
template's `ready` (with the path of its listening socket) and `unusable` go to the driver
over the SSH channel's stdout, and each spawn client (hvdlite.template.spawn) sends its one
spawn over its own connection to that socket and receives its replies there. A kept
template (kept.py) serves drivers on its socket as a remote one serves spawn clients;
`outdated` says it refused because a module it preloaded changed on disk.
"""
import array
import json
import os
import socket
import struct

_PREFIX = struct.Struct(">II")
_MAX_FDS = 8
_CHUNK = 65536


def encode(header: dict, payload: bytes = b"") -> bytes:
    head = json.dumps(header, separators=(",", ":")).encode()
    return _PREFIX.pack(len(head), len(payload)) + head + payload


def send(sock: socket.socket, header: dict, payload: bytes = b"", fds=()) -> None:
    data = encode(dict(header, fds=len(fds)) if fds else header, payload)
    if fds:
        sent = sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
        data = data[sent:]
    if data:
        sock.sendall(data)


def write(fd: int, header: dict) -> None:
    """One frame to a pipe (a remote template's stdout is the driver's SSH channel)."""
    data = encode(header)
    while data:
        data = data[os.write(fd, data):]


class Reader:
    """Splits what a socket delivers into (header, payload, fds) frames."""

    def __init__(self, sock: socket.socket = None):
        self.sock = sock
        self.buffer = b""
        self.fds = []

    def read_once(self) -> bool:
        """Receive what is there (blocking until something is); False at end of stream."""
        data, ancillary, _, _ = self.sock.recvmsg(_CHUNK, socket.CMSG_SPACE(_MAX_FDS * 4))
        for level, kind, raw in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds = array.array("i")
                fds.frombytes(raw[:len(raw) - len(raw) % fds.itemsize])
                self.fds.extend(fds)
        return self.feed(data)

    def feed(self, data: bytes) -> bool:
        """Add bytes read elsewhere (an SSH channel); False for the empty read of end of stream."""
        self.buffer += data
        return bool(data)

    def frames(self):
        while len(self.buffer) >= _PREFIX.size:
            head_len, payload_len = _PREFIX.unpack_from(self.buffer)
            end = _PREFIX.size + head_len + payload_len
            if len(self.buffer) < end:
                return
            header = json.loads(self.buffer[_PREFIX.size:_PREFIX.size + head_len])
            payload = self.buffer[_PREFIX.size + head_len:end]
            self.buffer = self.buffer[end:]
            count = header.get("fds", 0)
            fds, self.fds = self.fds[:count], self.fds[count:]
            yield header, payload, fds
