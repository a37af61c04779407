"""Which GPUs each launcher leaves a worker, without GPUs: the user's CUDA_VISIBLE_DEVICES
kept and shared by the slots (local, and over SSH to tests/sshhosts.py's hosts), none of the
driver's under Slurm (slurmd sets a step's), exactly the GPUs Ray reserved for the slot's actor
(a Ray cluster whose nodes say they have GPUs: Ray hands out their ids without looking)."""
import os
import sys

import pytest

import raycluster
import slurmcluster
from jobs import SCRIPTS, job_env, run_job, ssh_flags

SCRIPT = [sys.executable, os.path.join(SCRIPTS, "gpu_env.py")]


def _lines(stdout):
    """rank -> (host, CUDA_VISIBLE_DEVICES as its repr, the GPU line)."""
    out = {}
    for line in stdout.splitlines():
        if "<stdout>:" in line:
            fields, said = line.split("<stdout>:", 1)[1].split("|", 1)
            rank, host, visible = fields.split()
            out[int(rank)] = (host, visible, said.strip())
    return out


def test_the_users_visible_gpus_are_kept_and_the_local_rank_picks_among_them(tmp_path):
    r = run_job(["-np", "3", *SCRIPT], tmp_path, timeout=60,
                env={**job_env(tmp_path), "CUDA_VISIBLE_DEVICES": "4,6"})
    assert r.code == 0, r.stderr
    lines = _lines(r.stdout)
    assert [visible for _, visible, _ in lines.values()] == ["'4,6'"] * 3
    assert {rank: said.split(" uses GPU ")[1].split(":")[0] for rank, (_, _, said) in lines.items()} \
        == {0: "4", 1: "6", 2: "4"}


def test_over_ssh_every_host_gets_the_users_visible_gpus(tmp_path, ssh_hosts):
    hosts = ssh_hosts(2)
    r = run_job([*ssh_flags(hosts), "-np", "4", "-H", "host-1:2,host-2:2", *SCRIPT], tmp_path, timeout=60,
                env={**job_env(tmp_path), "CUDA_VISIBLE_DEVICES": "4,6"})
    assert r.code == 0, r.stderr
    lines = _lines(r.stdout)
    assert sorted((host, visible) for host, visible, _ in lines.values()) == \
        [("host-1", "'4,6'")] * 2 + [("host-2", "'4,6'")] * 2
    assert sorted(said.split(" uses GPU ")[1].split(":")[0] for _, _, said in lines.values()) == ["4", "4", "6", "6"]


def test_under_slurm_a_step_gets_none_of_the_drivers_visible_gpus(tmp_path):
    reason = slurmcluster.missing()
    if reason:
        pytest.skip(reason)
    cluster = slurmcluster.SlurmCluster(2)
    try:
        env = {**job_env(tmp_path), "SLURM_CONF": cluster.conf, "CUDA_VISIBLE_DEVICES": "9",
               "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}
        r = run_job(SCRIPT, tmp_path, timeout=120, env=env, prefix=["salloc", "-N2", "--ntasks-per-node=1"])
    finally:
        cluster.close()
    assert r.code == 0, r.stderr
    # This cluster's nodes have no GPUs (no gres), so slurmd sets no CUDA_VISIBLE_DEVICES.
    assert sorted(visible for _, visible, _ in _lines(r.stdout).values()) == ["None", "None"]


@pytest.fixture(scope="module")
def gpu_cluster():
    reason = raycluster.missing()
    if reason:
        pytest.skip(reason)
    cluster = raycluster.RayCluster(2, cpus=2, gpus=2)
    yield cluster
    cluster.close()


def test_on_ray_a_worker_sees_exactly_the_gpus_reserved_for_its_actor(tmp_path, gpu_cluster):
    env = {**job_env(tmp_path), "RAY_AUTH_MODE": "disabled", "RAY_ADDRESS": gpu_cluster.address,
           "CUDA_VISIBLE_DEVICES": "7"}  # the driver's own: no Ray worker's business
    r = run_job(["--ray", "--start-timeout", "120", "-np", "4", "--gpus-per-slot", "1", *SCRIPT], tmp_path, timeout=180, env=env)
    assert r.code == 0, r.stderr
    lines = _lines(r.stdout)
    assert sorted(lines) == [0, 1, 2, 3]
    by_node = {}
    for host, visible, said in lines.values():
        by_node.setdefault(host, []).append(visible)
        assert said.endswith("of the 1 it sees")
    assert sorted(by_node) == ["n1", "n2"]
    assert all(sorted(ids) == ["'0'", "'1'"] for ids in by_node.values()), by_node  # one GPU each, none shared
    r = run_job(["--ray", "--start-timeout", "120", "-np", "2", "--cpus-per-slot", "1", *SCRIPT], tmp_path, timeout=180, env=env)
    assert r.code == 0, r.stderr
    assert [visible for _, visible, _ in _lines(r.stdout).values()] == ["''", "''"]  # reserved none: sees none
