"""ElasticSampler: an epoch's samples split among a world that may change mid-epoch."""
import math
import random

import torch

from hvdlite.torch import basics
from hvdlite.worker import generators


class ElasticSampler(torch.utils.data.Sampler):
    """Splits an epoch's not yet processed samples among the current world.

    Ranks step in lockstep, so after each rank consumed k samples of its share, the world has
    consumed the first k * size samples of the split (shares are interleaved). That lets every
    rank, and so any survivor, know what the whole world processed, including dead ranks.

    A commit taken once a pass over the epoch's split began records so; the first pass after
    loading such a state (a rollback, a sync) puts the random generators back to the commit's
    once the loader has made its iterator: making it drew the loader's base seed from torch's
    generator, which the uninterrupted run drew once, before the commit (generators.put_back).
    That holds for a commit after the pass's last batch too: the script's loop, re-entered,
    makes an iterator over nothing, a draw the uninterrupted run never made. A set_epoch() to
    another epoch ends that: its pass's draw is one the uninterrupted run made as well.
    """

    def __init__(self, dataset, shuffle=True, seed=0):
        self.dataset, self.shuffle, self.seed = dataset, shuffle, seed
        self.epoch = 0
        self.processed = []  # this epoch's samples finished before the current split
        self.local_done = 0  # samples this rank consumed since the current split
        self._passing = False  # a pass over the current split began
        self._resuming = False  # the next pass resumes one that a commit saw under way
        self.reset()

    def set_epoch(self, epoch):
        """Start `epoch`; calling it again for the current epoch (after a reset) keeps progress."""
        if epoch != self.epoch:
            self.epoch, self.processed, self.local_done = epoch, [], 0
            self.reset()
            self._resuming = False

    def record_batch(self, batch_idx, batch_size):
        """Record that this rank finished batches 0..batch_idx of the current split."""
        self.local_done = min((batch_idx + 1) * batch_size, len(self.indices))

    def record_indices(self, indices):
        self.local_done += len(indices)

    def reset(self):
        """Re-split the remaining samples of the epoch for the current world."""
        self.size, self.rank = (basics.size(), basics.rank()) if basics.is_initialized() else (1, 0)
        done, order = set(self.processed), self._order()
        self.remaining = [i for i in order if i not in done]
        per_rank = math.ceil(len(self.remaining) / self.size) if self.remaining else 0
        # evened out with the epoch's first samples, whenever the split is made: a world of the
        # same size re-split mid-epoch pads as the split at the epoch's start did
        padded = self.remaining + (order * self.size)[:per_rank * self.size - len(self.remaining)]
        self.shares = [padded[r::self.size] for r in range(self.size)]  # every rank's share
        self.indices = self.shares[self.rank]
        self.local_done = 0
        self._passing = False

    def _order(self):
        """The epoch's samples in order: shuffled as Horovod's sampler shuffles them, so that
        a script trains on the same samples in the same order."""
        order = list(range(len(self.dataset)))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(order)
        return order

    def state_dict(self):
        consumed = self.remaining[:self.local_done * self.size]
        passing = self._resuming or self._passing
        return {"epoch": self.epoch, "processed": self.processed + consumed, "passing": passing}

    def load_state_dict(self, state_dict):
        self.epoch, self.processed = state_dict["epoch"], list(state_dict["processed"])
        self.reset()
        self._resuming = bool(state_dict.get("passing", False))

    def __iter__(self):
        if self._resuming:
            self._resuming = False
            generators.put_back()
        self._passing = True
        return iter(self.indices[self.local_done:])

    def __len__(self):
        return len(self.indices) - self.local_done
