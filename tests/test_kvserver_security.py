"""The KV server's signatures, replay and skew checks, pre-authentication limits, deferred
route answers, scope snapshots and heartbeat datagrams, over real loopback sockets; and the
signed pickles every backend loads."""
import socket
import threading
import time
from concurrent.futures import Future

import pytest

from hvdlite.driver.kv.auth import Replays, Senders
from hvdlite.driver.kv.server import KVServer
from hvdlite.worker import kvproto, objects
from hvdlite.worker.kvclient import Heartbeats, KVClient, KVError
from hvdlite.worker.scopestore import ScopeStore

SECRET = "security-secret"
KEY = kvproto.job_key(SECRET)


def exchange(server, data: bytes, sock=None):
    """Send raw bytes (on a fresh connection unless given one); (status, headers, body)."""
    own = sock is None
    sock = sock or socket.create_connection(server.address, timeout=5)
    try:
        sock.sendall(data)
        parser = kvproto.ResponseParser()
        while True:
            answer = parser.next()
            if answer is not None:
                return answer
            chunk = sock.recv(65536)
            if not chunk:
                return None, {}, b""
            parser.feed(chunk)
    finally:
        if own:
            sock.close()


def request(method, target, body=b"", key=KEY, now=None, nonce=None, claimed_body=None):
    auth = kvproto.auth_value(key, method, target, body if claimed_body is None else claimed_body,
                              time.time() if now is None else now, nonce)
    return (f"{method} {target} HTTP/1.1\r\n{kvproto.AUTH_HEADER}: {auth}\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


def test_forged_replayed_and_stale_requests_store_nothing(server):
    wrong = kvproto.job_key("not-the-secret")
    assert exchange(server, request("PUT", "/kv/sec/k", b"v", key=wrong))[0] == 403
    good = request("PUT", "/kv/sec/k", b"v")
    tampered = good.replace(b"/kv/sec/k", b"/kv/sec/x")  # signature over another target
    assert exchange(server, tampered)[0] == 403
    body_swapped = request("PUT", "/kv/sec/k", b"evil", claimed_body=b"good")
    assert exchange(server, body_swapped)[0] == 403
    stale = exchange(server, request("PUT", "/kv/sec/k", b"v", now=time.time() - 120))
    assert stale[0] == 403 and abs(kvproto.server_time(403, stale[2]) - time.time()) < 5
    assert exchange(server, request("PUT", "/kv/sec/k", b"v", now=time.time() + 120))[0] == 403
    unsigned = b"PUT /kv/sec/k HTTP/1.1\r\nContent-Length: 1\r\n\r\nv"
    assert exchange(server, unsigned)[0] == 401
    twice = request("PUT", "/kv/sec/k", b"v").replace(b"Content-Length", b"X-Hvdlite-Auth: x\r\nContent-Length")
    assert exchange(server, twice)[0] == 401
    assert server.get("sec", "k") is None and server.get("sec", "x") is None
    assert exchange(server, good)[0] == 200
    server.delete("sec", "k")
    assert exchange(server, good)[0] == 403  # the same request again: a replay
    assert server.get("sec", "k") is None


def test_client_follows_the_servers_clock(server):
    client = KVClient(*server.address, SECRET, timeout=5)
    client.offset = 300.0  # as if our clock ran 5 min behind the server's
    client.put("clock", "k", b"v")  # refused once as stale, then signed with the server's time
    assert server.get("clock", "k") == b"v" and abs(client.offset) < 5


def test_replays_and_senders_are_pure():
    replays = Replays(skew=10)
    assert replays.verdict(100.0, "n1", now=100.0) is None
    assert replays.verdict(100.0, "n1", now=105.0) == "replayed"
    assert replays.verdict(80.0, "n2", now=100.0) == "stale"
    assert replays.verdict(120.0, "n3", now=105.0) == "stale"
    assert replays.verdict(104.0, "n4", now=105.0) is None
    assert len(replays) == 2
    replays.verdict(130.0, "n5", now=130.0)  # the old nonces went stale: forgotten
    assert len(replays) == 1
    senders = Senders(skew=10)
    assert senders.verdict(100.0, b"a", 1, now=100.0) is None
    assert senders.verdict(100.0, b"a", 1, now=100.0) == "replayed"
    assert senders.verdict(101.0, b"a", 3, now=101.0) is None
    assert senders.verdict(101.0, b"a", 2, now=101.0) == "replayed"
    assert senders.verdict(50.0, b"b", 1, now=101.0) == "stale"
    senders.prune(now=200.0)
    assert senders.verdict(200.0, b"a", 1, now=200.0) is None


def test_heartbeat_datagrams(server):
    heard = []

    def handler(beats):
        heard.append(beats)
        return b"alive %d" % len(heard)
    server.set_heartbeat(handler)
    client = KVClient(*server.address, SECRET, timeout=5)
    beats = Heartbeats(client, timeout=1.0)
    assert beats.beat("h/1#1", 7, calls=3, waited=0.5, idle=True) == b"alive 1"
    assert heard == [[("h/1#1", 7, None, (3, 0.5, True))]]
    key = kvproto.beat_key(KEY)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        udp.connect(server.address)
        udp.settimeout(0.5)
        replay = kvproto.encode_beat(key, beats.sender, beats.counter, "h/1#1", 7, time.time())
        forged = kvproto.encode_beat(kvproto.beat_key(kvproto.job_key("wrong")), b"f" * 8, 1, "h/1#1", 0,
                                     time.time())
        unkeyed = kvproto.encode_beat(KEY, b"u" * 8, 1, "h/1#1", 0, time.time())  # the job's key itself
        stale = kvproto.encode_beat(key, b"s" * 8, 1, "h/1#1", 0, time.time() - 120)
        for datagram in (replay, forged, unkeyed, stale, b"garbage"):
            udp.send(datagram)
            with pytest.raises(socket.timeout):
                udp.recv(2048)
        assert len(heard) == 1, "a refused datagram reached the handler"
        fresh = kvproto.encode_beat(key, b"n" * 8, 1, "h/2#1", 3, time.time())
        udp.send(fresh)
        answer = udp.recv(2048)
        assert kvproto.decode_beat_answer(key, fresh[:kvproto.BEAT_TAG], answer) == b"alive 2"
        assert heard[-1] == [("h/2#1", 3, None, (0, 0.0, False))]
        # Bound to its request, and to its own bytes:
        assert kvproto.decode_beat_answer(key, replay[:kvproto.BEAT_TAG], answer) is None
        assert kvproto.decode_beat_answer(key, fresh[:kvproto.BEAT_TAG], answer[:-1] + b"3") is None
        # Many senders at once: one call of the handler for the datagrams that came in together.
        before = len(heard)
        burst = [kvproto.encode_beat(key, b"b%07d" % i, 1, f"h/{i}#1", i, time.time()) for i in range(50)]
        for datagram in burst:
            udp.send(datagram)
        answers = [udp.recv(2048) for _ in burst]
        tags = {d[:kvproto.BEAT_TAG] for d in burst}
        assert all(any(kvproto.decode_beat_answer(key, t, a) for t in tags) for a in answers)
        got = [pair for batch in heard[before:] for pair in batch]
        assert sorted(got) == sorted((f"h/{i}#1", i, None, (0, 0.0, False)) for i in range(50))
        assert len(heard) - before < 50, "the handler was called once a beat, not once a batch"
    beats.close()


def test_heartbeat_to_nobody_returns_none():
    srv = KVServer(SECRET)
    address = srv.address
    srv.stop()  # never started: the port is closed
    beats = Heartbeats(KVClient(*address, SECRET), timeout=0.3)
    started = time.monotonic()
    assert beats.beat("h/0#1") is None
    assert time.monotonic() - started < 1.0
    beats.close()


def test_deferred_route_answers():
    srv = KVServer(SECRET, max_wait=0.5)
    srv.start()
    futures = []

    def handler(method, subpath, query, body):
        if subpath == "now":
            return 200, b"at once"
        future = Future()
        futures.append(future)
        return future
    srv.add_route("/rdzv/", handler)
    try:
        client = KVClient(*srv.address, SECRET, timeout=5)
        assert client.request("GET", "/rdzv/now") == (200, b"at once")
        threading.Timer(0.1, lambda: futures[0].set_result((201, b"later"))).start()
        assert client.request("GET", "/rdzv/wait") == (201, b"later")
        started = time.monotonic()
        assert client.request("GET", "/rdzv/wait")[0] == 408  # nobody answered: the cap
        assert 0.4 < time.monotonic() - started < 3 and futures[1].cancelled()
        threading.Timer(0.1, lambda: futures[2].set_exception(ValueError("boom"))).start()
        with pytest.raises(KVError, match="500: internal error") as err:
            client.request("GET", "/rdzv/wait")
        assert "boom" not in str(err.value)
        with socket.create_connection(srv.address, timeout=5) as gone:  # client leaves early
            gone.sendall(request("GET", "/rdzv/wait"))
            deadline = time.monotonic() + 5
            while len(futures) < 4 and time.monotonic() < deadline:
                time.sleep(0.01)
        deadline = time.monotonic() + 5
        while not futures[3].cancelled() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert futures[3].cancelled()
        assert client.request("GET", "/rdzv/now") == (200, b"at once")
    finally:
        srv.stop()


def test_a_family_of_keys_in_one_answer(server):
    client = KVClient(*server.address, SECRET, timeout=5)
    got = {}
    thread = threading.Thread(target=lambda: got.update(client.gather("snap", "0/", 3, timeout=5)))
    thread.start()
    other = KVClient(*server.address, SECRET, timeout=5)
    other.put("snap", "rank_0", b"not of the family")
    for rank in range(3):
        other.put("snap", f"0/{rank}", b"addr%d" % rank)
        other.put("snap", f"0/{rank}0", b"not of the family either")
    thread.join(5)
    assert got == {"0/0": b"addr0", "0/1": b"addr1", "0/2": b"addr2"}
    with pytest.raises(TimeoutError):
        client.gather("snap", "0/", 4, timeout=0.2)
    other.put("snap", "0/1", b"changed")
    other.delete("snap", "0/2")
    with pytest.raises(TimeoutError):
        client.gather("snap", "0/", 3, timeout=0.2)
    other.put("snap", "0/2", b"back")
    assert client.gather("snap", "0/", 3, timeout=1) == {"0/0": b"addr0", "0/1": b"changed", "0/2": b"back"}


def test_a_rank_sends_its_own_key_with_its_read_of_the_family():
    class Counting(KVServer):  # the real server, its requests noted
        def serve(self, method, target, body):
            seen.append((method, target.partition("?")[0]))
            return super().serve(method, target, body)
    seen, got = [], {}
    srv = Counting(SECRET)
    srv.start()
    try:
        def rank(r):
            store = ScopeStore(KVClient(*srv.address, SECRET, timeout=5), "mesh", peers=3)
            store.set(f"0/{r}", b"addr%d" % r)  # as gloo: its own address, then every peer's
            got[r] = [store.get(f"0/{k}", 5) for k in range(3)]
        threads = [threading.Thread(target=rank, args=(r,)) for r in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        assert got == {r: [b"addr0", b"addr1", b"addr2"] for r in range(3)}
        assert sorted(seen) == [("PUT", f"/kv/mesh/0%2F{r}") for r in range(3)]  # one request each
        # Any other call sends a held key first.
        store = ScopeStore(KVClient(*srv.address, SECRET, timeout=5), "other", peers=2)
        store.set("0/1", b"mine")
        assert store.check(["0/1"]) and srv.get("other", "0/1") == b"mine"
        with pytest.raises(RuntimeError, match="not set within"):
            store.get("0/0", 0.3)  # the family's read: 0/0 is missing
    finally:
        srv.stop()


def test_unauthenticated_flood_is_bounded_and_locks_nobody_out():
    srv = KVServer(SECRET, max_unauthenticated=32, auth_timeout=0.5)
    srv.start()
    flood = []
    try:
        for _ in range(200):  # connect, say nothing
            flood.append(socket.create_connection(srv.address, timeout=5))
        client = KVClient(*srv.address, SECRET, timeout=5)
        started = time.monotonic()
        client.put("flood", "k", b"v")
        assert client.get("flood", "k") == b"v"
        assert time.monotonic() - started < 1.0
        assert len(srv._unauthenticated) <= 32
        time.sleep(1.5)  # past the time to authenticate: every silent one is gone
        assert len(srv._unauthenticated) == 0
        assert client.get("flood", "k") == b"v"
    finally:
        for sock in flood:
            sock.close()
        srv.stop()


def test_signed_objects():
    key = objects.key_for("job-a")
    data = objects.dumps({"x": [1, 2]}, key)
    assert objects.loads(data, key) == {"x": [1, 2]}
    assert objects.loads(bytearray(data), key) == {"x": [1, 2]}
    with pytest.raises(objects.ForgedObject):
        objects.loads(data, objects.key_for("job-b"))
    tampered = bytearray(data)
    tampered[-2] ^= 1
    with pytest.raises(objects.ForgedObject):
        objects.loads(tampered, key)
    with pytest.raises(objects.ForgedObject):
        objects.loads(b"short", key)


class ManInTheMiddle:
    """Relays connections to the server and rewrites the server's answers with `tamper`
    (bytes -> bytes), as anyone on the path could."""

    def __init__(self, server_address, tamper):
        self.server_address, self.tamper = server_address, tamper
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.2)
        self.address = self.listener.getsockname()
        self.stop = threading.Event()
        self.sockets = []
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self):
        while not self.stop.is_set():
            try:
                client, _ = self.listener.accept()
            except socket.timeout:
                continue
            upstream = socket.create_connection(self.server_address, timeout=5)
            self.sockets += [client, upstream]
            for source, sink, tamper in ((client, upstream, bytes), (upstream, client, self.tamper)):
                threading.Thread(target=self._relay, args=(source, sink, tamper), daemon=True).start()

    @staticmethod
    def _relay(source, sink, tamper):
        try:
            while True:
                data = source.recv(65536)
                if not data:
                    break
                sink.sendall(tamper(data))
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self):
        self.stop.set()
        self.thread.join(5)
        self.listener.close()
        for sock in self.sockets:
            sock.close()


