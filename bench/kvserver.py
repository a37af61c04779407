"""Rendezvous KV server under load: python bench/kvserver.py [--seconds 5] [--clients 4].

Starts the driver's KV server in a process of its own, parks 1024 long-poll waiters on it,
then measures, while they wait:
- raw throughput: client processes sending small signed PUT/GET requests on kept-alive
  connections (target >= 5000 requests/s on this 2-core machine, clients included);
- library throughput: hvdlite's KVClient (set/get) against torch's TCPStore, the store torchrun
  uses, with the same client processes in the same run; prints the ratio.
Finally one PUT releases the waiters and every one must get the value.
"""
import argparse
import multiprocessing as mp
import os
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
SECRET = "bench-secret"
WAITERS = 1024

SERVER = f"""
import sys
from hvdlite.driver.kv.server import KVServer
server = KVServer({SECRET!r})
server.start()
print(server.address[1], flush=True)
sys.stdin.read()  # until the bench closes our stdin
server.stop()
"""


def read_response(sock, buf=b""):
    """One response from a kept-alive connection: (status, body, leftover bytes)."""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("server closed the connection")
        buf += chunk
    head, rest = buf.split(b"\r\n\r\n", 1)
    length = int(head.lower().split(b"content-length:", 1)[1].split(b"\r\n", 1)[0])
    while len(rest) < length:
        rest += sock.recv(65536)
    return int(head.split(b" ", 2)[1]), rest[:length], rest[length:]


def signed(method, target, body=b""):
    from hvdlite.worker import kvproto
    return kvproto.encode_request(kvproto.job_key(SECRET), method, target, body)[0]


def raw_client(port, seconds, worker, result):
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    target = f"/kv/load/k{worker}"
    done, buf, deadline = 0, b"", time.monotonic() + seconds
    while time.monotonic() < deadline:
        for request in (signed("PUT", target, b"12345678"), signed("GET", target)):  # a nonce each
            sock.sendall(request)
            status, _, buf = read_response(sock, buf)
            assert status == 200, status
            done += 1
    sock.close()
    result.put(done)


def library_client(kind, port, seconds, worker, result):
    if kind == "hvdlite":
        from hvdlite.worker.kvclient import KVClient
        client = KVClient("127.0.0.1", port, SECRET)
        put, get = (lambda k, v: client.put("lib", k, v)), (lambda k: client.get("lib", k))
    else:
        from datetime import timedelta
        import torch.distributed as dist
        store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=30))
        put, get = store.set, store.get
    done, deadline = 0, time.monotonic() + seconds
    key = f"k{worker}"
    while time.monotonic() < deadline:
        put(key, b"12345678")
        assert get(key) == b"12345678"
        done += 2
    result.put(done)


def measure(target, args, clients, seconds):
    # Spawned, not forked: a child forked while this process runs TCPStore's server thread
    # can hang in torch before its first request.
    ctx = mp.get_context("spawn")
    result = ctx.Queue()
    procs = [ctx.Process(target=target, args=(*args, seconds, w, result)) for w in range(clients)]
    for p in procs:
        p.start()
    total = sum(result.get(timeout=seconds + 60) for _ in procs)
    for p in procs:
        p.join(10)
    return total / seconds  # each client counts within its own `seconds` window


def rss_mb(pid):
    with open(f"/proc/{pid}/status") as f:
        return int(f.read().split("VmRSS:")[1].split()[0]) // 1024


def park_waiters(port):
    socks = []
    for _ in range(WAITERS):
        s = socket.create_connection(("127.0.0.1", port), timeout=90)
        s.sendall(signed("GET", "/kv/park/go?wait=60"))
        socks.append(s)
    return socks


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--clients", type=int, default=4)
    args = p.parse_args()
    server = subprocess.Popen([sys.executable, "-c", SERVER], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    tcpstore = None
    try:
        port = int(server.stdout.readline())
        waiters = park_waiters(port)
        print(f"{WAITERS} waiters parked; server RSS {rss_mb(server.pid)} MB")
        raw = measure(raw_client, (port,), args.clients, args.seconds)
        print(f"raw PUT/GET, {args.clients} client processes: {raw:,.0f} requests/s "
              f"(target >= 5,000: {'met' if raw >= 5000 else 'NOT met'})")

        from datetime import timedelta
        import torch.distributed as dist
        tcpstore = dist.TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=30))
        ours = measure(library_client, ("hvdlite", port), args.clients, args.seconds)
        theirs = measure(library_client, ("tcpstore", tcpstore.port), args.clients, args.seconds)
        print(f"library set/get: hvdlite KVClient {ours:,.0f} ops/s, torch TCPStore {theirs:,.0f} ops/s, "
              f"ratio {ours / theirs:.2f}x")

        start = time.monotonic()
        release = socket.create_connection(("127.0.0.1", port))
        release.sendall(signed("PUT", "/kv/park/go", b"go"))
        assert read_response(release)[0] == 200
        answered = sum(read_response(s)[:2] == (200, b"go") for s in waiters)
        print(f"released {answered}/{WAITERS} waiters in {time.monotonic() - start:.2f} s; "
              f"server RSS {rss_mb(server.pid)} MB")
        for s in waiters + [release]:
            s.close()
    finally:
        server.stdin.close()
        try:
            server.wait(15)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(5)


if __name__ == "__main__":
    main()
