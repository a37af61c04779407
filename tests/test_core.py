"""The elastic core driven by hand-written event sequences: no processes, threads or clock.

One sequence per defect the core once had and per Horovod rule it follows.
"""
import signal

import pytest

from hvdlite import exitcodes
from hvdlite.driver.decisions.core import ElasticCore
from hvdlite.driver.decisions.policy import Policy
from hvdlite.driver.decisions.workers import Phase
from hvdlite.driver.decisions.messages import (
    LISTENING, REFUSED, SILENT, Answer, EndJob, Exited, Exiting, Heartbeats, HostsFound, Launch, Launched,
    LaunchFailed, Leaving, LinkBroken, LoadFailed, Log, Probe, Probed, Publish, Ready, Stop, StopRequested,
    TemplateDied, Tick, WriteFailed, Written)
from hvdlite.driver.decisions.nodeloss import EXIT_WAIT, REPROBE
from hvdlite.driver.probe import ATTEMPTS
from hvdlite.worker.probed import BACKLOG


class Sim:
    """Feeds events to a core at a fake time and remembers every action."""

    def __init__(self, hosts, **policy):
        self.core = ElasticCore(Policy(**policy), rng=lambda: 0.0)
        self.now = 0.0
        self.actions = []
        self.pids = 100
        self.send(HostsFound(tuple(hosts)))

    def send(self, event, after=0.01):
        self.now += after
        out = self.core.handle(event, self.now)
        self.actions += out
        return out

    def launched(self, out=None):
        """Start every worker the last actions launched; returns their ids."""
        ids = [a.worker for a in (out if out is not None else self.actions) if isinstance(a, Launch)]
        for worker in ids:
            self.pids += 1
            self.send(Launched(worker, self.pids))
        return ids

    def ready(self, worker, after=-1, commit=0, rolled_back=True):
        return self.send(Ready(worker, after, commit, rolled_back))

    def world(self):
        return {self.core.workers[w].slot: p.rank for w, p in self.core.world.items()}

    def logged(self, event):
        return [a.fields for a in self.actions if isinstance(a, Log) and a.event == event]

    def end(self):
        ends = [a for a in self.actions if isinstance(a, EndJob)]
        return ends[-1] if ends else None


def answers(out, worker):
    return [a.body for a in out if isinstance(a, Answer) and a.worker == worker]


def first_world(hosts, **policy):
    """A core whose first world formed with every slot of `hosts`; returns (sim, ids)."""
    sim = Sim(hosts, **policy)
    ids = sim.launched()
    for worker in ids:
        sim.ready(worker)
    assert sim.core.round == 1
    return sim, ids


def leave(sim, ids, commit=5):
    """Every id leaves the current world for the rendezvous, holding `commit`."""
    for worker in ids:
        sim.ready(worker, after=sim.core.round, commit=commit)


# ---- defects ------------------------------------------------------------------------------
def test_exit_of_a_slots_earlier_process_changes_nothing():
    sim, (a, b) = first_world([("a", 1), ("b", 1)])
    sim.send(HostsFound((("a", 1), ("b", 1), ("c", 1))))
    (c1,) = sim.launched(sim.actions[-3:])
    sim.send(HostsFound((("a", 1), ("b", 1))))  # c vanishes for one poll ...
    assert Stop(c1, 3.0) in sim.actions
    out = sim.send(HostsFound((("a", 1), ("b", 1), ("c", 1))))  # ... and comes back
    assert not [x for x in out if isinstance(x, Launch)], "relaunched while its old process runs"
    sim.send(Exited(c1, 0))  # the old process ends cleanly: not the job's success
    assert sim.end() is None and not sim.core.succeeded
    (c2,) = sim.launched(sim.actions[-2:])
    assert c2 == "c/0#2"
    before = sim.core.workers[c2].phase
    assert answers(sim.send(Ready(c1, -1, 0)), c1) == [{"removed": True}]
    sim.send(Exited(c1, 1))  # told twice, and with a failure: still nothing
    sim.send(Heartbeats(((c1, 9),)))
    assert sim.core.workers[c2].phase is before and not sim.logged("blacklisted")


def test_new_worker_that_never_synced_does_not_count_as_holding_the_state():
    sim, (a, b) = first_world([("a", 1), ("b", 1)])
    sim.send(HostsFound((("a", 1), ("b", 1), ("c", 1))))
    (c,) = sim.launched(sim.actions[-3:])
    sim.ready(c)
    leave(sim, [a, b], commit=7)  # the host update: world 2 is a, b and the new c
    assert sim.core.round == 2 and sim.world()["a/0"] == 0
    sim.send(Exited(a, -9))  # the holders die during the first sync
    sim.send(Exited(b, -9))
    sim.ready(c, after=2, commit=0)  # c's sync failed: it holds nothing
    end = sim.end()
    assert end is not None and end.code == 1 and "training state is gone (last commit 7)" in end.error
    assert sim.core.round == 2, "a world of workers holding nothing must not form"


def test_a_worker_that_can_read_a_checkpoint_holds_its_commit():
    # As above, but with --checkpoint-dir: c reports the newest commit it can read from disk
    # (5), so the job resumes from it instead of failing, and says what was lost.
    sim, (a, b) = first_world([("a", 1), ("b", 1)])
    sim.send(HostsFound((("a", 1), ("b", 1), ("c", 1))))
    (c,) = sim.launched(sim.actions[-3:])
    sim.ready(c, commit=5)
    leave(sim, [a, b], commit=7)
    sim.send(Exited(a, -9))
    sim.send(Exited(b, -9))
    sim.ready(c, after=2, commit=5)
    assert sim.end() is None and sim.core.round == 3 and sim.world() == {"c/0": 0}
    assert sim.logged("commit_lost") == [{"newest": 7, "resumed": 5}]


def test_every_worker_failing_with_checkpoints_waits_for_the_cooldown_and_resumes_from_disk():
    # Horovod stops when every worker failed; with --checkpoint-dir the slots coming back
    # from their cooldown are relaunched, and their workers report what they read from disk.
    for durable in (False, True):
        sim, (a, b) = first_world([("a", 1), ("b", 1)], cooldown_range=(1.0, 2.0), durable=durable)
        sim.send(Heartbeats(((a, 7), (b, 7))))  # the only word of commit 7: nobody left since
        sim.send(Exited(a, -9))
        sim.send(Exited(b, -9))
        if not durable:
            assert "all workers failed" in sim.end().error
            continue
        assert sim.end() is None
        out = sim.send(Tick(), after=1.5)
        relaunched = sim.launched(out)
        assert sorted(relaunched) == ["a/0#2", "b/0#2"]
        for worker in relaunched:
            sim.ready(worker, commit=5)
        assert sim.end() is None and sim.core.round == 2
        assert sim.logged("commit_lost") == [{"newest": 7, "resumed": 5}]


def test_every_worker_failing_ends_the_job_when_no_commit_or_slot_can_come_back():
    for cooldown, beat in [((1.0, 2.0), 0), (None, 7)]:  # nothing committed; no cooldown
        sim, (a,) = first_world([("a", 1)], cooldown_range=cooldown, durable=True)
        sim.send(Heartbeats(((a, beat),)))
        sim.send(Exited(a, 1))
        assert "all workers failed" in sim.end().error


def test_removal_reaches_a_member_waiting_after_the_round_it_left():
    sim, (a, b, c) = first_world([("a", 1), ("b", 1), ("c", 1)])
    sim.send(Exited(b, 1))  # b fails: the world breaks
    out = sim.ready(a, after=1, commit=9)  # a leaves round 1 and waits
    assert not answers(out, a)
    out = sim.send(Exited(c, 0))  # meanwhile c finished: the job succeeded
    assert answers(out, a) == [{"removed": True}]
    assert answers(sim.ready(a, after=1, commit=9), a) == [{"removed": True}]  # asked again
    sim.send(Exited(a, 0))
    assert sim.end() == EndJob(0)


