"""Checkpoints without a job: the file format, the folder (atomic writes, pruning), the
background writer, TorchState/ObjectState snapshots, and kill -9 of a writer mid-write."""
import os
import random
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from hvdlite.torch import elastic
from hvdlite.worker import checkpointdir, checkpoints, durable, trusted
from hvdlite.worker.checkpoints import CorruptCheckpoint
from jobs import wait_until

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


LINEAGE = "0" * checkpoints.LINEAGE_CHARS


def _write(path, commit, state):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT)
    try:
        checkpoints.dump(fd, commit, LINEAGE, state)
    finally:
        os.close(fd)


def test_tensors_arrays_and_plain_values_come_back_equal(tmp_path):
    shared = torch.arange(6.0).reshape(2, 3)
    state = {"t": torch.randn(3, 4), "tied": [shared, shared], "half": torch.ones(5, dtype=torch.bfloat16),
             "empty": torch.empty(0, 3), "scalar": torch.tensor(7, dtype=torch.int64),
             "strided": torch.arange(12.0).reshape(3, 4).t(), "grad": torch.ones(2, requires_grad=True),
             "param": torch.nn.Parameter(torch.ones(2)), "np": np.arange(10, dtype=np.int16),
             "fortran": np.asfortranarray(np.ones((3, 2))), "plain": {"epoch": 3, "seen": [1, 2]}}
    _write(tmp_path / "c", 42, state)
    commit, lineage, back = checkpoints.load(str(tmp_path / "c"))
    assert commit == 42 and lineage == LINEAGE
    for key in ("t", "half", "empty", "scalar", "strided", "grad", "param"):
        assert back[key].dtype == state[key].dtype and torch.equal(back[key], state[key]), key
    assert back["grad"].requires_grad and isinstance(back["param"], torch.nn.Parameter)
    assert back["tied"][0] is back["tied"][1] and torch.equal(back["tied"][0], shared)
    assert back["np"].dtype == np.int16 and (back["np"] == state["np"]).all()
    assert (back["fortran"] == 1).all() and back["plain"] == state["plain"]


def test_each_array_sits_in_the_file_as_far_into_a_block_as_it_is_into_a_page():
    parts = [(10, 4000), (0, 0), (3 * checkpoints.ALIGN, 0), (5, 7), (checkpoints.ALIGN + 1, 4095)]
    layout = checkpoints._layout(100, parts)
    assert layout[0] + 100 <= layout[1]
    for (n, phase), start, following in zip(parts, layout[1:], layout[2:]):
        assert start % checkpoints.ALIGN == phase and start + n <= following
    assert layout[-1] % checkpoints.ALIGN == 0 and layout[-1] - layout[-2] < parts[-1][0] + checkpoints.ALIGN


def test_arrays_at_any_offset_within_a_page_and_of_any_size_come_back_equal(tmp_path):
    # Slices start anywhere in a page; sizes below, around and above a block and the staging
    # buffer exercise the head, whole blocks straight from memory and the tail of a part.
    big = torch.arange(3_000_000, dtype=torch.float32)
    state = {f"t{k}": big[k:k + n] for k, n in [(1, 3), (3, 1023), (5, 1025), (7, 1_100_000),
                                                (0, 1024), (9, 2_999_000)]}
    state["np"] = np.arange(10 ** 6, dtype=np.int8)[3:]
    path = str(tmp_path / "c")
    fd, _ = checkpoints.create(path)  # O_DIRECT here: the fast path is the one tested
    try:
        checkpoints.dump(fd, 7, LINEAGE, state, direct=True)
    finally:
        os.close(fd)
    commit, _, back = checkpoints.load(path)
    assert commit == 7 and sorted(back) == sorted(state)
    for key, value in state.items():
        assert (back[key] == value).all(), key


def _array_offset(data: bytes, array) -> int:
    return bytes(data).index(array.tobytes()[:256])


@pytest.mark.parametrize("damage", ["truncate", "extend", "flip_header", "flip_pickle", "flip_array"])
def test_a_damaged_file_is_refused(tmp_path, damage):
    array = np.arange(10_000) * 7 + 13
    checkpointdir.write(str(tmp_path), LINEAGE, 2, {"w": array}, keep=5)
    path = tmp_path / checkpointdir.file_name(2, LINEAGE)
    data = bytearray(path.read_bytes())
    if damage == "truncate":
        data = data[:-10]
    elif damage == "extend":
        data += b"x"
    elif damage == "flip_array":  # a byte of the tensor data, far from the header
        data[_array_offset(data, array) + 40_000] ^= 0x01
    else:
        data[8 if damage == "flip_header" else 120] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptCheckpoint):
        checkpointdir.load(str(path), 2, LINEAGE)


