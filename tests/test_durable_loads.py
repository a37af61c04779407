"""Durable commits that load, through the CLI with real workers on both backends: a damaged or
unfitting checkpoint ends the job with one line naming the file and exit 65, never a fresh
start; another run's files are never pruned against; a malicious pickle runs nothing; the
driver's kill -9 still gets rank 0's last commit to the disk."""
import os
import pickle
import re
import shutil
import signal
import struct
import sys
import time

import pytest

from jobs import PRELOADED, SCRIPTS, Job, job_env, progress, wait_progress
from test_durable import wait_written
from test_numpy_backend import PYTHON as NUMPY_PYTHON
from hvdlite import exitcodes, procstat
from hvdlite.worker import checkpointdir, checkpoints, trusted

SCRIPT = os.path.join(SCRIPTS, "durable_edit.py")
BACKENDS = [
    pytest.param("torch", id="torch"),
    pytest.param("numpy", id="numpy", marks=pytest.mark.skipif(
        not os.path.exists(NUMPY_PYTHON), reason=f"no pygloo venv at {NUMPY_PYTHON}")),
]
ELASTIC = ["-H", "localhost:2", "--min-np", "1"]
# Steps of a job that a failed write must end: the stop's delay is no bound (a loaded machine
# takes seconds to pass it on), so the job is long enough that training to its end is seen.
STOPPED_LONG_BEFORE = 1000


def run(tmp_path, backend, name, *flags, timeout=120, hosts=ELASTIC, **knobs):
    """One job of durable_edit.py on tmp_path/ckpt to its end; its Result. A torch job's workers
    fork from a template (jobs.PRELOADED): what is proved here is how a worker loads and writes."""
    folder = tmp_path / name
    folder.mkdir()
    python, preload = (NUMPY_PYTHON, []) if backend == "numpy" else (sys.executable, PRELOADED)
    env = job_env(tmp_path, BACKEND=backend, RUN=name, **knobs)
    with Job(["--checkpoint-dir", str(tmp_path / "ckpt"), *flags, *hosts, *preload, python, SCRIPT], folder,
             env=env) as job:
        return job.finish(timeout)


def runs_logged(tmp_path):
    """{run: [steps]} from every worker's steps.txt lines."""
    found = {}
    with open(tmp_path / "steps.txt") as f:
        for line in f:
            name, step = line.split()
            found.setdefault(name, []).append(int(step))
    return found


def files_and_bytes(directory):
    """The checkpoints (the driver's folder, its lease and journal, aside)."""
    return {name: (directory / name).read_bytes() for name in sorted(os.listdir(directory))
            if (directory / name).is_file()}


def check_ended_by(result, path, cause):
    """The driver ended the job with exit 65 and one line naming the file and the cause; the
    workers said nothing (no traceback, no gloo noise), none was blamed or blacklisted."""
    everything = result.stdout + result.stderr
    naming = [line for line in everything.splitlines() if str(path) in line]
    assert len(naming) == 1, everything
    assert re.match(rf"^hvdlite: error: (rank \d|worker localhost/\d) on localhost cannot load checkpoint {re.escape(str(path))}: "
                    rf"{cause}.*Nothing was deleted.*--fresh$", naming[0]), naming
    assert result.code == exitcodes.UNLOADABLE, everything
    assert not [line for line in everything.splitlines() if "<stderr>:" in line], everything
    assert "Traceback" not in everything, everything  # nor the driver (its liveness lines may come on a busy machine)
    assert not result.of("blacklisted") and not result.of("round_broken")
    (end,) = result.of("job_end")
    assert end["result"] == "failure" and str(path) in end["reason"]


def first_run(tmp_path, backend):
    result = run(tmp_path, backend, "1", "--checkpoint-interval", "0", TOTAL_STEPS=5)
    assert result.code == 0, result.stderr
    commit, lineage, path = checkpointdir.newest(str(tmp_path / "ckpt"))
    assert commit == 5
    return lineage, path


