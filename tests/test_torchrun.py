"""torchrun scripts under `hvdlite run`, unchanged (docs/torchrun.md): the same variables as
torchrun gives, env:// through hvdlite's signed rendezvous, the same final parameters."""
import json
import os
import shutil
import signal
import subprocess
import sys

import pytest

from jobs import PRELOADED, SCRIPTS, Job, check_training_continuous, job_env, sizes, slot_pid, ssh_flags, wait_progress

# Facts of a rank that must read as under torchrun; the rest name a store or a run.
SAME = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
        "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "TORCHELASTIC_RESTART_COUNT",
        "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_USE_AGENT_STORE")
TORCHRUN = shutil.which("torchrun")


def ranks(folder, n):
    return [json.loads((folder / f"rank{r}.json").read_text()) for r in range(n)]


SCRIPT = os.path.join(SCRIPTS, "train_ddp.py")


@pytest.fixture(scope="module")
def torchrun_ranks(tmp_path_factory):
    """train_ddp.py's 4 ranks under torchrun --nproc-per-node 4, run once for the module."""
    theirs = tmp_path_factory.mktemp("torchrun")
    for _ in range(3):
        done = subprocess.run([TORCHRUN, "--nproc-per-node", "4", SCRIPT], env={**os.environ, "OUT_DIR": str(theirs)},
                              capture_output=True, text=True, timeout=300)
        # torch 2.13 itself now and then aborts a rank of this script at its end (a CI run under
        # load: SIGABRT, 'terminate called without an active exception'; with
        # TORCH_FR_BUFFER_SIZE=0, 2 runs of 4 on a quiet machine; twice running in a CI run at 97783d6):
        # the reference is run again, up to three runs. No hvdlite code runs there. The same script
        # without destroy_process_group() aborted so in 1 run of 36 under load, its main thread past
        # its last Python frame (the interpreter's teardown, faulthandler); with it, 0 of 33.
        if done.returncode == 0 or "terminate called without an active exception" not in done.stderr:
            break
    assert done.returncode == 0, done.stderr[-3000:]
    return ranks(theirs, 4)


def both_ways(tmp_path, torchrun_ranks, hvdlite_flags):
    """(torchrun's rank, hvdlite run's rank) of train_ddp.py's 4 ranks, under `hvdlite_flags`."""
    ours = tmp_path / "hvdlite"
    ours.mkdir()
    with Job([*hvdlite_flags, "-np", "4", sys.executable, SCRIPT], tmp_path, env={"OUT_DIR": str(ours)}) as job:
        result = job.finish(300)
    assert result.code == 0, result.stderr[-3000:]
    return list(zip(torchrun_ranks, ranks(ours, 4)))


@pytest.mark.skipif(TORCHRUN is None, reason="torchrun is not on PATH")
def test_a_ddp_script_computes_under_hvdlite_what_it_computes_under_torchrun(tmp_path, torchrun_ranks):
    pairs = both_ways(tmp_path, torchrun_ranks, [])
    for rank, (a, b) in enumerate(pairs):
        assert {k: a["env"][k] for k in SAME} == {k: b["env"][k] for k in SAME}
        assert b["env"]["MASTER_ADDR"] and b["env"]["MASTER_PORT"] and b["env"]["TORCHELASTIC_RUN_ID"]
        assert (a["store"], b["store"]) == ("TCPStore", "KVStore")  # hvdlite's: signed, no open port
        # the job's --gloo-timeout-seconds (default 30 s), not torch's 30 minutes, for every group made
        groups = 2 if rank < 2 else 1
        assert (a["timeouts"], b["timeouts"]) == ([1800.0] * groups, [30.0] * groups)
        assert a["params"] == b["params"] and a["loss"] == b["loss"]
    assert len({b["params"] for _, b in pairs}) == 1


