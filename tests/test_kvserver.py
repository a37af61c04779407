"""KVServer and KVClient over real loopback sockets."""
import http.client
import socket
import threading
import time

import pytest

from hvdlite.driver.kv.server import KVServer
from hvdlite.worker import kvproto
from hvdlite.worker.kvclient import KVClient, KVError

SECRET = "s3cret"
KEY = kvproto.job_key(SECRET)




@pytest.fixture
def client(server):
    return KVClient(*server.address, SECRET, timeout=5.0)


def signed(method, target, body=b""):
    """The X-Hvdlite-Auth header line of a fresh signed request."""
    return f"{kvproto.AUTH_HEADER}: {kvproto.auth_value(KEY, method, target, body, time.time())}\r\n".encode()


def http_request(server, method, target, body=b"", headers=None):
    """Through the stdlib's HTTP client: signed unless headers are given."""
    if headers is None:
        headers = {kvproto.AUTH_HEADER: kvproto.auth_value(KEY, method, target, body, time.time())}
    conn = http.client.HTTPConnection(*server.address, timeout=5)
    try:
        conn.request(method, target, body, headers)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def read_response(sock):
    response = http.client.HTTPResponse(sock)
    response.begin()
    return response.status, response.read()


def raw_exchange(server, data: bytes):
    """Send raw bytes on a fresh connection; return (status, body) of the answer."""
    with socket.create_connection(server.address, timeout=5) as sock:
        sock.sendall(data)
        return read_response(sock)


def assert_serves(server):
    fresh = KVClient(*server.address, SECRET, timeout=5.0)
    fresh.put("health", "k", b"ok")
    assert fresh.get("health", "k") == b"ok"


def test_auth_required(server):
    assert http_request(server, "PUT", "/kv/a/b", b"v", headers={})[0] == 401
    assert http_request(server, "PUT", "/kv/a/b", b"v", headers={"X-Hvdlite-Secret": SECRET})[0] == 401
    assert server.get("a", "b") is None
    with pytest.raises(KVError) as err:
        KVClient(*server.address, "wrong", timeout=5.0).put("a", "b", b"v")
    assert err.value.status == 403
    assert server.get("a", "b") is None


def test_put_get_delete(server, client):
    client.put("scope", "key/with slash é", b"\x00value")
    assert client.get("scope", "key/with slash é") == b"\x00value"
    assert server.get("scope", "key/with slash é") == b"\x00value"
    assert client.get("scope", "missing") is None
    server.put("scope", "from-driver", b"d")
    assert client.get("scope", "from-driver") == b"d"
    assert client.delete("scope", "key/with slash é") is True
    assert client.delete("scope", "key/with slash é") is False
    big = bytes(range(256)) * 4096
    client.put("scope", "big", big)
    assert client.get("scope", "big") == big
    server.delete_scope("scope")
    assert client.get("scope", "from-driver") is None


def test_long_poll_woken_by_set(server, client):
    threading.Timer(0.2, client_put, (server, "s", "late", b"here")).start()
    started = time.monotonic()
    assert client.wait("s", "late", timeout=5.0) == b"here"
    assert 0.15 < time.monotonic() - started < 2.0
    threading.Timer(0.1, server.put, ("s", "late2", b"driver")).start()
    assert client.wait("s", "late2", timeout=5.0) == b"driver"


def client_put(server, scope, key, value):
    KVClient(*server.address, SECRET, timeout=5.0).put(scope, key, value)


def test_long_poll_expires(server, client):
    started = time.monotonic()
    assert http_request(server, "GET", "/kv/s/never?wait=0.2")[0] == 408
    with pytest.raises(TimeoutError):
        client.wait("s", "never", timeout=0.3)
    assert time.monotonic() - started < 2.0


