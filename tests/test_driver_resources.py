"""The driver's own resources on real jobs: descriptors under a low `ulimit -n` while strangers
hold connections open, output files closed per launch, metrics scrapes that cost no thread."""
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

import pytest

from hvdlite.worker.sockets import inodes, open_sockets
from jobs import SCRIPTS, Job, job_env, next_world, slot_pid, wait_progress

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PYTHON = os.path.join(ROOT, ".venv-pygloo", "bin", "python")
needs_pygloo = pytest.mark.skipif(not os.path.exists(PYTHON), reason=f"no pygloo venv at {PYTHON}")
NUMPY_JOB = [PYTHON, os.path.join(SCRIPTS, "numpy_elastic_job.py")]


def rendezvous_address(job):
    """The driver's one TCP listener (no --metrics-port): its KV server, from the host's TCP
    table rows whose inode the driver holds."""
    mine = inodes(open_sockets(job.proc.pid))
    for table in ("tcp", "tcp6"):
        with open(f"/proc/{job.proc.pid}/net/{table}") as f:
            rows = [line.split() for line in f.readlines()[1:]]
        found = [row[1] for row in rows if row[3] == "0A" and int(row[9]) in mine]
        if found:
            (address,) = found  # exactly one
            return _address(address)
    raise AssertionError("the driver listens on no TCP socket")


def _address(hex_address: str):
    """(host, port) of a /proc/net/tcp{,6} address: host words in host byte order, port hex."""
    host, port = hex_address.split(":")
    raw = bytes.fromhex(host)
    words = b"".join(struct.pack("=I", int.from_bytes(raw[i:i + 4], "big")) for i in range(0, len(raw), 4))
    return socket.inet_ntop(socket.AF_INET if len(words) == 4 else socket.AF_INET6, words), int(port, 16)


def hold_idle(address, count: int, stop: threading.Event, held: list):
    """Keep `count` unauthenticated connections open, the newest ones: one the server drops is
    replaced, so the driver always has strangers to hold."""
    while not stop.is_set():
        try:
            sock = socket.create_connection(address, timeout=2)
            sock.sendall(b"PUT /kv/gloo.1/0%2F0 HTTP/1.1\r\n")  # a head that never ends
            held.append(sock)
            while len(held) > count:
                held.pop(0).close()
        except OSError:
            time.sleep(0.01)
        if len(held) >= count:
            time.sleep(0.002)


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


@needs_pygloo
def test_400_idle_connections_under_ulimit_256_do_not_stop_a_reform(tmp_path):
    stop, held, thread = threading.Event(), [], None
    # A cooldown brings the killed worker's slot back: its relaunch needs descriptors too.
    with Job(["-H", "localhost:3", "--min-np", "1", "--blacklist-cooldown-range", "1", "1", *NUMPY_JOB],
             tmp_path, nofile=256,
             env=job_env(tmp_path, TOTAL_STEPS=400, STEP_SLEEP=0.05)) as job:
        try:
            wait_progress(job, tmp_path, 5)
            thread = threading.Thread(target=hold_idle, daemon=True,
                                      args=(rendezvous_address(job), 400, stop, held))
            thread.start()
            deadline = time.monotonic() + 20
            while len(held) < 400 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert len(held) >= 400, "could not open 400 connections"
            time.sleep(1)
            seconds, world = next_world(job, lambda: os.kill(slot_pid(job, "localhost/1"), signal.SIGKILL))
            assert seconds < 10, f"re-formed only after {seconds:.1f} s"
            job.wait_for(lambda events: [e for e in events if e["event"] == "round_complete"
                                         and e["round"] > world["round"] and e["size"] == 3], 60)
            result = job.finish(120)
        finally:
            stop.set()
            if thread is not None:
                thread.join(10)
            for sock in held:
                sock.close()
    assert result.code == 0, result.stderr[-3000:]
    assert not result.of("launch_failed")
    assert [e["key"] for e in result.of("blacklisted")] == ["localhost/1"]  # the kill only
    assert len(result.stderr) < 20_000, f"{len(result.stderr)} bytes of stderr:\n{result.stderr[:3000]}"


SERVER_AT_ITS_LIMIT = """
import resource, sys, time
resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
from hvdlite.driver.kv.server import KVServer
# Caps above the limit, as a driver whose launches took the descriptors: accept() hits EMFILE.
server = KVServer("s3cret", max_unauthenticated=1000, max_connections=1000, auth_timeout=60,
                  on_exhausted=lambda n: print("exhausted", n, flush=True))
server.start()
print(server.address[1], flush=True)
time.sleep(60)
"""


