"""User code around hvdlite in real jobs: its own connections survive a world breaking; a
static job's habits in an elastic script fail with one line that says what to change."""
import os
import signal
import socketserver
import sys
import threading

import pytest

from jobs import SCRIPTS, Job, discovery, job_env, run_job, slot_pid, wait_progress
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


def test_a_joiner_running_a_collective_outside_run_says_what_to_move(tmp_path):
    schedule = [[0, ["127.0.0.1:1", "127.0.0.2:1"]], [5, ["127.0.0.1:1", "127.0.0.2:1", "127.0.0.3:1"]]]
    r = run_job([*discovery(tmp_path, schedule), "--min-np", "2", sys.executable,
                 os.path.join(SCRIPTS, "static_style_job.py")], tmp_path,
                env=job_env(tmp_path, TOTAL_STEPS=30, STEP_SLEEP=0.1))
    assert r.code == 0, r.stderr
    said = [line for line in r.stdout.splitlines() + r.stderr.splitlines() if "127.0.0.3/0" in line or "[2]" in line]
    assert "Traceback" not in r.stdout + r.stderr, said
    errors = [line for line in said if "<stderr>:" in line]
    assert len(errors) == 1 and "static_style_job.py:14 runs a collective outside @hvd.elastic.run" \
        in errors[0], errors
    assert [e["code"] for e in r.of("worker_exit") if e["slot"] == "127.0.0.3/0"] == [1]
    (failed,) = r.of("job_end")[-1]["failed"]  # the summary names it
    assert "127.0.0.3" in failed and "exited with code 1" in failed, failed
    assert f"1 worker failed on the way: {failed}" in r.stderr