def test_a_file_renamed_to_another_commit_or_lineage_is_refused(tmp_path):
    checkpointdir.write(str(tmp_path), LINEAGE, 2, {"w": 1}, keep=5)
    with pytest.raises(CorruptCheckpoint, match="not what its name says"):
        checkpointdir.load(str(tmp_path / checkpointdir.file_name(2, LINEAGE)), 3, LINEAGE)


OLD, NEW = "0000000000aa" + "0" * 8, "0000000000bb" + "0" * 8  # NEW started later


def test_only_the_writers_lineage_is_pruned_and_its_newest_always_kept(tmp_path):
    stale, fresh = tmp_path / ".commit-000000000009.ckpt.h.1.tmp", tmp_path / ".commit-000000000010.ckpt.h.2.tmp"
    stale.write_bytes(b"x")
    fresh.write_bytes(b"x")
    old = time.time() - checkpointdir.STALE_TEMP - 1
    os.utime(stale, (old, old))
    # an earlier run's higher-numbered commit: the new run's 1, 2, 3 must not be pruned against it
    checkpointdir.write(str(tmp_path), OLD, 10, {"c": 10}, keep=2)
    for commit in (1, 3, 4, 5):  # a writer writes its newest commit: in order
        checkpointdir.write(str(tmp_path), NEW, commit, {"c": commit}, keep=2)
    assert checkpointdir.files(str(tmp_path)) == [(10, OLD), (5, NEW), (4, NEW)]
    assert not stale.exists() and fresh.exists()
    assert checkpointdir.newest(str(tmp_path))[:2] == (5, NEW)  # the newest lineage, not the highest commit
    assert checkpointdir.newest(str(tmp_path), OLD)[:2] == (10, OLD)
    assert checkpointdir.newest(str(tmp_path), "f" * 20) is None
    assert checkpointdir.newest(str(tmp_path / "missing")) is None


def test_decisions():
    files = [(1, NEW), (5, NEW), (3, NEW), (4, NEW), (10, OLD)]
    assert checkpointdir.to_prune(files, NEW, 2, 5) == [(3, NEW), (1, NEW)]
    assert checkpointdir.to_prune([(1, NEW), (9, OLD)], NEW, 0, 1) == []  # the newest is never deleted
    assert checkpointdir.to_prune([(1, NEW), (7, NEW), (8, NEW)], NEW, 1, 1) == []  # nor by higher names
    assert checkpointdir.name_of(checkpointdir.file_name(12, NEW)) == (12, NEW)
    assert checkpointdir.name_of("commit-000000000012.ckpt") == (12, "")  # before lineages
    assert checkpointdir.name_of(".commit-000000000012.ckpt.h.3.tmp") is None
    first, second = checkpointdir.new_lineage(), checkpointdir.new_lineage()
    assert len(first) == checkpoints.LINEAGE_CHARS and first != second
    time.sleep(0.002)
    assert checkpointdir.new_lineage() > first
    assert durable.wait_before_write(10.0, None, 5.0) == 0.0
    assert durable.wait_before_write(10.0, 8.0, 5.0) == 3.0
    assert durable.wait_before_write(10.0, 2.0, 5.0) == 0.0
    assert durable.pause(cpu=0.03, written=0, elapsed=0.4, share=0.05, rate=1e6) == pytest.approx(0.2)
    assert durable.pause(cpu=0.03, written=0, elapsed=0.7, share=0.05, rate=1e6) == 0.0
    assert durable.pause(cpu=0.0, written=2e6, elapsed=0.5, share=0.05, rate=1e6) == pytest.approx(1.5)
    assert durable.pause(cpu=0.03, written=1e6, elapsed=0.4, share=0.05, rate=1e6) == pytest.approx(0.6)


