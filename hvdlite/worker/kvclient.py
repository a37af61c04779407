"""Client of the driver's KV server (hvdlite.driver.kv.server): one keep-alive connection per
thread, every request signed (hvdlite.worker.kvproto); heartbeats as signed datagrams."""
import os
import socket
import threading
import time
import weakref
from urllib.parse import quote, urlencode

from hvdlite.worker import kvproto

_POLL = 30.0  # one long-poll request; under the server's 60 s cap
MAX_BODY = kvproto.MAX_BODY  # the server answers 413 and drops the connection


class KVError(RuntimeError):
    """The server answered with a status the caller did not expect."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


class _Connection:
    def __init__(self, host, port, timeout):
        self.address = (host, port)
        self.sock = socket.create_connection((host, port), timeout=timeout)
        # Without it Nagle + delayed ACK add ~44 ms to every request.
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.parser = kvproto.ResponseParser()
        self.used = False

    def exchange(self, request: bytes, timeout: float):
        self.sock.settimeout(timeout)
        self.sock.sendall(request)
        while True:
            answer = self.parser.next()
            if answer is not None:
                self.used = True
                return answer
            data = self.sock.recv(1 << 20)
            if not data:
                raise ConnectionResetError("connection closed by the server")
            self.parser.feed(data)

    def close(self):
        self.sock.close()


class KVClient:
    def __init__(self, host: str, port: int, secret: str, timeout: float = 30.0):
        self.host, self.port, self.timeout = host, port, timeout
        self.key = kvproto.job_key(secret)
        self.offset = 0.0  # the server's clock minus ours, learnt when it refused our time
        self._local = threading.local()
        self._open = weakref.WeakSet()  # every thread's connection (gone with its thread), for move()
        self._lock = threading.Lock()

    def move(self, host: str, port: int) -> None:
        """Talk to the server at host:port from now on (another driver took the job over): a
        request waiting on the old one (a long-poll) is cut and made again there."""
        self.host, self.port = host, port
        with self._lock:
            conns = list(self._open)
        for conn in conns:
            try:
                conn.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def put(self, scope: str, key: str, value: bytes) -> None:
        self._expect(("PUT", scope, key), self.request("PUT", _kv_path(scope, key), value), 200)

    def get(self, scope: str, key: str):
        """The value, or None if the key is not set."""
        status, body = self._expect(("GET", scope, key), self.request("GET", _kv_path(scope, key)), 200, 404)
        return body if status == 200 else None

    def wait(self, scope: str, key: str, timeout: float) -> bytes:
        """The value once the key is set; TimeoutError if that takes over timeout seconds."""
        return self._long_poll(_kv_path(scope, key), {}, timeout, ("wait for", scope, key))

    def gather(self, scope: str, prefix: str, count: int, timeout: float, put=None) -> dict:
        """Keys prefix0 .. prefix<count-1> once all are set, in one answer; TimeoutError if
        that takes over timeout seconds. `put`, a (key, value), is set by the same request."""
        path, value = f"/kv/{quote(scope, safe='')}", None
        if put is not None:
            path, value = _kv_path(scope, put[0]), put[1]
        snapshot = self._long_poll(path, {"prefix": prefix, "count": str(count)}, timeout,
                                   ("gather", scope, f"{prefix}0..{count - 1}"), value)
        return kvproto.decode_snapshot(snapshot)

    def _long_poll(self, path, query, timeout, what, put=None):
        """GET path until answered; with `put`, PUT it as the body (setting twice is harmless)."""
        deadline = time.monotonic() + timeout
        while True:
            poll = min(max(deadline - time.monotonic(), 0.0), _POLL)
            answer = self.request("GET" if put is None else "PUT", path, put or b"",
                                  query={**query, "wait": f"{poll:.3f}"}, timeout=poll + self.timeout)
            status, body = self._expect(what, answer, 200, 408)
            if status == 200:
                return body
            if time.monotonic() >= deadline:
                raise TimeoutError(f"{what[0]} {what[1]}/{what[2]}: not done within {timeout:g} s "
                                   f"(KV server {self.host}:{self.port})")

    def delete(self, scope: str, key: str) -> bool:
        status, _ = self._expect(("DELETE", scope, key), self.request("DELETE", _kv_path(scope, key)), 200, 404)
        return status == 200

    def add(self, scope: str, key: str, amount: int) -> int:
        answer = self.request("POST", _kv_path(scope, key), query={"add": str(int(amount))})
        return int(self._expect(("add to", scope, key), answer, 200)[1])

    def request(self, method: str, path: str, body: bytes = b"", query=None, timeout=None):
        """Send one signed request; returns (status, body). Raises KVError on 401/403/5xx or
        an answer not signed with the job's key, and ConnectionError when the server cannot be
        reached or does not answer."""
        if len(body) > MAX_BODY:
            raise ValueError(f"request body of {len(body)} bytes is over the KV server's 64 MiB limit")
        target = path + ("?" + urlencode(query) if query else "")
        body = bytes(body)
        retried = set()
        while True:
            conn = getattr(self._local, "conn", None)
            if conn is not None and conn.address != (self.host, self.port):  # another driver took over
                self.close()
                conn = None
            reused = conn is not None and conn.used
            try:
                if conn is None:
                    conn = self._local.conn = _Connection(self.host, self.port, self.timeout)
                    with self._lock:
                        self._open.add(conn)
                request, signed = kvproto.encode_request(self.key, method, target, body, self.offset)
                status, headers, data = conn.exchange(request, self.timeout if timeout is None else timeout)
            except (OSError, ValueError) as e:
                moved = conn is not None and conn.address != (self.host, self.port)
                self.close()
                # A kept-alive connection the server closed while idle: the request never ran.
                # Or move() cut it: the new server is asked.
                if moved or reused and "reconnect" not in retried and isinstance(e, ConnectionError):
                    retried.add("reconnect")
                    continue
                raise ConnectionError(f"KV server {self.host}:{self.port}: {method} {path} failed: "
                                      f"{type(e).__name__}: {e}") from e
            if headers.get("connection", "").lower() == "close":
                self.close()
            if not kvproto.answer_is_signed(self.key, signed, status, headers, data):
                self.close()  # whatever else comes on this connection cannot be trusted either
                raise KVError(status, f"KV server {self.host}:{self.port}: the answer to {method} {path} "
                                      f"({status}: {_text(data)}) does not carry this job's signature: "
                                      f"forged on the way, or not this job's driver")
            server_time = kvproto.server_time(status, data)  # in the signed body: finite, or None
            if server_time is not None and "clock" not in retried:
                retried.add("clock")  # our clock is off: sign with the server's time instead, once
                self.offset = server_time - time.time()
                continue
            if status in (401, 403) or status >= 500:
                raise KVError(status, f"KV server {self.host}:{self.port} answered {method} {path} "
                                      f"with {status}: {_text(data)}")
            return status, data

    def close(self) -> None:
        """Close this thread's connection (other threads' close when they end)."""
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            self._local.conn = None
            with self._lock:
                self._open.discard(conn)
            conn.close()

    def _expect(self, what, answer, *statuses):
        status, body = answer
        if status not in statuses:
            verb, scope, key = what
            raise KVError(status, f"KV server {self.host}:{self.port}: {verb} {scope}/{key} "
                                  f"answered {status}: {_text(body)}")
        return answer


class Heartbeats:
    """Signed heartbeat datagrams to the KV server's port, each answered by the driver."""

    def __init__(self, client: KVClient, timeout: float):
        self.client, self.timeout = client, timeout
        self.key = kvproto.beat_key(client.key)
        family = socket.AF_INET6 if ":" in client.host else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_DGRAM)
        self.sock.connect((client.host, client.port))
        self.sender, self.counter = os.urandom(8), 0

    def beat(self, worker: str, commit: int = 0, vouched=None, calls: int = 0, waited: float = 0.0,
             idle: bool = False, timeout: float = None):
        """Tell the driver `worker` is alive, holds `commit` commits, entered `calls`
        collectives and waited `waited` seconds in them, is `idle` in hvd.join() (`vouched`: see kvproto.encode_beat); the
        driver's answer (bytes), or None if none came within the timeout (`timeout`, else the one given at creation)."""
        self.counter += 1
        datagram = kvproto.encode_beat(self.key, self.sender, self.counter, worker, commit,
                                       time.time() + self.client.offset, vouched, calls, waited, idle)
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        try:
            self.sock.send(datagram)
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self.sock.settimeout(left)
                answer = kvproto.decode_beat_answer(self.key, datagram[:kvproto.BEAT_TAG],
                                                    self.sock.recv(kvproto.MAX_DATAGRAM))
                if answer is not None:  # else a late answer to an earlier beat, or forged
                    return answer
        except OSError:  # timeout, or ICMP unreachable: no driver there
            return None

    def close(self) -> None:
        self.sock.close()


def _kv_path(scope: str, key: str) -> str:
    return f"/kv/{quote(scope, safe='')}/{quote(key, safe='')}"


def _text(body: bytes) -> str:
    return body[:200].decode("utf-8", "replace")