def test_a_lost_answer_is_given_again():
    sim = Sim([("a", 1)])
    (a,) = sim.launched()
    first = answers(sim.ready(a), a)
    assert first and "world" in first[0]
    assert answers(sim.ready(a), a) == first  # the request timed out before it arrived


def test_launches_are_actions_and_a_failed_launch_blacklists_its_host():
    sim = Sim([("a", 1), ("b", 1)])
    launches = [x for x in sim.actions if isinstance(x, Launch)]
    assert [x.worker for x in launches] == ["a/0#1", "b/0#1"]
    sim.send(Launched("a/0#1", 1))
    sim.send(LaunchFailed("b/0#1", "SSH connection to b port 22 refused"))
    assert sim.logged("blacklisted") == [{"key": "b", "cooldown": "permanent"}]
    sim.ready("a/0#1")
    assert sim.world() == {"a/0": 0}


def test_heartbeat_silence_kills_a_worker_and_breaks_its_world():
    sim, (a, b) = first_world([("a", 1), ("b", 1)], liveness_timeout=5.0)
    sim.send(Heartbeats(((a, 1), (b, 1))))
    for _ in range(40):
        sim.send(Heartbeats(((a, 1),)), after=0.2)
        sim.send(Tick(), after=0.0)
    assert Stop(b, 0.0) in sim.actions
    assert sim.logged("worker_unresponsive")[0]["worker"] == b
    assert Publish(0, 1) in sim.actions  # round 1 broken: the members cut their connections


def test_a_starved_driver_does_not_blame_the_workers():
    sim, (a,) = first_world([("a", 1)], liveness_timeout=5.0)
    sim.send(Heartbeats(((a, 1),)))
    sim.send(Tick(), after=0.1)
    sim.send(Tick(), after=8.0)  # the driver was not running for 8 s
    assert not sim.logged("worker_unresponsive")


def test_a_worker_never_heard_is_still_ended_once_it_exits_or_its_world_breaks():
    """Past its start a member never heard from has no time to be looked at (decisions/
    deadlines.py), until it says it exits or its world breaks: each gives it one."""
    sim, (a, b, c) = first_world([("a", 1), ("b", 1), ("c", 1)], start_timeout=5.0, exit_grace=3.0,
                                 elastic_timeout=4.0)
    while sim.now < 6.0:  # past every start timeout: nothing is due any more
        sim.send(Tick(), after=0.5)
    sim.send(Exiting(a, 0))
    while sim.now < 10.0:
        sim.send(Tick(), after=0.5)
    assert [(f["worker"], f["reason"]) for f in sim.logged("worker_unresponsive")] == [(a, "still exiting after 3 s")]
    sim.send(Exited(c, -signal.SIGKILL))  # the world breaks; b never comes back from it
    while sim.now < 15.0:
        sim.send(Tick(), after=0.5)
    assert [(f["worker"], f["reason"]) for f in sim.logged("worker_stuck")] == \
        [(b, "still in a world that broke over --elastic-timeout 4 s ago")]
    assert Stop(a, 0.0) in sim.actions and Stop(b, 0.0) in sim.actions


# ---- Horovod's rules ----------------------------------------------------------------------
def test_a_failure_blacklists_its_host_on_a_multi_host_job():
    sim, (a0, a1, b0, b1) = first_world([("a", 2), ("b", 2)])
    sim.send(Exited(b0, -9))
    assert sim.logged("blacklisted") == [{"key": "b", "cooldown": "permanent"}]
    leave(sim, [a0, a1, b1])
    assert sim.world() == {"a/0": 0, "a/1": 1}  # b's healthy worker went out with its host
    assert answers(sim.actions, b1)[-1] == {"removed": True}


def test_a_failure_on_every_host_ends_the_job():
    sim, (a, b) = first_world([("a", 1), ("b", 1)])
    sim.send(Exited(b, 1))
    leave(sim, [a])
    sim.send(Exited(a, 1))
    assert sim.end().code == 1


def test_all_hosts_blacklisted_while_a_worker_lives_ends_the_job():
    sim, (a0, a1, b0, b1) = first_world([("a", 2), ("b", 2)])
    sim.send(Exited(b0, 1))
    sim.send(Exited(a0, 1))
    assert sim.end().error == "all hosts are blacklisted"


def test_a_single_host_job_sidelines_only_the_failed_slot():
    sim, (s0, s1, s2) = first_world([("localhost", 3)])
    sim.send(Exited(s1, -9))
    assert sim.logged("blacklisted") == [{"key": "localhost/1", "cooldown": "permanent"}]
    leave(sim, [s0, s2])
    assert sim.world() == {"localhost/0": 0, "localhost/2": 1}


def test_the_rule_can_be_chosen():
    sim, ids = first_world([("localhost", 2)], blacklist="host")
    sim.send(Exited(ids[0], 1))
    assert sim.logged("blacklisted")[0]["key"] == "localhost"
    sim, ids = first_world([("a", 1), ("b", 1)], blacklist="slot")
    sim.send(Exited(ids[1], 1))
    assert [f["key"] for f in sim.logged("blacklisted")] == ["b/0", "b"]  # b had one worker


def test_first_world_ranks_follow_host_order():
    sim = Sim([("localhost", 2), ("127.0.0.1", 2)])
    ids = sim.launched()
    for worker in reversed(ids):
        sim.ready(worker)
    assert sim.world() == {"localhost/0": 0, "localhost/1": 1, "127.0.0.1/0": 2, "127.0.0.1/1": 3}


def test_later_worlds_keep_survivors_order_and_put_new_hosts_last():
    sim, (a, b, c) = first_world([("c", 1), ("a", 1), ("b", 1)])
    sim.send(HostsFound((("a", 1), ("b", 1), ("c", 1), ("d", 1))))
    (d,) = sim.launched(sim.actions[-3:])
    sim.ready(d)
    leave(sim, [a, b, c])
    assert sim.world() == {"c/0": 0, "a/0": 1, "b/0": 2, "d/0": 3}


def test_launch_tells_the_place_horovod_would_announce():
    sim = Sim([("a", 2), ("b", 1)], max_np=2)
    places = {x.slot: (x.world.rank, x.world.size, x.world.local_rank) for x in sim.actions
              if isinstance(x, Launch)}
    assert places == {"a/0": (0, 2, 0), "a/1": (1, 2, 1)}


def test_every_new_world_syncs_from_the_holder_of_the_newest_commit():
    sim, (a, b, c) = first_world([("a", 1), ("b", 1), ("c", 1)])
    sim.send(Exited(a, -9))
    sim.ready(b, after=1, commit=4)
    sim.ready(c, after=1, commit=5)
    assert sim.world() == {"b/0": 0, "c/0": 1}  # shrunk: the survivors keep their order
    assert sim.logged("round_complete")[-1]["commit"] == 5
    assert sim.logged("round_complete")[-1]["root"] == 1
    assert {p.root for p in sim.core.world.values()} == {1}


@pytest.mark.parametrize("dead", [0, 1])
def test_a_spare_takes_the_dead_ranks_number_and_the_survivors_keep_theirs(dead):
    sim, ids = first_world([("a", 1), ("b", 1), ("c", 1), ("d", 1)], max_np=3, min_np=3)
    assert sim.world() == {"a/0": 0, "b/0": 1, "c/0": 2}
    sim.send(Exited(ids[dead], -9))
    (spare,) = sim.launched(sim.actions[-4:])
    survivors = [w for w in ids if w != ids[dead]]
    for worker in survivors:
        sim.ready(worker, after=1, commit=6)
    sim.ready(spare)
    expected = {"a/0": 0, "b/0": 1, "c/0": 2}
    expected["d/0"] = expected.pop("ab"[dead] + "/0")
    assert sim.world() == expected
    assert sim.core.world[survivors[0]].root == sim.world()[sim.core.workers[survivors[0]].slot]