def test_the_writer_writes_the_newest_commit_and_at_most_every_interval(tmp_path):
    writer = durable.Writer(durable.Config(str(tmp_path), interval=0.5, keep=100))
    start = time.monotonic()
    for commit in range(1, 101):
        writer.offer(LINEAGE, commit, {"c": commit})
        time.sleep(0.01)
    assert writer.flush(10, forced=False)
    written = [commit for commit, _ in checkpointdir.files(str(tmp_path))]
    assert written[0] == 100  # the newest always ends on disk
    assert len(written) <= (time.monotonic() - start) / 0.5 + 1
    writer.offer(LINEAGE, 101, {"c": 101})
    assert writer.flush(10)  # forced: not held back by the interval
    assert checkpointdir.newest(str(tmp_path))[0] == 101
    writer.offer(LINEAGE, 102, {"c": 102})
    assert writer.flush(10, last=True)  # the process is about to end: nothing offered later is written
    writer.offer(LINEAGE, 103, {"c": 103})
    assert writer.flush(10) and checkpointdir.newest(str(tmp_path))[0] == 102


def test_a_pacer_told_to_hurry_holds_nothing():
    start = time.monotonic()
    durable.Pacer(share=0.5, rate=1.0, hurry=lambda: True)(30)  # paced: a 30 s pause
    assert time.monotonic() - start < 5


def test_a_write_error_without_a_driver_to_tell_is_said_here_and_nothing_later_is_tried(tmp_path, capfd):
    # With a driver, it ends the job (test_durable_loads); without one, this worker says it.
    blocker = tmp_path / "file"
    blocker.write_text("")
    writer = durable.Writer(durable.Config(str(blocker / "sub"), interval=0, keep=2))
    for commit in (1, 2):
        writer.offer(LINEAGE, commit, {"c": commit})
        assert writer.flush(10)
    err = capfd.readouterr().err
    assert err == f"hvdlite: could not write checkpoint 1 to {blocker / 'sub'}: NotADirectoryError: " \
                  f"[Errno 20] Not a directory: '{blocker / 'sub'}'\n"


def _torch_objects():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    sampler = elastic.ElasticSampler(list(range(20)), seed=3)
    return model, opt, sched, sampler


def test_a_torch_state_snapshot_restores_every_object_in_place(tmp_path):
    model, opt, sched, sampler = _torch_objects()
    state = elastic.TorchState(model, opt, sched=sched, sampler=sampler, epoch=0, history=[])
    for step in range(3):
        opt.zero_grad()
        model(torch.randn(5, 3)).pow(2).sum().backward()
        opt.step()
        sched.step()
        sampler.record_indices(list(sampler)[:2])
        state.epoch, state.history = step, state.history + [step]
        state._commits += 1
        state.save()  # what commit() does locally
    commit, snapshot = state._snapshot()
    checkpointdir.write(str(tmp_path), LINEAGE, commit, snapshot, keep=2)

    model2, opt2, sched2, sampler2 = _torch_objects()  # a fresh process's objects
    fresh = elastic.TorchState(model2, opt2, sched=sched2, sampler=sampler2, epoch=0, history=[])
    found_commit, _, path = checkpointdir.newest(str(tmp_path))
    fresh._load_snapshot(found_commit, checkpointdir.load(path, found_commit, LINEAGE))
    assert fresh._commits == 3 and fresh.epoch == 2 and fresh.history == [0, 1, 2]
    assert fresh.model is model2 and fresh.optimizer is opt2
    for a, b in zip(model.state_dict().values(), model2.state_dict().values()):
        assert torch.equal(a, b)
    assert opt2.state_dict()["state"][0]["exp_avg"].equal(opt.state_dict()["state"][0]["exp_avg"])
    assert sched2.last_epoch == 3 and list(sampler2) == list(sampler)


def test_a_checkpoint_of_another_state_is_a_clear_error():
    state = elastic.ObjectState(epoch=0)
    with pytest.raises(RuntimeError, match=r"checkpoint holds the state \['step'\]"):
        state._load_snapshot(1, {"values": {"step": 1}})


WRITER = """
import sys, numpy as np
from hvdlite.worker import checkpointdir
directory, commit = sys.argv[1], int(sys.argv[2])
print("writing", flush=True)
while True:
    commit += 1
    # every array holds the commit number: a file mixing two commits would show it
    checkpointdir.write(directory, "0" * 20, commit, {"commit": commit, "a": np.full(1 << 20, commit),
                                                     "b": [np.full(1000 * k, commit) for k in range(1, 20)]}, keep=3)
"""