@pytest.mark.skipif(TORCHRUN is None, reason="torchrun is not on PATH")
def test_a_ddp_script_on_two_ssh_hosts_computes_what_torchrun_computes_on_one(tmp_path, torchrun_ranks,
                                                                               ssh_hosts):
    hosts = ssh_hosts(2)
    flags = [*ssh_flags(hosts), "-H", "host-1:2,host-2:2"]
    for rank, (a, b) in enumerate(both_ways(tmp_path, torchrun_ranks, flags)):
        assert (b["env"]["GROUP_RANK"], b["env"]["GROUP_WORLD_SIZE"], b["env"]["LOCAL_RANK"]) == \
            (str(rank // 2), "2", str(rank % 2))
        assert b["store"] == "KVStore" and a["params"] == b["params"]


def test_after_hvd_init_the_default_group_is_the_world(tmp_path):
    # The workers fork from a template (jobs.PRELOADED): the group is made after the fork.
    with Job(["-np", "3", *PRELOADED, sys.executable, os.path.join(SCRIPTS, "hvd_dist.py")], tmp_path) as job:
        result = job.finish(120)
    assert result.code == 0, result.stderr[-3000:]
    assert sorted(line.split()[-1] for line in result.stdout.splitlines() if "OK" in line) == ["0", "1", "2"]


def test_elastic_ddp_survives_a_kill_9_in_process(tmp_path):
    """A DDP model in a TorchState: the survivors roll back, re-form, move DDP onto the new
    world and go on in the same processes; every step is applied exactly once."""
    with Job(["-H", "127.0.0.1:1,127.0.0.2:1,127.0.0.3:1", "--min-np", "1",
              sys.executable, os.path.join(SCRIPTS, "elastic_job.py")], tmp_path,
             env=job_env(tmp_path, TOTAL_STEPS=40, STEP_SLEEP=0.05, DDP=1)) as job:
        wait_progress(job, tmp_path, 10)
        survivors = [slot_pid(job, "127.0.0.1/0"), slot_pid(job, "127.0.0.2/0")]
        os.kill(slot_pid(job, "127.0.0.3/0"), signal.SIGKILL)
        result = job.finish(120)
    assert result.code == 0, result.stderr[-3000:]
    records = check_training_continuous(tmp_path, 40)
    assert sizes(records) == [3, 2]
    assert {r["pid"] for r in records if r["size"] == 2} == set(survivors)  # nobody restarted


def test_a_workers_group_left_at_exit_is_destroyed(tmp_path):
    """torch asks a script to destroy its group before the end; a gloo group left to the
    interpreter's end aborted a worker now and then (SIGABRT after the script's last line, a
    failed job in CI). The boot destroys a worker's leftover group at exit, and no other's."""
    from hvdlite.driver.torchrunenv import BOOT
    code = ("import atexit, sys; atexit.register(lambda: print('left', "
            "sys.modules['torch.distributed'].is_initialized()))\n"  # runs after the boot's handler
            "import torch.distributed as dist\n"
            f"dist.init_process_group('gloo', init_method='file://{tmp_path}/store', rank=0, world_size=1)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("HVDLITE_")}
    env.update(PYTHONPATH=os.pathsep.join([BOOT, env.get("PYTHONPATH", "")]))
    for worker, left in (True, "False"), (False, "True"):
        (tmp_path / "store").unlink(missing_ok=True)
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                              env={**env, **({"HVDLITE_RENDEZVOUS_ADDR": "127.0.0.1"} if worker else {})})
        assert done.returncode == 0 and done.stdout.split() == ["left", left], done.stderr[-2000:]


def test_outside_hvdlite_workers_env_is_torchs_own(tmp_path):
    """The boot hook on PYTHONPATH changes nothing for a process hvdlite did not start."""
    from hvdlite.driver.torchrunenv import BOOT
    code = ("import sys, torch.distributed as dist; dist.init_process_group('gloo'); "
            "s = dist.distributed_c10d._get_default_store()\n"
            "while hasattr(s, 'underlying_store'): s = s.underlying_store\n"
            "print(type(s).__name__, sys.modules['torch.distributed.rendezvous']._rendezvous_handlers['env'].__module__)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("HVDLITE_")}
    env.update(PYTHONPATH=os.pathsep.join([BOOT, env.get("PYTHONPATH", "")]), RANK="0", WORLD_SIZE="1",
               MASTER_ADDR="127.0.0.1", MASTER_PORT="0", TORCHELASTIC_USE_AGENT_STORE="False")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == ["TCPStore", "sitecustomize"], done.stderr[-2000:]  # the hook, passing