def test_a_relaunch_after_the_cooldown_takes_back_its_slots_rank():
    sim, (a, b, c) = first_world([("a", 1), ("b", 1), ("c", 1)], min_np=3, cooldown_range=(1.0, 1.0))
    sim.send(Exited(a, -9))  # rank 0
    sim.ready(b, after=1, commit=6)
    sim.ready(c, after=1, commit=6)
    sim.send(Tick(), after=2.0)  # the cooldown is over: a/0 is launched again
    (a2,) = sim.launched(sim.actions[-3:])
    sim.ready(a2)
    assert a2 == "a/0#2" and sim.world() == {"a/0": 0, "b/0": 1, "c/0": 2}
    assert {p.root for p in sim.core.world.values()} == {1}


def test_losing_the_newest_commit_is_said():
    sim, (a, b) = first_world([("a", 1), ("b", 1)])
    leave(sim, [a, b], commit=3)  # world 2 at commit 3
    sim.send(HostsFound((("a", 1), ("b", 1), ("c", 1))))
    (c,) = sim.launched(sim.actions[-3:])
    sim.ready(c)
    sim.ready(a, after=2, commit=8)
    sim.send(Exited(a, -9))  # the only holder of commit 8 dies before the world forms
    sim.ready(b, after=2, commit=6)
    assert sim.logged("commit_lost") == [{"newest": 8, "resumed": 6}]
    assert sim.world() == {"c/0": 0, "b/0": 1}  # c takes a's rank; b, its root, keeps its own


def test_slots_beyond_max_np_are_not_launched_and_cause_no_reset():
    sim, ids = first_world([("a", 1), ("b", 1)], max_np=2)
    out = sim.send(HostsFound((("a", 1), ("b", 1), ("c", 2))))
    assert not [x for x in out if isinstance(x, Launch)] and sim.core.updates == 0


def test_below_min_np_the_job_waits_then_fails():
    sim, (a, b) = first_world([("a", 1), ("b", 1)], min_np=2, elastic_timeout=3.0)
    sim.send(Exited(b, -9))
    leave(sim, [a])
    assert sim.logged("waiting_for_workers") and sim.end() is None
    sim.send(Tick(), after=0.5)
    for _ in range(8):
        sim.send(Tick(), after=0.5)
    assert "fewer than --min-np 2 workers" in sim.end().error


def test_reset_limit():
    sim, (a, b, c) = first_world([("a", 1), ("b", 1), ("c", 1)], reset_limit=1)
    sim.send(Exited(c, 1))
    leave(sim, [a, b])
    assert sim.core.round == 2
    sim.send(Exited(b, 1))
    leave(sim, [a])
    assert "reset limit 1 reached" in sim.end().error


def test_cooldown_brings_a_host_back():
    sim, (a, b) = first_world([("a", 1), ("b", 1)], cooldown_range=(1.0, 2.0))
    sim.send(Exited(b, 1))
    leave(sim, [a])
    assert sim.world() == {"a/0": 0}
    out = sim.send(Tick(), after=1.5)
    assert sim.logged("whitelisted") == [{"key": "b"}]
    assert [x.worker for x in out if isinstance(x, Launch)] == ["b/0#2"]


def test_state_is_handed_over_before_its_last_holder_leaves():
    sim, (a, b) = first_world([("a", 1), ("b", 1)])
    sim.send(HostsFound((("b", 1), ("c", 1))))  # a is going away
    (c,) = sim.launched(sim.actions[-3:])
    sim.send(Exited(b, -9))
    sim.ready(c)
    sim.ready(a, after=1, commit=4)
    assert sim.world() == {"a/0": 0, "c/0": 1}  # a stays until c has synced from it
    assert handover_world(sim)  # and the members leave it once c has synced
    leave(sim, [a, c], commit=4)
    assert sim.world() == {"c/0": 0}
    assert sim.core.workers[a].phase is Phase.LEAVING


def test_a_failing_discovery_is_said_once_per_kind_and_its_recovery_too():
    from hvdlite.driver.decisions.messages import DiscoveryFailed
    sim = Sim([("a", 1)])
    for error in ["exited with code 1"] * 5 + ["timed out"] * 3:
        sim.send(DiscoveryFailed(error), after=1.0)
    assert [f["error"] for f in sim.logged("discovery_failed")] == ["exited with code 1", "timed out"]
    sim.send(HostsFound((("a", 1),)), after=1.0)
    sim.send(HostsFound((("a", 1),)), after=1.0)
    assert sim.logged("discovery_recovered") == [{"failures": 8}]
    sim.send(DiscoveryFailed("exited with code 1"), after=1.0)  # a new streak is said again
    assert len(sim.logged("discovery_failed")) == 3


def test_a_slot_count_change_is_logged_as_a_resize():
    sim = Sim([("a", 2), ("b", 1)])
    sim.send(HostsFound((("a", 3), ("b", 1))))
    sim.send(HostsFound((("a", 1), ("b", 1), ("c", 1))))
    changes = sim.logged("hosts_changed")
    assert changes[1]["resized"] == {"a": [2, 3]} and changes[1]["added"] == ["a"]
    assert changes[2]["resized"] == {"a": [3, 1]} and changes[2]["added"] == ["c"]


def test_the_end_of_a_job_names_every_worker_that_failed_on_the_way():
    sim = Sim([("a", 3)], min_np=1)
    workers = sim.launched()
    for w in workers:
        sim.ready(w)
    sim.send(Exited(workers[1], 1, "ValueError: boom"))
    sim.send(Exited(workers[2], -9))
    for w in [workers[0]]:
        sim.ready(w, after=1, commit=3)
    sim.send(Exited(workers[0], 0))
    end = sim.logged("job_end")[-1]
    assert end["result"] == "success" and sim.end().code == 0
    assert end["failed"] == ["rank 1 on a exited with code 1 (ValueError: boom)",
                             "rank 2 on a was killed by SIGKILL"]


@pytest.mark.parametrize("strict", [False, True])
def test_fail_on_worker_failure_fails_a_job_that_finished_after_a_failure(strict):
    # Horovod's rule by default (the job finished: 0); for CI, any worker failure fails it (1).
    sim, ids = first_world([("a", 2)], min_np=1, fail_on_worker_failure=strict)
    sim.send(Exited(ids[1], 1, "ValueError: boom"))
    sim.ready(ids[0], after=1, commit=3)
    sim.send(Exited(ids[0], 0))
    end = sim.logged("job_end")[-1]
    assert sim.end().code == (exitcodes.FAILED if strict else exitcodes.FINISHED)
    assert end["result"] == ("failure" if strict else "success")
    if strict:
        assert "1 worker failed on the way" in end["reason"] and "ValueError: boom" in end["reason"]


def test_a_job_without_failures_finishes_under_fail_on_worker_failure():
    sim, ids = first_world([("a", 2)], fail_on_worker_failure=True)
    for w in ids:
        sim.send(Exited(w, 0))
    assert sim.end().code == exitcodes.FINISHED


def test_a_discovery_that_lists_no_hosts_is_said_at_once_and_at_every_change():
    sim = Sim([])
    assert len(sim.logged("discovery_empty")) == 1  # the first read, before any wait
    sim.send(HostsFound(()), after=1.0)
    assert len(sim.logged("discovery_empty")) == 1  # the same empty list again: said once
    sim.send(HostsFound((("a", 1),)), after=1.0)
    sim.send(HostsFound(()), after=1.0)
    assert len(sim.logged("discovery_empty")) == 2  # empty again after a change


# ---- the training state is never thrown away while someone holds it (issue 19) -------------
def handover_world(sim):
    """The current world's answer says it only hands the state over: members leave it right
    after their first sync."""
    bodies = [answers(sim.actions, w)[-1] for w in sim.core.world]
    return {b["world"]["handover"] for b in bodies} == {True}


def joined(sim, hosts, commit=0):
    """Discovery shows `hosts`; the one new worker starts and waits holding `commit`."""
    out = sim.send(HostsFound(tuple(hosts)))
    (new,) = sim.launched(out)
    sim.ready(new, commit=commit)
    return new