def test_out_of_descriptors_the_oldest_stranger_goes_and_nothing_floods_stderr(tmp_path):
    from hvdlite.worker.kvclient import KVClient
    err = open(tmp_path / "server.err", "w+")
    proc = subprocess.Popen([sys.executable, "-c", SERVER_AT_ITS_LIMIT], stdout=subprocess.PIPE,
                            stderr=err, text=True, env={**os.environ, "PYTHONPATH": ROOT})
    strangers = []
    try:
        port = int(proc.stdout.readline())
        for _ in range(120):  # more than the server's 64 descriptors
            sock = socket.create_connection(("127.0.0.1", port), timeout=2)
            sock.sendall(b"GET /kv/a/b HTTP/1.1\r\n")
            strangers.append(sock)
        time.sleep(1)
        client = KVClient("127.0.0.1", port, "s3cret", timeout=10)
        start = time.monotonic()
        client.put("scope", "key", b"value")
        assert client.get("scope", "key") == b"value"
        assert time.monotonic() - start < 5, "a worker waited for the strangers to time out"
        assert proc.stdout.readline().startswith("exhausted"), "running out was not said"
    finally:
        for sock in strangers:
            sock.close()
        proc.kill()
        proc.wait(10)
    err.seek(0)
    assert len(err.read()) < 2000, "stderr flooded"


def test_the_soft_limit_is_raised_to_the_hard_one_and_the_caps_follow_it():
    from hvdlite.driver.descriptors import MAX_CONNECTIONS, MAX_UNAUTHENTICATED, connection_caps
    script = ("import resource; resource.setrlimit(resource.RLIMIT_NOFILE, (256, 1024)); "
              "from hvdlite.driver.descriptors import raise_limit; "
              "print(raise_limit(), resource.getrlimit(resource.RLIMIT_NOFILE)[0])")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": ROOT})
    assert out.stdout.split() == ["1024", "1024"], out.stderr
    assert connection_caps(256) == (96, 192)  # 64 descriptors kept for launches and files
    assert connection_caps(1024) == (384, 768)
    assert connection_caps(1 << 20) == (MAX_UNAUTHENTICATED, MAX_CONNECTIONS)


def launches(job, slot):
    return len([e for e in job.events() if e["event"] in ("worker_start", "launch_failed")
                and e["slot"] == slot])


@needs_pygloo
def test_output_files_are_closed_when_a_worker_ends(tmp_path):
    # Slot 1 prints a line on each stream and fails at once; its cooldown brings it back, so
    # it is launched again and again while slot 0 trains.
    script = ('case "$HVDLITE_SLOT" in */1) echo out; echo err >&2; exit 3;; esac; '
              f'exec {PYTHON} {SCRIPTS}/numpy_elastic_job.py')
    with Job(["-H", "localhost:2", "--min-np", "1", "--blacklist-cooldown-range", "0.1", "0.1",
              "--output-filename", str(tmp_path / "out"), "sh", "-c", script], tmp_path,
             env=job_env(tmp_path, TOTAL_STEPS=100000, STEP_SLEEP=0.05)) as job:
        job.wait_for(lambda _: launches(job, "localhost/1") >= 10, 60)
        time.sleep(1)
        at_10, counted = open_fds(job.proc.pid), launches(job, "localhost/1")
        job.wait_for(lambda _: launches(job, "localhost/1") >= counted + 40, 120)
        time.sleep(1)
        grown = open_fds(job.proc.pid) - at_10
        later = launches(job, "localhost/1") - counted
    assert grown < 10, f"the driver's descriptors grew by {grown} over {later} launches"
    assert (tmp_path / "out" / "slot.localhost.1" / "stderr").read_text().count("err") >= counted + 40


def threads_of(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


@needs_pygloo
def test_idle_metrics_connections_cost_no_thread_and_scrapes_still_answer(tmp_path):
    import urllib.request
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    idle = []
    with Job(["-H", "localhost:2", "--min-np", "1", "--metrics-port", str(port), *NUMPY_JOB], tmp_path,
             env=job_env(tmp_path, TOTAL_STEPS=100000, STEP_SLEEP=0.05)) as job:
        try:
            wait_progress(job, tmp_path, 3)
            before = threads_of(job.proc.pid)
            idle = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(300)]
            time.sleep(1)
            grown = threads_of(job.proc.pid) - before
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                text = r.read().decode()
        finally:
            for sock in idle:
                sock.close()
    assert grown < 10, f"300 idle connections added {grown} threads to the driver"
    assert "hvdlite_world_size 2" in text