@pytest.mark.parametrize("tamper, what", [
    (lambda d: d.replace(b"10.0.0.1", b"66.6.6.6"), "a peer's address swapped"),
    (lambda d: d.replace(b"HTTP/1.1 404", b"HTTP/1.1 200"), "the status changed"),
    (lambda d: d.replace(kvproto.SIG_HEADER.encode(), b"X-Dropped"), "the signature removed"),
])
def test_a_forged_answer_is_refused(server, tamper, what):
    KVClient(*server.address, SECRET, timeout=5).put("mitm", "0/0", b"10.0.0.1:4000")
    honest = ManInTheMiddle(server.address, bytes)
    forger = ManInTheMiddle(server.address, tamper)
    try:
        through = KVClient(*honest.address, SECRET, timeout=5)
        assert through.get("mitm", "0/0") == b"10.0.0.1:4000"  # the relay alone changes nothing
        assert through.get("mitm", "none") is None
        client = KVClient(*forger.address, SECRET, timeout=5)
        with pytest.raises(KVError, match="does not carry this job's signature") as err:
            client.get("mitm", "0/0" if "address" in what else "none")
        assert "\n" not in str(err.value), "one line"
    finally:
        honest.close()
        forger.close()


def test_answers_are_bound_to_their_request(server):
    key = kvproto.job_key(SECRET)
    first, signed_first = kvproto.encode_request(key, "GET", "/kv/bind/k")
    second, signed_second = kvproto.encode_request(key, "GET", "/kv/bind/k")
    status, headers, body = exchange(server, first)
    assert status == 404 and kvproto.answer_is_signed(key, signed_first, status, headers, body)
    # The same answer passed off as the answer to another request (a replay) is refused.
    assert not kvproto.answer_is_signed(key, signed_second, status, headers, body)
    assert not kvproto.answer_is_signed(kvproto.job_key("other job"), signed_first, status, headers, body)
    # Unsigned: an answer to a request that was not the job's (nothing to bind it to).
    assert kvproto.SIG_HEADER.lower() not in exchange(server, request("GET", "/kv/bind/k", key=b"x"))[1]
    with pytest.raises(KVError, match="403: bad signature.*not this job's driver"):
        KVClient(*server.address, "wrong secret", timeout=5).get("bind", "k")