def test_a_live_holder_on_a_blacklisted_host_hands_the_state_over():
    # x runs {x/0, x/1} at commit 100; y joins holding nothing; x/0 dies before the next
    # commit, so x is blacklisted (two hosts: the host rule). x/1 still holds commit 100.
    for cooldown in (None, (5.0, 10.0)):
        sim, (x0, x1) = first_world([("x", 2)], cooldown_range=cooldown)
        y = joined(sim, [("x", 2), ("y", 1)])
        sim.send(Exited(x0, -9))
        assert [f["key"] for f in sim.logged("blacklisted")] == ["x"]
        sim.ready(x1, after=1, commit=100)
        assert sim.end() is None, sim.end()
        assert sim.world() == {"y/0": 0, "x/1": 1} and handover_world(sim)
        assert sim.logged("round_complete")[-1]["commit"] == 100
        assert sim.logged("round_complete")[-1]["root"] == 1
        leave(sim, [x1, y], commit=100)  # y synced: x/1 leaves, y goes on from commit 100
        assert sim.world() == {"y/0": 0} and not handover_world(sim)
        assert answers(sim.actions, x1)[-1] == {"removed": True}


def test_rank0_dying_during_a_new_hosts_first_sync_leaves_the_other_holder_as_source():
    for durable, disk in ((False, 0), (True, 5)):  # with --checkpoint-dir y can read commit 5
        sim, (x0, x1) = first_world([("x", 2)], durable=durable)
        y = joined(sim, [("x", 2), ("y", 1)], commit=disk)
        leave(sim, [x0, x1], commit=7)  # world 2: x/0 (rank 0), x/1, y
        assert sim.world() == {"x/0": 0, "x/1": 1, "y/0": 2}
        sim.send(Exited(x0, -9))  # during the first sync: y got nothing
        sim.ready(x1, after=2, commit=7)
        sim.ready(y, after=2, commit=disk)
        assert sim.end() is None and sim.world() == {"x/1": 0, "y/0": 1} and handover_world(sim)
        assert not sim.logged("commit_lost")


def test_with_no_hosts_listed_the_holder_keeps_the_state_without_training():
    sim, (a, b) = first_world([("a", 1), ("b", 1)], elastic_timeout=5.0)
    sim.send(HostsFound(()))  # discovery lists nobody
    leave(sim, [a, b], commit=3)
    assert sim.core.round == 1, "a world formed on removed slots"
    assert sim.logged("state_kept") and sim.logged("state_kept")[0]["commit"] == 3
    # hosts return before --elastic-timeout: the holder hands the state over, then leaves
    c = joined(sim, [("c", 1)])
    holder = next(w for w in sim.core.world)
    assert sim.world() in ({"a/0": 0, "c/0": 1}, {"b/0": 0, "c/0": 1}) and handover_world(sim)
    leave(sim, [holder, c], commit=3)
    assert sim.world() == {"c/0": 0}


def test_with_no_hosts_listed_until_the_elastic_timeout_the_job_ends_saying_so():
    sim, (a,) = first_world([("a", 1)], elastic_timeout=5.0)
    sim.send(HostsFound(()))
    leave(sim, [a], commit=3)
    for _ in range(12):
        sim.send(Heartbeats(((a, 3),)), after=0.5)
        sim.send(Tick(), after=0.0)
    end = sim.end()
    assert end is not None and end.code == 1
    assert "--elastic-timeout 5 s" in end.error and "commit 3" in end.error
    assert sim.core.round == 1


def test_a_template_dying_relaunches_its_workers_and_blacklists_nothing():
    sim, (s0, s1) = first_world([("localhost", 2)])
    out = sim.send(TemplateDied(s1))  # forked from it; s0 started plainly
    assert [a.worker for a in out if isinstance(a, Launch)] == ["localhost/1#2"]
    assert not sim.logged("blacklisted") and sim.core.first_failure is None
    assert sim.logged("worker_exit")[-1]["cause"] == "its template died"
    sim.launched(out)
    sim.ready("localhost/1#2")
    leave(sim, [s0], commit=4)
    leave(sim, [s0, "localhost/1#2"], commit=4)
    assert sim.world() == {"localhost/0": 0, "localhost/1": 1}
    # every worker forked from it: all relaunched, the job goes on (from disk with one)
    sim, ids = first_world([("localhost", 2)], durable=True)
    for worker in ids:
        sim.send(TemplateDied(worker))
    assert sim.end() is None and not sim.logged("blacklisted")
    assert len([a for a in sim.actions if isinstance(a, Launch)]) == 4


def test_a_template_dying_with_every_holder_never_trains_on_from_scratch():
    # No --checkpoint-dir: its workers were the only holders of commit 7. Relaunching them is
    # no failure, but the world they would form has nothing: that is said, not trained over.
    sim, ids = first_world([("localhost", 2)])
    sim.send(Heartbeats(tuple((worker, 7) for worker in ids)))
    out = [a for worker in ids for a in sim.send(TemplateDied(worker))]
    for worker in sim.launched(out):
        sim.ready(worker)
    assert sim.core.round == 1 and not sim.logged("blacklisted")
    assert "every worker holding the training state is gone (last commit 7)" in sim.end().error


def test_a_template_dying_before_it_forks_a_joiner_blacklists_no_host():
    # Two hosts (the host rule): c's template dies before forking c's first worker. c answered
    # (unlike a host that is gone, LaunchFailed): the worker is launched again, nothing judged.
    sim, (a, b) = first_world([("a", 1), ("b", 1)])
    sim.send(HostsFound((("a", 1), ("b", 1), ("c", 1))))
    out = sim.send(TemplateDied("c/0#1"))
    assert [x.worker for x in out if isinstance(x, Launch)] == ["c/0#2"]
    assert sim.logged("worker_exit")[-1]["cause"] == "its template died before forking it"
    assert not sim.logged("blacklisted") and sim.core.first_failure is None and not sim.core.failures
    sim.launched(out)
    sim.ready("c/0#2")
    leave(sim, [a, b], commit=4)
    assert sorted(sim.world()) == ["a/0", "b/0", "c/0"]
    # a host that is really gone still fails the launch, and is blacklisted
    sim.send(HostsFound((("a", 1), ("b", 1), ("c", 1), ("d", 1))))
    sim.send(LaunchFailed("d/0#1", "SSH connection to d port 22: no route to host"))
    assert [e["key"] for e in sim.logged("blacklisted")] == ["d"]


def test_a_failed_launch_of_a_worker_told_to_leave_is_not_a_failure():
    sim, (a, b) = first_world([("a", 1), ("b", 1)])
    sim.send(HostsFound((("a", 1), ("b", 1), ("c", 1))))
    sim.send(HostsFound((("a", 1), ("b", 1))))  # c leaves discovery while its launch runs
    assert Stop("c/0#1", 3.0) in sim.actions
    sim.send(LaunchFailed("c/0#1", "SSH connection to c port 22 refused"))
    assert not sim.logged("blacklisted") and sim.core.first_failure is None
    sim.send(Exited(b, 3))
    assert sim.core.first_failure.startswith("rank 1 on b exited with code 3")
    sim.send(HostsFound((("a", 1), ("b", 1), ("c", 1))))  # c is back: usable
    assert [x.worker for x in sim.actions if isinstance(x, Launch)][-1] == "c/0#2"


def test_a_worker_killed_for_silence_is_never_placed_in_the_next_world():
    sim, (a, b) = first_world([("a", 1), ("b", 1)], liveness_timeout=5.0)
    sim.send(HostsFound((("a", 1), ("b", 1), ("c", 1))))
    (c,) = sim.launched(sim.actions[-3:])
    sim.ready(c)
    sim.send(Heartbeats(((a, 8), (b, 8), (c, 0))))
    sim.ready(b, after=1, commit=9)  # b left for the host update ...
    for _ in range(30):  # ... and then fell silent (SIGSTOP)
        sim.send(Heartbeats(((a, 8), (c, 0))), after=0.2)
        sim.send(Tick(), after=0.0)
    assert Stop(b, 0.0) in sim.actions
    sim.ready(a, after=1, commit=8)
    assert "b/0" not in sim.world() and sim.world() == {"a/0": 0, "c/0": 1}
    assert sim.logged("commit_lost") == [{"newest": 9, "resumed": 8}]