def test_kill_9_during_writes_never_leaves_a_checkpoint_that_fails_or_mixes(tmp_path):
    rng = random.Random(14)
    directory, commit = str(tmp_path), 0
    extra = 0  # files over `keep` that a kill between rename and prune may have left
    env = {**os.environ, "PYTHONPATH": ROOT}
    for trial in range(40):
        proc = subprocess.Popen([sys.executable, "-c", WRITER, directory, str(commit)], env=env,
                                stdout=subprocess.PIPE, start_new_session=True)
        try:
            assert proc.stdout.readline() == b"writing\n"
            if trial == 0:  # a loaded machine may take longer than the sleep for the first write
                wait_until(lambda: checkpointdir.files(directory), 60, "the first checkpoint")
            time.sleep(rng.uniform(0.05, 0.3))  # a write takes ~0.04 s: kills land anywhere in one
        finally:
            proc.stdout.close()
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        found = [c for c, _ in checkpointdir.files(directory)]
        assert found, f"trial {trial}: nothing written"
        for c in found:
            loaded, _, state = checkpoints.load(os.path.join(directory, checkpointdir.file_name(c, LINEAGE)))
            assert loaded == c == state["commit"], f"trial {trial}"
            assert (state["a"] == c).all() and all((b == c).all() for b in state["b"]), f"trial {trial}"
        # A kill between rename and prune leaves one file over `keep`, pruned by the next write
        # that gets that far: a trial that renamed two files pruned after the first; one whose
        # only write was cut there (a loaded machine) adds its own extra to those before it.
        if found[0] > commit + 1:
            extra = 1
        elif found[0] == commit + 1:
            extra += 1
        assert len(found) <= 3 + extra, f"trial {trial}: {found}"
        commit = found[0]
    leftovers = [n for n in os.listdir(directory) if n.endswith(".tmp")]
    assert len(leftovers) <= 40  # junk of killed writes: removed once stale


class Config:
    """A script's own class kept in its state."""

    def __init__(self, lr):
        self.lr = lr


class Payload:
    def __init__(self, command):
        self.command = command

    def __reduce__(self):
        return os.system, (self.command,)


def test_a_malicious_pickle_runs_nothing(tmp_path, monkeypatch):
    marker = tmp_path / "it-ran"
    with monkeypatch.context() as m:  # as a writer that does not check would write it
        m.setattr(checkpoints.trusted, "loads", lambda data, buffers, place=True: None)
        _write(tmp_path / "c", 1, {"step": Payload(f"touch {marker}")})
    with pytest.raises(trusted.Untrusted, match=r"posix\.system"):
        checkpoints.load(str(tmp_path / "c"))
    assert not marker.exists()


def test_a_state_holding_an_untrusted_class_is_refused_at_the_write_and_loads_once_trusted(tmp_path):
    with pytest.raises(trusted.Untrusted, match=r"\.Config, which is neither a plain value"):
        checkpointdir.write(str(tmp_path), LINEAGE, 1, {"cfg": Config(0.5)}, keep=2)
    assert checkpointdir.files(str(tmp_path)) == []  # nothing written, nothing pruned
    trusted.trust(Config)
    try:
        checkpointdir.write(str(tmp_path), LINEAGE, 1, {"cfg": Config(0.5)}, keep=2)
        state = checkpointdir.load(str(tmp_path / checkpointdir.file_name(1, LINEAGE)), 1, LINEAGE)
    finally:
        trusted._trusted.pop((Config.__module__, Config.__qualname__), None)
    assert isinstance(state["cfg"], Config) and state["cfg"].lr == 0.5


def test_a_class_the_edited_script_no_longer_defines_is_named_as_gone(tmp_path, monkeypatch):
    trusted.trust(Config)
    try:
        checkpointdir.write(str(tmp_path), LINEAGE, 1, {"cfg": Config(0.5)}, keep=2)
    finally:
        trusted._trusted.pop((Config.__module__, Config.__qualname__), None)
    monkeypatch.delattr(sys.modules[Config.__module__], "Config")  # the script renamed it
    with pytest.raises(trusted.Untrusted, match=r"\.Config, which the script no longer defines"):
        checkpointdir.load(str(tmp_path / checkpointdir.file_name(1, LINEAGE)), 1, LINEAGE)