@pytest.fixture(scope="module")
def first_runs(tmp_path_factory):
    """first_run(tmp_path, backend) with the job run once per backend for the module: each test
    gets its own copy of that run's checkpoint folder and steps log, to damage or resume."""
    done = {}

    def copy(tmp_path, backend):
        if backend not in done:
            folder = tmp_path_factory.mktemp(f"first-{backend}")
            done[backend] = folder, first_run(folder, backend)
        folder, (lineage, path) = done[backend]
        shutil.copytree(folder / "ckpt", tmp_path / "ckpt")
        shutil.copyfile(folder / "steps.txt", tmp_path / "steps.txt")
        return lineage, str(tmp_path / "ckpt" / os.path.basename(path))
    return copy


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_flipped_byte_in_tensor_data_ends_the_job_naming_the_file(tmp_path, backend, first_runs):
    _, path = first_runs(tmp_path, backend)
    with open(path, "r+b") as f:
        _, _, _, layout = checkpoints._read_manifest(f, os.fstat(f.fileno()).st_size)
        f.seek(layout[1] + 5)  # a byte of the first array: the model's weights
        byte = f.read(1)[0]
        f.seek(layout[1] + 5)
        f.write(bytes([byte ^ 0x10]))
    before = files_and_bytes(tmp_path / "ckpt")
    result = run(tmp_path, backend, "2", TOTAL_STEPS=8)
    check_ended_by(result, path, "CorruptCheckpoint: the checksum of array 0")
    assert files_and_bytes(tmp_path / "ckpt") == before
    assert "2" not in runs_logged(tmp_path)  # no step of a fresh start


def test_a_checkpoint_name_that_cannot_be_opened_ends_the_job_naming_the_file(tmp_path, first_runs):
    # Before: RecursionError, 27,788 lines of traceback, exit 1 and the host blacklisted.
    lineage, _ = first_runs(tmp_path, "torch")
    path = tmp_path / "ckpt" / checkpointdir.file_name(9, lineage)
    os.symlink(tmp_path / "nowhere", path)
    result = run(tmp_path, "torch", "2", TOTAL_STEPS=8)
    check_ended_by(result, path, "CorruptCheckpoint: it cannot be opened: it is a symbolic link to nothing")
    assert os.path.islink(path) and "2" not in runs_logged(tmp_path)


EDITS = [
    pytest.param("torch", {"CLASS": "Settings"}, r"Untrusted: it holds __main__\.Config", id="torch-renamed-class"),
    pytest.param("torch", {"WIDTH": 3}, r"RuntimeError: Error\(s\) in loading state_dict for Linear: size mismatch",
                 id="torch-changed-shape"),
    pytest.param(*BACKENDS[1].values, {"CLASS": "Settings"}, r"Untrusted: it holds __main__\.Config",
                 id="numpy-renamed-class", marks=BACKENDS[1].marks),
]


@pytest.mark.parametrize("backend, edit, cause", EDITS)
def test_an_edited_script_ends_the_job_with_one_line_and_the_original_still_resumes(tmp_path, backend, edit, cause,
                                                                                  first_runs):
    _, path = first_runs(tmp_path, backend)
    before = files_and_bytes(tmp_path / "ckpt")
    result = run(tmp_path, backend, "2", TOTAL_STEPS=8, **edit)
    check_ended_by(result, path, cause)
    assert files_and_bytes(tmp_path / "ckpt") == before  # nothing pruned or written
    assert "2" not in runs_logged(tmp_path)
    result = run(tmp_path, backend, "3", TOTAL_STEPS=8)  # the script as it was
    assert result.code == 0, result.stderr
    assert f"resumed from commit 5 ({path})" in result.stdout + result.stderr
    assert min(runs_logged(tmp_path)["3"]) == 6


def test_a_static_job_that_cannot_load_ends_with_the_same_one_line_and_exit_65(tmp_path, first_runs):
    _, path = first_runs(tmp_path, "torch")
    before = files_and_bytes(tmp_path / "ckpt")
    result = run(tmp_path, "torch", "2", TOTAL_STEPS=8, WIDTH=3, hosts=["-np", "2"])
    check_ended_by(result, path, r"RuntimeError: Error\(s\) in loading state_dict for Linear: size mismatch")
    assert files_and_bytes(tmp_path / "ckpt") == before
    assert "2" not in runs_logged(tmp_path)