def test_a_member_that_never_leaves_a_broken_world_is_killed_after_the_elastic_timeout():
    sim, (a, b, c) = first_world([("a", 1), ("b", 1), ("c", 1)], elastic_timeout=10.0)
    sim.send(Exited(c, 1))  # the world breaks
    sim.ready(a, after=1, commit=4)
    for _ in range(19):  # b is stuck in user code, its heartbeat thread goes on
        sim.send(Heartbeats(((a, 4), (b, 4))), after=0.5)
        sim.send(Tick(), after=0.0)
    assert Stop(b, 0.0) not in sim.actions
    for _ in range(4):
        sim.send(Heartbeats(((a, 4), (b, 4))), after=0.5)
        sim.send(Tick(), after=0.0)
    assert Stop(b, 0.0) in sim.actions
    (stuck,) = sim.logged("worker_stuck")
    assert stuck["worker"] == b and "--elastic-timeout 10 s" in stuck["reason"]
    sim.send(Exited(b, -9))
    assert sim.world() == {"a/0": 0}


def test_a_commit_that_does_not_load_ends_the_job_naming_it():
    sim, (a, b) = first_world([("a", 1), ("b", 1)], durable=True)
    sim.send(LoadFailed(a, "/ckpt/commit-00000007.pt: no class Net in module __main__"))
    end = sim.end()
    assert end.code == exitcodes.UNLOADABLE and end.error.startswith(
        "rank 0 on a cannot load checkpoint /ckpt/commit-00000007.pt: no class Net in module __main__. "
        "Nothing was deleted.")
    assert not sim.logged("blacklisted") and not sim.logged("round_broken")
    sim.send(Exited(a, exitcodes.UNLOADABLE))  # its exit, and the peers' when stopped, judge nobody
    sim.send(Exited(b, -15))
    assert sim.end().code == exitcodes.UNLOADABLE and not sim.logged("blacklisted")


def test_a_worker_that_could_not_say_why_its_checkpoint_does_not_load_is_not_its_hosts_fault():
    # Exit 65 without the report (the driver did not answer within 5 s; the worker printed the
    # line itself): before, the host was blacklisted for good and the job went on without it.
    sim, (a, b) = first_world([("a", 1), ("b", 1)], durable=True)
    sim.send(Exited(a, exitcodes.UNLOADABLE))
    end = sim.end()
    assert end.code == exitcodes.UNLOADABLE and end.error.startswith("rank 0 on a exited with code 65: a checkpoint")
    assert not sim.logged("blacklisted")


def test_a_checkpoint_rank_0_cannot_write_ends_the_job_naming_it():
    sim, (a, b) = first_world([("a", 1), ("b", 1)], durable=True)
    sim.send(WriteFailed(a, "could not write checkpoint 1 to /ckpt: Untrusted: it holds __main__.Config"))
    end = sim.end()
    assert end.code == 1
    assert end.error == "rank 0 on a could not write checkpoint 1 to /ckpt: Untrusted: it holds __main__.Config"
    sim.send(Exited(a, -15))  # stopped with the job: nobody is judged
    sim.send(Exited(b, -15))
    assert sim.end().code == 1 and not sim.logged("blacklisted")


def test_a_world_re_formed_for_a_host_update_is_not_said_to_roll_back():
    from hvdlite.driver.sentences import sentence
    sim, (a, b) = first_world([("a", 1), ("b", 1)])
    sim.send(HostsFound((("a", 1), ("b", 1), ("c", 1))))
    (c,) = sim.launched(sim.actions[-3:])
    sim.ready(c)  # announced: a and b leave together at their next commit
    leave(sim, [a, b], commit=5)
    (broken,) = sim.logged("round_broken")
    assert broken == {"round": 1, "cause": "hosts updated"}
    assert sentence("round_broken", broken) == \
        "world 1 re-forms for the host update; its members left it at a commit, nobody rolls back"
    assert sim.core.round == 2
    sim.send(Exited(c, -9))  # a failure: the survivors do roll back
    assert sim.logged("round_broken")[-1] == {"round": 2, "cause": "failure"}
    assert sentence("round_broken", sim.logged("round_broken")[-1]) == \
        "world 2 broke; the survivors roll back to their last commit"


def test_a_drained_host_leaves_without_blacklisting_and_its_workers_hand_over():
    sim, ids = first_world([("a", 1), ("b", 1), ("c", 1)], min_np=1)
    sim.send(HostsFound((("a", 1), ("b", 1)), drained=("c",)))
    assert sim.logged("host_drained") == [{"host": "c"}]
    assert sim.logged("hosts_updated")[-1]["reason"] == "slots removed: ['c/0']"
    # the node went away before its worker left: killed, yet no failure
    sim.send(Exited(ids[2], -9))
    assert sim.logged("blacklisted") == [] and sim.core.first_failure is None
    assert sim.logged("worker_exit")[-1]["drained"] is True
    for worker in ids[:2]:
        sim.ready(worker, after=1, commit=1)
    assert sim.world() == {"a/0": 0, "b/0": 1} and sim.end() is None


def test_the_launcher_can_say_a_worker_went_with_its_drained_host():
    sim, ids = first_world([("a", 1), ("b", 1)], min_np=1)
    sim.send(Exited(ids[1], 255, "actor died", drained=True))  # before discovery said so
    assert sim.logged("blacklisted") == [] and sim.core.first_failure is None


def test_a_failed_host_kills_its_workers_as_failed_and_is_blacklisted():
    sim, ids = first_world([("a", 1), ("b", 1), ("c", 1)], min_np=1)
    out = sim.send(HostsFound((("a", 1), ("b", 1)), failed=("c",)))
    assert Stop(ids[2], 0.0) in out
    assert sim.logged("host_failed")[0]["worker"] == ids[2]
    sim.send(Exited(ids[2], -9))
    assert sim.logged("blacklisted") == [{"key": "c", "cooldown": "permanent"}]
    assert "its host failed" in sim.core.first_failure


# ---- leaving at a commit, graceful stops (docs/signals.md) ----------------------------------
def test_a_worker_leaving_at_a_commit_is_no_failure_and_its_slot_waits_for_discovery():
    hosts = (("a", 1), ("b", 1), ("c", 1))
    sim, (a, b, c) = first_world(list(hosts))
    leave(sim, [a, b], commit=7)  # they agreed on c's leave at commit 7 and re-rendezvous
    sim.send(Exited(c, exitcodes.LEFT))
    assert sim.world() == {"a/0": 0, "b/0": 1} and sim.core.round == 2
    assert not sim.logged("blacklisted")
    assert sim.logged("worker_exit")[-1]["left"] and not sim.core.succeeded
    assert not [x for x in sim.actions if isinstance(x, Launch) and x.slot == "c/0"][1:]
    sim.send(Tick(), after=1.0)
    assert len([x for x in sim.actions if isinstance(x, Launch) and x.slot == "c/0"]) == 1
    sim.send(HostsFound(hosts[:2]))  # c leaves discovery, then comes back: usable again
    out = sim.send(HostsFound(hosts))
    assert [x.slot for x in out if isinstance(x, Launch)] == ["c/0"]


def test_a_worker_killed_by_the_driver_is_a_failure_whatever_its_code():
    sim, (a, b) = first_world([("a", 1), ("b", 1)], liveness_timeout=1.0)
    sim.send(Heartbeats(((a, 1), (b, 1))))
    sim.send(Heartbeats(((a, 2),)), after=1.5)
    sim.send(Tick())
    sim.send(Exited(b, exitcodes.LEFT))
    assert [f["key"] for f in sim.logged("blacklisted")] == ["b"]


def stopping(durable, signum=signal.SIGUSR1):
    sim, (a, b) = first_world([("h", 2)], durable=durable, stop_timeout=25.0)
    out = sim.send(StopRequested(signum))
    assert Publish(0, 0, stop=True) in out
    return sim, a, b