def test_plain_values_load_without_trusting_anything(tmp_path):
    import collections
    import datetime
    state = {"od": collections.OrderedDict(a=1), "dd": collections.defaultdict(list, b=[2]),
             "when": datetime.datetime(2026, 1, 2), "c": 1 + 2j, "fs": frozenset({1}), "b": bytearray(b"x"),
             "dtype": torch.float16, "device": torch.device("cpu"), "size": torch.Size([2, 3]),
             "np_scalar": np.float32(1.5), "np_object": np.array([1, "a"], dtype=object)}
    checkpointdir.write(str(tmp_path), LINEAGE, 1, state, keep=2)
    back = checkpointdir.load(str(tmp_path / checkpointdir.file_name(1, LINEAGE)), 1, LINEAGE)
    assert {k: v for k, v in back.items() if k != "np_object"} == {k: v for k, v in state.items() if k != "np_object"}
    assert list(back["np_object"]) == [1, "a"]


def test_a_file_of_hvdlite_before_lineages_is_refused_with_a_reason(tmp_path):
    old = tmp_path / "commit-000000000003.ckpt"
    old.write_bytes(b"HVDLCKP2" + bytes(100))
    commit, lineage, path = checkpointdir.newest(str(tmp_path))
    assert (commit, lineage, path) == (3, "", str(old))
    with pytest.raises(CorruptCheckpoint, match="older hvdlite"):
        checkpointdir.load(path, commit, lineage)
    checkpointdir.write(str(tmp_path), LINEAGE, 1, {"c": 1}, keep=1)  # any lineage is newer
    assert checkpointdir.newest(str(tmp_path))[:2] == (1, LINEAGE) and old.exists()


def test_the_checkpoint_a_worker_reported_is_the_one_it_resumes_even_if_the_file_goes(tmp_path, monkeypatch):
    from hvdlite.worker import elastic as core
    from hvdlite.worker.world import WorldInfo
    monkeypatch.setenv("HVDLITE_CHECKPOINT_DIR", str(tmp_path))
    monkeypatch.setattr(durable, "_found", None)
    checkpointdir.write(str(tmp_path), LINEAGE, 3, {"values": {"step": 3}}, keep=2)

    class State(core.ObjectState):
        backend = core.Backend(*[None] * 4, info=lambda: WorldInfo(1, 2, 1, 2, 0, 1, "h"),
                               agree_flag=None, broadcast_object=None)
    state = State(step=0)
    assert durable.reportable(state._commits) == 3  # loaded in full before it is reported
    os.unlink(tmp_path / checkpointdir.file_name(3, LINEAGE))  # deleted by hand meanwhile
    durable.catch_up(state)  # rank 1 here: no "resumed" line, the same load
    assert (state.step, state._commits, state._lineage) == (3, 3, LINEAGE)
    assert durable.reportable(state._commits) == 3 and durable.catch_up(state) is None


@pytest.mark.parametrize("plant", ["dangling-symlink", "fifo", "folder"])
def test_a_checkpoint_name_that_cannot_be_opened_is_unloadable_at_once(tmp_path, monkeypatch, plant):
    # Before: a dangling symlink recursed in _verified until RecursionError (27,788 lines of
    # traceback, exit 1); a FIFO blocked the worker in open() for good.
    monkeypatch.setenv("HVDLITE_CHECKPOINT_DIR", str(tmp_path))
    monkeypatch.setattr(durable, "_found", None)
    path = tmp_path / checkpointdir.file_name(7, LINEAGE)
    {"dangling-symlink": lambda: os.symlink(tmp_path / "gone", path), "fifo": lambda: os.mkfifo(path),
     "folder": path.mkdir}[plant]()
    said = []
    monkeypatch.setattr(durable, "unloadable", lambda where, error: said.append((where, error)) or sys.exit(65))
    start = time.monotonic()
    with pytest.raises(SystemExit):
        durable.reportable(0)
    assert time.monotonic() - start < 5
    ((where, error),) = said
    assert where == str(path) and isinstance(error, CorruptCheckpoint), error
    assert "cannot be opened" in str(error) or "not a regular file" in str(error), error


