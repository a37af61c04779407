"""Heartbeats to the KV server: signed UDP datagrams on its TCP port (kvproto.encode_beat).

The server's loop reads them in batches, one every BEAT_POLL seconds, and answers every good
datagram of a batch with what the heartbeat handler returned for the batch: thousands of
workers' beats cost one loop turn per BEAT_POLL, not one each, and one call of the handler.
A launch's claim of the job's secret (driver/claims.py) comes on the same socket, shorter than
any heartbeat, and is answered on its own.
"""
import errno
import socket
import time

from hvdlite.worker import claim, kvproto

UDP_BUFFER = 4 * 1024 * 1024
BEAT_POLL = 0.01  # seconds between reads of the heartbeat socket: a beat waits this at most
MAX_BEATS_PER_POLL = 10000


class Beats:
    """The datagrams on `udp`, checked by `gate` (auth.Gate); used on the server's thread."""

    def __init__(self, udp, gate):
        self.udp, self.gate = udp, gate
        self.handler = None  # handler(beats) -> bytes; None: datagrams are read and dropped
        self.claims = None  # driver.claims.Claims; None: claims go unanswered

    def drain(self) -> None:
        """Answer the datagrams that came in since the last call."""
        udp, gate, handler = self.udp, self.gate, self.handler
        heard, now = [], time.time()
        for _ in range(MAX_BEATS_PER_POLL):
            try:
                data, addr = udp.recvfrom(kvproto.MAX_DATAGRAM + 1)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:  # an ICMP error for a worker that went away; the socket is fine
                continue
            if len(data) == claim.REQUEST_SIZE:
                self._claim(data, addr)
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
        try:  # thousands of workers' beats arrive in bursts; the kernel caps this at rmem_max
            udp.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, UDP_BUFFER)
        except OSError:
            pass
        return tcp, udp
    raise OSError(errno.EADDRINUSE, "no free port for both TCP and UDP")
