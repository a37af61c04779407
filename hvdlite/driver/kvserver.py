"""The driver's authenticated HTTP key-value server (rendezvous store for gloo and workers).

Protocol, HTTP/1.1 with keep-alive; every request carries ``X-Hvdlite-Secret``:

- ``PUT    /kv/<scope>/<key>``          body is the value -> 200
- ``GET    /kv/<scope>/<key>``          -> 200 + value, or 404
- ``GET    /kv/<scope>/<key>?wait=S``   long-poll: 200 + value, 408 after min(S, 60) s, 503 on stop
- ``DELETE /kv/<scope>/<key>``          -> 200, or 404
- ``POST   /kv/<scope>/<key>?add=N``    atomic add on an ASCII decimal -> 200 + new value

Scope and key are percent-encoded path segments, 1..512 bytes once decoded (UTF-8).
Routes added with ``add_route`` share the authentication and the limits.
"""
import hmac
import re
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qsl, unquote_to_bytes, urlsplit

SECRET_HEADER = "X-Hvdlite-Secret"
MAX_BODY = 64 * 1024 * 1024
MAX_NAME = 512
MAX_WAIT = 60.0  # one long-poll; clients loop for longer waits
IDLE_TIMEOUT = 10.0  # seconds per socket read/write: a silent or trickling client is dropped

_PERCENT_OK = re.compile(r"(?:[^%]|%[0-9A-Fa-f]{2})*")
_DIGITS = re.compile(r"[0-9]+")
_INTEGER = re.compile(r"[+-]?[0-9]+")


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
    try:
        return dict(parse_qsl(raw, keep_blank_values=True, strict_parsing=True, errors="strict"))
    except (ValueError, UnicodeDecodeError):
        raise _BadRequest("bad query string") from None


class KVServer:
    def __init__(self, secret: str, bind: str = "127.0.0.1", port: int = 0,
                 idle_timeout: float = IDLE_TIMEOUT):
        self._secret = secret.encode("ascii")  # headers travel as latin-1; keep it plain
        self._idle_timeout = idle_timeout
        self._lock = threading.Lock()
        self._data = {}  # scope -> {key: bytes}
        self._waiters = {}  # (scope, key) -> [Condition on self._lock, number of waiters]
        self._routes = []  # (prefix, handler), longest prefix first
        self._connections = set()
        self._stopped = False
        self._httpd = _HTTPServer((bind, port), _Handler)
        self._httpd.kv = self
        self._thread = None

    @property
    def address(self):
        host, port = self._httpd.server_address[:2]
        return host, port

    def start(self) -> None:
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.1},
                                        name="hvdlite-kvserver", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
            for cond, _ in self._waiters.values():
                cond.notify_all()
        if self._thread is not None:
            self._httpd.shutdown()
            self._thread.join()
        self._httpd.server_close()
        # Kept-alive connections would otherwise go on being served by their threads.
        with self._lock:
            connections = list(self._connections)
        for conn in connections:
            _shutdown(conn)

    # -- data, shared by HTTP and the driver ------------------------------------------------

    def put(self, scope: str, key: str, value: bytes) -> None:
        with self._lock:
            self._set_locked(scope, key, bytes(value))

    def get(self, scope: str, key: str):
        with self._lock:
            return self._data.get(scope, {}).get(key)

    def delete(self, scope: str, key: str) -> bool:
        with self._lock:
            keys = self._data.get(scope, {})
            found = keys.pop(key, None) is not None
            if not keys:
                self._data.pop(scope, None)
            return found

    def delete_scope(self, scope: str) -> None:
        with self._lock:
            self._data.pop(scope, None)

    def add(self, scope: str, key: str, amount: int) -> int:
        with self._lock:
            old = self._data.get(scope, {}).get(key, b"0")
            if not _INTEGER.fullmatch(old.decode("latin-1")):
                raise ValueError(f"value of {scope}/{key} is not an integer")
            new = int(old) + amount
            self._set_locked(scope, key, str(new).encode("ascii"))
            return new

    def _set_locked(self, scope, key, value):
        self._data.setdefault(scope, {})[key] = value
        waiting = self._waiters.get((scope, key))
        if waiting:
            waiting[0].notify_all()

    def wait(self, scope: str, key: str, timeout: float):
        """The value once the key exists, or None after timeout seconds (or on stop)."""
        name = (scope, key)
        with self._lock:
            # One condition per awaited key: a set wakes only that key's waiters.
            waiting = self._waiters.setdefault(name, [threading.Condition(self._lock), 0])
            waiting[1] += 1
            try:
                waiting[0].wait_for(lambda: self._stopped or key in self._data.get(scope, {}), timeout)
                return self._data.get(scope, {}).get(key)
            finally:
                waiting[1] -= 1
                if not waiting[1]:
                    del self._waiters[name]

    def add_route(self, prefix: str, handler) -> None:
        """Serve ``prefix`` + subpath with handler(method, subpath, query, body) -> (status, body).

        subpath is passed still percent-encoded so handlers can split it on "/" unambiguously;
        query values are decoded. The handler runs in the request's thread and bounds its own
        blocking; an exception in it answers 500.
        """
        with self._lock:
            # Rebound, never mutated: request threads iterate it without the lock.
            self._routes = sorted(self._routes + [(prefix, handler)], key=lambda route: -len(route[0]))

    # -- HTTP dispatch ----------------------------------------------------------------------

    def _serve(self, method: str, target: str, body: bytes):
        url = urlsplit(target)
        query = _parse_query(url.query)
        if url.path.startswith("/kv/"):
            return self._serve_kv(method, url.path[len("/kv/"):], query, body)
        for prefix, handler in self._routes:
            if url.path.startswith(prefix):
                return handler(method, url.path[len(prefix):], query, body)
        return 404, b"unknown path"

    def _serve_kv(self, method, subpath, query, body):
        parts = subpath.split("/")
        if len(parts) != 2:
            return 404, b"expected /kv/<scope>/<key>"
        scope, key = (_decode_segment(part) for part in parts)
        if method == "PUT":
            self.put(scope, key, body)
            return 200, b""
        if method == "GET":
            if "wait" not in query:
                value = self.get(scope, key)
                return (404, b"no such key") if value is None else (200, value)
            try:
                seconds = float(query["wait"])
            except ValueError:
                raise _BadRequest("wait must be a number of seconds") from None
            if not 0 <= seconds < float("inf"):
                raise _BadRequest("wait must be a number of seconds")
            value = self.wait(scope, key, min(seconds, MAX_WAIT))
            if value is None:
                return (503, b"server stopping") if self._stopped else (408, b"key not set in time")
            return 200, value
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


