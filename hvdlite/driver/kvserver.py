"""The driver's KV server (rendezvous store for gloo and workers): one asyncio loop on one
thread serves every connection, long-poll and heartbeat; none costs a thread.

Protocol, HTTP/1.1 with keep-alive; every request is signed, and so is every answer to a
signed request (hvdlite.worker.kvproto):

- ``PUT    /kv/<scope>/<key>``          body is the value -> 200
- ``GET    /kv/<scope>/<key>``          -> 200 + value, or 404
- ``GET    /kv/<scope>/<key>?wait=S``   long-poll: 200 + value, 408 after min(S, 60) s, 503 on stop
- ``DELETE /kv/<scope>/<key>``          -> 200, or 404
- ``POST   /kv/<scope>/<key>?add=N``    atomic add on an ASCII decimal -> 200 + new value
- ``GET    /kv/<scope>?prefix=P&count=N&wait=S``  once keys P0 .. P<N-1> all exist: those
  keys in one answer (kvproto.encode_snapshot), so a rank reads its peers' addresses in one
  request, not N (gloo names a rank's key by a prefix and the rank)

Scope and key are percent-encoded path segments, 1..512 bytes once decoded (UTF-8). Routes
added with ``add_route`` share the authentication and the limits. Heartbeats are signed UDP
datagrams on the same port (kvproto.encode_beat), read in batches every BEAT_POLL and
answered with what the ``set_heartbeat`` handler says for the batch.

Unauthenticated connections are bounded (count, head size, time to authenticate; the oldest
is dropped for a new one), and a body is read only after the head's signature checked out, so
a flood of them costs bounded memory and does not lock real workers out.
"""
import asyncio
import collections
import errno
import heapq
import hmac
import re
import socket
import threading
import time
from concurrent.futures import Future
from urllib.parse import unquote, unquote_to_bytes

from hvdlite.worker import kvproto

MAX_BODY = kvproto.MAX_BODY
MAX_HEAD = kvproto.MAX_HEAD
MAX_NAME = 512
MAX_FAMILY = 1 << 20  # keys one snapshot may wait for
MAX_WAIT = 60.0  # one long-poll or deferred route answer; clients loop for longer waits
IDLE_TIMEOUT = 10.0  # seconds an idle kept-alive connection, or one request in transit, may take
AUTH_TIMEOUT = 5.0  # seconds a new connection has to send its first signed request
# Connections not yet authenticated; the oldest goes for a new one. Room for thousands of
# workers connecting at once (a few KiB each), while a flood is bounded and cannot lock out.
MAX_UNAUTHENTICATED = 4096
MAX_CONNECTIONS = 16384
BACKLOG = 4096
UDP_BUFFER = 4 * 1024 * 1024
BEAT_POLL = 0.01  # seconds between reads of the heartbeat socket: a beat waits this at most
MAX_BEATS_PER_POLL = 10000
BULK = 256 * 1024  # an answer this big waits its turn while...
BULK_BUDGET = 64 * 1024 * 1024  # ...big answers not yet taken by the kernel hold this much
BULK_HASHED = 4096  # bodies this big have their hash remembered (_body_sha)

_PERCENT_OK = re.compile(r"(?:[^%]|%[0-9A-Fa-f]{2})*")
_DIGITS = re.compile(r"[0-9]+")
_INTEGER = re.compile(r"[+-]?[0-9]+")
_REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found",
            405: "Method Not Allowed", 408: "Request Timeout", 413: "Payload Too Large",
            431: "Request Header Fields Too Large", 500: "Internal Server Error",
            503: "Service Unavailable"}
_METHODS = ("GET", "PUT", "POST", "DELETE")
_AUTH = kvproto.AUTH_HEADER.lower()


class _BadRequest(Exception):
    pass