def test_add_is_atomic(server, client):
    def adder():
        own = KVClient(*server.address, SECRET, timeout=5.0)
        for _ in range(50):
            own.add("c", "counter", 1)

    threads = [threading.Thread(target=adder) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    assert client.get("c", "counter") == b"400"
    assert client.add("c", "counter", -400) == 0
    client.put("c", "text", b"abc")
    with pytest.raises(KVError) as err:
        client.add("c", "text", 1)
    assert err.value.status == 400


@pytest.mark.parametrize("method, target, headers, status", [
    ("PUT", "/kv/a/b", b"Content-Length: abc\r\n", 400),
    ("PUT", "/kv/a/b", b"Content-Length: -1\r\n", 400),
    ("PUT", "/kv/a/b", b"Content-Length: 1000000000\r\n", 413),
    ("PUT", "/kv/a/b", b"Transfer-Encoding: chunked\r\n", 400),
    ("PATCH", "/kv/a/b", b"", 405),
    ("GET", "/kv/a/%zz", b"", 400),
    ("GET", "/kv/a/%ff", b"", 400),
    ("GET", "/kv/a/", b"", 400),
    ("GET", "/kv/a/" + "k" * 513, b"", 400),
    ("GET", "/kv/a/b?wait=soon", b"", 400),
    ("GET", "/kv/a?prefix=0&count=x", b"", 400),
    ("POST", "/kv/a/b?add=x", b"", 400),
    ("GET", "/nowhere", b"", 404),
])
def test_malformed_requests(server, method, target, headers, status):
    request = f"{method} {target} HTTP/1.1\r\n".encode() + signed(method, target) + headers + b"\r\n"
    assert raw_exchange(server, request)[0] == status
    assert server.get("a", "b") is None
    assert_serves(server)


def test_garbage_is_refused(server):
    assert raw_exchange(server, b"\x00\xff garbage line with too many words\r\n\r\n")[0] == 400
    assert raw_exchange(server, b"GET /kv/a/b HTTP/1.1\r\n" + b"X: " + b"y" * 20000)[0] == 431
    assert server.get("a", "b") is None
    assert_serves(server)


def test_oversized_body_is_not_read(server):
    with socket.create_connection(server.address, timeout=5) as sock:
        sock.sendall(b"PUT /kv/a/b HTTP/1.1\r\n" + signed("PUT", "/kv/a/b", b"x")
                     + b"Content-Length: 67108865\r\n\r\n" + b"x" * 1024)
        assert read_response(sock)[0] == 413
        sock.settimeout(2)
        while sock.recv(65536):  # the server closes instead of draining 64 MiB
            pass
    assert_serves(server)


def test_slow_client_is_dropped_and_blocks_nobody():
    srv = KVServer(SECRET, idle_timeout=0.5)
    srv.start()
    try:
        with socket.create_connection(srv.address, timeout=5) as slow:
            slow.sendall(b"PUT /kv/a/b HTTP/1.1\r\nX-Hvdlite-Au")
            started = time.monotonic()
            assert_serves(srv)
            assert time.monotonic() - started < 0.4
            assert slow.recv(1024) == b""  # dropped after the idle timeout
            assert time.monotonic() - started < 3.0
    finally:
        srv.stop()


def test_long_poll_outlives_idle_timeout():
    srv = KVServer(SECRET, idle_timeout=0.2)
    srv.start()
    try:
        threading.Timer(0.5, srv.put, ("s", "k", b"v")).start()
        client = KVClient(*srv.address, SECRET, timeout=5.0)
        assert client.wait("s", "k", timeout=5.0) == b"v"
        time.sleep(0.3)  # the server drops the idle kept-alive connection meanwhile
        assert client.get("s", "k") == b"v"  # transparent reconnect
    finally:
        srv.stop()


def test_many_blocked_waiters(server):
    count = 1024
    target = "/kv/many/key?wait=20"
    sockets = []
    try:
        for _ in range(count):
            sock = socket.create_connection(server.address, timeout=10)
            sock.sendall(f"GET {target} HTTP/1.1\r\n".encode() + signed("GET", target) + b"\r\n")
            sockets.append(sock)
        time.sleep(0.2)
        server.put("many", "key", b"go")
        for sock in sockets:
            assert read_response(sock) == (200, b"go")
    finally:
        for sock in sockets:
            sock.close()


def test_calls_from_another_thread_share_a_wakeup(server):
    """A world's answers come from the decision thread by thousands: they wake the server's
    loop once, not once each, and every one still runs, in order."""
    busy, go, ran, wakeups = threading.Event(), threading.Event(), [], []
    loop = server._loop
    wake = loop.call_soon_threadsafe
    loop.call_soon_threadsafe = lambda *args: (wakeups.append(args), wake(*args))[1]
    server.call_soon(lambda: (busy.set(), go.wait(5)))  # holds the loop
    assert busy.wait(5)
    for i in range(1000):
        server.call_soon(ran.append, i)
    go.set()
    deadline = time.monotonic() + 5
    while len(ran) < 1000 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert ran == list(range(1000))
    assert len(wakeups) <= 2, len(wakeups)
    assert_serves(server)


def test_reads_allocate_nothing_read_sized(server):
    """The server reads every connection into one buffer: asyncio's recv() would allocate its
    256 KiB read size for each read of a 200-byte request (most of a request's cost)."""
    import tracemalloc
    sock = socket.create_connection(server.address, timeout=5)
    tracemalloc.start()
    try:
        for i in range(20):
            target = f"/kv/reads/k{i}"
            sock.sendall(f"PUT {target} HTTP/1.1\r\n".encode() + signed("PUT", target, b"v")
                         + b"Content-Length: 1\r\n\r\nv")
            assert read_response(sock) == (200, b"")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
        sock.close()
    assert peak < 128 * 1024, peak
    assert_serves(server)


def test_waits_cost_no_condition_each(server, monkeypatch):
    """Thousands of ranks wait on keys at once: a wait costs no lock and condition of its own
    (a concurrent.futures.Future's), and each is still answered."""
    made, condition = [], threading.Condition
    monkeypatch.setattr(threading, "Condition", lambda *args: (made.append(1), condition(*args))[1])
    sockets = []
    try:
        for i in range(100):
            sock = socket.create_connection(server.address, timeout=10)
            target = f"/kv/conds/k{i % 2}?wait=20"
            sock.sendall(f"GET {target} HTTP/1.1\r\n".encode() + signed("GET", target) + b"\r\n")
            sockets.append(sock)
        time.sleep(0.2)
        server.put("conds", "k0", b"zero")
        server.put("conds", "k1", b"one")
        for i, sock in enumerate(sockets):
            assert read_response(sock) == (200, [b"zero", b"one"][i % 2])
    finally:
        for sock in sockets:
            sock.close()
    assert len(made) < 10, len(made)


def test_route(server):
    calls = []

    def handler(method, subpath, query, body):
        calls.append((method, subpath, query, body))
        if subpath == "boom":
            raise ValueError("handler failed")
        return 201, b"routed"

    server.add_route("/rdzv/", handler)
    client = KVClient(*server.address, SECRET, timeout=5.0)
    assert client.request("POST", "/rdzv/slot/host%2F0", b"payload", query={"round": "3", "x": "a b"}) == (201, b"routed")
    assert calls == [("POST", "slot/host%2F0", {"round": "3", "x": "a b"}, b"payload")]
    assert http_request(server, "GET", "/rdzv/slot", headers={})[0] == 401
    assert len(calls) == 1
    with pytest.raises(KVError) as err:
        client.request("GET", "/rdzv/boom")
    # no 500 carries the error's text (it may quote the request): the driver's stderr has it
    assert err.value.status == 500 and "handler failed" not in str(err.value) and "internal error" in str(err.value)
    assert_serves(server)


def test_stop_is_prompt_and_client_reports_address():
    srv = KVServer(SECRET)
    srv.start()
    client = KVClient(*srv.address, SECRET, timeout=5.0)
    client.put("s", "k", b"v")  # leaves a kept-alive connection open
    waiter_done = threading.Event()

    def waiter():
        try:
            KVClient(*srv.address, SECRET, timeout=5.0).wait("s", "never", timeout=30)
        except (TimeoutError, ConnectionError, KVError):
            waiter_done.set()

    thread = threading.Thread(target=waiter, daemon=True)
    thread.start()
    time.sleep(0.2)
    started = time.monotonic()
    srv.stop()
    assert time.monotonic() - started < 2.0
    host, port = srv.address
    with pytest.raises(ConnectionError, match=f"{host}:{port}"):
        client.get("s", "k")
    thread.join(timeout=5)
    assert waiter_done.is_set()