@pytest.mark.parametrize("backend, hosts", [
    pytest.param("torch", ELASTIC, id="torch"),
    pytest.param(*BACKENDS[1].values, ELASTIC, id="numpy", marks=BACKENDS[1].marks),
    pytest.param("torch", ["-np", "2"], id="torch-static"),
])
def test_a_state_holding_a_class_not_trusted_ends_the_job_at_its_first_commit_saying_how_to_trust_it(
        tmp_path, backend, hosts):
    # Before: "could not write checkpoint 1 ..." once, then training to the end, exit 0 and
    # nothing on disk: a user who counted on the checkpoints had none.
    result = run(tmp_path, backend, "1", "--checkpoint-interval", "0", hosts=hosts, TOTAL_STEPS=STOPPED_LONG_BEFORE,
                 TRUST=0)
    everything = result.stdout + result.stderr
    naming = [line for line in everything.splitlines() if "could not write" in line]
    assert len(naming) == 1, everything
    assert re.match(rf"^hvdlite: error: (rank 0|worker localhost/\d) on localhost could not write checkpoint 1 to "
                    rf"{re.escape(str(tmp_path / 'ckpt'))}: Untrusted: it holds __main__\.Config, which is neither "
                    rf"a plain value nor a class the script passed to hvd\.elastic\.trust\(\) before hvd\.init\(\)$",
                    naming[0]), naming
    assert result.code == 1, everything
    assert checkpointdir.files(str(tmp_path / "ckpt")) == []
    assert max(runs_logged(tmp_path)["1"]) < STOPPED_LONG_BEFORE - 1  # the failure ended it, not its steps
    assert not result.of("blacklisted")
    assert not [line for line in everything.splitlines() if "Traceback" in line], everything


def test_a_folder_that_cannot_be_written_any_more_ends_the_job_and_keeps_what_was_written(tmp_path):
    # A write failing for any other reason (the folder replaced by a file here: as root, no
    # permission bit stops a write; one under way when it happens fails at its rename) is no
    # more silent: the job ends, the files on disk stay.
    ckpt = tmp_path / "ckpt"
    env = job_env(tmp_path, BACKEND="torch", RUN="1", TOTAL_STEPS=STOPPED_LONG_BEFORE)
    with Job(["--checkpoint-dir", str(ckpt), "--checkpoint-interval", "0", *ELASTIC, *PRELOADED, sys.executable,
              SCRIPT], tmp_path, env=env) as job:
        wait_progress(job, tmp_path, 5)
        written = wait_written(ckpt, 1)  # (rank 0's writer lags under load: 1 at step 5)
        ckpt.rename(tmp_path / "moved")
        ckpt.write_text("not a folder")
        result = job.finish(60)
    everything = result.stdout + result.stderr
    naming = [line for line in everything.splitlines() if "could not write" in line]
    assert len(naming) == 1, everything
    assert re.match(rf"^hvdlite: error: (rank 0|worker localhost/\d) on localhost could not write checkpoint \d+ "
                    rf"to {re.escape(str(ckpt))}: (FileExistsError|NotADirectoryError): ", naming[0]), naming
    assert result.code == 1, everything
    assert checkpointdir.newest(str(tmp_path / "moved"))[0] >= written  # what was written stays
    assert max(runs_logged(tmp_path)["1"]) < STOPPED_LONG_BEFORE - 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_fresh_keeps_an_earlier_runs_higher_commits_and_prunes_only_its_own(tmp_path, backend, first_runs):
    old_lineage, _ = first_runs(tmp_path, backend)
    old = files_and_bytes(tmp_path / "ckpt")
    kept = checkpointdir.files(str(tmp_path / "ckpt"))  # 5 and one before (a busy writer skips some)
    result = run(tmp_path, backend, "2", "--fresh", "--checkpoint-interval", "0", "--checkpoint-keep", "2",
                 TOTAL_STEPS=4)
    assert result.code == 0, result.stderr
    assert min(runs_logged(tmp_path)["2"]) == 1  # anew, on purpose
    found = checkpointdir.files(str(tmp_path / "ckpt"))
    new_lineage = next(lineage for _, lineage in found if lineage != old_lineage)
    assert [f for f in found if f[1] == old_lineage] == kept and kept[0] == (5, old_lineage)
    # its own pruned to --checkpoint-keep 2; the last commit is always written
    mine = [commit for commit, lineage in found if lineage == new_lineage]
    assert mine[0] == 4 and len(mine) <= 2 and len(found) == len(kept) + len(mine), found
    assert {name: data for name, data in files_and_bytes(tmp_path / "ckpt").items() if name in old} == old
    # without --fresh, a run resumes the newest lineage, not the highest commit of any
    result = run(tmp_path, backend, "3", TOTAL_STEPS=8)
    assert result.code == 0, result.stderr
    assert "resumed from commit 4 (" in result.stdout + result.stderr and min(runs_logged(tmp_path)["3"]) == 5


