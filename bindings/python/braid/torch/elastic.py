"""Elastic training's data side: ``ElasticSampler``, as Horovod's ``hvd.elastic.ElasticSampler``.

A job whose world changes mid-epoch (ranks lost, ranks added) must neither repeat nor skip
the samples of that epoch: the sampler remembers which indices the job has processed in the
epoch and, at each ``reset()``, shards only the remaining ones over the world as it is then.

Only the sampler exists so far: braid does not yet change a job's membership (a lost rank
still ends the job on every rank), and ``run``, ``TorchState`` and the recoverable error
that would drive ``reset()`` are not built. The sampler is usable on its own, e.g. to resume
an epoch from a checkpoint on another number of ranks (``state_dict()`` /
``load_state_dict()``, with the processed indices of every rank merged: see
``record_indices``).
"""

import math

import torch.utils.data

__all__ = ["ElasticSampler"]


class ElasticSampler(torch.utils.data.Sampler):
    """Shards a dataset's indices over the ranks, leaving out those the epoch has processed.

    Args:
        dataset: anything with ``len()``: the indices are ``0 .. len(dataset) - 1``.
        shuffle: permute the remaining indices each epoch, from ``seed + epoch`` (the same
            permutation on every rank, so the shards do not overlap). Default True.
        seed: the permutation's seed (an int; default 0).
        num_replicas, rank: the world to shard over; ``None`` (the default) reads
            ``braid.torch.size()`` / ``rank()`` at every ``reset()``, so a changed world is
            picked up.

    Each rank iterates ``num_samples = ceil(remaining / num_replicas)`` indices: the
    (shuffled) remaining indices padded by repeating their first ones up to ``num_samples *
    num_replicas``, then every ``num_replicas``-th from ``rank``, as
    ``torch.utils.data.DistributedSampler`` does. Record what was processed with
    ``record_batch`` (after each batch) or ``record_indices``; ``set_epoch`` starts an epoch
    with nothing processed.

    Raises ValueError for a ``rank`` outside ``[0, num_replicas)`` or a negative batch
    index or size.
    """

    def __init__(self, dataset, shuffle=True, seed=0, num_replicas=None, rank=None):
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self._world = (num_replicas, rank)
        self.epoch = 0
        self.processed_indices = set()
        self.num_replicas = 1
        self.rank = 0
        self.remaining_indices = []
        self.num_samples = 0
        self.total_size = 0
        self.indices = []  # this rank's shard, made once per reset()
        self.reset()

    def set_epoch(self, epoch):
        """Starts epoch ``epoch`` (an int): nothing processed, a new permutation."""
        self.epoch = epoch
        self.processed_indices = set()
        self.reset()

    def record_batch(self, batch_idx, batch_size):
        """Records this rank's batch ``batch_idx`` (0-based, of ``batch_size`` indices, the
        DataLoader's) of the current shard as processed."""
        self.record_indices(self.get_indices(batch_idx, batch_size))

    def record_indices(self, indices):
        """Records dataset indices as processed. Each rank records its own: before the
        world changes, merge every rank's (``braid.torch.allgather_object`` of
        ``processed_indices``, then this) so that no rank's work is repeated."""
        self.processed_indices.update(int(i) for i in indices)

    def get_indices(self, batch_idx, batch_size):
        """The dataset indices of this rank's batch ``batch_idx`` in the current shard."""
        if batch_idx < 0 or batch_size < 0:
            raise ValueError(f"get_indices({batch_idx}, {batch_size}): expected a batch index "
                             "and size of at least 0")
        start = batch_idx * batch_size
        return self.indices[start:min(start + batch_size, len(self.indices))]

    def state_dict(self):
        """``{"epoch": int, "processed_indices": set of int}``."""
        return {"epoch": self.epoch, "processed_indices": set(self.processed_indices)}

    def load_state_dict(self, state_dict):
        """Restores ``state_dict()``'s figures and re-shards (``reset()``)."""
        self.epoch = state_dict["epoch"]
        self.processed_indices = set(state_dict["processed_indices"])
        self.reset()

    def reset(self):
        """Re-reads the world and shards the indices not yet processed over it."""
        num_replicas, rank = self._world
        if num_replicas is None or rank is None:
            from braid.torch import rank as braid_rank, size as braid_size
            num_replicas = braid_size() if num_replicas is None else num_replicas
            rank = braid_rank() if rank is None else rank
        if num_replicas < 1 or not 0 <= rank < num_replicas:
            raise ValueError(f"ElasticSampler: rank {rank} is not in a world of "
                             f"{num_replicas} ranks")
        self.num_replicas, self.rank = num_replicas, rank
        self.remaining_indices = [i for i in range(len(self.dataset))
                                  if i not in self.processed_indices]
        self.num_samples = math.ceil(len(self.remaining_indices) / self.num_replicas)
        self.total_size = self.num_samples * self.num_replicas
        self.indices = self._shard()

    def _shard(self):
        indices = list(self.remaining_indices)
        if self.shuffle:
            g = torch.Generator()
            g.manual_seed(self.seed + self.epoch)
            order = torch.randperm(len(indices), generator=g).tolist()
            indices = [indices[i] for i in order]
        if indices:
            # Pad with the first indices so every rank has num_samples (as DistributedSampler).
            while len(indices) < self.total_size:
                indices += indices[:self.total_size - len(indices)]
        return indices[self.rank:self.total_size:self.num_replicas]

    def __iter__(self):
        return iter(self.indices)

    def __len__(self):
        return self.num_samples
