"""hvdlite.ray.RayExecutor, horovod.ray's API, on `ray.cluster_utils.Cluster`: a head and three
one-CPU Ray nodes as processes of this machine (no root, no namespaces: the executor's calls,
results, errors and shutdown need no network faults). This test process is the Ray driver."""
import os
import sys
import tempfile
import threading
import time

import pytest

try:
    import ray
    from ray.cluster_utils import Cluster
except ImportError:
    pytest.skip("ray is not installed (pip install 'hvdlite[ray]'; .ci/setup.sh installs it)",
                allow_module_level=True)

import cloudpickle

from hvdlite.ray import RayExecutor, WorkerError

# The workers cannot import this test module: its functions travel by value, as a script's do.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture(scope="module")
def cluster():
    os.environ["RAY_AUTH_MODE"] = "disabled"  # a stale token file would turn auth on
    temp = tempfile.mkdtemp(prefix="hvdlite-rayapi-")
    # Cluster writes its address file under Ray's default folder, not under temp_dir: point that
    # default at our own folder, or a machine that never ran Ray (no /tmp/ray) fails here.
    saved = os.environ.get("RAY_TMPDIR")
    os.environ["RAY_TMPDIR"] = temp
    os.makedirs(os.path.join(temp, "ray"))
    c = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 0, "include_dashboard": False, "object_store_memory": 80_000_000, "temp_dir": temp})
    try:
        for _ in range(3):
            c.add_node(num_cpus=1, object_store_memory=80_000_000)
        ray.init(address=c.address, logging_level="ERROR", log_to_driver=False)
        yield c
    finally:
        ray.shutdown()
        c.shutdown()
        if saved is None:
            os.environ.pop("RAY_TMPDIR", None)
        else:
            os.environ["RAY_TMPDIR"] = saved


def live_slots():
    return [a for a in ray._private.state.state.actor_table(None).values()
            if a["State"] != "DEAD" and a["ActorClassName"].endswith("Slot")]


def no_slot_left(within=10.0):
    """Every Slot actor dead within `within` s: ray.kill, which ends them, does not wait."""
    deadline = time.monotonic() + within
    while live_slots():
        assert time.monotonic() < deadline, f"actors left: {live_slots()}"
        time.sleep(0.1)


def allreduce_rank(x):
    import torch
    import hvdlite.torch as hvd
    hvd.init()
    total = hvd.allreduce(torch.tensor([float(hvd.rank())]), op=hvd.Sum).item()
    return hvd.rank(), hvd.size(), total, x


def test_run_returns_each_ranks_value_in_rank_order(cluster):
    ex = RayExecutor(RayExecutor.create_settings(timeout_s=60), num_workers=3, cpus_per_worker=1)
    ex.start()
    assert ex.run(allreduce_rank, args=[7]) == [(r, 3, 3.0, 7) for r in range(3)]
    ex.shutdown()
    no_slot_left()


def test_an_elastic_executor_runs_on_every_node(cluster):
    ex = RayExecutor(RayExecutor.create_settings(timeout_s=60), min_workers=2, max_workers=3)
    ex.start()
    assert ex.run(allreduce_rank, kwargs={"x": "k"}) == [(r, 3, 3.0, "k") for r in range(3)]
    ex.shutdown()


class Counter:
    def __init__(self, start):
        self.value = start


def test_execute_calls_fn_on_the_executable_and_callbacks_get_rank_0s_values(cluster):
    def logs():
        from hvdlite.ray import log
        for i in range(3):
            log(("step", i))
        return "done"

    ex = RayExecutor(RayExecutor.create_settings(timeout_s=60), num_workers=2)
    ex.start(executable_cls=Counter, executable_args=[5], extra_env_vars={"HVDLITE_TEST_VAR": "x"})
    assert ex.execute(lambda c: (c.value, os.environ["HVDLITE_TEST_VAR"])) == [(5, "x"), (5, "x")]
    seen = []
    assert ex.run(logs, callbacks=[seen.append]) == ["done", "done"]
    assert seen == [("step", 0), ("step", 1), ("step", 2)]  # once each: rank 0's only
    ex.shutdown()


def test_fn_raising_on_one_rank_is_a_clear_error(cluster):
    def fails_on_rank_1():
        if os.environ["HVDLITE_RANK"] == "1":
            raise ValueError("boom")
        return "fine"

    ex = RayExecutor(RayExecutor.create_settings(timeout_s=60), num_workers=2)
    ex.start()
    with pytest.raises(WorkerError, match=r"^rank 1 raised ValueError: boom$") as info:
        ex.run(fails_on_rank_1)
    assert info.value.rank == 1
    ex.shutdown()
    no_slot_left()


def test_shutdown_ends_a_run_under_way_and_leaves_no_actor(cluster):
    ex = RayExecutor(RayExecutor.create_settings(timeout_s=60), num_workers=3)
    ex.start()
    outcome = []

    def run():
        try:
            outcome.append(ex.run(time.sleep, args=[120]))
        except Exception as e:  # noqa: BLE001 - the test looks at it
            outcome.append(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while len(live_slots()) < 3:
        assert time.monotonic() < deadline, "the run's actors did not start"
        time.sleep(0.1)
    time.sleep(1)
    ex.shutdown()
    thread.join(30)
    assert not thread.is_alive() and isinstance(outcome[0], Exception)
    no_slot_left()


def test_bad_arguments_are_refused_as_horovod_ray_does():
    settings = RayExecutor.create_settings(timeout_s=5)
    with pytest.raises(ValueError, match="min_workers"):
        RayExecutor(settings, max_workers=3)
    with pytest.raises(ValueError, match="not both"):
        RayExecutor(settings, num_workers=2, min_workers=2)
    with pytest.raises(ValueError, match="use_gpu"):
        RayExecutor(settings, num_workers=2, gpus_per_worker=1)
