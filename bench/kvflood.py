"""KV latency under a flood of junk datagrams:
python bench/kvflood.py [--seconds 5] [--crafted] [--senders N] [--against TREE]

Starts the driver's KV server in a process of its own (heartbeats answered), then measures the
round trips of signed GETs (KVClient) and of heartbeats, and the share of a core the server's
process takes, quiet and while N processes (--senders, default 1) send junk datagrams to the
server's port as fast as they can (sendmmsg, 1024 a call): random bytes of random sizes up to a
datagram's limit, or with --crafted a heartbeat's size and mark without its signature. With
--against TREE (another source tree, e.g. `git archive` of the commit before) the same runs
for both trees in the same run, one after the other, and the table has a row for each.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SECRET = "bench-secret"

SERVER = f"""
import sys
from hvdlite.driver.kv.server import KVServer
server = KVServer({SECRET!r})
server.set_heartbeat(lambda beats: b"heard")
server.start()
print(server.address[1], flush=True)
sys.stdin.read()  # until the bench closes our stdin
server.stop()
"""

FLOOD = """
import ctypes, os, random, socket, sys, time
port, crafted, seconds = int(sys.argv[1]), sys.argv[2] == "1", float(sys.argv[3])
rng = random.Random(os.getpid())
junk = [rng.randbytes(16) + b"hb" + rng.randbytes(rng.randrange(57, 200)) if crafted
        else rng.randbytes(rng.randrange(1, 1401)) for _ in range(1024)]
sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
sock.connect(("127.0.0.1", port))


class Iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_char_p), ("len", ctypes.c_size_t)]


class Mmsghdr(ctypes.Structure):  # struct mmsghdr: a msghdr and the length sent
    _fields_ = [("name", ctypes.c_void_p), ("namelen", ctypes.c_uint32), ("iov", ctypes.POINTER(Iovec)),
                ("iovlen", ctypes.c_size_t), ("control", ctypes.c_void_p), ("controllen", ctypes.c_size_t),
                ("flags", ctypes.c_int), ("len", ctypes.c_uint)]


def batch():  # one sendmmsg(2) call sends all 1024 (Python's socket has none): the kernel's cost alone
    libc = ctypes.CDLL(None, use_errno=True)
    iovs = (Iovec * len(junk))(*[Iovec(d, len(d)) for d in junk])
    msgs = (Mmsghdr * len(junk))()
    for m, iov in zip(msgs, iovs):
        m.iov, m.iovlen = ctypes.pointer(iov), 1
    fd, n = sock.fileno(), len(junk)
    return lambda: max(0, libc.sendmmsg(fd, msgs, n, 0))


try:
    send = batch()
    send()
except (OSError, AttributeError):  # no sendmmsg (not Linux): one datagram a call
    def send():
        for datagram in junk:
            try:
                sock.send(datagram)
            except ConnectionRefusedError:
                pass
        return len(junk)
sent, deadline = 0, time.monotonic() + seconds
while time.monotonic() < deadline:
    sent += send()
print(sent, flush=True)
"""


def cpu_seconds(pid) -> float:
    """User + system CPU of process `pid` so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def phase(client, beats, seconds, server):
    """GET and heartbeat round trips (ms) for `seconds`: a heartbeat after every 10th GET; and the
    share of a core the server's process used meanwhile."""
    gets, heard, lost = [], [], 0
    cpu, start_all = cpu_seconds(server), time.monotonic()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for _ in range(10):
            start = time.perf_counter()
            client.get("bench", "k")
            gets.append((time.perf_counter() - start) * 1000)
        start = time.perf_counter()
        if beats.beat("n1/0#1") is None:
            lost += 1
        else:
            heard.append((time.perf_counter() - start) * 1000)
    gets.sort()
    return {"server_cpu": (cpu_seconds(server) - cpu) / (time.monotonic() - start_all), "gets": len(gets), "get_median_ms": statistics.median(gets), "get_mean_ms": statistics.fmean(gets),
            "get_p99_ms": gets[int(len(gets) * 0.99)], "get_max_ms": gets[-1],
            "beat_median_ms": statistics.median(heard) if heard else None, "beats_lost": lost,
            "beats": lost + len(heard)}


def measure(seconds, crafted, senders):
    """One tree (this process's hvdlite): quiet, then flooded; one JSON line."""
    from hvdlite.worker.kvclient import Heartbeats, KVClient
    server = subprocess.Popen([sys.executable, "-c", SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        port = int(server.stdout.readline())
        client = KVClient("127.0.0.1", port, SECRET, timeout=30)
        client.put("bench", "k", b"v" * 64)
        beats = Heartbeats(client, timeout=1.0)
        quiet = phase(client, beats, seconds, server.pid)
        floods = [subprocess.Popen([sys.executable, "-c", FLOOD, str(port), "1" if crafted else "0", str(seconds + 1)],
                                   stdout=subprocess.PIPE, text=True) for _ in range(senders)]
        time.sleep(0.5)  # the flood at full rate first
        flooded = phase(client, beats, seconds, server.pid)
        sent = sum(int(flood.communicate(timeout=60)[0]) for flood in floods)
        beats.close()
        client.close()
    finally:
        server.stdin.close()
        server.wait(30)
    print(json.dumps({"quiet": quiet, "flooded": flooded, "junk_per_s": sent / (seconds + 1)}))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--crafted", action="store_true", help="junk with a heartbeat's size and mark")
    p.add_argument("--senders", type=int, default=1, help="flooding processes (each sends with sendmmsg)")
    p.add_argument("--against", help="another source tree, measured in the same run")
    p.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.measure:
        return measure(args.seconds, args.crafted, args.senders)
    trees = [ROOT] + ([os.path.abspath(args.against)] if args.against else [])
    print(f"{'tree':<30} {'phase':<8} {'GETs':>6} {'median':>8} {'mean':>8} {'p99':>8} {'max':>8} "
          f"{'beat':>7} {'lost':>9} {'junk/s':>8} {'server CPU':>10}")
    for tree in trees:
        done = subprocess.run([sys.executable, os.path.abspath(__file__), "--measure", "--seconds", str(args.seconds),
                               "--senders", str(args.senders)]
                              + (["--crafted"] if args.crafted else []), capture_output=True, text=True,
                              env={**os.environ, "PYTHONPATH": tree}, timeout=args.seconds * 4 + 120)
        if done.returncode:
            sys.exit(f"kvflood: the run for {tree} failed: {done.stderr.strip().splitlines()[-1:]}")
        result = json.loads(done.stdout.splitlines()[-1])
        for name in ("quiet", "flooded"):
            r = result[name]
            beat = f"{r['beat_median_ms']:.2f}" if r["beat_median_ms"] is not None else "-"
            print(f"{tree[-30:]:<30} {name:<8} {r['gets']:>6} {r['get_median_ms']:>8.2f} {r['get_mean_ms']:>8.2f} "
                  f"{r['get_p99_ms']:>8.2f} {r['get_max_ms']:>8.2f} {beat:>7} {r['beats_lost']:>4}/{r['beats']:<4} "
                  f"{result['junk_per_s'] if name == 'flooded' else 0:>8.0f} {r['server_cpu'] * 100:>9.0f}%")
        quiet, flooded = result["quiet"], result["flooded"]
        print(f"{tree[-30:]:<30} flooded/quiet: GET median {flooded['get_median_ms'] / quiet['get_median_ms']:.2f}x, "
              f"p99 {flooded['get_p99_ms'] / quiet['get_p99_ms']:.2f}x")


if __name__ == "__main__":
    main()