def _decode_segment(raw: str) -> str:
    if not _PERCENT_OK.fullmatch(raw):
        raise _BadRequest("bad percent-encoding")
    data = unquote_to_bytes(raw)
    if not 0 < len(data) <= MAX_NAME:
        raise _BadRequest(f"names must be 1..{MAX_NAME} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise _BadRequest("names must be UTF-8") from None


def _parse_query(raw: str) -> dict:
    """name=value&... as parse_qsl(strict) reads it, the last of a repeated name counting;
    without its cost on the plain fields every request has."""
    query = {}
    if raw:
        for field in raw.split("&"):
            name, eq, value = field.partition("=")
            if not eq:
                raise _BadRequest("bad query string")
            query[_unquote(name)] = _unquote(value)
    return query


def _unquote(text: str) -> str:
    text = text.replace("+", " ")
    if "%" not in text:
        return text
    try:
        return unquote(text, errors="strict")
    except UnicodeDecodeError:
        raise _BadRequest("bad query string") from None


def _seconds(query) -> float:
    try:
        seconds = float(query["wait"])
    except ValueError:
        raise _BadRequest("wait must be a number of seconds") from None
    if not 0 <= seconds < float("inf"):
        raise _BadRequest("wait must be a number of seconds")
    return seconds


class Replays:
    """Nonces seen within the accepted clock window (pure: the caller passes the time)."""

    def __init__(self, skew: float = kvproto.SKEW):
        self.skew = skew
        self._seen, self._expiry = set(), []  # heap of (time the nonce goes stale, nonce)

    def verdict(self, stamp: float, nonce: str, now: float):
        """None to accept (and remember) the nonce, else why it is refused."""
        if abs(stamp - now) > self.skew:
            return "stale"
        while self._expiry and self._expiry[0][0] < now:
            self._seen.discard(heapq.heappop(self._expiry)[1])
        if nonce in self._seen:
            return "replayed"
        self._seen.add(nonce)
        heapq.heappush(self._expiry, (stamp + self.skew, nonce))
        return None

    def __len__(self):
        return len(self._seen)


class Senders:
    """Heartbeat senders' counters: a datagram must carry a counter above its sender's last."""

    def __init__(self, skew: float = kvproto.SKEW):
        self.skew = skew
        self._last = {}  # sender -> (counter, newest time)

    def verdict(self, stamp: float, sender: bytes, counter: int, now: float):
        if abs(stamp - now) > self.skew:
            return "stale"
        last = self._last.get(sender)
        if last is not None and counter <= last[0]:
            return "replayed"
        self._last[sender] = (counter, max(stamp, last[1]) if last else stamp)
        return None

    def prune(self, now: float) -> None:
        """Forget senders silent for longer than any datagram of theirs stays acceptable."""
        self._last = {s: v for s, v in self._last.items() if v[1] + self.skew >= now}


class KVServer:
    def __init__(self, secret: str, bind: str = "127.0.0.1", port: int = 0,
                 idle_timeout: float = IDLE_TIMEOUT, auth_timeout: float = AUTH_TIMEOUT,
                 max_unauthenticated: int = MAX_UNAUTHENTICATED, max_wait: float = MAX_WAIT):
        self._key = kvproto.job_key(secret)
        self._beat_key = kvproto.beat_key(self._key)
        self.idle_timeout, self.auth_timeout, self.max_wait = idle_timeout, auth_timeout, max_wait
        self.max_unauthenticated = max_unauthenticated
        self._lock = threading.Lock()  # data, waiters: the driver's threads use them too
        self._data = {}  # scope -> {key: bytes}
        self._waiters = {}  # (scope, key) -> {token: callback(value or None)}
        self._families = {}  # scope -> {(prefix, count): _Family}
        self._routes = []  # (prefix, handler), longest prefix first
        self._heartbeat = None
        self._replays, self._senders = Replays(), Senders()
        self._bulk = collections.deque()  # (connection, head, body, close) waiting to be written
        self._bulk_bytes = 0  # big answers written but still in their connections' buffers
        self._big_sha = None  # (body, its sha256) of the last big answer
        self._connections = {}  # _Connection -> None, oldest first
        self._unauthenticated = {}  # the same, not authenticated yet
        self._stopped = False
        self._loop = asyncio.new_event_loop()
        self._loop_thread = None
        self._thread = None
        self._tcp, self._udp = _bind_pair(bind, port)
        self._address = tuple(self._tcp.getsockname()[:2])

    @property
    def address(self):
        return self._address

    def start(self) -> None:
        ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(ready,), name="hvdlite-kvserver",
                                        daemon=True)
        self._thread.start()
        ready.wait()

    def _run(self, ready):
        loop = self._loop
        asyncio.set_event_loop(loop)
        self._loop_thread = threading.get_ident()
        self._listener = loop.run_until_complete(
            loop.create_server(lambda: _Connection(self), sock=self._tcp, backlog=BACKLOG))
        loop.call_soon(self._sweep)
        loop.call_soon(self._drain_beats)
        ready.set()
        loop.run_forever()
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()

    def stop(self) -> None:
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
        if self._thread is None:
            self._tcp.close()
            self._udp.close()
            return
        self._loop.call_soon_threadsafe(self._shutdown)
        self._thread.join(10)

    def _shutdown(self):
        self._listener.close()
        self._udp.close()
        with self._lock:
            waiting = [cb for group in self._waiters.values() for cb in group.values()]
            waiting += [cb for fams in self._families.values() for f in fams.values() for cb in f.waiters.values()]
            self._waiters, self._families = {}, {}
        for callback in waiting:
            callback(None)  # answers 503: the server is stopping
        for conn in list(self._connections):
            conn.close()
        self._loop.call_soon(self._loop.stop)

    def _drain_beats(self):
        """Answer the heartbeat datagrams that came in since the last call, then sleep a little:
        thousands of workers' beats cost one loop turn per BEAT_POLL, not one each, and one
        call of the handler."""
        if self._stopped:
            return
        udp, key, handler, senders = self._udp, self._beat_key, self._heartbeat, self._senders
        heard, now = [], time.time()
        for _ in range(MAX_BEATS_PER_POLL):
            try:
                data, addr = udp.recvfrom(kvproto.MAX_DATAGRAM + 1)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:  # an ICMP error for a worker that went away; the socket is fine
                continue
            beat = kvproto.decode_beat(key, data)  # None unless signed
            if beat is not None and handler is not None and not senders.verdict(beat[1], beat[2], beat[3], now):
                heard.append((beat, addr))
        if heard:
            self._answer_beats(handler, heard)
        self._loop.call_later(BEAT_POLL, self._drain_beats)

    def _answer_beats(self, handler, heard):
        try:
            sign = kvproto.beat_answerer(self._beat_key, handler([beat[4:] for beat, _ in heard]))
        except Exception:  # noqa: BLE001 - no answers; the workers' liveness checks decide
            return
        udp = self._udp
        for beat, addr in heard:
            try:
                udp.sendto(sign(beat[0]), addr)
            except OSError:  # buffer full or unreachable: the worker beats again soon
                pass

    def _sweep(self):
        """Drop connections past their deadline; forget silent heartbeat senders."""
        now = time.monotonic()
        for conn in [c for c in self._connections if c.deadline is not None and c.deadline < now]:
            conn.close()
        self._senders.prune(time.time())
        if not self._stopped:
            self._loop.call_later(min(1.0, self.idle_timeout / 4, self.auth_timeout / 4), self._sweep)

    # -- data, shared by HTTP and the driver ------------------------------------------------

    def put(self, scope: str, key: str, value: bytes) -> None:
        self._notify(self._set(scope, key, bytes(value)))

    def get(self, scope: str, key: str):
        with self._lock:
            return self._data.get(scope, {}).get(key)

    def delete(self, scope: str, key: str) -> bool:
        with self._lock:
            keys = self._data.get(scope, {})
            found = keys.pop(key, None) is not None
            if not keys:
                self._data.pop(scope, None)
            for family in self._families.get(scope, {}).values():
                if found and family.member(key):
                    family.present -= 1
                    family.snapshot = None
            return found

    def delete_scope(self, scope: str) -> None:
        with self._lock:
            self._data.pop(scope, None)
            self._families.pop(scope, None)

    def add(self, scope: str, key: str, amount: int) -> int:
        with self._lock:
            old = self._data.get(scope, {}).get(key, b"0")
            if not _INTEGER.fullmatch(old.decode("latin-1")):
                raise ValueError(f"value of {scope}/{key} is not an integer")
            new = int(old) + amount
        self._notify(self._set(scope, key, str(new).encode("ascii")))
        return new

    def _set(self, scope, key, value):
        """Store; returns the callbacks to run (outside the lock) and what to pass them."""
        with self._lock:
            keys = self._data.setdefault(scope, {})
            new = key not in keys
            keys[key] = value
            woken = [(cb, value) for cb in self._waiters.pop((scope, key), {}).values()]
            for family in self._families.get(scope, {}).values():
                if not family.member(key):
                    continue
                family.snapshot = None
                family.present += new
                if family.complete() and family.waiters:
                    snapshot = family.encode(keys)
                    woken += [(cb, snapshot) for cb in family.waiters.values()]
                    family.waiters = {}
            return woken

    @staticmethod
    def _notify(woken):
        for callback, value in woken:
            callback(value)

    def wait(self, scope: str, key: str, timeout: float):
        """The value once the key exists, or None after timeout seconds (or on stop)."""
        done, result = threading.Event(), []

        def woken(value):
            result.append(value)
            done.set()
        token = object()
        with self._lock:
            value = self._data.get(scope, {}).get(key)
            if value is not None or self._stopped:
                return value
            self._waiters.setdefault((scope, key), {})[token] = woken
        done.wait(timeout)
        self._forget_waiter((scope, key), token)
        return result[0] if result else None

    def _forget_waiter(self, name, token):
        with self._lock:
            group = self._waiters.get(name)
            if group is not None:
                group.pop(token, None)
                if not group:
                    del self._waiters[name]

    def _forget_gather(self, family, token):
        with self._lock:
            family.waiters.pop(token, None)

    def add_route(self, prefix: str, handler) -> None:
        """Serve ``prefix`` + subpath with handler(method, subpath, query, body).

        The handler runs on the server's thread and must not block. It returns (status, body),
        or a concurrent.futures.Future resolving to one, which the route's owner completes
        from any thread; one still pending after the long-poll cap is answered 408 and
        cancelled (so is one whose client went away). subpath is passed still percent-encoded
        so handlers can split it on "/" unambiguously; query values are decoded. An exception
        in the handler answers 500.
        """
        # Rebound, never mutated: the loop iterates it without the lock.
        self._routes = sorted(self._routes + [(prefix, handler)], key=lambda route: -len(route[0]))

    def set_heartbeat(self, handler) -> None:
        """Answer heartbeat datagrams with handler(beats) -> bytes, on the server's thread (it
        must not block): beats are the (worker, commit) pairs of the good datagrams that came
        in together, each answered with what the handler returned."""
        self._heartbeat = handler

    # -- dispatch (server thread) -----------------------------------------------------------

    def call_soon(self, callback, *args):
        """Run callback on the server's thread: at once if this is it."""
        if threading.get_ident() == self._loop_thread:
            callback(*args)
        elif not self._loop.is_closed():
            try:
                self._loop.call_soon_threadsafe(callback, *args)
            except RuntimeError:  # closed meanwhile: nobody is left to answer
                pass

    def _serve(self, conn, method, target, body):
        """(status, body), or a (Future, cancel) pair for an answer that comes later."""
        path, _, raw_query = target.partition("?")
        query = _parse_query(raw_query)
        if path.startswith("/kv/"):
            return self._serve_kv(conn, method, path[len("/kv/"):], query, body)
        for prefix, handler in self._routes:
            if path.startswith(prefix):
                answer = handler(method, path[len(prefix):], query, body)
                return (answer, answer.cancel) if isinstance(answer, Future) else answer
        return 404, b"unknown path"

    def _serve_kv(self, conn, method, subpath, query, body):
        parts = subpath.split("/")
        if len(parts) == 1 and method == "GET":
            return self._gather(_decode_segment(parts[0]), query)
        if len(parts) != 2:
            return 404, b"expected /kv/<scope>/<key>"
        scope, key = (_decode_segment(part) for part in parts)
        if method == "PUT":
            self.put(scope, key, body)
            # Naming a family makes it a gather too: a gloo rank publishes its address and
            # reads every peer's in one request.
            return self._gather(scope, query) if "count" in query else (200, b"")
        if method == "GET":
            if "wait" not in query:
                value = self.get(scope, key)
                return (404, b"no such key") if value is None else (200, value)
            seconds = _seconds(query)
            token = object()
            with self._lock:
                value = self._data.get(scope, {}).get(key)
                if value is not None:
                    return 200, value
                future = Future()
                self._waiters.setdefault((scope, key), {})[token] = \
                    lambda v: _resolve(future, (200, v) if v is not None else (503, b"server stopping"))
            return future, lambda: self._forget_waiter((scope, key), token), seconds, b"key not set in time"
        if method == "DELETE":
            return (200, b"") if self.delete(scope, key) else (404, b"no such key")
        if method == "POST":
            if not _INTEGER.fullmatch(query.get("add", "")):
                raise _BadRequest("POST needs ?add=<integer>")
            try:
                return 200, str(self.add(scope, key, int(query["add"]))).encode("ascii")
            except ValueError as e:
                raise _BadRequest(str(e)) from None
        return 405, b"method not allowed"

    def _gather(self, scope, query):
        count, prefix = query.get("count", ""), query.get("prefix", "")
        if not _DIGITS.fullmatch(count) or int(count) > MAX_FAMILY:
            raise _BadRequest(f"count must be a number of keys up to {MAX_FAMILY}")
        seconds = _seconds(query) if "wait" in query else 0.0
        token = object()
        with self._lock:
            keys = self._data.get(scope, {})
            families = self._families.setdefault(scope, {})
            family = families.get((prefix, int(count)))
            if family is None:  # shared by every rank asking: counted once, then kept up to date
                family = families[prefix, int(count)] = _Family(prefix, int(count), keys)
            if family.complete():
                return 200, family.encode(keys)
            if "wait" not in query:
                return 408, b"not every key of the family is set"
            future = Future()
            family.waiters[token] = lambda s: _resolve(
                future, (200, s) if s is not None else (503, b"server stopping"))
        return future, lambda: self._forget_gather(family, token), seconds, b"keys not all set in time"

    # -- connections (server thread) --------------------------------------------------------

    def _admit(self, conn) -> bool:
        if self._stopped or len(self._connections) >= MAX_CONNECTIONS:
            return False
        if len(self._unauthenticated) >= self.max_unauthenticated:
            next(iter(self._unauthenticated)).close()  # the oldest: a flood cannot lock us out
        self._connections[conn] = None
        self._unauthenticated[conn] = None
        return True

    def _forget(self, conn):
        self._connections.pop(conn, None)
        self._unauthenticated.pop(conn, None)

    def _pump(self):
        """Write waiting big answers while the budget allows (always at least one): a world's
        snapshot answered to thousands of ranks at once must not be copied into memory whole."""
        while self._bulk and (not self._bulk_bytes or self._bulk_bytes + len(self._bulk[0][2]) <= BULK_BUDGET):
            conn, head, body, close = self._bulk.popleft()
            if not conn.closed:
                conn._send(head, body, close)

    def _authenticate(self, method, target, fields):
        """(None, True) if the signed head is good, else ((status, reason), authentic): a
        stale or replayed request is still signed with the job's key, so its answer is signed
        too (a client corrects its clock only by a signed answer). Remembers the nonce."""
        if fields is None:
            return (401, b"missing or malformed " + kvproto.AUTH_HEADER.encode()), False
        stamp, nonce, body_sha, mac = fields
        expected = kvproto.signature(self._key, method, target, body_sha, stamp, nonce)
        if not hmac.compare_digest(mac, expected):
            return (403, b"bad signature"), False
        refused = self._replays.verdict(float(stamp), nonce, time.time())
        return ((403, refused.encode()) if refused else None), True

    def _body_sha(self, body) -> str:
        """The sha256 an answer's signature covers. A world's snapshot goes to every rank in
        turn: the last big body's is kept, so it is hashed once, not once per rank."""
        if len(body) < BULK_HASHED or type(body) is not bytes:
            return kvproto.body_sha(body)
        last = self._big_sha
        if last is None or last[0] is not body:
            last = self._big_sha = (body, kvproto.body_sha(body))
        return last[1]


