"""One client connection of the KV server: reads requests in order, has each head's signature
checked before its body is read, and answers one request at a time.

A connection reads the next request only when the last is answered: not while a long-poll
(`poll`) waits, nor while a big answer waits its turn in the pump. `deadline` is when the
server drops it: the time to authenticate, then to finish a request or to send the next."""
import asyncio
import socket
import time
from concurrent.futures import Future

from hvdlite.driver.kv.parse import AUTH, MAX_HEAD, BadRequest, answer_head, body_framing, internal, read_head
from hvdlite.driver.kv.polls import Later, LongPoll
from hvdlite.driver.kv.pump import BULK
from hvdlite.worker import kvproto


class Connection(asyncio.BufferedProtocol):
    def __init__(self, server):
        self.server = server
        self.transport = None
        self.buffer = bytearray()
        self.request = None  # (method, target, fields, body length, close): head read, body not yet
        self.poll = None  # LongPoll of the request being answered later
        self.authenticated = False  # a request signed with the job's key came
        self.signed = None  # mac of the request being answered, when signed with the job's key
        self.deadline = None
        self.closed = False

    # -- transport events -----------------------------------------------------------------

    def connection_made(self, transport):
        self.transport = transport
        if not self.server.admit(self):
            self.closed = True
            transport.abort()
            return
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:  # else Nagle + delayed ACK cost ~44 ms per request
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
        self.deadline = time.monotonic() + min(self.server.auth_timeout, self.server.idle_timeout)
        transport.set_write_buffer_limits(high=0)  # told when anything is buffered, and drained

    def connection_lost(self, exc):
        self._gone()
        self.server.pump.drained(self)

    def pause_writing(self):
        pass  # resume_writing says when the buffer has drained

    def resume_writing(self):
        self.server.pump.drained(self)

    def close(self):
        if not self.closed:
            self._gone()
            self.transport.abort()

    def _gone(self):
        self.closed = True
        self.server.forget(self)
        if self.poll is not None:
            self.poll, poll = None, self.poll
            poll.drop()

    def get_buffer(self, sizehint):
        return self.server.scratch

    def buffer_updated(self, nbytes):
        if self.closed:
            return
        self.buffer += self.server.scratch[:nbytes]
        if self.poll is not None and len(self.buffer) > MAX_HEAD:
            return self._fail(400, b"requests pipelined behind a waiting one")
        try:
            self._process()
        except Exception as e:  # noqa: BLE001 - a bug here must cost one connection, loudly
            if not self.closed:
                self._fail(*internal(e))

    # -- requests ---------------------------------------------------------------------------

    def _process(self):
        while not self.closed and self.poll is None and not self.server.pump.waiting(self):
            if self.request is None:
                end = self.buffer.find(b"\r\n\r\n")
                if end < 0:
                    if len(self.buffer) > MAX_HEAD:
                        self._fail(431, b"request head over 16 KiB")
                    return
                if end > MAX_HEAD:
                    return self._fail(431, b"request head over 16 KiB")
                head = bytes(self.buffer[:end])
                del self.buffer[:end + 4]
                try:
                    self.request = self._read_head(head)
                except BadRequest as e:
                    return self._fail(*e.args)
                if self.authenticated:  # the rest of this request must come in time
                    self.deadline = time.monotonic() + self.server.idle_timeout
            method, target, fields, length, close = self.request
            if len(self.buffer) < length:
                return
            body = bytes(self.buffer[:length])
            del self.buffer[:length]
            self.request = None
            if kvproto.body_sha(body) != fields[2]:
                return self._fail(403, b"body does not match its signed hash")
            if not self.authenticated:
                self.authenticated = True
                self.server.authenticated(self)
            self._answer(method, target, body, close)

    def _read_head(self, head: bytes):
        self.signed = None
        method, target, headers, lengths = read_head(head)
        # Authentication comes first: nothing about an unsigned request is worth an answer.
        refused, fields = self.server.gate.check(method, target, headers.get(AUTH))
        if fields is not None:
            self.signed = fields[3]
        if refused:
            raise BadRequest(*refused)
        length, expects, close = body_framing(method, headers, lengths)
        if expects:
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        return method, target, fields, length, close

    def _answer(self, method, target, body, close):
        server = self.server
        try:
            answer = server.serve(method, target, body)
        except BadRequest as e:
            answer = 400, str(e.args[0]).encode() if len(e.args) == 1 else e.args[1]
        except Exception as e:  # noqa: BLE001 - a failing route handler answers 500
            answer = internal(e)
        if isinstance(answer, tuple) and len(answer) in (2, 4) and isinstance(answer[0], (Future, Later)):
            future, cancel = answer[:2]
            seconds, expired = answer[2:] if len(answer) == 4 else (server.max_wait, b"no answer yet")
            self.deadline = None
            self.poll = LongPoll(future, cancel, lambda later: self._answered_later(later, close))
            self.poll.start(server, min(seconds, server.max_wait), expired)
            return
        self._reply(answer, close)

    def _answered_later(self, answer, close):
        if self.closed:
            return
        self.poll = None
        self._reply(answer, close)
        self._process()

    # -- answers ----------------------------------------------------------------------------

    def _reply(self, answer, close):
        status, body = answer if isinstance(answer, tuple) and len(answer) == 2 else (None, None)
        if not (isinstance(status, int) and 200 <= status <= 599 and isinstance(body, (bytes, bytearray))):
            status, body = 500, b"route handler returned an invalid (status, body)"
        self._write(status, body, close)
        self.deadline = None if close else time.monotonic() + self.server.idle_timeout

    def _write(self, status, body, close, extra=""):
        if close:
            extra += "Connection: close\r\n"
        if self.signed is not None:
            extra += self.server.gate.answer_header(self.signed, status, body)
        head = answer_head(status, len(body), extra)
        if len(body) >= BULK:
            return self.server.pump.queue(self, head, body, close)
        self.transport.write(head + body)
        if close:
            self._close_after_write()

    def send_turn(self, head, body, close):
        """Write a big answer whose turn came (Pump)."""
        self.transport.writelines((head, body))
        if not self.transport.get_write_buffer_size():
            self.resume_writing()  # the kernel took it all at once
        if close:
            self._close_after_write()
        else:
            self._process()

    def _close_after_write(self):
        self._gone()
        self.transport.close()

    def _fail(self, status, reason):
        """Answer an error and close: the rest of the stream cannot be trusted."""
        self._write(status, reason, True)
