"""A real job's control plane under watch and under attack: a loopback capture of a 2-worker
job never contains the job's secret; a flood of unauthenticated connections neither stops a
world from re-forming after kill -9 nor grows the driver's memory without bound."""
import os
import shutil
import signal
import socket
import threading
import time

import pytest

from capture import Capture, found, secret_forms
from jobs import SCRIPTS, Job, job_env, next_world, run_job, slot_pid, wait_progress

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PYTHON = os.path.join(ROOT, ".venv-pygloo", "bin", "python")
needs_pygloo = pytest.mark.skipif(not os.path.exists(PYTHON), reason=f"no pygloo venv at {PYTHON}")
ADDRESS = "127.0.0.77"  # the driver's own loopback address, so the capture holds only its traffic


def worker_env(pid: int) -> dict:
    with open(f"/proc/{pid}/environ", "rb") as f:
        pairs = [item.split(b"=", 1) for item in f.read().split(b"\0") if b"=" in item]
    return {k.decode(): v.decode("utf-8", "replace") for k, v in pairs}


@needs_pygloo
@pytest.mark.skipif(shutil.which("tcpdump") is None, reason="tcpdump is not installed (.ci/install-ssh.sh)")
def test_capture_of_a_real_job_never_contains_the_secret(tmp_path):
    secret_file = tmp_path / "secret"
    with Capture("lo", tmp_path / "lo.pcap", "host", ADDRESS) as capture:
        # The worker records the secret it was given (from its environment, not a command line).
        script = f'echo "$HVDLITE_SECRET" > {secret_file}; exec {PYTHON} {SCRIPTS}/numpy_check.py'
        r = run_job(["-np", "2", "--rendezvous-addr", ADDRESS, "sh", "-c", script], tmp_path, timeout=90)
        assert r.code == 0, r.stderr
    secret = secret_file.read_text().strip()
    assert len(secret) >= 32
    packets = capture.packets()
    # The capture is of this job's control plane: signed requests for gloo's bootstrap keys.
    assert b"X-Hvdlite-Auth" in packets and b"/kv/gloo." in packets
    assert found(secret_forms(secret), packets) == []


def flood(address, stop: threading.Event, opened: list):
    """Unauthenticated connections as fast as one thread can open them, each left half-sent."""
    while not stop.is_set():
        try:
            sock = socket.create_connection(address, timeout=2)
            sock.sendall(b"PUT /kv/gloo.1/0%2F0 HTTP/1.1\r\nX-Hvdlite-Auth: 1")
            opened.append(sock)
            if len(opened) > 2000:  # our own fds are bounded too; the server forgets them anyway
                opened.pop(0).close()
        except OSError:
            time.sleep(0.01)


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return int(f.read().split("VmRSS:")[1].split()[0]) / 1024


@needs_pygloo
@pytest.mark.plain_start("reads the rendezvous address from a worker's /proc/PID/environ: a forked "
                         "worker's shows its template's")
def test_kill_9_during_an_unauthenticated_flood_still_reforms(tmp_path):
    job_script = [PYTHON, os.path.join(SCRIPTS, "numpy_elastic_job.py")]
    stop, opened, threads = threading.Event(), [], []
    with Job(["-H", "localhost:3", "--min-np", "1", *job_script], tmp_path,
             env=job_env(tmp_path, TOTAL_STEPS=100000, STEP_SLEEP=0.05)) as job:
        try:
            wait_progress(job, tmp_path, 5)
            env = worker_env(slot_pid(job, "localhost/0"))
            address = (env["HVDLITE_RENDEZVOUS_ADDR"], int(env["HVDLITE_RENDEZVOUS_PORT"]))
            before = rss_mb(job.proc.pid)
            threads = [threading.Thread(target=flood, args=(address, stop, opened), daemon=True)
                       for _ in range(4)]
            for thread in threads:
                thread.start()
            time.sleep(2)
            assert len(opened) > 500, "the flood did not get going"
            seconds, world = next_world(job, lambda: os.kill(slot_pid(job, "localhost/1"), signal.SIGKILL))
            assert world["size"] == 2
            assert seconds < 10, f"re-formed only after {seconds:.1f} s under the flood"  # ~0.1 s quiet
            time.sleep(2)
            assert rss_mb(job.proc.pid) - before < 100, "the driver's memory grew with the flood"
        finally:
            stop.set()
            for thread in threads:
                thread.join(10)
            for sock in opened:
                sock.close()
