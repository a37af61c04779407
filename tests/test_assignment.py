from hvdlite.driver.decisions.assignment import assign


def table(slots):
    return [(s.hostname, s.rank, s.size, s.local_rank, s.local_size, s.cross_rank, s.cross_size)
            for s in slots]


def test_uneven_hosts():
    assert table(assign([("a", 2), ("b", 1), ("c", 3)])) == [
        ("a", 0, 6, 0, 2, 0, 3),
        ("a", 1, 6, 1, 2, 0, 2),
        ("b", 2, 6, 0, 1, 1, 3),
        ("c", 3, 6, 0, 3, 2, 3),
        ("c", 4, 6, 1, 3, 1, 2),
        ("c", 5, 6, 2, 3, 0, 1),
    ]


def test_max_np_cuts_the_last_host_short_and_skips_the_rest():
    assert table(assign([("a", 2), ("b", 3), ("c", 1)], max_np=3)) == [
        ("a", 0, 3, 0, 2, 0, 2),
        ("a", 1, 3, 1, 2, 0, 1),
        ("b", 2, 3, 0, 1, 1, 2),
    ]


def test_host_order_decides_ranks():
    assert [s.hostname for s in assign([("z", 1), ("a", 1)])] == ["z", "a"]


def test_env_carries_horovod_and_torch_names():
    e = assign([("a", 1), ("b", 1)])[1].env()
    assert e["HVDLITE_RANK"] == e["RANK"] == "1"
    assert e["HVDLITE_SIZE"] == e["WORLD_SIZE"] == "2"
    assert e["HVDLITE_CROSS_RANK"] == "1" and e["HVDLITE_HOSTNAME"] == "b"
    assert (e["ROLE_RANK"], e["ROLE_WORLD_SIZE"], e["GROUP_RANK"], e["GROUP_WORLD_SIZE"]) == ("1", "2", "1", "2")


def test_no_hosts_no_slots():
    assert assign([]) == [] and assign([("a", 2)], max_np=0) == []
