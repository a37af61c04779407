"""User code around hvdlite in real jobs: its own connections survive a world breaking."""
import os
import signal
import socketserver
import sys
import threading

import pytest

from jobs import SCRIPTS, Job, job_env, slot_pid, wait_progress
from test_numpy_backend import PYTHON, needs_pygloo


class _Echo(socketserver.BaseRequestHandler):
    def handle(self):
        while data := self.request.recv(1024):
            self.request.sendall(data)


@pytest.fixture
def echo_port():
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("backend", ["torch", pytest.param("numpy", marks=needs_pygloo)])
def test_a_users_connection_opened_while_gloo_connects_survives_a_world_breaking(tmp_path, echo_port, backend):
    python = PYTHON if backend == "numpy" else sys.executable
    with Job(["-H", "localhost:3", "--min-np", "1", python, os.path.join(SCRIPTS, "user_socket_job.py")],
             tmp_path, env=job_env(tmp_path, ECHO_PORT=echo_port, BACKEND=backend, TOTAL_STEPS=30)) as job:
        wait_progress(job, tmp_path, 8)
        os.kill(slot_pid(job, "localhost/2"), signal.SIGKILL)
        r = job.finish(120)
    assert r.code == 0, r.stderr
    assert len(r.of("round_broken")) == 1
    # gloo's own sockets were still cut: the survivors did not wait out gloo's 30 s timeout
    assert r.of("round_complete")[1]["reformed_in"] < 10
    lines = sorted(line.split(":", 1)[1] for line in r.stdout.splitlines() if "USER_SOCKET" in line)
    assert lines == [f"USER_SOCKET localhost/{i} inside=True reply=b'ping' gloo=some" for i in (0, 1)], r.stdout