class _Family:
    """The keys prefix0 .. prefix<count-1> of a scope, as ranks wait for all of them."""

    def __init__(self, prefix, count, keys):
        self.prefix, self.count = prefix, count
        self.present = sum(1 for i in range(count) if f"{prefix}{i}" in keys)
        self.waiters = {}  # token -> callback(snapshot or None)
        self.snapshot = None  # encoded once complete, shared by every answer

    def member(self, key) -> bool:
        rank = key[len(self.prefix):]
        return key.startswith(self.prefix) and rank.isdigit() and str(int(rank)) == rank \
            and int(rank) < self.count

    def complete(self) -> bool:
        return self.present == self.count

    def encode(self, keys) -> bytes:
        if self.snapshot is None:
            names = (f"{self.prefix}{i}" for i in range(self.count))
            self.snapshot = kvproto.encode_snapshot((name, keys[name]) for name in names)
        return self.snapshot


def _answered(answer) -> Future:
    future = Future()
    future.set_result(answer)
    return future


def _resolve(future, answer):
    if not future.done():
        try:
            future.set_result(answer)
        except Exception:  # noqa: BLE001 - cancelled meanwhile
            pass


class _Connection(asyncio.Protocol):
    """One client connection: parses requests, checks signatures, answers in order."""

    def __init__(self, server: KVServer):
        self.server = server
        self.transport = None
        self.buffer = bytearray()
        self.head = None  # (method, target, auth fields, body length, close) awaiting its body
        self.pending = None  # (future, cancel, timer) of the answer being waited for
        self.authenticated = False
        self.deadline = None
        self.closed = False
        self.queued = False  # a big answer waits for its turn: later requests wait behind it
        self.held = 0  # bytes of big answers in this connection's buffer
        self.answering = None  # signature of the request being answered, when it is the job's

    def connection_made(self, transport):
        self.transport = transport
        if not self.server._admit(self):
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
        self.closed = True
        self.server._forget(self)
        self._drop_pending()
        self.resume_writing()

    def pause_writing(self):
        pass  # resume_writing says when the buffer has drained

    def resume_writing(self):
        if self.held:
            self.server._bulk_bytes -= self.held
            self.held = 0
            self.server._pump()

    def close(self):
        if not self.closed:
            self.closed = True
            self.server._forget(self)
            self._drop_pending()
            self.transport.abort()

    def _drop_pending(self):
        if self.pending is not None:
            future, cancel, timer = self.pending
            self.pending = None
            timer.cancel()
            cancel()
            future.cancel()

    def data_received(self, data):
        if self.closed:
            return
        self.buffer += data
        if self.pending is not None and len(self.buffer) > MAX_HEAD:
            return self._fail(400, b"requests pipelined behind a waiting one")
        try:
            self._process()
        except Exception as e:  # noqa: BLE001 - a bug here must cost one connection, loudly
            if not self.closed:
                self._fail(500, f"{type(e).__name__}: {e}".encode())

    def _process(self):
        while not self.closed and self.pending is None and not self.queued:
            if self.head is None:
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
                    self.head = self._parse_head(head)
                except _BadRequest as e:
                    return self._fail(*e.args)
                if self.authenticated:  # the rest of this request must come in time
                    self.deadline = time.monotonic() + self.server.idle_timeout
            method, target, fields, length, close = self.head
            if len(self.buffer) < length:
                return
            body = bytes(self.buffer[:length])
            del self.buffer[:length]
            self.head = None
            if kvproto.body_sha(body) != fields[2]:
                return self._fail(403, b"body does not match its signed hash")
            if not self.authenticated:
                self.authenticated = True
                self.server._unauthenticated.pop(self, None)
            self._answer(method, target, body, close)

    def _parse_head(self, head: bytes):
        self.answering = None
        lines = head.decode("latin-1").split("\r\n")
        words = lines[0].split(" ")
        if len(words) != 3 or not words[2].startswith("HTTP/1.") or not words[1].startswith("/"):
            raise _BadRequest(400, b"bad request line")
        method, target = words[0], words[1]
        headers, lengths = {}, []
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep or not name or name != name.strip():
                raise _BadRequest(400, b"bad header line")
            name = name.lower()
            value = value.strip()
            if name == "content-length":
                lengths.append(value)
            elif name == _AUTH and name in headers:
                headers[name] = ""  # two signatures: which one would count is anybody's guess
            headers.setdefault(name, value)
        # Authentication comes first: nothing about an unsigned request is worth an answer.
        auth = headers.get(_AUTH)
        fields = kvproto.parse_auth(auth) if auth else None
        refused, authentic = self.server._authenticate(method, target, fields)
        if authentic:
            self.answering = fields[3]
        if refused:
            status, reason = refused
            if reason == b"stale":
                raise _BadRequest(status, reason, f"{time.time():.3f}")
            raise _BadRequest(status, reason)
        if method not in _METHODS:
            raise _BadRequest(405, b"method not allowed")
        if "transfer-encoding" in headers:
            raise _BadRequest(400, b"Transfer-Encoding is not supported; send Content-Length")
        lengths = lengths or ["0"]
        if len(lengths) != 1 or not _DIGITS.fullmatch(lengths[0]):
            raise _BadRequest(400, b"bad Content-Length")
        length = int(lengths[0])
        if length > MAX_BODY:
            raise _BadRequest(413, b"body over 64 MiB")
        if headers.get("expect", "").lower() == "100-continue":
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        close = headers.get("connection", "").lower() == "close"
        return method, target, fields, length, close

    def _answer(self, method, target, body, close):
        server = self.server
        try:
            answer = server._serve(self, method, target, body)
        except _BadRequest as e:
            answer = 400, str(e.args[0]).encode() if len(e.args) == 1 else e.args[1]
        except Exception as e:  # noqa: BLE001 - a failing route handler answers 500
            answer = 500, f"{type(e).__name__}: {e}".encode()
        if isinstance(answer, tuple) and len(answer) in (2, 4) and isinstance(answer[0], Future):
            future, cancel = answer[:2]
            seconds, expired = answer[2:] if len(answer) == 4 else (server.max_wait, b"no answer yet")
            timer = server._loop.call_later(min(seconds, server.max_wait), self._expire, future, expired)
            self.pending = (future, cancel, timer)
            self.deadline = None
            future.add_done_callback(lambda f: server.call_soon(self._deferred, f, close))
            return
        self._reply(answer, close)

    def _expire(self, future, reason):
        if self.pending is not None and self.pending[0] is future:
            future_, cancel, _ = self.pending
            self.pending = None
            cancel()
            future.cancel()
            self._reply((408, reason), False)
            self._process()

    def _deferred(self, future, close):
        if self.pending is None or self.pending[0] is not future or self.closed:
            return
        self.pending[2].cancel()
        self.pending = None
        error = None if future.cancelled() else future.exception()
        if future.cancelled():
            future = _answered((503, b"the route gave up this request"))
        self._reply((500, f"{type(error).__name__}: {error}".encode()) if error else future.result(), close)
        self._process()

    def _reply(self, answer, close):
        status, body = answer if isinstance(answer, tuple) and len(answer) == 2 else (None, None)
        if not (isinstance(status, int) and 200 <= status <= 599 and isinstance(body, (bytes, bytearray))):
            status, body = 500, b"route handler returned an invalid (status, body)"
        self._write(status, body, close)
        self.deadline = None if close else time.monotonic() + self.server.idle_timeout

    def _write(self, status, body, close, extra=""):
        if close:
            extra += "Connection: close\r\n"
        if self.answering is not None:
            server = self.server
            signature = kvproto.answer_signature(server._key, self.answering, status, server._body_sha(body))
            extra += f"{kvproto.SIG_HEADER}: {signature}\r\n"
        head = f"HTTP/1.1 {status} {_REASONS.get(status, 'Status')}\r\nContent-Length: {len(body)}\r\n{extra}\r\n"
        head = head.encode("latin-1")
        if len(body) < BULK:
            self.transport.write(head + body)
        else:
            self.queued = True
            self.server._bulk.append((self, head, body, close))
            return self.server._pump()
        if close:
            self.closed = True
            self.server._forget(self)
            self.transport.close()

    def _send(self, head, body, close):
        """Write a big answer whose turn came."""
        self.queued = False
        self.held += len(body)
        self.server._bulk_bytes += len(body)
        self.transport.writelines((head, body))
        if not self.transport.get_write_buffer_size():
            self.resume_writing()  # the kernel took it all at once
        if close:
            self.closed = True
            self.server._forget(self)
            self.transport.close()
        else:
            self._process()

    def _fail(self, status, reason, server_time=None):
        """Answer an error and close: the rest of the stream cannot be trusted."""
        self._write(status, reason, True, f"{kvproto.TIME_HEADER}: {server_time}\r\n" if server_time else "")


def _bind_pair(bind, port):
    """A listening TCP socket and a UDP socket on the same port."""
    for _ in range(50 if port == 0 else 1):
        family = socket.AF_INET6 if ":" in bind else socket.AF_INET
        tcp = socket.socket(family, socket.SOCK_STREAM)
        tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        tcp.bind((bind, port))
        tcp.listen(BACKLOG)
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
