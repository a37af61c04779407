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
datagrams on the same port, answered with what the ``set_heartbeat`` handler says (beats.py);
so are the claims of the secret by workers launched without it (``set_claims``, claims.py).

Unauthenticated connections are bounded (count, head size, time to authenticate; the oldest
is dropped for a new one), and a body is read only after the head's signature checked out, so
a flood of them costs bounded memory and does not lock real workers out. The caps follow the
descriptor limit (descriptors.py); should accept() still run out, the oldest stranger goes.

This module holds the data, the routes and the server's life; its parts in this folder read
alone: parse (HTTP), auth (signatures), connection (one client), polls (answers that come
later), families (snapshots of key families), pump (big answers in turn), beats (heartbeats).
"""
import asyncio
import threading
import time
from concurrent.futures import Future

from hvdlite.driver.descriptors import connection_caps
from hvdlite.driver.kv.auth import Gate
from hvdlite.driver.kv.beats import BEAT_POLL, Beats, bind_pair
from hvdlite.driver.kv.connection import Connection
from hvdlite.driver.kv.families import MAX_FAMILY, Families
from hvdlite.driver.kv.parse import DIGITS, INTEGER, BadRequest, decode_segment, parse_query, seconds
from hvdlite.driver.kv.polls import Later, Waiters, resolve
from hvdlite.driver.kv.pump import Pump

MAX_WAIT = 60.0  # one long-poll or deferred route answer; clients loop for longer waits
IDLE_TIMEOUT = 10.0  # seconds an idle kept-alive connection, or one request in transit, may take
AUTH_TIMEOUT = 5.0  # seconds a new connection has to send its first signed request
BACKLOG = 4096
READ_SIZE = 256 * 1024  # bytes one read of a connection takes at most, as asyncio's own
ACCEPT_BATCH = 16  # connections accepted and not yet admitted, at most: a flood cannot hold
# the loop, nor more descriptors than the caps allow and this
ACCEPT_PAUSE = 0.1  # seconds accepting rests when out of descriptors with no stranger to drop
EXHAUSTED_EVERY = 60.0  # seconds between two reports of running out of descriptors


class KVServer:
    def __init__(self, secret: str, bind: str = "127.0.0.1", port: int = 0,
                 idle_timeout: float = IDLE_TIMEOUT, auth_timeout: float = AUTH_TIMEOUT,
                 max_unauthenticated=None, max_connections=None, max_wait: float = MAX_WAIT,
                 on_exhausted=None):
        """The connection caps default to what the descriptor limit leaves room for
        (descriptors.connection_caps). on_exhausted(n), on the server's thread, at most once
        per EXHAUSTED_EVERY: n connections could not be accepted for want of descriptors."""
        self.gate = Gate(secret)
        self.idle_timeout, self.auth_timeout, self.max_wait = idle_timeout, auth_timeout, max_wait
        unauthenticated, total = connection_caps()
        self.max_unauthenticated = max_unauthenticated or unauthenticated
        self.max_connections = max_connections or total
        self._on_exhausted, self._exhausted, self._exhausted_said = on_exhausted, 0, None
        self._lock = threading.Lock()  # data, waiters: the driver's threads use them too
        self._data = {}  # scope -> {key: bytes}
        self._waiters = Waiters()  # who waits for which key
        self._families = Families()  # of each scope, as ranks wait for them
        self._routes = []  # (prefix, handler), longest prefix first
        self._calls, self._calls_lock = [], threading.Lock()  # call_soon's from other threads
        # What every connection reads into, on the loop's thread (asyncio's recv() would
        # allocate READ_SIZE anew for each read: most of a small request's cost).
        self.scratch = memoryview(bytearray(READ_SIZE))
        self.pump = Pump()  # big answers, in turn
        self._connections = {}  # Connection -> None, oldest first
        self._unauthenticated = {}  # the same, not authenticated yet
        self._opening = 0  # accepted, not admitted yet
        self._stopped = False
        self._loop = asyncio.new_event_loop()
        self._loop_thread = None
        self._thread = None
        self._tcp, self._udp = bind_pair(bind, port, BACKLOG)
        self._beats = Beats(self._udp, self.gate)
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
        loop.add_reader(self._tcp.fileno(), self._accept)
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
        self._loop.remove_reader(self._tcp.fileno())
        self._tcp.close()
        self._udp.close()
        with self._lock:
            waiting = self._waiters.drain() + self._families.drain()
        for callback in waiting:
            callback(None)  # answers 503: the server is stopping
        for conn in list(self._connections):
            conn.close()
        self._loop.call_soon(self._loop.stop)

    def _drain_beats(self):
        """Heartbeats, a batch every BEAT_POLL until the server stops (beats.py)."""
        if not self._stopped:
            self._beats.drain()
            self._loop.call_later(BEAT_POLL, self._drain_beats)

    def _sweep(self):
        """Drop connections past their deadline; forget silent heartbeat senders."""
        now = time.monotonic()
        for conn in [c for c in self._connections if c.deadline is not None and c.deadline < now]:
            conn.close()
        self.gate.senders.prune(time.time())
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
            if found:
                self._families.on_delete(scope, key)
            return found

    def delete_scope(self, scope: str) -> None:
        """Forget the scope and the scopes under it ("<scope>.<more>": a world's process sets)."""
        under = scope + "."
        with self._lock:
            for name in [s for s in self._data if s == scope or s.startswith(under)]:
                del self._data[name]
            self._families.drop(scope, under)

    def sizes(self) -> dict:
        """How much the server holds, for soak checks: scopes, key waiters, family scopes,
        connections."""
        with self._lock:
            return {"scopes": len(self._data), "waiters": len(self._waiters),
                    "families": len(self._families), "connections": len(self._connections)}

    def add(self, scope: str, key: str, amount: int) -> int:
        with self._lock:
            old = self._data.get(scope, {}).get(key, b"0")
            if not INTEGER.fullmatch(old.decode("latin-1")):
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
            woken = [(cb, value) for cb in self._waiters.pop((scope, key))]
            return woken + self._families.on_set(scope, key, new, keys)

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
        with self._lock:
            value = self._data.get(scope, {}).get(key)
            if value is not None or self._stopped:
                return value
            token = self._waiters.add((scope, key), woken)
        done.wait(timeout)
        self._forget_waiter((scope, key), token)
        return result[0] if result else None

    def _forget_waiter(self, name, token):
        with self._lock:
            self._waiters.forget(name, token)

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
        must not block): beats are the (worker, commit, vouched) triples of the good datagrams that came
        in together, each answered with what the handler returned."""
        self._beats.handler = handler

    def set_claims(self, claims) -> None:
        """Answer launches' claims of the job's secret (driver.claims.Claims) on the heartbeats' port."""
        self._beats.claims = claims

    # -- dispatch (server thread) -----------------------------------------------------------

    def call_soon(self, callback, *args):
        """Run callback on the server's thread: at once if this is it. Calls from other
        threads share one wake-up of the loop until it runs them (a world's answers come
        from the decision thread by thousands: one self-pipe write and loop turn each cost
        more than the answer)."""
        if threading.get_ident() == self._loop_thread:
            return callback(*args)
        with self._calls_lock:
            self._calls.append((callback, args))
            if len(self._calls) > 1:
                return  # the loop is woken already
        if not self._loop.is_closed():
            try:
                self._loop.call_soon_threadsafe(self._run_calls)
            except RuntimeError:  # closed meanwhile: nobody is left to answer
                pass

    def _run_calls(self):
        with self._calls_lock:
            calls, self._calls = self._calls, []
        for callback, args in calls:  # a handle each: one that fails costs only itself
            self._loop.call_soon(callback, *args)

    def call_later(self, delay, callback, *args):
        return self._loop.call_later(delay, callback, *args)

    def serve(self, method, target, body):
        """(status, body), or (Future, cancel[, seconds, reason if they pass]) for an answer
        that comes later."""
        path, _, raw_query = target.partition("?")
        query = parse_query(raw_query)
        if path.startswith("/kv/"):
            return self._serve_kv(method, path[len("/kv/"):], query, body)
        for prefix, handler in self._routes:
            if path.startswith(prefix):
                answer = handler(method, path[len(prefix):], query, body)
                return (answer, answer.cancel) if isinstance(answer, Future) else answer
        return 404, b"unknown path"

    def _serve_kv(self, method, subpath, query, body):
        parts = subpath.split("/")
        if len(parts) == 1 and method == "GET":
            return self._gather(decode_segment(parts[0]), query)
        if len(parts) != 2:
            return 404, b"expected /kv/<scope>/<key>"
        scope, key = (decode_segment(part) for part in parts)
        if method == "PUT":
            self.put(scope, key, body)
            # Naming a family makes it a gather too: a gloo rank publishes its address and
            # reads every peer's in one request.
            return self._gather(scope, query) if "count" in query else (200, b"")
        if method == "GET":
            if "wait" not in query:
                value = self.get(scope, key)
                return (404, b"no such key") if value is None else (200, value)
            wait = seconds(query)
            with self._lock:
                value = self._data.get(scope, {}).get(key)
                if value is not None:
                    return 200, value
                future = Later()
                token = self._waiters.add((scope, key), lambda v: resolve(
                    future, (200, v) if v is not None else (503, b"server stopping")))
            return future, lambda: self._forget_waiter((scope, key), token), wait, b"key not set in time"
        if method == "DELETE":
            return (200, b"") if self.delete(scope, key) else (404, b"no such key")
        if method == "POST":
            if not INTEGER.fullmatch(query.get("add", "")):
                raise BadRequest("POST needs ?add=<integer>")
            try:
                return 200, str(self.add(scope, key, int(query["add"]))).encode("ascii")
            except ValueError as e:
                raise BadRequest(str(e)) from None
        return 405, b"method not allowed"

    def _gather(self, scope, query):
        count, prefix = query.get("count", ""), query.get("prefix", "")
        if not DIGITS.fullmatch(count) or int(count) > MAX_FAMILY:
            raise BadRequest(f"count must be a number of keys up to {MAX_FAMILY}")
        wait = seconds(query) if "wait" in query else 0.0
        token = object()
        with self._lock:
            keys = self._data.get(scope, {})
            family = self._families.find(scope, prefix, int(count), keys)
            if family.complete():
                return 200, family.encode(keys)
            if "wait" not in query:
                return 408, b"not every key of the family is set"
            future = Later()
            family.waiters[token] = lambda s: resolve(
                future, (200, s) if s is not None else (503, b"server stopping"))
        return future, lambda: self._forget_gather(family, token), wait, b"keys not all set in time"

    # -- connections (server thread) --------------------------------------------------------

    def _accept(self):
        """Take the connections waiting, a batch per loop turn (asyncio's own accept logs a
        traceback for every failure, thousands a second, and drops no one to make room)."""
        while self._opening < ACCEPT_BATCH:
            try:
                sock, _ = self._tcp.accept()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:
                continue  # that client went away
            except OSError:  # out of descriptors (EMFILE, ENFILE) or buffers
                return self._out_of_descriptors()
            sock.setblocking(False)
            self._opening += 1
            self._loop.create_task(self._open(sock))

    async def _open(self, sock):
        try:
            await self._loop.connect_accepted_socket(lambda: Connection(self), sock)
        except OSError:  # the client went away meanwhile
            sock.close()
        finally:
            self._opening -= 1

    def _out_of_descriptors(self):
        """The oldest stranger goes (its descriptor is free by the next loop turn); with none
        to drop, accepting rests a little. Said once in a while, not once a failure."""
        if self._unauthenticated:
            next(iter(self._unauthenticated)).close()
        else:
            self._loop.remove_reader(self._tcp.fileno())
            self._loop.call_later(ACCEPT_PAUSE, self._resume_accepting)
        self._exhausted += 1
        now = time.monotonic()
        if self._on_exhausted is not None and \
                (self._exhausted_said is None or now - self._exhausted_said >= EXHAUSTED_EVERY):
            self._exhausted_said, count, self._exhausted = now, self._exhausted, 0
            try:
                self._on_exhausted(count)
            except Exception:  # noqa: BLE001 - a report must not stop the server
                pass

    def _resume_accepting(self):
        if not self._stopped:
            self._loop.add_reader(self._tcp.fileno(), self._accept)

    def admit(self, conn) -> bool:
        if self._stopped:
            return False
        if len(self._unauthenticated) >= self.max_unauthenticated or \
                (len(self._connections) >= self.max_connections and self._unauthenticated):
            next(iter(self._unauthenticated)).close()  # the oldest: a flood cannot lock us out
        if len(self._connections) >= self.max_connections:
            return False
        self._connections[conn] = None
        self._unauthenticated[conn] = None
        return True

    def authenticated(self, conn) -> None:
        self._unauthenticated.pop(conn, None)

    def forget(self, conn) -> None:
        self._connections.pop(conn, None)
        self._unauthenticated.pop(conn, None)
