"""Pure decisions of the elastic driver, driven without processes."""
from hvdlite.discovery.hostset import diff, reorder
from hvdlite.driver.blacklist import Blacklist
from hvdlite.driver.registry import Candidate, best_survivor, free_slots, plan_world


def test_cooldown_grows_and_is_clamped():
    b = Blacklist((2.0, 10.0), rng=lambda: 0.5)
    assert [b.cooldown(n) for n in range(4)] == [3.0, 5.0, 9.0, 10.0]
    assert Blacklist((2.0, 10.0), rng=lambda: 0.0).cooldown(0) == 2.0


def test_blacklist_with_cooldown_expires():
    b = Blacklist((2.0, 10.0), rng=lambda: 0.0)
    assert b.add("h1", now=100.0) == 102.0
    assert b.blocked("h1", 101.0) and not b.blocked("h2", 101.0)
    assert b.expire(101.0) == [] and b.expire(102.0) == ["h1"]
    assert not b.blocked("h1", 102.0)
    assert b.add("h1", now=200.0) == 204.0  # second time: twice as long


def test_blacklist_without_range_is_permanent():
    b = Blacklist(None)
    assert b.add("h1", now=0.0) is None
    assert b.blocked("h1", 1e9) and b.expire(1e9) == [] and b.permanent("h1")
    assert not Blacklist((1.0, 2.0)).permanent("h1")


def test_diff_classifies():
    assert diff([("a", 1)], [("a", 1), ("b", 2)]).kind == "added"
    assert diff([("a", 1), ("b", 2)], [("a", 1)]).kind == "removed"
    assert diff([("a", 1), ("b", 2)], [("a", 2), ("c", 1)]).kind == "mixed"
    assert diff([("a", 2)], [("a", 1)]).removed == ("a",)
    assert diff([("a", 1)], [("a", 1)]).kind is None


def test_reorder_keeps_survivors_first():
    assert reorder([("a", 1), ("b", 1), ("c", 1)], [("d", 1), ("c", 2), ("a", 1)]) == \
        [("a", 1), ("c", 2), ("d", 1)]


def ranks(plan):
    return {key: slot.rank for key, slot in plan}


def test_rank0_is_the_survivor_with_newest_commit():
    plan = plan_world([("a", 2), ("b", 2)], [
        Candidate("a/0", "a", 5, 0), Candidate("a/1", "a", 5, 1),
        Candidate("b/0", "b", 6, 2), Candidate("b/1", "b", 0, None)])
    assert ranks(plan) == {"b/0": 0, "b/1": 1, "a/0": 2, "a/1": 3}


def test_new_worker_is_never_rank0_while_a_survivor_exists():
    plan = plan_world([("new", 1), ("old", 1)], [
        Candidate("new/0", "new", 0, None), Candidate("old/0", "old", 3, 1)])
    assert ranks(plan) == {"old/0": 0, "new/0": 1}


def test_plan_respects_max_np_and_keeps_old_rank_order():
    plan = plan_world([("a", 3)], [Candidate("a/2", "a", 4, 0), Candidate("a/0", "a", 4, 1),
                                   Candidate("a/1", "a", 0, None)], max_np=2)
    assert ranks(plan) == {"a/2": 0, "a/0": 1}
    assert [s.local_rank for _, s in plan] == [0, 1]


def test_free_slots_skips_occupied_and_blocked():
    blocked = {"a/1", "c"}.__contains__
    assert free_slots([("a", 3), ("b", 1), ("c", 2)], {"a/0"}, blocked, limit=10) == ["a/2", "b/0"]
    assert free_slots([("a", 3), ("b", 1)], set(), blocked, limit=1) == ["a/0"]


def test_best_survivor_has_the_newest_commit_then_the_lowest_rank():
    assert best_survivor([Candidate("a/0", "a", 3, 0), Candidate("b/0", "b", 4, 2),
                          Candidate("b/1", "b", 4, 1), Candidate("c/0", "c", 9, None)]).key == "b/1"
