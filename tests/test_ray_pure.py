"""hvdlite on Ray without a cluster: reading ray.nodes() answers, slot shapes, the autoscaler
check, the --ray flags, the errors that need no cluster (none at the address, no ray), and the
node side of templates (a slot's and a template's actor classes, run here as plain objects on
real processes)."""
import os
import signal
import subprocess
import sys
import time

import pytest

from hvdlite import procstat
from hvdlite.cli import parse_settings
from hvdlite.discovery.raynodes import SlotShape, can_add_nodes, listing
from hvdlite.discovery.sources import host_source
from hvdlite.driver.decisions import adoption
from hvdlite.driver.launchers.hosttemplates import template_argv
from hvdlite.driver.launchers.rayslot import Slot, running
from hvdlite.driver.launchers.raytemplate import NodeTemplate
from hvdlite.driver.launchers.start import spawn_argv
from hvdlite.errors import UsageError
from raycluster import parent


def node(node_id, address, alive=True, death=0, **resources):
    return {"NodeID": node_id, "Alive": alive, "NodeManagerAddress": address,
            "Resources": resources, "DeathReason": death}


NODES = [
    node("b2", "10.0.0.2", CPU=4.0, GPU=2.0),
    node("a1", "10.0.0.2", CPU=2.0),  # same address: still a host of its own
    node("head", "10.0.0.1", CPU=0.0),  # no slots: not a host
    node("c3", "10.0.0.3", CPU=2.0, accel=3.0),
    node("gone", "10.0.0.4", alive=False, death=3, CPU=2.0),  # drained (preempted)
    node("idle", "10.0.0.5", alive=False, death=4, CPU=2.0),  # drained (idle)
    node("stop", "10.0.0.6", alive=False, death=1, CPU=2.0),  # ray stop: expected
    node("dead", "10.0.0.7", alive=False, death=2, CPU=2.0),  # unexpected: a failure
]


def test_hosts_are_alive_nodes_by_node_id_in_address_order():
    hosts = listing(NODES, SlotShape())
    assert hosts == [("a1", 2), ("b2", 4), ("c3", 2)]
    assert hosts.drained == ("gone", "idle", "stop") and hosts.failed == ("dead",)


def test_a_node_being_drained_is_no_longer_offered_and_counts_as_drained():
    hosts = listing(NODES, SlotShape(), draining=frozenset({"b2"}))
    assert hosts == [("a1", 2), ("c3", 2)] and "b2" in hosts.drained


@pytest.mark.parametrize("shape, slots", [
    (SlotShape(cpus=2), [("a1", 1), ("b2", 2), ("c3", 1)]),
    (SlotShape(cpus=1, gpus=1), [("b2", 2)]),  # GPUs bound it; nodes without GPUs have none
    (SlotShape(cpus=0, gpus=0.5), [("b2", 4)]),
    (SlotShape(resource="accel"), [("c3", 3)]),
])
def test_slots_come_from_cpus_gpus_or_a_named_resource(shape, slots):
    assert listing(NODES, shape) == slots


def test_a_slots_actor_asks_for_its_shape():
    assert SlotShape(cpus=2, gpus=1).bundle() == {"CPU": 2, "GPU": 1}
    assert SlotShape(cpus=1).bundle() == {"CPU": 1}
    assert SlotShape(resource="accel").bundle() == {"accel": 1}


def test_only_an_autoscaler_that_can_launch_nodes_counts():
    readonly = {"autoscaler_report": {"node_type_mapping": {"ab": "node_ab", "cd": "node_cd"}}}
    scaling = {"autoscaler_report": {"node_type_mapping": {"ab": "ray.head.default"}}}
    assert not can_add_nodes(None, readonly) and not can_add_nodes(None, {})
    assert can_add_nodes(None, scaling) and can_add_nodes(object(), {})


def test_ray_flags():
    s = parse_settings(["--ray", "--min-np", "2", "--max-np", "4", "--cpus-per-slot", "2", "true"])
    assert (s.launcher, s.elastic, s.hosts, s.cpus_per_slot, s.ray_address) == ("ray", True, None, 2.0, None)
    assert parse_settings(["--ray", "--ray-address", "h:6379", "true"]).num_proc is None  # all slots
    for argv, message in [(["--ray", "-H", "a:1", "true"], "takes the hosts from the Ray cluster"),
                          (["--ray-address", "auto", "true"], "need --ray"),
                          (["--ray", "--cpus-per-slot", "0", "true"], "must take something")]:
        with pytest.raises(UsageError, match=message):
            parse_settings(argv)


def test_a_static_job_asks_the_autoscaler_for_its_slots_and_waits_for_them():
    static = host_source(parse_settings(["--ray", "-np", "3", "--start-timeout", "7", "true"]))
    assert (static.need, static.request, static.wait) == (3, 3, 7.0)
    elastic = host_source(parse_settings(["--ray", "--min-np", "2", "--max-np", "4", "true"]))
    assert (elastic.need, elastic.request, elastic.wait) == (2, 4, 0.0)  # its world may be smaller


