"""Reading a --checkpoint-dir outside a job: the newest commit, through the loader a resuming
worker uses (checked, and running no code), into a model for evaluation or export.

    model = Net()
    found = hvd.load_checkpoint("ckpt", model=model)   # the weights of the newest commit
    print(found.commit, found.values["epoch"])

No hvd.init(), no driver: a plain Python process.
"""
from dataclasses import dataclass

from hvdlite.torch.statehandlers import handler_for
from hvdlite.worker import checkpointdir


@dataclass(frozen=True)
class Checkpoint:
    commit: int  # the commit (training step) the file holds
    lineage: str  # the training it belongs to (docs/durable-commits.md#lineages-several-runs-in-one-folder)
    path: str
    values: dict  # the TorchState's plain values, by keyword (epoch=..., batch=...)
    objects: dict  # what the TorchState's models, optimizers, ... saved, by keyword (a state_dict)


def load_checkpoint(directory: str, lineage: str = None, **into) -> Checkpoint:
    """The newest commit in `directory` (of `lineage`, default the newest lineage there); each
    keyword's object (model=..., optimizer=...) takes what the TorchState keyword of that name
    saved, in place, as a resuming worker's would. FileNotFoundError when the folder holds no
    checkpoint; CorruptCheckpoint or Untrusted when the newest does not load (classes of your
    own in the state need hvd.elastic.trust(), as in the job); KeyError for a keyword the
    checkpoint lacks."""
    tried = None
    while True:
        newest = checkpointdir.newest(directory, lineage)
        if newest is None:
            raise FileNotFoundError(f"no checkpoint in {directory}"
                                    + (f" of lineage {lineage}" if lineage else ""))
        commit, found_lineage, path = newest
        try:
            snapshot = checkpointdir.load(path, commit, found_lineage)
            break
        except FileNotFoundError:
            if newest == tried:  # still listed, still not there: not a running job's pruning
                raise
            tried = newest  # pruned meanwhile by a job writing a newer one
    saved = snapshot.get("handlers", {})
    missing = sorted(set(into) - set(saved))
    if missing:
        raise KeyError(f"{path} holds no {', '.join(missing)}: its TorchState's objects are "
                       f"{', '.join(sorted(saved)) or 'none'}")
    for name, target in into.items():
        handler = handler_for(target)
        if handler is None:
            raise TypeError(f"{name}: {type(target).__name__} has no state handler (a model, an "
                            f"optimizer, a scheduler, a sampler or a registered type)")
        handler.load_saved(saved[name])
        handler.restore()
    return Checkpoint(commit, found_lineage, path, dict(snapshot["values"]), saved)