def test_what_steers_a_clock_or_liveness_is_signed_and_finite(server):
    """The server's time in a refusal for skew is in the signed body: an on-path rewrite to
    nan is refused (before: applied, and every later request refused); a heartbeat stamped
    nan is refused (before: never stale, so replayable for good); an answer's Content-Length
    is capped before its signature can be checked; a non-ASCII signature gets a clean 401."""
    import re
    nan = ManInTheMiddle(server.address, lambda d: re.sub(
        rb"(X-Hvdlite-Time: |stale )([0-9.]+)", lambda m: m[1] + b"nan".ljust(len(m[2])), d))
    try:
        client = KVClient(*nan.address, SECRET, timeout=5)
        client.offset = 300.0
        with pytest.raises(KVError):
            client.put("clock", "nan", b"v")
        assert client.offset == 300.0  # not applied
    finally:
        nan.close()
    beat_key = kvproto.beat_key(KEY)
    assert kvproto.decode_beat(beat_key, kvproto.encode_beat(beat_key, b"s" * 8, 1, "w", 0, float("nan"))) is None
    assert kvproto.decode_beat(beat_key, kvproto.encode_beat(beat_key, b"s" * 8, 1, "w", 0, time.time())) is not None
    parser = kvproto.ResponseParser()
    parser.feed(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % (kvproto.MAX_ANSWER + 1))
    with pytest.raises(ValueError):
        parser.next()
    auth = kvproto.auth_value(KEY, "GET", "/kv/a/b", b"", time.time())
    status, _, body = exchange(server, f"GET /kv/a/b HTTP/1.1\r\n{kvproto.AUTH_HEADER}: {auth[:-2]}\u00e9\r\n"
                                       f"Content-Length: 0\r\n\r\n".encode("utf-8"))
    assert status in (400, 401) and b"Error" not in body and b"ASCII" not in body, (status, body)


