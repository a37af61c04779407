"""Which backend carries CUDA tensors (worker/backends.py, torch/backend.py), without a GPU:
the choice from what each rank can do, the flag and variable that ask for one, every rank of a
real gloo world choosing alike from faked readiness, a job asking for NCCL where there is none
ending at once with one line, and the recovery hooks an NCCL world hangs on the gloo ones
(abort where sockets are cut, works polled). tests/test_gpu_nccl.py runs NCCL itself on a GPU."""
import os
import sys
import threading
import types
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

import gloo_harness
from hvdlite.cli import parse_settings
from hvdlite.driver.workerenv import worker_env
from hvdlite.errors import UsageError
from hvdlite.torch import backend, handles, ops, runtime
from hvdlite.worker import backends
from hvdlite.worker.errors import HorovodInternalError
from hvdlite.worker.links import Links
from jobs import SCRIPTS, job_env, run_job

READY, NO_NCCL, NO_GPU = backends.READY, backends.NO_NCCL, backends.NO_GPU


def test_auto_takes_nccl_only_where_every_rank_can():
    assert backends.choose("auto", [READY] * 4) == "nccl"
    assert backends.choose("auto", [READY, NO_GPU, READY]) == "gloo"
    assert backends.choose("auto", [NO_NCCL]) == "gloo"
    assert backends.choose("gloo", [READY] * 2) == "gloo"
    assert backends.choose("nccl", [READY] * 2) == "nccl"


def test_nccl_asked_for_where_a_rank_cannot_names_the_first_such_rank_and_why():
    with pytest.raises(RuntimeError) as e:
        backends.choose("nccl", [READY, READY, NO_GPU, NO_NCCL])
    assert "rank 2 cannot use NCCL: torch sees no GPU there" in str(e.value)
    assert "\n" not in str(e.value)


def test_readiness_and_the_asked_backend():
    assert backends.readiness(False, 8) == NO_NCCL and backends.readiness(True, 0) == NO_GPU
    assert backends.readiness(True, 1) == READY
    assert backends.requested({}) == "auto" and backends.requested({backends.ENV: ""}) == "auto"
    assert backends.requested({backends.ENV: " NCCL "}) == "nccl"
    with pytest.raises(ValueError, match="HVDLITE_BACKEND='mpi': must be one of auto, nccl, gloo"):
        backends.requested({backends.ENV: "mpi"})
    # This machine's torch (a CPU build in CI) says so truthfully.
    assert (backend.readiness() == READY) is (torch.distributed.is_nccl_available() and torch.cuda.device_count() > 0)


