"""What a horovod.torch 0.28.1 script (gloo-only build) sees before init(), and the timeline
written where Horovod writes it (rank 0's path), with every rank's collectives by name."""
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
    assert hvd.nccl_built() == 0 and type(hvd.nccl_built()) is int  # a version number, 0: none
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
