"""Heartbeats to the KV server: signed UDP datagrams on its TCP port (kvproto.encode_beat).

The server's loop reads them in batches, one every BEAT_POLL seconds, and answers every good
datagram of a batch with what the heartbeat handler returned for the batch: thousands of
workers' beats cost one loop turn per BEAT_POLL, not one each, and one call of the handler.
A launch's claim of the job's secret (driver/claims.py) comes on the same socket, shorter than
any heartbeat, and is answered on its own.

Junk costs the loop next to nothing: on Linux a socket filter drops, in the kernel, every
datagram that has neither a claim's size and mark nor a heartbeat's size range and mark (`_FILTER`),
so random bytes never reach this process; what passes it is checked again in the same way
before any hashing, and a source's datagrams past MAX_PER_SOURCE in one read are dropped unread,
so crafted junk costs a read and a look-up each, its key work bounded per source.
"""
import collections
import errno
import socket
import struct
import sys
import time

from hvdlite.worker import claim, kvproto

UDP_BUFFER = 4 * 1024 * 1024
BEAT_POLL = 0.01  # seconds between reads of the heartbeat socket: a beat waits this at most
MAX_BEATS_PER_POLL = 10000
# Datagrams of one source checked per read: a worker's socket sends a beat per answer, one per
# 0.1-0.5 s, and reads are BEAT_POLL apart; a flood from one source gets no more key work than this.
MAX_PER_SOURCE = 64
_BEAT_SIZES = range(kvproto.BEAT_TAG + kvproto.BEAT_SIZE, kvproto.MAX_DATAGRAM + 1)
_BEAT_MARK = slice(kvproto.BEAT_TAG, kvproto.BEAT_TAG + 2)


class Beats:
    """The datagrams on `udp`, checked by `gate` (auth.Gate); used on the server's thread."""

    def __init__(self, udp, gate):
        self.udp, self.gate = udp, gate
        self.handler = None  # handler(beats) -> bytes; None: datagrams are read and dropped
        self.claims = None  # driver.claims.Claims; None: claims go unanswered

    def drain(self) -> None:
        """Answer the datagrams that came in since the last call."""
        udp, gate, handler = self.udp, self.gate, self.handler
        heard, now, sources = [], time.time(), collections.Counter()
        for _ in range(MAX_BEATS_PER_POLL):
            try:
                data, addr = udp.recvfrom(kvproto.MAX_DATAGRAM + 1)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:  # an ICMP error for a worker that went away; the socket is fine
                continue
            sources[addr] += 1
            if sources[addr] > MAX_PER_SOURCE:
                continue
            if len(data) == claim.REQUEST_SIZE and data.startswith(claim.REQUEST):
                self._claim(data, addr)
                continue
            if len(data) not in _BEAT_SIZES or data[_BEAT_MARK] != kvproto.BEAT_MARK:
                continue
            beat = gate.beat(data, now) if handler is not None else None
            if beat is not None:
                heard.append((beat, addr))
        if heard:
            self._answer(handler, heard)

    def _claim(self, data, addr):
        try:
            answer = self.claims.answer(data, addr, time.monotonic()) if self.claims is not None else None
        except Exception:  # noqa: BLE001 - a bug here must cost one claim, not the heartbeats
            return
        if answer is not None:
            try:
                self.udp.sendto(answer, addr)
            except OSError:  # the worker sends its claim again
                pass

    def _answer(self, handler, heard):
        try:
            sign = self.gate.beat_answerer(handler([beat[4:] for beat, _ in heard]))
        except Exception:  # noqa: BLE001 - no answers; the workers' liveness checks decide
            return
        for beat, addr in heard:
            try:
                self.udp.sendto(sign(beat[0]), addr)
            except OSError:  # buffer full or unreachable: the worker beats again soon
                pass


# The kernel's check (classic BPF; on a UDP socket the packet starts at its 8-byte header):
# a claim's size and first 4 bytes, or a heartbeat's size range and mark; anything else dropped.
_UDP, _LOAD_LEN, _LOAD_WORD, _LOAD_HALF, _JEQ, _JGE, _JGT, _RET = 8, 0x80, 0x20, 0x28, 0x15, 0x35, 0x25, 0x06
_FILTER = (
    (_LOAD_LEN, 0, 0, 0),
    (_JEQ, 0, 2, _UDP + claim.REQUEST_SIZE),
    (_LOAD_WORD, 0, 0, _UDP),
    (_JEQ, 4, 5, int.from_bytes(claim.REQUEST, "big")),
    (_JGE, 0, 4, _UDP + _BEAT_SIZES.start),
    (_JGT, 3, 0, _UDP + _BEAT_SIZES.stop - 1),
    (_LOAD_HALF, 0, 0, _UDP + _BEAT_MARK.start),
    (_JEQ, 0, 1, int.from_bytes(kvproto.BEAT_MARK, "big")),
    (_RET, 0, 0, 0xFFFFFFFF),  # keep it whole
    (_RET, 0, 0, 0),  # drop it
)
SO_ATTACH_FILTER = 26


def only_ours(udp) -> bool:
    """Attach _FILTER to `udp` where the kernel takes it (Linux); whether it did."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes
    program = ctypes.create_string_buffer(b"".join(struct.pack("HBBI", *op) for op in _FILTER))
    try:
        udp.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER,
                       struct.pack("HL", len(_FILTER), ctypes.addressof(program)))  # struct sock_fprog
    except OSError:
        return False
    return True


def bind_pair(bind, port, backlog):
    """A listening TCP socket and the heartbeats' UDP socket on the same port."""
    for _ in range(50 if port == 0 else 1):
        family = socket.AF_INET6 if ":" in bind else socket.AF_INET
        tcp = socket.socket(family, socket.SOCK_STREAM)
        tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        tcp.bind((bind, port))
        tcp.listen(backlog)
        tcp.setblocking(False)
        udp = socket.socket(family, socket.SOCK_DGRAM)
        try:
            udp.bind((bind, tcp.getsockname()[1]))
        except OSError as e:
            tcp.close()
            udp.close()
            if e.errno != errno.EADDRINUSE or port != 0:
                raise
            continue
        udp.setblocking(False)
        only_ours(udp)
        try:  # thousands of workers' beats arrive in bursts; the kernel caps this at rmem_max
            udp.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, UDP_BUFFER)
        except OSError:
            pass
        return tcp, udp
    raise OSError(errno.EADDRINUSE, "no free port for both TCP and UDP")