def test_a_symlink_planted_at_a_temporary_name_is_never_followed(tmp_path, monkeypatch):
    # Before: the temporary file was .NAME.HOST.PID.tmp, opened without O_EXCL or O_NOFOLLOW,
    # so another user of a group-writable folder could plant a symlink there and rank 0
    # truncated and overwrote its target. Now the name has random bits and O_EXCL|O_NOFOLLOW:
    # a symlink planted even at the exact name (its random bits forced here) fails the write.
    import socket
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    final = checkpointdir.file_name(1, LINEAGE)
    os.symlink(victim, ckpt / f".{final}.{socket.gethostname()}.{os.getpid()}.tmp")  # the old name
    checkpointdir.write(str(ckpt), LINEAGE, 1, {"step": 1}, keep=2)
    assert victim.read_bytes() == b"precious" and checkpointdir.files(str(ckpt)) == [(1, LINEAGE)]
    monkeypatch.setattr(checkpointdir.secrets, "token_hex", lambda n: "f" * 2 * n)
    final = checkpointdir.file_name(2, LINEAGE)
    os.symlink(victim, ckpt / f".{final}.{socket.gethostname()}.{os.getpid()}.{'f' * 16}.tmp")
    with pytest.raises(FileExistsError):
        checkpointdir.write(str(ckpt), LINEAGE, 2, {"step": 2}, keep=2)
    assert victim.read_bytes() == b"precious" and checkpointdir.files(str(ckpt)) == [(1, LINEAGE)]


def test_load_checkpoint_reads_the_newest_commit_into_a_model_outside_a_job(tmp_path):
    import hvdlite.torch as hvd
    with pytest.raises(FileNotFoundError, match="no checkpoint in"):
        hvd.load_checkpoint(str(tmp_path))
    model, opt, _, _ = _torch_objects()
    state = elastic.TorchState(model, opt, epoch=0)
    for step in (1, 2):  # two commits on disk; the newest is read
        with torch.no_grad():
            next(model.parameters()).add_(1.0)
        state.epoch, state._commits = step, step
        state.save()
        checkpointdir.write(str(tmp_path), LINEAGE, *state._snapshot(), keep=2)
    fresh, _, _, _ = _torch_objects()
    found = hvd.load_checkpoint(str(tmp_path), model=fresh)
    assert (found.commit, found.lineage, found.values) == (2, LINEAGE, {"epoch": 2})
    assert sorted(found.objects) == ["model", "optimizer"]
    for a, b in zip(model.state_dict().values(), fresh.state_dict().values()):
        assert torch.equal(a, b)
    with pytest.raises(KeyError, match="holds no scheduler"):
        hvd.load_checkpoint(str(tmp_path), scheduler=fresh)
    # The newest does not load: said, never an older one read instead (the job's loader).
    with open(found.path, "r+b") as f:
        f.truncate(os.path.getsize(found.path) - 10)
    with pytest.raises(CorruptCheckpoint):
        hvd.load_checkpoint(str(tmp_path), model=fresh)


def test_planted_names_neither_erase_the_written_checkpoint_nor_take_over_a_resume(tmp_path):
    """Before: the writer kept the --checkpoint-keep highest names of its lineage whoever made
    them (two planted empty names erased every real checkpoint, the one just written too), and
    a resume took the greatest lineage id in the folder."""
    directory = str(tmp_path)
    for commit in (1, 2, 3):
        checkpointdir.write(directory, NEW, commit, {"c": commit}, keep=2)
    for commit in (100, 101):  # planted above, in our lineage
        (tmp_path / checkpointdir.file_name(commit, NEW)).write_bytes(b"")
    path = checkpointdir.write(directory, NEW, 4, {"c": 4}, keep=2)
    assert os.path.exists(path) and checkpointdir.files(directory) == [(101, NEW), (100, NEW), (4, NEW), (3, NEW)]
    planted = tmp_path / checkpointdir.file_name(7, "f" * 20)  # a lineage id above every real one
    planted.write_bytes(b"")
    os.utime(planted, (time.time() - 60, time.time() - 60))  # written before ours
    assert checkpointdir.newest(directory)[1] == NEW  # the lineage written last, not the greatest id
    if os.geteuid() == 0:  # another user's files: never resumed, never pruned, said by the driver
        stranger = tmp_path / checkpointdir.file_name(2, NEW)
        stranger.write_bytes(b"")
        os.chown(stranger, 12345, 12345)
        os.chown(planted, 12345, 12345)
        os.utime(planted)  # written last, but not by us
        assert checkpointdir.newest(directory)[:2] == (101, NEW)
        checkpointdir.write(directory, NEW, 5, {"c": 5}, keep=1)
        assert stranger.exists() and checkpointdir.others(directory) == {NEW: 12345, "f" * 20: 12345}
