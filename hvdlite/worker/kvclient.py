"""Client of the driver's KV server (hvdlite.driver.kvserver): one keep-alive connection per thread."""
import http.client
import socket
import threading
import time
from urllib.parse import quote, urlencode

SECRET_HEADER = "X-Hvdlite-Secret"
_POLL = 30.0  # one long-poll request; under the server's 60 s cap
MAX_BODY = 64 * 1024 * 1024  # the server's limit; it answers 413 and drops the connection


class KVError(RuntimeError):
    """The server answered with a status the caller did not expect."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


class _Connection(http.client.HTTPConnection):
    def connect(self):
        super().connect()
        # Without it Nagle + delayed ACK add ~44 ms to every request.
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class KVClient:
    def __init__(self, host: str, port: int, secret: str, timeout: float = 30.0):
        self.host, self.port, self.timeout = host, port, timeout
        self._secret = secret
        self._local = threading.local()

    def put(self, scope: str, key: str, value: bytes) -> None:
        self._expect(("PUT", scope, key), self.request("PUT", _kv_path(scope, key), value), 200)

    def get(self, scope: str, key: str):
        """The value, or None if the key is not set."""
        status, body = self._expect(("GET", scope, key), self.request("GET", _kv_path(scope, key)), 200, 404)
        return body if status == 200 else None

    def wait(self, scope: str, key: str, timeout: float) -> bytes:
        """The value once the key is set; TimeoutError if that takes over timeout seconds."""
        deadline = time.monotonic() + timeout
        while True:
            poll = min(max(deadline - time.monotonic(), 0.0), _POLL)
            answer = self.request("GET", _kv_path(scope, key), query={"wait": f"{poll:.3f}"},
                                  timeout=poll + self.timeout)
            status, body = self._expect(("wait for", scope, key), answer, 200, 408)
            if status == 200:
                return body
            if time.monotonic() >= deadline:
                raise TimeoutError(f"key {scope}/{key} not set within {timeout:g} s "
                                   f"(KV server {self.host}:{self.port})")

    def delete(self, scope: str, key: str) -> bool:
        status, _ = self._expect(("DELETE", scope, key), self.request("DELETE", _kv_path(scope, key)), 200, 404)
        return status == 200

    def add(self, scope: str, key: str, amount: int) -> int:
        answer = self.request("POST", _kv_path(scope, key), query={"add": str(int(amount))})
        return int(self._expect(("add to", scope, key), answer, 200)[1])

    def request(self, method: str, path: str, body: bytes = b"", query=None, timeout=None):
        """Send one request; returns (status, body). Raises KVError on 401/403/5xx and
        ConnectionError when the server cannot be reached or does not answer."""
        if len(body) > MAX_BODY:
            raise ValueError(f"request body of {len(body)} bytes is over the KV server's 64 MiB limit")
        target = path + ("?" + urlencode(query) if query else "")
        headers = {SECRET_HEADER: self._secret, "Content-Length": str(len(body))}
        for retry in (False, True):
            conn = self._connection()
            reused = conn.sock is not None
            try:
                if not reused:
                    conn.connect()
                conn.sock.settimeout(self.timeout if timeout is None else timeout)
                conn.request(method, target, body, headers)
                response = conn.getresponse()
                data = response.read()
            except (OSError, http.client.HTTPException) as e:
                conn.close()
                # A kept-alive connection the server closed while idle: the request never ran.
                if reused and not retry and isinstance(e, ConnectionError):
                    continue
                raise ConnectionError(f"KV server {self.host}:{self.port}: {method} {path} failed: "
                                      f"{type(e).__name__}: {e}") from e
            if response.will_close:
                conn.close()
            if response.status in (401, 403) or response.status >= 500:
                raise KVError(response.status, f"KV server {self.host}:{self.port} answered {method} {path} "
                                                f"with {response.status}: {_text(data)}")
            return response.status, data

    def close(self) -> None:
        """Close this thread's connection (other threads' close when they end)."""
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()

    def _connection(self) -> _Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = _Connection(self.host, self.port, timeout=self.timeout)
        return conn

    def _expect(self, what, answer, *statuses):
        status, body = answer
        if status not in statuses:
            verb, scope, key = what
            raise KVError(status, f"KV server {self.host}:{self.port}: {verb} {scope}/{key} "
                                  f"answered {status}: {_text(body)}")
        return answer


def _kv_path(scope: str, key: str) -> str:
    return f"/kv/{quote(scope, safe='')}/{quote(key, safe='')}"


def _text(body: bytes) -> str:
    return body[:200].decode("utf-8", "replace")