def test_the_flag_reaches_the_workers_and_without_it_their_environment_decides(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("")
    flagged = parse_settings(["--backend", "gloo", "-np", "1", sys.executable, str(script)])
    assert worker_env(flagged, ("h", 1), "s", "w", "h/0", 1, None, False)[backends.ENV] == "gloo"
    plain = parse_settings(["-np", "1", sys.executable, str(script)])
    plain.env = {backends.ENV: "nccl"}
    assert worker_env(plain, ("h", 1), "s", "w", "h/0", 1, None, False)[backends.ENV] == "nccl"
    plain.env = {}
    assert backends.ENV not in worker_env(plain, ("h", 1), "s", "w", "h/0", 1, None, False)
    with pytest.raises(UsageError, match="invalid choice: 'mpi'"):
        parse_settings(["--backend", "mpi", "-np", "1", sys.executable, str(script)])


@pytest.mark.skipif(backend.readiness() == READY, reason="this machine can use NCCL")
def test_a_job_asking_for_nccl_without_it_ends_at_once_with_one_line(tmp_path):
    r = run_job(["--backend", "nccl", "-np", "2", sys.executable, os.path.join(SCRIPTS, "gpu_env.py")],
                tmp_path, timeout=60, env=job_env(tmp_path))
    assert r.code != 0
    said = [line for line in r.stderr.splitlines() if "cannot use NCCL" in line]
    assert said and all("HVDLITE_BACKEND=nccl (--backend nccl), but slot localhost/" in line for line in said)
    assert "Traceback" not in r.stderr


def test_a_backend_that_does_not_exist_ends_the_job_with_one_line(tmp_path):
    r = run_job(["-np", "1", sys.executable, os.path.join(SCRIPTS, "gpu_env.py")],
                tmp_path, timeout=60, env={**job_env(tmp_path), backends.ENV: "mpi"})
    assert r.code != 0 and "HVDLITE_BACKEND='mpi': must be one of auto, nccl, gloo" in r.stderr
    assert "Traceback" not in r.stderr


class FakeNccl:
    """Stands for the NCCL group where there is none: records its making and its aborts."""
    made = []

    def __init__(self, store, rank, size, timeout):
        FakeNccl.made.append(rank)
        self.aborts = 0
        self.group = self  # what torch.distributed's CUDA tensors would take (defaultgroup.carry_cuda)

    def _get_sequence_number_for_group(self):  # backend.entered()'s count: no collective here
        return 0

    def abort(self):
        self.aborts += 1

    def abort_ended(self, timeout):
        return True


def _choose_with(readiness_of):
    """Every rank runs the choice of a new world with its faked readiness."""
    backend.readiness = lambda: readiness_of(runtime.info().rank)
    backend.Nccl = FakeNccl
    backend.gloo.bootstrap_store = lambda scope, abandoned: f"store {scope}"  # (no driver here)
    backend.gloo.collective_timeout = lambda: 30
    backend.begin(runtime.process_group(), runtime.info())


def check_auto_every_rank_able():
    os.environ[backends.ENV] = "auto"
    _choose_with(lambda rank: READY)
    assert backend.active() and FakeNccl.made == [runtime.info().rank]
    # Host tensors keep to gloo beside it.
    assert torch.equal(ops.allreduce_(torch.ones(2), op=ops.Sum), torch.full((2,), float(runtime.info().size)))
    nccl = backend.leave()
    assert nccl.aborts == 1 and not backend.active()
    ops.barrier()


def check_auto_one_rank_without_a_gpu():
    os.environ[backends.ENV] = "auto"
    _choose_with(lambda rank: NO_GPU if rank == 1 else READY)
    assert not backend.active() and FakeNccl.made == []
    assert backend.leave() is None
    ops.barrier()


def check_gloo_asked_for():
    os.environ[backends.ENV] = "gloo"
    _choose_with(lambda rank: READY)
    assert not backend.active() and FakeNccl.made == []
    ops.barrier()


@pytest.mark.parametrize("check", [check_auto_every_rank_able, check_auto_one_rank_without_a_gpu,
                                   check_gloo_asked_for])
def test_every_rank_of_a_world_chooses_alike(check):
    gloo_harness.run(check, 3, timeout=90)


def test_nccl_asked_for_on_a_worker_that_cannot_exits_at_init(monkeypatch):
    monkeypatch.setattr(backend, "readiness", lambda: NO_GPU)
    with pytest.raises(SystemExit, match="slot h/1 cannot use NCCL: torch sees no GPU there"):
        backend.check_requested({backends.ENV: "nccl", "HVDLITE_SLOT": "h/1"})
    backend.check_requested({backends.ENV: "auto"})  # auto and gloo go on
    with pytest.raises(SystemExit, match="must be one of"):
        backend.check_requested({backends.ENV: "nccl2"})


def test_cutting_the_links_aborts_the_nccl_communicator_too():
    aborted = []
    links = Links(lambda: aborted.append(True))
    links.cut()
    assert aborted == [True]
    links._round = 3
    links.on_round_broken(2)  # an older round broke: not this group's
    assert aborted == [True]
    links.on_round_broken(3)
    assert aborted == [True, True]


class Group:
    """What handles' waits read of an NCCL group (backend.Nccl): whether it was aborted."""
    aborted = False


class Work:
    """A torch WorkNCCL as ProcessGroupNCCL's source (2.11-2.13) makes it behave:
    is_completed() first checks NCCL for an error (set from the `fails_after`th poll on), and is
    True once an error is set or its kernels ended; once its communicator was aborted it skips
    that check (pytorch PR #124466) and says True, its buffer half reduced. wait() raises only
    an error that was set; a timed wait would abort the communicator."""

    def __init__(self, group, done_after, error=None, fails_after=0):
        self.group, self.done_after, self.error, self.fails_after = group, done_after, error, fails_after
        self.polls, self.timed_waits, self.raised = 0, 0, None

    def is_completed(self):
        self.polls += 1
        if not self.group.aborted and self.error and self.polls > self.fails_after:
            self.raised = self.error
        return self.group.aborted or self.raised is not None or self.polls > self.done_after

    def wait(self, timeout=None):
        if timeout is not None:
            self.timed_waits += 1
        if self.raised:
            raise RuntimeError(self.raised)
        return True


def test_an_nccl_work_is_polled_never_waited_with_a_timeout(monkeypatch):
    group = Group()
    work = Work(group, done_after=5)
    handles.wait_work(handles.Polled(work, group))
    assert work.polls == 6 and work.timed_waits == 0
    failed = Work(group, done_after=10 ** 9, error="NCCL error: remote process exited", fails_after=3)
    with pytest.raises(HorovodInternalError, match="remote process exited"):
        handles.wait_work(handles.Polled(failed, group))
    assert failed.timed_waits == 0
    monkeypatch.setattr(handles, "_SPIN", 0.0)
    monkeypatch.setattr(handles, "_world_broke", lambda: True)
    with pytest.raises(HorovodInternalError, match="the driver said this world broke"):
        handles.wait_work(handles.Polled(Work(group, done_after=10 ** 9), group))


def test_a_collective_of_an_aborted_communicator_never_returns_its_buffer():
    """hvd.abort() in a static world (no driver's word), and hvd.poll() then synchronize():
    torch's work says it completed, without an error; hvdlite's wait raises all the same."""
    group = Group()
    pending = handles.Handle([handles.Polled(Work(group, done_after=10 ** 9), group)], lambda: "half reduced")
    group.aborted = True
    assert handles.poll(pending)
    with pytest.raises(HorovodInternalError, match="NCCL communicator was aborted"):
        handles.synchronize(pending)
    # Aborted by the heartbeat thread while the wait polls.
    group = Group()
    waiting = handles.Polled(Work(group, done_after=10 ** 9), group)
    threading.Timer(0.05, setattr, (group, "aborted", True)).start()
    with pytest.raises(HorovodInternalError, match="NCCL communicator was aborted"):
        handles.wait_work(waiting)


class FakeProcessGroupNCCL:
    """torch's ProcessGroupNCCL where there is none: records the environment it was made in,
    and its abort waits until `hang` is set (a hung ncclCommAbort)."""
    made = []

    class Options:
        def __init__(self):
            self.config = types.SimpleNamespace(blocking=-2147483648)  # NCCL_CONFIG_UNDEF_INT

    def __init__(self, store, rank, size, options):
        self.options, self.hang, self.aborted = options, threading.Event(), threading.Event()
        FakeProcessGroupNCCL.made.append((dict(os.environ), options))

    def abort(self):
        self.hang.wait(30)
        self.aborted.set()


NCCL_VARIABLES = (*backend.QUIET, backend.ERROR_HANDLING, backend.NONBLOCKING, backend.NONBLOCKING_TIMEOUT)


@pytest.fixture
def fake_nccl(monkeypatch):
    monkeypatch.setattr(dist, "ProcessGroupNCCL", FakeProcessGroupNCCL, raising=False)
    monkeypatch.setattr(FakeProcessGroupNCCL, "made", [])
    for name in NCCL_VARIABLES:  # (os.environ as the group saw it is restored after)
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_an_nccl_group_is_made_with_hvdlites_settings_unless_the_user_set_them(fake_nccl, capfd):
    backend.Nccl("store", 0, 2, timedelta(seconds=42))
    (seen, options), = FakeProcessGroupNCCL.made
    assert {name: seen.get(name) for name in NCCL_VARIABLES} == {
        "TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC": "0", "TORCH_NCCL_DUMP_ON_TIMEOUT": "0",
        "TORCH_NCCL_ENABLE_MONITORING": "0", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "2",
        "TORCH_NCCL_USE_COMM_NONBLOCKING": None, "TORCH_NCCL_NONBLOCKING_TIMEOUT": "42"}
    assert options.config.blocking == 0 and options._timeout == timedelta(seconds=42)
    assert capfd.readouterr().err == ""
    # A user's settings stand, but for the error handling a survivor needs (said once).
    theirs = {"TORCH_NCCL_DUMP_ON_TIMEOUT": "1", "TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC": "500",
              "TORCH_NCCL_ENABLE_MONITORING": "1", "TORCH_NCCL_USE_COMM_NONBLOCKING": "0",
              "TORCH_NCCL_NONBLOCKING_TIMEOUT": "7", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "3"}
    for name, value in theirs.items():
        fake_nccl.setenv(name, value)
    backend.Nccl("store", 0, 2, timedelta(seconds=42))
    seen, options = FakeProcessGroupNCCL.made[1]
    assert {name: seen[name] for name in theirs} == {**theirs, "TORCH_NCCL_ASYNC_ERROR_HANDLING": "2"}
    assert options.config.blocking == FakeProcessGroupNCCL.Options().config.blocking
    assert capfd.readouterr().err == ("hvdlite: TORCH_NCCL_ASYNC_ERROR_HANDLING=3 is replaced with 2 in this "
                                      "worker: hvdlite's survivors of a failed NCCL collective must live on\n")


def test_a_hung_nccl_abort_stops_neither_the_heartbeat_thread_nor_leaving(fake_nccl, capfd):
    fake_nccl.setattr(backend, "ABORT_WAIT", 0.2)
    fake_nccl.setattr(backend, "_world", [backend.Nccl("store", 0, 2, timedelta(seconds=30))])
    nccl = backend._world[0]
    links = Links(backend.abort)
    links._round = 3
    heard = threading.Thread(target=links.on_round_broken, args=(3,))  # the heartbeat thread's call
    heard.start()
    heard.join(5)
    try:
        assert not heard.is_alive() and nccl.aborted and not nccl.group.aborted.is_set()
        assert links.current() == (3, [])  # the links' lock is free: the next heartbeat goes on
        with pytest.raises(HorovodInternalError, match="NCCL communicator was aborted"):
            handles.wait_work(handles.Polled(Work(nccl, done_after=10 ** 9), nccl))
        capfd.readouterr()
        assert backend.leave() is nccl and not backend.active()
        assert capfd.readouterr().err == ("hvdlite: the abort of the left world's NCCL communicator has not "
                                          "returned after 0.2 s (a hung ncclCommAbort); going on without it\n")
    finally:
        nccl.group.hang.set()
    assert nccl.abort_ended(5) and nccl.group.aborted.is_set()


def test_host_tensors_process_sets_and_dtypes_nccl_lacks_never_take_nccl(monkeypatch):
    from hvdlite.torch.processsets import ProcessSet, global_process_set
    monkeypatch.setattr(backend, "_world", [object()])
    meta = torch.empty(2, device="meta")  # off the host, not CUDA
    assert not backend.takes([meta], 1, global_process_set)
    assert not backend.takes([meta], 1, ProcessSet([0]))

    def cuda(dtype):  # what takes() reads of a CUDA tensor (CI has none)
        return types.SimpleNamespace(is_cuda=True, device=torch.device("cuda", 0), dtype=dtype)
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.uint8, torch.bool):
        assert backend.takes([cuda(dtype)], 1, global_process_set), dtype
    # Those torch's NCCL backend refuses go over gloo through host copies (devices.staged).
    for dtype in (torch.int16, torch.uint16, torch.uint32, torch.uint64, torch.complex64, torch.complex128):
        assert not backend.takes([cuda(torch.float32), cuda(dtype)], 2, global_process_set), dtype
    host = torch.ones(1)
    assert backend.data("gloo group", host) == "gloo group"