class Payload:
    """A pickle that, loaded by pickle.loads, runs a shell command."""

    def __init__(self, command):
        self.command = command

    def __reduce__(self):
        return os.system, (self.command,)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_malicious_checkpoint_runs_nothing(tmp_path, backend, monkeypatch):
    ckpt, marker = tmp_path / "ckpt", tmp_path / "it-ran"
    ckpt.mkdir()
    lineage = checkpointdir.new_lineage()
    path = ckpt / checkpointdir.file_name(3, lineage)
    with monkeypatch.context() as m:  # as a writer that does not check would write it
        m.setattr(trusted, "loads", lambda data, buffers, place=True: None)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT)
        try:
            checkpoints.dump(fd, 3, lineage, {"values": {"step": Payload(f"touch {marker}")}})
        finally:
            os.close(fd)
    result = run(tmp_path, backend, "1", TOTAL_STEPS=5)
    check_ended_by(result, path, r"Untrusted: it holds posix\.system")
    assert not marker.exists()


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_crafted_checkpoint_that_crashed_every_worker_ends_the_job_with_one_line(tmp_path, backend):
    # Before (numpy backend): ObjectState values whose w is numpy.ndarray((2, 4), dtype('O'),
    # file bytes) passed the CRC and the header, and every worker died of SIGSEGV at its first
    # step (w + ...); the driver blamed and blacklisted the host.
    from test_checkpoint_safety import call, dtype, name, seal, small, text, tup
    config = (name("__main__", "Config") + pickle.EMPTY_TUPLE + pickle.NEWOBJ + pickle.EMPTY_DICT + text("lr")
              + pickle.BINFLOAT + struct.pack(">d", 0.1) + pickle.SETITEM + pickle.BUILD)
    w = call(name("numpy", "ndarray"), tup(small(2), small(4)), dtype("O8"), pickle.SHORT_BINBYTES + bytes([64])
             + b"\x41" * 64)
    values = (pickle.EMPTY_DICT + pickle.MARK + text("step") + small(3) + text("cfg") + config + text("w") + w
              + pickle.SETITEMS)
    (tmp_path / "ckpt").mkdir()
    lineage = checkpointdir.new_lineage()
    path = tmp_path / "ckpt" / checkpointdir.file_name(3, lineage)
    seal(path, pickle.EMPTY_DICT + text("values") + values + pickle.SETITEM, commit=3, lineage=lineage)
    result = run(tmp_path, backend, "1", TOTAL_STEPS=5)
    check_ended_by(result, path, r"Untrusted: it calls numpy\.ndarray")


def wait_exited(pid, timeout):
    """Until pid has exited (gone, or a zombie nobody reaped yet)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if procstat.state(pid) in procstat.GONE:
            return
        time.sleep(0.05)
    raise AssertionError(f"worker {pid} still runs {timeout} s after the driver died")


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_drivers_kill_9_still_gets_rank_0s_last_commit_to_disk(tmp_path, backend):
    # The interval holds every write back but the first: only the flush at exit writes more.
    # --driver-grace as short as the liveness timeout: the workers give the driver up then.
    # One worker: with more, a peer's exit breaks the world and rank 0 ends by an exception
    # (its rendezvous refused), not by losing the driver's heartbeat answers.
    python = NUMPY_PYTHON if backend == "numpy" else sys.executable
    flags = ["--checkpoint-dir", str(tmp_path / "ckpt"), "--checkpoint-interval", "600",
             "--liveness-timeout", "2", "--driver-grace", "2", "-H", "localhost:1", "--min-np", "1", python, SCRIPT]
    with Job(flags, tmp_path, env=job_env(tmp_path, BACKEND=backend, TOTAL_STEPS=10_000, STEP_SLEEP=0.1)) as job:
        wait_progress(job, tmp_path, 8)
        workers = job.worker_pids()
        job.proc.send_signal(signal.SIGKILL)
        job.proc.wait(10)
        made = progress(tmp_path)
        for pid in workers:
            wait_exited(pid, 30)
        written = checkpointdir.newest(str(tmp_path / "ckpt"))[0]
    assert made <= written <= progress(tmp_path)