@pytest.mark.parametrize("durable, code", [(True, exitcodes.RESUMABLE), (False, 128 + signal.SIGUSR1)])
def test_a_stop_ends_once_every_worker_left_at_its_commit(durable, code):
    sim, a, b = stopping(durable)
    if durable:
        sim.send(Written(12, a))  # rank 0's writer, before its exit
    for w in (a, b):
        sim.send(Exiting(w, commit=12))
        assert sim.end() is None
        sim.send(Exited(w, exitcodes.LEFT))
    assert sim.end() == EndJob(code, None)
    end = sim.logged("job_end")[-1]
    assert end["result"] == "stopped" and end["commit"] == 12 and end["resumable"] is durable
    assert not sim.logged("blacklisted") and not [x for x in sim.actions if isinstance(x, Launch)][2:]


def test_a_stop_tells_a_worker_asking_for_a_world_to_go_and_kills_the_late_ones_in_time():
    sim, a, b = stopping(durable=True)
    assert answers(sim.ready(a, after=1, commit=3), a) == [{"removed": True}]  # rank 0: its exit writes
    sim.send(Written(3, a))
    sim.send(Exited(a, 0))  # told to go: not the job's success
    sim.send(Tick(), after=20.0)
    assert sim.end() is None
    out = sim.send(Tick(), after=6.0)
    assert Stop(b, 0.0) in out and sim.end().code == exitcodes.RESUMABLE
    assert sim.logged("job_end")[-1]["late"] == ["rank 1"]


def test_a_stop_before_any_worker_was_launched_ends_at_once():
    core = ElasticCore(Policy())
    out = core.handle(StopRequested(signal.SIGTERM), 1.0)
    assert out[-1] == EndJob(128 + signal.SIGTERM, None)


def _beat_while(sim, beats, seconds):
    for _ in range(int(seconds / 0.5)):
        sim.send(Heartbeats(beats), after=0.5)
        sim.send(Tick(), after=0.0)


def test_a_member_slow_to_leave_a_broken_world_no_longer_holds_the_next_one():
    sim, (a, b, c) = first_world([("a", 1), ("b", 1), ("c", 1)], liveness_timeout=5.0, elastic_timeout=60.0)
    sim.send(Exited(c, -9))  # the world breaks; b stays in it (pygloo lost its wakeup)
    sim.ready(a, after=1, commit=4)
    _beat_while(sim, ((a, 4), (b, 4)), 4.5)
    assert sim.core.round == 1
    _beat_while(sim, ((a, 4), (b, 4)), 1.5)
    assert sim.core.round == 2 and sim.world() == {"a/0": 0}
    (behind,) = sim.logged("member_left_behind")
    assert behind["worker"] == b and behind["round"] == 1 and 5.0 < behind["after"] < 6.1
    sim.ready(b, after=1, commit=4)  # back: it joins as any joiner, nobody failed
    assert sim.logged("hosts_updated")[-1]["reason"] == "workers ready to join: ['b/0']"
    leave(sim, [a], commit=6)
    assert sim.world() == {"a/0": 0, "b/0": 1}
    assert Stop(b, 0.0) not in sim.actions and not sim.logged("worker_stuck")
    assert [x["key"] for x in sim.logged("blacklisted")] == ["c"]  # only the dead worker's host


def test_a_slow_member_that_alone_holds_the_newest_commit_is_waited_for():
    sim, (a, b, c) = first_world([("a", 1), ("b", 1), ("c", 1)], liveness_timeout=5.0, elastic_timeout=60.0)
    sim.send(Heartbeats(((a, 4), (b, 5), (c, 4))))
    sim.send(Exited(c, -9))
    sim.ready(a, after=1, commit=4)
    _beat_while(sim, ((a, 4), (b, 5)), 20)
    assert sim.core.round == 1 and not sim.logged("member_left_behind")
    sim.ready(b, after=1, commit=5)
    assert sim.world() == {"a/0": 0, "b/0": 1} and sim.logged("round_complete")[-1]["root"] == 1


def test_a_stuck_member_killed_with_the_newest_commit_is_said_lost_when_the_world_forms_without_it():
    sim, (a, b, c) = first_world([("a", 1), ("b", 1), ("c", 1)], liveness_timeout=5.0, elastic_timeout=10.0)
    sim.send(Heartbeats(((a, 4), (b, 5), (c, 4))))
    sim.send(Exited(c, -9))
    sim.ready(a, after=1, commit=4)
    _beat_while(sim, ((a, 4), (b, 5)), 11)  # b never leaves its broken world: killed
    assert Stop(b, 0.0) in sim.actions
    sim.send(Exited(b, -9))
    assert sim.world() == {"a/0": 0}
    assert sim.logged("commit_lost") == [{"newest": 5, "resumed": 4}]


def test_a_left_behind_member_that_never_returns_is_still_killed_after_the_elastic_timeout():
    sim, (a, b, c) = first_world([("a", 1), ("b", 1), ("c", 1)], liveness_timeout=5.0, elastic_timeout=10.0)
    sim.send(Exited(c, -9))
    sim.ready(a, after=1, commit=4)
    _beat_while(sim, ((a, 4), (b, 4)), 9.5)
    assert sim.core.round == 2 and Stop(b, 0.0) not in sim.actions
    _beat_while(sim, ((a, 4), (b, 4)), 1.5)
    assert Stop(b, 0.0) in sim.actions and sim.logged("worker_stuck")[0]["worker"] == b


def test_a_member_silent_since_its_world_broke_is_killed_not_left_behind():
    sim, (a, b, c) = first_world([("a", 1), ("b", 1), ("c", 1)], liveness_timeout=5.0, elastic_timeout=60.0)
    sim.send(Heartbeats(((a, 4), (b, 4), (c, 4))))
    sim.send(Exited(c, -9))
    sim.ready(a, after=1, commit=4)
    _beat_while(sim, ((a, 4),), 6)  # b is hung: what it holds is unknown
    assert not sim.logged("member_left_behind") and sim.logged("worker_unresponsive")[0]["worker"] == b
    sim.send(Exited(b, -9))
    assert sim.world() == {"a/0": 0}


# ---- a member held in a pygloo collective of a broken world (its stand-in beats for it) ----
def _pass(sim, seconds, beats=(), vouched=(), step=0.1):
    """`seconds` of beats and ticks, every `step`."""
    for _ in range(round(seconds / step)):
        sim.send(Heartbeats(beats, vouched), after=step)
        sim.send(Tick(), after=0.0)


def held_world(commit_b=4):
    """a, b, c train at commit 4 (b at `commit_b`); b enters a collective (its own beats stop,
    its stand-in's go on) and c dies; a is back in the rendezvous at once."""
    sim, (a, b, c) = first_world([("a", 1), ("b", 1), ("c", 1)], liveness_timeout=5.0, elastic_timeout=60.0)
    sim.send(Heartbeats(((a, 4), (b, commit_b), (c, 4)), ((b, 1),)))
    sim.send(Exited(c, -9))
    sim.ready(a, after=1, commit=4)
    return sim, a, b


def test_a_member_held_in_a_pygloo_collective_is_left_behind_after_the_grace_and_comes_back_as_a_joiner():
    sim, a, b = held_world()
    _pass(sim, 0.9, ((a, 4),), ((b, 1),))
    assert sim.core.round == 1  # the grace: a survivor whose sockets were cut is back in milliseconds
    _pass(sim, 0.3, ((a, 4),), ((b, 1),))
    assert sim.core.round == 2 and sim.world() == {"a/0": 0}
    (behind,) = sim.logged("member_left_behind")
    assert behind["worker"] == b and behind["held"] and 1.0 < behind["after"] < 1.2
    _pass(sim, 30, ((a, 4),), ((b, 1),), step=0.5)  # gloo's 30 s: it beats, nothing kills it
    assert not [s for s in sim.actions if isinstance(s, Stop) and s.worker == b]
    sim.ready(b, after=1, commit=4)  # its send timed out: it joins as any joiner
    assert sim.logged("hosts_updated")[-1]["reason"] == "workers ready to join: ['b/0']"
    leave(sim, [a], commit=6)
    assert sim.world() == {"a/0": 0, "b/0": 1}
    assert [x["key"] for x in sim.logged("blacklisted")] == ["c"]