def _shutdown(conn):
    try:
        conn.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False  # stop() must not wait for long-pollers
    request_queue_size = 1024  # many workers connect at once

    def handle_error(self, request, client_address):
        pass  # a client that vanished mid-request is not the server's problem


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # else Nagle + delayed ACK cost ~44 ms per request
    wbufsize = 64 * 1024  # flushed once per response

    def setup(self):
        kv = self.server.kv
        self.timeout = kv._idle_timeout  # read by StreamRequestHandler.setup
        super().setup()
        with kv._lock:
            kv._connections.add(self.connection)
            if kv._stopped:  # accepted just before stop() took its snapshot
                _shutdown(self.connection)

    def finish(self):
        kv = self.server.kv
        with kv._lock:
            kv._connections.discard(self.connection)
        try:
            super().finish()
        except OSError:
            pass

    def log_message(self, format, *args):
        pass

    def handle_one_request(self):
        try:
            self._read_and_answer()
            self.wfile.flush()  # headers and body leave in one segment
        except OSError:  # includes socket timeouts: drop the connection
            self.close_connection = True

    def _read_and_answer(self):
        self.raw_requestline = self.rfile.readline(65537)
        if not self.raw_requestline:
            self.close_connection = True
        elif len(self.raw_requestline) > 65536:
            self.send_error(414)
        elif self.parse_request():  # else it answered 400 and marked the connection closed
            self._handle()

    def handle_expect_100(self):
        super().handle_expect_100()
        self.wfile.flush()  # buffered output would otherwise hold "100 Continue" back
        return True

    def send_error(self, code, message=None, explain=None):
        """Plain-text errors, always with an HTTP/1.1 status line (even for garbage input)."""
        self.request_version = "HTTP/1.1"
        text = message or self.responses.get(code, ("error",))[0]
        self._reply(code, text.encode("latin-1", "replace"), close=True)

    def _handle(self):
        secret = self.headers.get(SECRET_HEADER)
        if secret is None:
            return self._reply(401, b"missing " + SECRET_HEADER.encode(), close=True)
        if not hmac.compare_digest(secret.encode("latin-1"), self.server.kv._secret):
            return self._reply(403, b"wrong secret", close=True)
        if self.command not in ("GET", "PUT", "POST", "DELETE"):
            return self._reply(405, b"method not allowed", close=True)
        if "Transfer-Encoding" in self.headers:
            return self._reply(400, b"Transfer-Encoding is not supported; send Content-Length", close=True)
        lengths = self.headers.get_all("Content-Length") or ["0"]
        if len(lengths) != 1 or not _DIGITS.fullmatch(lengths[0].strip()):
            return self._reply(400, b"bad Content-Length", close=True)
        length = int(lengths[0])
        if length > MAX_BODY:
            return self._reply(413, b"body over 64 MiB", close=True)
        body = self.rfile.read(length)
        if len(body) != length:
            self.close_connection = True
            return
        try:
            status, answer = self.server.kv._serve(self.command, self.path, body)
        except _BadRequest as e:
            status, answer = 400, str(e).encode()
        except Exception as e:  # a failing route handler must not take the connection down silently
            status, answer = 500, f"{type(e).__name__}: {e}".encode()
        if not (isinstance(status, int) and 200 <= status <= 599 and isinstance(answer, (bytes, bytearray))):
            status, answer = 500, b"route handler returned an invalid (status, body)"
        self._reply(status, answer)

    def _reply(self, status: int, body: bytes, close: bool = False):
        self.send_response_only(status)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(body)))
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(body)