def test_junk_datagrams_cost_the_servers_loop_next_to_nothing(monkeypatch):
    """Before: every datagram of a flood was read and hashed on the server's loop, and one
    process's flood of junk raised KV latency to ~200 ms (bench/kvflood.py measures it). Now
    random bytes never reach the loop (the kernel's filter), and crafted ones, a heartbeat's
    size and mark but no signature, are hashed MAX_PER_SOURCE times a read at most."""
    import random
    import sys
    from hvdlite.driver.kv.auth import Gate
    from hvdlite.driver.kv.beats import MAX_PER_SOURCE, Beats, bind_pair
    tcp, udp = bind_pair("127.0.0.1", 0, 1)
    reads, hashed, heard = [], [], []

    class Counted:  # the server's socket, its reads counted
        def recvfrom(self, size):
            got = udp.recvfrom(size)
            reads.append(got)
            return got

        def sendto(self, data, addr):
            return udp.sendto(data, addr)
    good = kvproto.encode_beat(kvproto.beat_key(KEY), b"w0000001", 1, "n1/0#1", 0, time.time())
    tag = kvproto._tag
    monkeypatch.setattr(kvproto, "_tag", lambda key, message: hashed.append(1) or tag(key, message))
    beats = Beats(Counted(), Gate(SECRET))
    beats.handler = lambda got: heard.extend(got) or b"heard"
    rng = random.Random(1)
    flood = [rng.randbytes(rng.randrange(1, kvproto.MAX_DATAGRAM + 1)) for _ in range(500)]
    crafted = [rng.randbytes(kvproto.BEAT_TAG) + kvproto.BEAT_MARK + rng.randbytes(80) for _ in range(200)]
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as junk, \
            socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as worker:
        for datagram in flood + crafted:
            junk.sendto(datagram, udp.getsockname())
        worker.sendto(good, udp.getsockname())
        deadline = time.monotonic() + 10
        while not heard and time.monotonic() < deadline:
            beats.drain()
            time.sleep(0.01)
        worker.settimeout(5)
        assert worker.recv(2048) and [got[0] for got in heard] == ["n1/0#1"]
    tcp.close()
    udp.close()
    if sys.platform.startswith("linux"):
        assert len(reads) == len(crafted) + 1  # the random ones were dropped by the kernel
    assert len(hashed) <= MAX_PER_SOURCE + 1