def test_a_held_member_that_alone_holds_the_newest_commit_is_waited_for():
    sim, a, b = held_world(commit_b=5)
    _pass(sim, 10, ((a, 4),), ((b, 1),), step=0.5)
    assert sim.core.round == 1 and not sim.logged("member_left_behind")
    sim.ready(b, after=1, commit=5)
    assert sim.world() == {"a/0": 0, "b/0": 1} and sim.logged("round_complete")[-1]["root"] == 1


@pytest.mark.parametrize("own, vouched", [(True, True), (True, False), (False, "an older round")])
def test_a_member_not_held_in_a_collective_of_the_broken_world_is_left_behind_only_after_the_liveness_timeout(
        own, vouched):
    # Its own beats go on (out of any collective, or a torch worker, which has no stand-in), or
    # its stand-in holds no group of the broken world: the rule of --liveness-timeout stands.
    sim, (a, b, c) = first_world([("a", 1), ("b", 1), ("c", 1)], liveness_timeout=5.0, elastic_timeout=60.0)
    sim.send(Exited(c, -9))
    sim.ready(a, after=1, commit=4)
    beats = ((a, 4), (b, 4)) if own else ((a, 4),)
    stand_in = ((b, 1),) if vouched is True else ((b, 0),) if vouched else ()
    _pass(sim, 4.8, beats, stand_in)
    assert sim.core.round == 1 and not sim.logged("member_left_behind")
    _pass(sim, 0.4, beats, stand_in)
    assert sim.core.round == 2 and sim.world() == {"a/0": 0}
    assert "held" not in sim.logged("member_left_behind")[0]


def test_a_member_whose_beats_a_starved_driver_did_not_read_is_not_taken_for_held():
    sim, a, b = held_world()
    _pass(sim, 2.0, ((a, 4), (b, 4)), ((b, 1),))  # b's own beats: it is out of any collective
    sim.send(Tick(), after=3.0)  # the driver did not run for 3 s
    sim.send(Heartbeats((), ((b, 1),)))  # its stand-in's beat is read before b's own
    assert sim.core.round == 1 and not sim.logged("member_left_behind")
    _pass(sim, 0.5, ((a, 4), (b, 4)), ((b, 1),))
    assert sim.core.round == 1 and not sim.logged("member_left_behind")


def test_a_left_behind_member_holding_the_newest_commit_is_waited_for_once_the_others_holding_it_died():
    # Found by the stateful model (on a member stuck in user code, left behind after 5 s): the
    # job ended "every worker holding the training state is gone" while it lived.
    sim, (a, b, c, d) = first_world([("a", 1), ("b", 1), ("c", 1), ("d", 1)], liveness_timeout=5.0,
                                    elastic_timeout=60.0)
    sim.send(Heartbeats(((a, 4), (b, 4), (c, 4), (d, 4)), ((b, 1),)))
    sim.send(Exited(c, -9))
    leave(sim, [a, d], commit=4)
    _pass(sim, 1.2, ((a, 4), (d, 4)), ((b, 1),))
    assert sim.world() == {"a/0": 0, "d/0": 1} and sim.logged("member_left_behind")
    (e,) = sim.launched(sim.send(HostsFound((("a", 1), ("b", 1), ("c", 1), ("d", 1), ("e", 1)))))
    sim.ready(e, commit=0)
    sim.send(Exited(a, -9))
    sim.send(Exited(d, -9))
    _pass(sim, 5, (), ((b, 1),), step=0.5)
    assert sim.end() is None and sim.core.round == 2
    sim.ready(b, after=1, commit=4)
    assert sim.world() == {"b/0": 0, "e/0": 1}


def _rank0_dies_and_the_survivor_waits(sim, a, b, commit=41):
    sim.send(Written(1, a))  # --checkpoint-interval held back every write after the first
    sim.send(Heartbeats(((a, commit), (b, commit))))
    sim.send(Exited(a, -9))
    sim.ready(b, after=1, commit=commit)  # it waits for --min-np 2
    assert sim.core.round == 1


def test_a_stop_while_only_a_non_writer_holds_the_newest_commit_forms_one_last_world_to_write_it():
    sim, (a, b) = first_world([("h", 2)], min_np=2, durable=True)
    _rank0_dies_and_the_survivor_waits(sim, a, b)
    sim.send(StopRequested(signal.SIGTERM))
    assert sim.core.round == 2 and sim.world() == {"h/1": 0} and sim.logged("round_complete")[-1]["last"]
    assert answers(sim.ready(b, after=2, commit=41), b) == [{"removed": True}]  # synced, offered
    sim.send(Written(41, b))  # as it exits
    sim.send(Exited(b, 0))
    assert sim.end().code == exitcodes.RESUMABLE and sim.logged("job_end")[-1]["commit"] == 41


def test_a_stop_names_only_the_commit_the_disk_holds():
    sim, (a, b) = first_world([("h", 2)], min_np=2, durable=True)
    _rank0_dies_and_the_survivor_waits(sim, a, b)
    sim.send(StopRequested(signal.SIGTERM))
    sim.send(Exited(b, -9))  # the last world's member dies before it wrote
    end = sim.logged("job_end")[-1]
    assert sim.end().code == exitcodes.RESUMABLE and end["commit"] == 1 and end["newest"] == 41


def test_the_min_np_timeout_writes_the_newest_commit_before_the_job_ends():
    sim, (a, b) = first_world([("h", 2)], min_np=2, durable=True, elastic_timeout=10.0)
    _rank0_dies_and_the_survivor_waits(sim, a, b)
    _beat_while(sim, ((b, 41),), 11.0)
    assert sim.end() is None and sim.logged("round_complete")[-1]["last"]
    assert answers(sim.ready(b, after=2, commit=41), b) == [{"removed": True}]
    sim.send(Written(41, b))
    sim.send(Exited(b, 0))
    assert sim.end().code == 1 and sim.end().error.startswith("fewer than --min-np 2")
    assert sim.end().error.endswith("; commit 41 is in --checkpoint-dir")


def test_a_leaver_holding_the_only_copy_hands_it_over_to_the_next_joiner_before_it_goes():
    sim, (a,) = first_world([("h", 1)], max_np=2)
    sim.send(Heartbeats(((a, 7),)))
    sim.send(HostsFound((("h", 2),)))
    joiner = [x.worker for x in sim.actions if isinstance(x, Launch)][-1]
    sim.send(Leaving(a))
    assert answers(sim.ready(a, after=1, commit=8), a) == []  # nobody else holds commit 8
    sim.send(Launched(joiner, 99))
    sim.ready(joiner, after=-1, commit=0)
    assert sim.core.round == 2 and sim.world() == {"h/0": 0, "h/1": 1}
    assert sim.logged("round_complete")[-1]["handover"] and sim.logged("round_complete")[-1]["commit"] == 8
    sim.ready(joiner, after=2, commit=8)
    assert answers(sim.ready(a, after=2, commit=8), a) == [{"removed": True}]
    assert sim.core.round == 3 and sim.world() == {"h/1": 0} and sim.logged("round_complete")[-1]["commit"] == 8
    sim.send(Exited(a, exitcodes.LEFT))
    assert sim.logged("worker_exit")[-1]["left"] and not sim.logged("blacklisted")


def test_a_leaver_whose_commit_another_worker_holds_goes_at_once():
    sim, (a, b) = first_world([("h", 2)])
    sim.send(Leaving(a))
    sim.ready(b, after=1, commit=5, rolled_back=False)
    assert answers(sim.ready(a, after=1, commit=5, rolled_back=False), a) == [{"removed": True}]
    assert sim.logged("round_broken")[-1]["cause"] == "a worker left"


