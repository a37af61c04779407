"""Seeing a job: /metrics during a real job, its timeline rendered in headless Chromium, the
status line on a pseudo-terminal, and the per-rank collective trace."""
import fcntl
import json
import os
import pty
import re
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import termios
import threading
import time
import urllib.request

import pytest

from jobs import SCRIPTS, Job, discovery, job_env, run_job, slot_pid, wait_progress
from pngs import png_pixels
from hvdlite.timeline import render, story
from hvdlite.worker import trace

JOB = [sys.executable, os.path.join(SCRIPTS, "elastic_job.py")]
CHROMIUM = shutil.which("chromium")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    return {m.group(1): float(m.group(2))
            for m in re.finditer(r"^(hvdlite_\w+(?:\{[^}]*\})?) (\S+)$", text, re.M)}


class Scraper:
    """Reads /metrics every 0.1 s on a thread; keeps each change of the world size."""

    def __init__(self, port):
        self.port, self.sizes, self.last = port, [], {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.wait(0.1):
            try:
                self.last = scrape(self.port)
            except OSError:
                continue  # not serving yet, or gone
            size = self.last.get("hvdlite_world_size")
            if size is not None and (not self.sizes or self.sizes[-1] != size):
                self.sizes.append(size)

    def stop(self):
        self._stop.set()
        self._thread.join(10)


def test_a_job_seen_through_metrics_timeline_and_trace(tmp_path):
    # 2 workers; kill -9 of one (its slot sits out: one host); a third slot appears at step 20.
    schedule = [[0, ["localhost:2"]], [20, ["localhost:3"]]]
    port = free_port()
    trace_file = tmp_path / "trace.json"
    with Job([*discovery(tmp_path, schedule), "--min-np", "1", "--metrics-port", str(port),
              "--timeline-filename", str(trace_file), *JOB], tmp_path,
             env=job_env(tmp_path, TOTAL_STEPS=40, STEP_SLEEP=0.1, RESIZE="30:2")) as job:
        scraper = Scraper(port)
        try:
            wait_progress(job, tmp_path, 8)
            os.kill(slot_pid(job, "localhost/1"), signal.SIGKILL)
            r = job.finish(180)
        finally:
            scraper.stop()
    assert r.code == 0, r.stderr
    # /metrics followed the world: 2, then 1 after the kill, then 2 after the scale-up
    assert [s for s in scraper.sizes if s > 0][:3] == [2, 1, 2], scraper.sizes
    last = scraper.last
    assert last["hvdlite_worker_failures_total"] == 1
    assert last["hvdlite_blacklisted_slots"] == 1 and last["hvdlite_target_world_size"] == 2
    assert last["hvdlite_resets_total"] >= 2 and last["hvdlite_newest_commit"] >= 35
    assert last["hvdlite_recovery_seconds_count"] >= 2
    # the console told the story in sentences
    assert "rank 1 on localhost (slot localhost/1) was killed by SIGKILL" in r.stderr
    assert re.search(r"world \d formed: 1 worker goes on from commit \d+ \(re-formed in [\d.]+ s "
                     r"after the failure\)", r.stderr), r.stderr
    assert "round_complete" not in r.stderr  # no raw event lines
    # the trace: valid JSON, every begin ended, per process and lane
    check_trace(json.loads(trace_file.read_text()), processes=3)
    assert not os.path.exists(str(trace_file) + ".parts")
    # the timeline of this job, drawn and looked at by a browser
    html = tmp_path / "timeline.html"
    done = subprocess.run([sys.executable, "-m", "hvdlite.cli", "timeline", job.event_log, "-o", str(html)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    page = html.read_text()
    assert "http://" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "") and "<script" not in page
    s = story.build(r.events)
    assert s.slots == ["localhost/0", "localhost/1", "localhost/2"]
    assert s.failures == 1 and len(s.recoveries) >= 2
    check_screenshot(html, tmp_path, s)


def test_a_static_job_serves_real_metrics(tmp_path):
    port = free_port()
    with Job(["-np", "2", "--metrics-port", str(port), *JOB], tmp_path,
             env=job_env(tmp_path, TOTAL_STEPS=60, STEP_SLEEP=0.1)) as job:
        wait_progress(job, tmp_path, 25)
        seen = scrape(port)
        r = job.finish(120)
    assert r.code == 0, r.stderr
    assert seen["hvdlite_world_size"] == 2 and seen["hvdlite_target_world_size"] == 2
    assert seen["hvdlite_world_round"] == 1 and seen["hvdlite_joining_workers"] == 0
    assert seen["hvdlite_newest_commit"] >= 15 and seen["hvdlite_steps_per_second"] > 1


def check_trace(trace, processes):
    events = trace["traceEvents"]
    spans = [e for e in events if e["ph"] in "BE"]
    pids = {e["pid"] for e in spans}
    assert len(pids) == processes, pids
    names = {e["name"] for e in spans}
    assert {"allreduce", "broadcast", "rendezvous"} <= names, names
    for pid in pids:
        lanes = {}
        for e in sorted((e for e in spans if e["pid"] == pid), key=lambda e: e["ts"]):
            stack = lanes.setdefault(e["tid"], [])
            if e["ph"] == "B":
                assert not stack, "a lane holds one span at a time"
                stack.append(e)
            else:
                assert stack and stack.pop()["name"] == e["name"]
        assert not any(lanes.values()), "every begin has its end"
    allreduces = [e for e in spans if e["name"] == "allreduce" and e["ph"] == "B"]
    assert all(e["args"]["bytes"] > 0 for e in allreduces)
    return spans


def _hex(colour):
    return tuple(int(colour[i:i + 2], 16) for i in (1, 3, 5))


def check_screenshot(html, tmp_path, s):
    if CHROMIUM is None:
        pytest.skip("chromium is not installed (.ci/setup.sh installs it)")
    png = tmp_path / "timeline.png"
    height = render.lane_top(len(s.slots)) + 120
    profile = tmp_path / "chromium-profile"
    proc = subprocess.Popen(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars",
         f"--user-data-dir={profile}", f"--window-size={render.WIDTH},{height}",
         f"--screenshot={png}", f"file://{html}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        proc.wait(120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    if os.environ.get("KEEP_TIMELINE"):  # a folder to keep the page and its picture in, to look at
        for made in (html, png):
            shutil.copy(made, os.environ["KEEP_TIMELINE"])
    width, _, rows = png_pixels(png)
    colours = {p for row in rows for p in row}
    assert len(colours) > 20, "the screenshot is blank"
    member, joining = _hex(render.COLOURS["member"]), _hex(render.COLOURS["joining"])
    for i, slot in enumerate(s.slots):  # every slot's lane was a member at some time
        y = render.lane_top(i) + render.LANE_H // 2 - 3
        lane = rows[y][render.LEFT:width]
        assert member in lane, f"lane of {slot} has no member colour"
        assert joining in lane, f"lane of {slot} has no joining colour"
    blacklisted = _hex(render.COLOURS["blacklisted"])
    y = render.lane_top(s.slots.index("localhost/1")) + render.LANE_H - 3
    assert blacklisted in rows[y][render.LEFT:width], "the killed slot is not shown blacklisted"


def test_static_two_ranks_trace_matches_begin_and_end(tmp_path):
    trace_file = tmp_path / "trace.json"
    r = run_job(["-np", "2", "--timeline-filename", str(trace_file), sys.executable,
                 os.path.join(SCRIPTS, "static_check.py")], tmp_path, timeout=120,
                env=job_env(tmp_path))
    assert r.code == 0, r.stderr
    spans = check_trace(json.loads(trace_file.read_text()), processes=2)
    ranks = {e["args"]["rank"] for e in spans if e["ph"] == "B" and e["name"] == "allreduce"}
    assert ranks == {0, 1}


def test_status_line_on_a_pseudo_terminal(tmp_path):
    """On a terminal the driver keeps one status line current; without one it prints none."""
    schedule = [[0, ["localhost:2"]]]
    args = [sys.executable, "-m", "hvdlite.cli", "run", *discovery(tmp_path, schedule), "--min-np", "1", *JOB]
    env = {**os.environ, **job_env(tmp_path, TOTAL_STEPS=30, STEP_SLEEP=0.1)}
    pid, fd = pty.fork()
    if pid == 0:  # the child: the driver, with the pty as its terminal, 160 wide from its start
        fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 160, 0, 0))
        os.execvpe(args[0], args, env)
    output, started = b"", time.monotonic()
    deadline = started + 120
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], 1)
            if ready:
                try:
                    chunk = os.read(fd, 65536)
                except OSError:  # EIO: the child closed the terminal
                    break
                if not chunk:
                    break
                output += chunk
        _, status = os.waitpid(pid, 0)
        took = time.monotonic() - started
    finally:
        try:
            os.killpg(os.getpgid(pid), signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        os.close(fd)
    text = output.decode("utf-8", "replace")
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, text[-2000:]
    statuses = re.findall(r"\r\x1b\[K(hvdlite: world \d+/\d+ [^\r\n]*)", text)
    assert any(re.match(r"hvdlite: world 2/2 \| [\d.]+ steps/s \| commit \d+", s) for s in statuses), statuses
    rates = [float(m.group(1)) for m in (re.search(r"\| ([\d.]+) steps/s", s) for s in statuses) if m]
    assert len(rates) == len(statuses), statuses
    assert max(rates) > 1, rates  # ~8 steps/s at 0.1 s per step
    assert "last event" in statuses[-1]
    # events still print as whole lines above it, and the line is cleared at the end
    assert re.search(r"\nhvdlite: world 1 formed: 2 workers start training\r?\n", text.replace("\r\x1b[K", "\n"))
    assert text.endswith("\r\x1b[K")
    # kept current at most once a second (redrawn unchanged under every printed line)
    changes = sum(1 for a, b in zip(statuses, statuses[1:]) if a != b)
    assert 3 <= changes <= took + 1, (changes, took)


def test_timeline_merges_the_parts_a_killed_driver_left(tmp_path):
    trace_file = tmp_path / "trace.json"
    os.makedirs(trace.parts_dir(str(trace_file)))
    for pid in (11, 12):  # as two workers wrote them: an allreduce, the second cut by the kill
        with open(os.path.join(trace.parts_dir(str(trace_file)), f"h_{pid}.jsonl"), "w") as f:
            f.write(json.dumps({"name": "allreduce", "ph": "B", "ts": 1.0, "pid": pid, "tid": 0}) + "\n")
            if pid == 11:
                f.write(json.dumps({"name": "allreduce", "ph": "E", "ts": 2.0, "pid": pid, "tid": 0}) + "\n")
            f.write('{"name": "allre')
    r = subprocess.run([sys.executable, "-m", "hvdlite.cli", "timeline", str(trace_file) + ".parts"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    events = json.loads(trace_file.read_text())["traceEvents"]
    assert sorted((e["pid"], e["ph"]) for e in events) == [(11, "B"), (11, "E"), (12, "B"), (12, "E")]
    assert [e["args"] for e in events if e["pid"] == 12 and e["ph"] == "E"] == [{"unfinished": True}]
    bad = subprocess.run([sys.executable, "-m", "hvdlite.cli", "timeline", str(tmp_path)],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "is a directory" in bad.stderr and len(bad.stderr.splitlines()) == 1


def test_a_symlink_planted_among_a_traces_parts_is_never_followed(tmp_path):
    # Before: FILE.parts/<worker>.jsonl was opened with open(..., "a"), following a symlink
    # that another user of a group-writable folder planted there, and FILE's temporary name
    # (FILE.tmpPID) was as predictable: both wrote into the symlink's target.
    victim = tmp_path / "victim"
    victim.write_text("precious")
    path = str(tmp_path / "trace.json")
    os.makedirs(trace.parts_dir(path))
    os.symlink(victim, os.path.join(trace.parts_dir(path), "w_0.jsonl"))
    with pytest.raises(OSError):
        trace.Recorder(path, "w/0")
    os.symlink(victim, f"{path}.tmp{os.getpid()}")
    rec = trace.Recorder(path, "w/1")
    rec.close()
    trace.merge_parts(path, remove=False)
    assert victim.read_text() == "precious"
    assert [e["args"]["name"] for e in json.load(open(path))["traceEvents"]] == ["worker w/1"]
    # a parts folder that is a symlink is refused too: discarding would delete *.jsonl there
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "mine.jsonl").write_text("{}\n")
    other = str(tmp_path / "other.json")
    os.symlink(elsewhere, trace.parts_dir(other))
    with pytest.raises(OSError):
        trace.Recorder(other, "w/0")
    trace.discard_parts(other)
    assert (elsewhere / "mine.jsonl").exists()


def test_the_merged_timeline_follows_the_umask(tmp_path):
    """Before: forced to 0644 whatever the umask (the parts and checkpoints follow it)."""
    path = str(tmp_path / "trace.json")
    os.makedirs(trace.parts_dir(path))
    old = os.umask(0o077)
    try:
        trace.Recorder(path, "w/0").close()
        trace.merge_parts(path, remove=False)
    finally:
        os.umask(old)
    assert os.stat(path).st_mode & 0o777 == 0o600