def run(argv, tmp_path, **env):
    return subprocess.run([sys.executable, "-m", "hvdlite.cli", "run", *argv], capture_output=True,
                          text=True, timeout=60, cwd=tmp_path, env={**os.environ, **env})


def test_no_cluster_at_the_address_is_one_line(tmp_path):
    pytest.importorskip("ray", reason="ray is not installed: this checks what ray.init would do")
    r = run(["--ray", "--ray-address", "127.0.0.1:1", "-np", "1", "true"], tmp_path, RAY_AUTH_MODE="disabled")
    assert r.returncode == 1
    assert r.stderr.strip().splitlines() == [r.stderr.strip().splitlines()[0]]
    assert r.stderr.startswith("hvdlite: error: no Ray cluster at 127.0.0.1:1: cannot connect to ")


def test_ray_not_installed_is_one_line(tmp_path):
    fake = tmp_path / "noray" / "ray"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError(\"No module named 'ray'\")\n")
    path = os.pathsep.join([str(tmp_path / "noray"), os.environ.get("PYTHONPATH", "")])
    r = run(["--ray", "-np", "1", "true"], tmp_path, PYTHONPATH=path)
    assert (r.returncode, r.stderr) == (1, "hvdlite: error: --ray needs the ray package: "
                                           "pip install 'hvdlite[ray]'\n")


def finish(slot, timeout=30):
    """(exit code, whether its template's death took it) once the slot's worker ended."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        _, code, template_died = slot.read(0.5)
        if code is not None:
            return code, template_died
    raise AssertionError("the worker did not end")


@pytest.mark.parametrize("adoptable", [True, False])
def test_a_rerun_waits_for_the_last_drivers_ray_workers_to_end_then_resumes_from_the_disk(adoptable):
    """kill -9 of a --ray driver: Ray ends its actors, and their workers with them
    (RayLauncher.ends_with_driver). A rerun that finds one still running on its node waits for
    it (`ending`) and never takes it over; once none runs it resumes from the disk, where it
    would be refused for --driver-grace if they trained on (srun's). `adoptable`: or the driver
    died ending the job."""
    saved = {"adoptable": adoptable, "round": 1, "command": ["train.py"], "written_at": 0.0,
             "driver_host": "here", "workers": [{"id": f"N{i}/0#1", "host": f"N{i}", "phase": "training"}
                                                for i in (1, 2)]}

    def rerun(elsewhere, how=adoption.ENDS):
        return adoption.rerun(saved, {}, elsewhere, set(), {"N1": how, "N2": how}, ["train.py"], "here",
                              1.0, 60.0, "/ckpt")
    assert rerun({"N2/0#1"}) == adoption.Rerun(ending=("N2/0#1",))
    assert rerun(set()) == adoption.Rerun()
    assert "N2/0#1" in adoption.not_ended(("N2/0#1",))
    if adoptable:  # srun's workers train on: a rerun is refused until the grace ends
        assert rerun(set(), adoption.OTHER).refused


def test_a_slot_forks_from_its_nodes_template_and_tells_a_kill_from_the_templates_death(tmp_path):
    keeper = NodeTemplate()
    ready = keeper.start(template_argv([sys.executable], ["json"]), dict(os.environ), str(tmp_path), 60)
    assert ready["op"] == "ready", ready
    script = tmp_path / "worker.py"
    script.write_text("import time\ntime.sleep(60)\n")
    slots = []

    def forked():
        slots.append(Slot())
        pid, how, fallback, identity = slots[-1].start(spawn_argv([sys.executable, str(script)], ready["socket"]),
                                                       dict(os.environ), str(tmp_path), ready["pid"])
        assert (how, fallback, parent(pid)) == ("template", None, ready["pid"])
        assert running([identity, f"{pid}:1"]) == [identity] == [procstat.identity(pid)]  # what a rerun asks
        return slots[-1], pid

    try:
        killed, pid = forked()
        os.kill(pid, signal.SIGKILL)  # the worker's own death: a failure
        assert finish(killed) == (-signal.SIGKILL, False)
        orphaned, _ = forked()
        os.kill(ready["pid"], signal.SIGKILL)  # the template's: not the worker's doing
        assert finish(orphaned) == (-signal.SIGKILL, True)
        assert keeper.wait(10)
    finally:
        for slot in slots:
            slot.stop(0.1)
        if keeper.proc.poll() is None:
            keeper.proc.kill()


def test_a_nodes_template_that_cannot_preload_says_why(tmp_path):
    (tmp_path / "badmod.py").write_text("raise RuntimeError('broken at import')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    keeper = NodeTemplate()
    answer = keeper.start(template_argv([sys.executable], ["badmod"]), env, str(tmp_path), 60)
    assert answer == {"op": "unusable", "reason": "preloading failed: RuntimeError: broken at import"}
    assert keeper.wait(10)
