"""Pure decisions of the elastic driver, driven without processes."""
from hvdlite.discovery.hostset import diff, reorder
from hvdlite.driver.decisions.blacklist import Blacklist
from hvdlite.driver.decisions.plan import Candidate, best_holder, free_slots, plan_world, prospective_places


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
    return {key.split("#")[0]: slot.rank for key, slot in plan}


def c(slot, commit, previous_rank=None):
    return Candidate(slot + "#1", slot, slot.split("/")[0], commit, previous_rank)


def root(plan):
    (rank,) = {slot.root for _, slot in plan}
    return next(key.split("#")[0] for key, slot in plan if slot.rank == rank)


def test_the_holder_of_the_newest_commit_is_the_root_and_ranks_stay():
    plan = plan_world([("a", 2), ("b", 2)], [c("a/0", 5, 0), c("a/1", 5, 1), c("b/0", 6, 2), c("b/1", 0)])
    assert ranks(plan) == {"a/0": 0, "a/1": 1, "b/0": 2, "b/1": 3}
    assert root(plan) == "b/0"


def test_a_new_worker_holding_nothing_is_never_the_root():
    plan = plan_world([("new", 1), ("old", 1)], [c("new/0", 0), c("old/0", 3, 1)])
    assert ranks(plan) == {"new/0": 0, "old/0": 1} and root(plan) == "old/0"


def test_a_relaunch_takes_back_its_slots_rank():
    """Rank 0 (a/0) died and was relaunched: the new a/0 is rank 0 again, synced from rank 1."""
    last = {"a/0": 0, "a/1": 1, "b/0": 2}
    plan = plan_world([("a", 2), ("b", 1)], [c("b/0", 4, 2), c("a/1", 4, 1), c("a/0", 0)], last_ranks=last)
    assert ranks(plan) == last and root(plan) == "a/1"
    assert [(s.local_rank, s.local_size, s.cross_rank) for _, s in plan] == [(0, 2, 0), (1, 2, 0), (0, 1, 1)]


def test_a_spare_slot_takes_the_rank_it_replaces():
    last = {"a/0": 0, "a/1": 1, "b/0": 2, "b/1": 3}
    plan = plan_world([("a", 2), ("b", 2), ("c", 1)],
                      [c("a/0", 4, 0), c("b/0", 4, 2), c("b/1", 4, 3), c("c/0", 0)], last_ranks=last)
    assert ranks(plan) == {"a/0": 0, "c/0": 1, "b/0": 2, "b/1": 3} and root(plan) == "a/0"
    # a's ranks are 0 alone now, b's 2 and 3: local ranks count a host's slots, hosts in rank order
    assert [(s.hostname, s.local_rank, s.local_size, s.cross_rank, s.cross_size) for _, s in plan] == \
        [("a", 0, 1, 0, 3), ("c", 0, 1, 1, 3), ("b", 0, 2, 2, 3), ("b", 1, 2, 0, 1)]


def test_a_shrunk_world_keeps_the_survivors_order():
    plan = plan_world([("a", 4)], [c("a/3", 4, 3), c("a/0", 4, 0), c("a/2", 4, 2)])
    assert ranks(plan) == {"a/0": 0, "a/2": 1, "a/3": 2}
    # a hole below the new size is filled by a newcomer, survivors past it keep their order
    plan = plan_world([("a", 4), ("b", 1)], [c("a/3", 4, 3), c("a/0", 4, 0), c("b/0", 0)])
    assert ranks(plan) == {"a/0": 0, "a/3": 1, "b/0": 2}


def test_a_grown_world_appends_newcomers():
    plan = plan_world([("a", 2), ("b", 2)], [c("b/0", 0), c("a/1", 3, 1), c("b/1", 0), c("a/0", 3, 0)],
                      last_ranks={"a/0": 0, "a/1": 1})
    assert ranks(plan) == {"a/0": 0, "a/1": 1, "b/0": 2, "b/1": 3} and root(plan) == "a/0"


def test_first_world_follows_host_order_not_the_alphabet():
    plan = plan_world([("localhost", 2), ("127.0.0.1", 2)],
                      [c("127.0.0.1/0", 0), c("127.0.0.1/1", 0), c("localhost/1", 0), c("localhost/0", 0)])
    assert ranks(plan) == {"localhost/0": 0, "localhost/1": 1, "127.0.0.1/0": 2, "127.0.0.1/1": 3}


def test_slots_are_ordered_by_number_not_as_text():
    plan = plan_world([("h", 12)], [c("h/10", 0), c("h/2", 0), c("h/1", 0)])
    assert ranks(plan) == {"h/1": 0, "h/2": 1, "h/10": 2}


def test_plan_respects_max_np_and_keeps_old_rank_order():
    plan = plan_world([("a", 3)], [c("a/2", 4, 0), c("a/0", 4, 1), c("a/1", 0)], max_np=2)
    assert ranks(plan) == {"a/2": 0, "a/0": 1}
    assert [s.local_rank for _, s in plan] == [1, 0]  # a host's local ranks follow its slot numbers
    # beyond max_np the holder stays in, whatever its seniority
    plan = plan_world([("a", 3)], [c("a/0", 4, 0), c("a/1", 4, 1), c("a/2", 5)], max_np=2)
    assert ranks(plan) == {"a/0": 0, "a/2": 1} and root(plan) == "a/2"


def test_free_slots_skips_occupied_and_blocked():
    blocked = {"a/1", "c"}.__contains__
    assert free_slots([("a", 3), ("b", 1), ("c", 2)], {"a/0"}, blocked, limit=10) == ["a/2", "b/0"]
    assert free_slots([("a", 3), ("b", 1)], set(), blocked, limit=1) == ["a/0"]


def test_best_holder_has_the_newest_commit_then_the_lowest_rank():
    hosts = [("a", 1), ("b", 2), ("c", 1)]
    assert best_holder(hosts, [c("a/0", 3, 0), c("b/0", 4, 2), c("b/1", 4, 1), c("c/0", 9)]).slot == "c/0"
    assert best_holder(hosts, [c("a/0", 3, 0), c("b/0", 4, 2), c("b/1", 4, 1)]).slot == "b/1"


def test_prospective_places_skip_blocked_slots_and_hosts():
    places = prospective_places([("a", 3), ("b", 1), ("c", 1)], {"a/1", "b"}.__contains__)
    assert {slot: (p.rank, p.local_rank, p.size) for slot, p in places.items()} == \
        {"a/0": (0, 0, 3), "a/2": (1, 1, 3), "c/0": (2, 0, 3)}
