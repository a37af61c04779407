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


# Horovod 0.28.1's parameters, in order, of every public name of horovod.torch and
# horovod.torch.elastic (read from its sources); hvdlite may add parameters after them.
HOROVOD_PARAMETERS = {
    'allgather_object': 'obj name',
    'broadcast_object': 'obj root_rank name process_set',
    'broadcast_optimizer_state': 'optimizer root_rank model',
    'broadcast_parameters': 'params root_rank',
    'allreduce': 'tensor average name compression op prescale_factor postscale_factor process_set',
    'allreduce_async': 'tensor average name op prescale_factor postscale_factor process_set',
    'allreduce_': 'tensor average name op prescale_factor postscale_factor process_set',
    'allreduce_async_': 'tensor average name op prescale_factor postscale_factor process_set',
    'grouped_allreduce': 'tensors average name compression op prescale_factor postscale_factor process_set',
    'grouped_allreduce_async': 'tensors average name op prescale_factor postscale_factor process_set',
    'grouped_allreduce_': 'tensors average name op prescale_factor postscale_factor process_set',
    'grouped_allreduce_async_': 'tensors average name op prescale_factor postscale_factor process_set',
    'sparse_allreduce_async': 'tensor name op process_set',
    'allgather': 'tensor name process_set',
    'allgather_async': 'tensor name process_set',
    'grouped_allgather': 'tensors name process_set',
    'grouped_allgather_async': 'tensors name process_set',
    'broadcast': 'tensor root_rank name process_set',
    'broadcast_async': 'tensor root_rank name process_set',
    'broadcast_': 'tensor root_rank name process_set',
    'broadcast_async_': 'tensor root_rank name process_set',
    'alltoall': 'tensor splits name process_set',
    'alltoall_async': 'tensor splits name process_set',
    'reducescatter': 'tensor name compression op process_set prescale_factor postscale_factor',
    'reducescatter_async': 'tensor name op process_set prescale_factor postscale_factor',
    'grouped_reducescatter': 'tensors name compression op process_set prescale_factor postscale_factor',
    'grouped_reducescatter_async': 'tensors name op process_set prescale_factor postscale_factor',
    'join': 'device',
    'barrier': 'process_set',
    'poll': 'handle',
    'synchronize': 'handle',
    'is_initialized': '',
    'start_timeline': 'file_path mark_cycles',
    'stop_timeline': '',
    'size': '',
    'local_size': '',
    'cross_size': '',
    'rank': '',
    'local_rank': '',
    'cross_rank': '',
    'mpi_threads_supported': '',
    'mpi_enabled': '',
    'mpi_built': '',
    'gloo_enabled': '',
    'gloo_built': '',
    'nccl_built': '',
    'ddl_built': '',
    'ccl_built': '',
    'cuda_built': '',
    'rocm_built': '',
    'ProcessSet': 'ranks_or_comm',
    'add_process_set': 'process_set',
    'remove_process_set': 'process_set',
    'DistributedOptimizer': 'optimizer named_parameters compression backward_passes_per_step op gradient_predivide_factor num_groups groups sparse_as_dense process_set',
    'SyncBatchNorm': 'num_features eps momentum affine track_running_stats',
    "elastic.run": "func",
    "elastic.TorchState": "model optimizer",
    "elastic.ElasticSampler": "dataset shuffle seed",
    "elastic.ElasticSampler.set_epoch": "self epoch",
    "elastic.ElasticSampler.record_batch": "self batch_idx batch_size",
    "elastic.ElasticSampler.load_state_dict": "self state_dict",
    "elastic.ElasticSampler.state_dict": "self",
    "elastic.ElasticSampler.reset": "self",
    "elastic.TorchState.save": "self",
    "elastic.TorchState.restore": "self",
    "elastic.TorchState.sync": "self",
    "elastic.TorchState.reset": "self",
    "elastic.TorchState.commit": "self",
    "elastic.TorchState.check_host_updates": "self",
    "elastic.TorchState.register_reset_callbacks": "self callbacks",
    "elastic.TorchState.on_reset": "self",
}


@pytest.mark.parametrize("name", sorted(HOROVOD_PARAMETERS))
def test_signatures_as_horovods(name):
    obj = hvd
    for part in name.split("."):
        obj = getattr(obj, part)
    ours = [p.name for p in inspect.signature(obj).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    theirs = HOROVOD_PARAMETERS[name].split()
    assert ours[:len(theirs)] == theirs, f"{name}{tuple(ours)} against Horovod's {tuple(theirs)}"


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
    with pytest.raises(ValueError, match="list of ranks"):
        hvd.ProcessSet(object())
