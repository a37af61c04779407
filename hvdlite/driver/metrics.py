"""`--metrics-port`: the job's numbers as Prometheus text at GET /metrics. Read-only: no other
path or method, nothing secret (the rendezvous secret never reaches this server).

One asyncio loop on one thread serves every scrape, one request per connection: an idle
connection costs a descriptor, not a thread, for READ_TIMEOUT at most, and at most
MAX_CONNECTIONS are held (the oldest goes for a new one)."""
import asyncio
import socket
import threading

from hvdlite.driver.jobstats import prometheus_text

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
READ_TIMEOUT = 5.0  # seconds a client has to send its request head
MAX_HEAD = 8192
MAX_CONNECTIONS = 64
_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 501: "Not Implemented"}


class MetricsServer:
    def __init__(self, stats, address: str, port: int):
        self._summary = stats.summary
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        self._sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._sock.bind((address, port))
            self._sock.listen(128)
        except OSError:
            self._sock.close()
            raise
        self.address = self._sock.getsockname()[:2]
        self._open = {}  # task serving a connection -> None, oldest first
        self._loop = asyncio.new_event_loop()
        # asyncio logs each failed accept (out of descriptors) with a traceback: not the job's news.
        self._loop.set_exception_handler(lambda loop, context: None)
        self._thread = None

    def start(self):
        ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(ready,), daemon=True, name="hvdlite-metrics")
        self._thread.start()
        ready.wait(10)

    def _run(self, ready):
        loop = self._loop
        asyncio.set_event_loop(loop)
        server = loop.run_until_complete(asyncio.start_server(self._serve, sock=self._sock, limit=MAX_HEAD))
        ready.set()
        loop.run_forever()
        server.close()
        tasks = list(self._open)
        for task in tasks:
            task.cancel()
        loop.run_until_complete(asyncio.gather(*tasks, server.wait_closed(), return_exceptions=True))
        loop.close()

    def stop(self):
        if self._thread is None:
            self._sock.close()
            self._loop.close()
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    async def _serve(self, reader, writer):
        if len(self._open) >= MAX_CONNECTIONS:
            next(iter(self._open)).cancel()  # the oldest goes: idle strangers cannot lock scrapes out
        task = asyncio.current_task()
        self._open[task] = None
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), READ_TIMEOUT)
            writer.write(self._answer(head.split(b"\r\n", 1)[0].decode("latin-1").split(" ")))
            await asyncio.wait_for(writer.drain(), READ_TIMEOUT)
        except (asyncio.TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError,
                asyncio.CancelledError, OSError):
            pass  # too slow, gone, dropped for a newer one, or a head too big: nothing to answer
        finally:
            del self._open[task]
            writer.close()

    def _answer(self, words) -> bytes:
        method, path = (words[0], words[1]) if len(words) == 3 else (None, None)
        if method not in ("GET", "HEAD"):
            status, kind, body = (400, "text/plain", b"bad request\n") if method is None \
                else (501, "text/plain", b"only GET and HEAD\n")
        elif path.split("?", 1)[0] != "/metrics":
            status, kind, body = 404, "text/plain", b"only /metrics is served here\n"
        else:
            status, kind, body = 200, CONTENT_TYPE, prometheus_text(self._summary()).encode()
        head = (f"HTTP/1.1 {status} {_REASONS[status]}\r\nContent-Type: {kind}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode("latin-1")
        return head if method == "HEAD" else head + body
