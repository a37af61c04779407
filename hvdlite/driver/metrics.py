"""`--metrics-port`: the job's numbers as Prometheus text at GET /metrics. Read-only: no other
path or method, nothing secret (the rendezvous secret never reaches this server)."""
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from hvdlite.driver.jobstats import prometheus_text

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class MetricsServer:
    def __init__(self, stats, address: str, port: int):
        summary = stats.summary

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                if self.path.split("?", 1)[0] != "/metrics":
                    return self._reply(404, "text/plain", b"only /metrics is served here\n")
                body = prometheus_text(summary()).encode()
                self._reply(200, CONTENT_TYPE, body)

            def do_HEAD(self):
                self.do_GET()

            def _reply(self, status, kind, body):
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            def log_message(self, *args):
                pass  # scrapes are not the job's news

        # Other methods get http.server's own 501 answer.
        self._server = ThreadingHTTPServer((address, port), Handler)
        self._server.daemon_threads = True
        self.address = self._server.server_address[:2]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True,
                                        name="hvdlite-metrics")

    def start(self):
        self._thread.start()

    def stop(self):
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)