def test_a_leaver_nobody_takes_the_state_from_goes_after_the_stop_timeout_and_the_loss_is_said():
    sim, (a,) = first_world([("h", 1)], max_np=2, stop_timeout=5.0)
    sim.send(Leaving(a))
    assert answers(sim.ready(a, after=1, commit=8), a) == []
    assert answers(sim.send(Tick(), after=6.0), a) == [{"removed": True}]
    sim.send(Exited(a, exitcodes.LEFT))
    sim.send(HostsFound((("h", 2),)))
    joiner = [x.worker for x in sim.actions if isinstance(x, Launch)][-1]
    sim.send(Launched(joiner, 99))
    sim.ready(joiner, after=-1, commit=0)
    assert sim.end().code == 1 and "every worker holding the training state is gone (last commit 8)" in sim.end().error


def test_a_stop_while_workers_start_on_a_folder_holding_a_checkpoint_is_resumable():
    core = ElasticCore(Policy(durable=True), on_disk=5)
    core.handle(HostsFound((("h", 2),)), 0.0)
    out = core.handle(StopRequested(signal.SIGTERM), 0.1)
    for x in out:
        if isinstance(x, Stop):
            out = core.handle(Exited(x.worker, -15), 0.2)
    assert out[-1] == EndJob(exitcodes.RESUMABLE, None)


def test_a_sole_holder_waiting_between_worlds_that_gets_sigterm_waits_to_hand_over():
    sim, (a, b) = first_world([("h", 2)], min_np=2)
    sim.send(Exited(b, -9))  # b's slot is blacklisted: a waits for --min-np with commit 6
    assert answers(sim.ready(a, after=1, commit=6), a) == []
    assert answers(sim.send(Leaving(a)), a) == []  # SIGTERM while it waits: nobody else holds 6
    assert sim.logged("worker_leaving")[-1]["slot"] == "h/0"


# ---- a lost node (decisions/nodeloss.py) ------------------------------------------------
def probes(out):
    return [a.worker for a in out if isinstance(a, Probe)]


def test_a_broken_link_probes_the_peer_and_a_silent_node_ends_it_at_once():
    sim, (a, b, c) = first_world([("a", 1), ("b", 1), ("c", 1)])
    sim.send(Heartbeats(((a, 0), (b, 0), (c, 0))))
    assert probes(sim.send(LinkBroken(a, (c,)))) == [c]
    assert probes(sim.send(LinkBroken(b, (c,)))) == []  # one probe per suspicion
    out = sim.send(Probed(c, SILENT), after=0.4)
    assert Stop(c, 0.0) in out and not sim.core.workers[c].alive
    assert sim.core.broken == 1 and [f["key"] for f in sim.logged("blacklisted")] == ["c"]
    leave(sim, [a, b])
    assert sim.core.round == 2 and sorted(sim.world()) == ["a/0", "b/0"]


def silence(sim, quiet, seconds, answer=LISTENING):
    """Up to `seconds` of ticks in which `quiet` is never heard (until it ends) and each probe
    is answered `answer` at once; returns when each probe was asked for."""
    asked = []
    heard = tuple((w, 0) for w in sim.core.workers if w != quiet and sim.core.workers[w].alive)
    for _ in range(round(seconds / 0.1)):
        if not sim.core.workers[quiet].alive:
            break
        out = sim.send(Tick(), after=0.1)
        sim.send(Heartbeats(heard), after=0.0)
        asked += [sim.now] * len(probes(out))
        for worker in probes(out):
            sim.send(Probed(worker, answer), after=0.0)
    return asked


def test_a_paused_worker_whose_node_answers_is_probed_on_and_waits_for_the_liveness_timeout():
    sim, (a, b) = first_world([("a", 1), ("b", 1)], liveness_timeout=5.0)
    sim.send(Heartbeats(((a, 0), (b, 0))))
    start = sim.now
    asked = silence(sim, b, 4.5)
    assert asked[0] - start == pytest.approx(0.7)  # probe_after 0.6, on the next tick
    gaps = [y - x for x, y in zip(asked, asked[1:])]
    assert len(asked) >= 4 and min(gaps) >= REPROBE - 1e-9, asked  # probed on, never faster
    assert sim.core.workers[b].alive and not sim.core.workers[b].killed and sim.core.broken == 0
    silence(sim, b, 1.0)
    assert sim.core.workers[b].killed and sim.logged("worker_unresponsive")


def test_a_worker_stopped_for_minutes_gets_few_probes():
    """Each probe leaves its connects in the stopped worker's accept queue (worker/probed.py)."""
    sim, (a, b) = first_world([("a", 1), ("b", 1)], liveness_timeout=600.0)
    sim.send(Heartbeats(((a, 0), (b, 0))))
    asked = silence(sim, b, 590)
    assert sim.core.workers[b].alive and len(asked) * ATTEMPTS < BACKLOG / 2, len(asked)


def test_a_node_lost_just_after_a_probe_found_it_listening_is_known_at_the_next():
    """Under load a late beat is probed often: the node dies after such a probe, the worker is
    never heard again (the lost-node tests of a CI run waited out the liveness timeout)."""
    sim, (a, b, c) = first_world([("a", 1), ("b", 1), ("c", 1)], liveness_timeout=15.0)
    sim.send(Heartbeats(((a, 0), (b, 0), (c, 0))))
    assert silence(sim, c, 0.7)  # probed once: listening
    lost = sim.now
    # its node died: a survivor's link to it broke, news that a probe answers at once
    assert probes(sim.send(LinkBroken(a, (c,)))) == [c]
    sim.send(Probed(c, REFUSED), after=0.05)
    silence(sim, c, 1.5, answer=REFUSED)
    assert not sim.core.workers[c].alive and sim.logged("worker_exit")[-1]["node"] == REFUSED
    assert sim.logged("blacklisted")[-1]["key"] == "c"
    assert sim.now - lost <= 0.1 + EXIT_WAIT + 0.1  # the exit its launcher did not report


def test_a_link_broken_while_a_probe_was_in_flight_is_probed_at_the_next_tick():
    sim, (a, b, c) = first_world([("a", 1), ("b", 1), ("c", 1)], liveness_timeout=15.0)
    sim.send(Heartbeats(((a, 0), (b, 0), (c, 0))))
    assert probes(sim.send(LinkBroken(a, (c,)))) == [c]
    assert probes(sim.send(LinkBroken(b, (c,)))) == []  # one probe at a time
    sim.send(Probed(c, LISTENING))  # begun before b's link broke
    assert probes(sim.send(Tick(), after=0.1)) == [c]


def test_a_silent_probe_of_a_worker_heard_since_it_began_changes_nothing():
    sim, (a, b) = first_world([("a", 1), ("b", 1)])
    sim.send(Heartbeats(((a, 0), (b, 0))))
    assert probes(sim.send(LinkBroken(a, (b,)))) == [b]
    sim.send(Heartbeats(((b, 0),)))  # a dropped SYN or three, but its heartbeats come through
    sim.send(Probed(b, SILENT))
    assert sim.core.workers[b].alive and not sim.logged("blacklisted")


def test_a_refused_probe_means_the_process_is_gone():
    sim, (a, b) = first_world([("a", 1), ("b", 1)])
    sim.send(Heartbeats(((a, 0), (b, 0))))
    sim.send(LinkBroken(a, (b,)))
    sim.send(Probed(b, REFUSED))
    assert sim.core.workers[b].alive  # its launcher may still report the exit, which says why
    sim.send(Tick(), after=0.6)
    assert not sim.core.workers[b].alive and sim.logged("worker_exit")[-1]["node"] == REFUSED


def test_a_refused_workers_exit_reported_meanwhile_says_why():
    sim, (a, b) = first_world([("a", 1), ("b", 1)])
    sim.send(Heartbeats(((a, 0), (b, 0))))
    sim.send(LinkBroken(a, (b,)))
    sim.send(Probed(b, REFUSED))
    sim.send(Exited(b, 1, "ValueError: injected"), after=0.1)
    sim.send(Tick(), after=0.6)
    assert "node" not in sim.logged("worker_exit")[-1]
    assert sim.core.failures == ["rank 1 on b exited with code 1 (ValueError: injected)"]
