"""What a horovod.torch 0.28.1 script (gloo-only build) sees before init(), and the timeline
written where Horovod writes it (rank 0's path), with every rank's collectives by name."""
import inspect
import json
import os

import pytest
import torch

import gloo_harness
import hvdlite.torch as hvd
from hvdlite.torch import runtime


def test_before_init_as_horovod():
    assert not runtime.is_initialized()
    assert hvd.gloo_built() is True and hvd.gloo_enabled() is False  # gloo is enabled by init()
    # a version number, 0: none (torch's CPU build has no NCCL)
    assert type(hvd.nccl_built()) is int and (hvd.nccl_built() > 0) is torch.distributed.is_nccl_available()
    with pytest.raises(ValueError, match="MPI is not enabled"):
        hvd.mpi_threads_supported()
    assert hvd.global_process_set.ranks is None
    for call in (lambda: hvd.start_timeline("t.json"), hvd.stop_timeline):
        with pytest.raises(ValueError, match=r"hvd\.init\(\)"):
            call()


def _shared_path():
    # The harness's store sits in the run's own temporary directory, the same for every rank.
    return os.path.join(os.path.dirname(gloo_harness._store_path), "timeline.json")


def check_every_rank_lands_in_rank0s_file():
    rank, size = runtime.info().rank, runtime.info().size
    path = _shared_path()
    assert hvd.global_process_set.ranks == list(range(size))
    hvd.start_timeline(path)
    hvd.allreduce(torch.ones(3), name="loss")
    hvd.synchronize(hvd.broadcast_async(torch.ones(2), 0, name="weights"))
    hvd.barrier()
    for turn in range(size):  # rank 0 stops first: later ranks add their part to its file
        if turn == rank:
            hvd.stop_timeline()
            assert os.path.exists(path)
        hvd.barrier()
    with open(path) as f:
        spans = [(e["name"], e["args"]["op"], e["pid"]) for e in json.load(f)["traceEvents"] if e["ph"] == "B"]
    assert sorted({(name, op) for name, op, _ in spans}) == [
        ("barrier", "barrier"), ("loss", "allreduce"), ("weights", "broadcast")], spans
    assert len({pid for _, _, pid in spans}) == size, spans


def test_the_timeline_holds_every_rank_at_rank0s_path():
    gloo_harness.run(check_every_rank_lands_in_rank0s_file, 3)


# Every public name of horovod.torch and horovod.torch.elastic 0.28.1, with its parameters as
# Horovod's sources write them (made by tests/horovod_api.py from a Horovod 0.28.1 checkout).
with open(os.path.join(os.path.dirname(__file__), "horovod_api.json")) as f:
    HOROVOD_API = json.load(f)


def _ours(name):
    """hvdlite's object for one of Horovod's names; `DistributedOptimizer().m` is method m of
    the optimizer DistributedOptimizer returns."""
    if name.startswith("DistributedOptimizer()."):
        model = torch.nn.Linear(1, 1)
        obj = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                       named_parameters=model.named_parameters())
        name = name.split(".", 1)[1]
    else:
        obj = hvd
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj


def signature_differences(obj, theirs):
    """How obj's parameters differ from Horovod's (name, kind and default, in order); hvdlite
    may add parameters after Horovod's when each has a default."""
    ours = list(inspect.signature(obj).parameters.values())
    found = []
    for i, (name, kind, default) in enumerate(theirs):
        if i >= len(ours):
            found.append(f"lacks {name}")
            continue
        p = ours[i]
        if (p.name, p.kind.name) != (name, kind):
            found.append(f"{p.name} ({p.kind.name}) where Horovod has {name} ({kind})")
        elif default is None and p.default is not p.empty:
            found.append(f"{name}={p.default!r} where Horovod has no default")
        elif default is not None and (p.default is p.empty or p.default != eval(default, vars(hvd))):
            found.append(f"{name}={p.default!r} where Horovod has {name}={default}")
    found += [f"an added {p.name} without a default" for p in ours[len(theirs):]
              if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    return found


# What is left different on purpose; docs/horovod-differences.md says why.
KNOWN = {
    "DistributedOptimizer().find_duplicates": None,  # absent
    "DistributedOptimizer().load_state_dict": [
        "state_dict (POSITIONAL_OR_KEYWORD) where Horovod has args (VAR_POSITIONAL)", "lacks kwargs"],
}


@pytest.mark.parametrize("name", sorted(HOROVOD_API))
def test_every_horovod_name_with_its_signature(name):
    try:
        obj = _ours(name)
    except AttributeError:
        assert name in KNOWN and KNOWN[name] is None, f"hvdlite lacks {name}"
        return
    found = [] if HOROVOD_API[name] is None else signature_differences(obj, HOROVOD_API[name])
    assert found == (KNOWN.get(name) or []), name


def test_the_known_differences_are_documented():
    with open(os.path.join(os.path.dirname(__file__), "..", "docs", "horovod-differences.md")) as f:
        page = f.read()
    for name in KNOWN:
        assert f"`{name.rsplit('.', 1)[1]}" in page, name


def test_a_planted_difference_is_caught():
    def allreduce(tensor, average=None, name=None, compression=hvd.Compression.none, op=None,
                  prescale_factor=2.0, postscale_factor=1.0, process_set=hvd.global_process_set):
        pass
    assert signature_differences(allreduce, HOROVOD_API["allreduce"]) == [
        "prescale_factor=2.0 where Horovod has prescale_factor=1.0"]


def test_the_list_is_horovods():
    """Made anew from Horovod's sources when HOROVOD_SOURCE names a 0.28.1 checkout."""
    root = os.environ.get("HOROVOD_SOURCE")
    if not root:
        pytest.skip("set HOROVOD_SOURCE to a Horovod 0.28.1 checkout to check horovod_api.json against it")
    import horovod_api
    assert horovod_api.api(root) == HOROVOD_API


def test_the_state_reset_hook_runs_at_every_reset():
    calls = []

    class Mine(hvd.elastic.ObjectState):
        def reset(self):
            calls.append("reset")

    state = Mine(epoch=0)
    state.register_reset_callbacks([lambda: calls.append("callback")])
    state.on_reset()
    assert calls == ["reset", "callback"]


def test_a_process_set_takes_ranks_only():
    assert hvd.ProcessSet(ranks_or_comm=[2, 0]).ranks == [0, 2]
    assert hvd.ProcessSet(r for r in (3, 1)).ranks == [1, 3]  # any iterable, as Horovod's
    for wrong in (object(), "01", [0.0, 1]):
        with pytest.raises(ValueError, match="list of ranks"):
            hvd.ProcessSet(wrong)
    unadded = hvd.ProcessSet([0])  # as Horovod's before add_process_set
    assert (unadded.process_set_id, unadded.mpi_comm, unadded.size(), unadded.rank()) == (None, None, None, None)
