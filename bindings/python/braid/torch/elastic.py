"""Elastic training, as Horovod's ``hvd.elastic``: a job that goes on when a rank is lost.

Under ``braidrun --min-np M`` (docs/elastic.md) a lost rank (its process ended, its host
lost, its heartbeat stopped) no longer ends the job: the coordinator ends the membership,
every survivor's collectives fail with ``UnavailableError``, and ``run`` restores the last
commit, leaves the job, joins the next membership (the survivors, renumbered), brings every
rank to the state of the rank with the newest commit and calls the training function
again::

    import braid.torch as hvd

    hvd.init()
    state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0, batch=0)

    @hvd.elastic.run
    def train(state):
        for state.epoch in range(state.epoch, epochs):
            for state.batch, (x, y) in enumerate(loader, start=state.batch):
                ...
                if state.batch % 10 == 0:
                    state.commit()
            state.batch = 0

    train(state)

Compression state (error feedback, PowerSGD's Q, ScaleComp's memories) lives in the
runtime and starts afresh in each membership: PowerSGD's Q must agree across ranks and a
joining rank has none, and a rank's error-feedback residual holds work of steps that the
restore undid.
"""

import copy
import functools
import math

import torch.utils.data

from .._core.errors import UnavailableError
from .._core.runtime import ranks_leaving, ranks_waiting, rejoin

__all__ = ["ElasticSampler", "HostsUpdatedInterrupt", "ObjectState", "State", "TorchState",
           "run"]


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


# --- run and the states -----------------------------------------------------------------


class HostsUpdatedInterrupt(RuntimeError):
    """Raised by ``State.commit()`` / ``check_host_updates()`` when the job's membership is
    about to change without a failure (ranks joining or leaving); ``run`` then re-joins without
    restoring. ``skip_sync``: whether the state needs no broadcast afterwards (Horovod's)."""

    def __init__(self, skip_sync=False):
        super().__init__("the job's hosts changed")
        self.skip_sync = skip_sync


def run(func):
    """Decorates ``func(state, *args, **kwargs)``, the training loop, to survive membership
    changes: ``state.sync()`` first; on ``UnavailableError`` (a rank was lost: the
    membership ended) ``state.restore()`` (the last commit), re-joining the job, the reset
    callbacks, ``sync()`` and ``func`` again; on ``HostsUpdatedInterrupt`` the same without
    the restore. Returns what ``func`` returns. A process whose host left braidrun's
    discovery output leaves at that re-join: ``SystemExit(0)`` (the code after the decorated
    call does not run there). Other errors propagate, as do a failed re-join's
    (``FailedPreconditionError`` naming the reason when fewer than braidrun's ``--min-np``
    ranks are left; ``DeadlineExceededError`` when the next membership did not form in
    time)."""

    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        skip_sync, rejoined = False, False
        while True:
            if rejoined:
                # The next membership (the survivors, renumbered). Its errors (too few ranks
                # left, no membership in time) propagate; a drained process exits 0 here
                # (init()'s SystemExit).
                rejoin()
            try:
                # A rank lost while the others run the reset callbacks or sync (two losses
                # close together, a rank lost while the others wait for it in the first
                # sync) is one more membership change, as one lost in `func`.
                if rejoined:
                    state.on_reset()
                if not skip_sync:
                    state.sync()
                return func(state, *args, **kwargs)
            except UnavailableError:
                state.restore()
                skip_sync = False
            except HostsUpdatedInterrupt as e:
                skip_sync = e.skip_sync
            rejoined = True

    return wrapper


def _newest_commit(commits):
    """The rank holding the newest commit (the lowest such rank): the state's source."""
    from braid.torch import allgather_object
    counts = allgather_object(commits, name="elastic.commits")
    root = max(range(len(counts)), key=lambda r: (counts[r], -r))
    return root, counts[root]


class State:
    """What a training loop must carry across a membership change (Horovod's
    ``hvd.elastic.State``): ``commit()`` keeps a copy (``save()``) and checks for host
    updates, ``restore()`` goes back to the last copy, ``sync()`` gives every rank the state
    of the rank with the newest commit. Subclasses define ``save``, ``restore`` and
    ``sync_from(root_rank)``."""

    def __init__(self):
        self._reset_callbacks = []
        self._commits = 0

    def register_reset_callbacks(self, callbacks):
        """``callbacks``: callables run (in order, without arguments) after each re-join,
        before ``sync()``: e.g. to scale the learning rate to the new ``size()``."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self):
        for callback in self._reset_callbacks:
            callback()

    def commit(self):
        """Keeps the current state as the one to restore; then ``check_host_updates()``."""
        self.save()
        self._commits += 1
        self.check_host_updates()

    def check_host_updates(self):
        """Collective: raises ``HostsUpdatedInterrupt`` on every rank when processes wait to
        join the job (braidrun started them for hosts its discovery script added) or ranks
        leave it (their host left the script's output), as any rank's last heartbeat said;
        ``run`` then ends this membership, without a restore, and the next one takes the
        newcomers in and the leavers out. One small all-reduce (``elastic.hosts_updated``)."""
        from braid.torch import Max, allreduce
        waiting = torch.tensor([max(ranks_waiting(), ranks_leaving())], dtype=torch.int32)
        if int(allreduce(waiting, op=Max, name="elastic.hosts_updated",
                         compression="none")[0]) > 0:
            raise HostsUpdatedInterrupt(skip_sync=False)

    def sync(self):
        """Collective: every rank takes the state of the rank with the newest commit (the
        lowest such rank), which is saved as the one to restore."""
        root, commits = _newest_commit(self._commits)
        self.sync_from(root)
        self._commits = commits
        self.save()

    def save(self):
        raise NotImplementedError

    def restore(self):
        raise NotImplementedError

    def sync_from(self, root_rank):
        raise NotImplementedError


class ObjectState(State):
    """A ``State`` of picklable attributes given as keyword arguments (Horovod's
    ``ObjectState``): ``state.epoch``, ``state.batch``, ... are plain attributes; ``save``
    deep-copies them, ``sync`` broadcasts them (``broadcast_object``) from the source rank.
    """

    def __init__(self, **kwargs):
        super().__init__()
        self._names = list(kwargs)
        self._saved = {}
        for name, value in kwargs.items():
            setattr(self, name, value)
        self.save()

    def save(self):
        self._saved = {n: copy.deepcopy(getattr(self, n)) for n in self._names}

    def restore(self):
        for name, value in copy.deepcopy(self._saved).items():
            setattr(self, name, value)

    def sync_from(self, root_rank):
        from braid.torch import broadcast_object
        values = broadcast_object({n: getattr(self, n) for n in self._names}, root_rank,
                                  name="elastic.objects")
        for name, value in values.items():
            setattr(self, name, value)


class TorchState(ObjectState):
    """Horovod's ``hvd.elastic.TorchState(model, optimizer, **kwargs)``: the model's
    parameters and buffers (``state_dict``), the optimizer's state (a
    ``DistributedOptimizer`` or a plain one), every ``ElasticSampler`` among ``kwargs``
    (synchronized by merging every rank's processed indices, then re-sharded over the new
    world) and the other ``kwargs`` as ``ObjectState`` attributes. ``model`` and
    ``optimizer`` may be None."""

    def __init__(self, model=None, optimizer=None, **kwargs):
        self.model = model
        self.optimizer = optimizer
        self._samplers = {n: v for n, v in kwargs.items() if isinstance(v, ElasticSampler)}
        self._saved_model = self._saved_optimizer = None
        self._saved_samplers = {}
        objects = {n: v for n, v in kwargs.items() if n not in self._samplers}
        for name, sampler in self._samplers.items():
            setattr(self, name, sampler)
        super().__init__(**objects)

    def save(self):
        if self.model is not None:
            self._saved_model = copy.deepcopy(self.model.state_dict())
        if self.optimizer is not None:
            self._saved_optimizer = copy.deepcopy(self.optimizer.state_dict())
        self._saved_samplers = {n: s.state_dict() for n, s in self._samplers.items()}
        super().save()

    def restore(self):
        if self.model is not None:
            self.model.load_state_dict(self._saved_model)
        if self.optimizer is not None:
            self.optimizer.load_state_dict(self._saved_optimizer)
        for name, sampler in self._samplers.items():
            sampler.load_state_dict(self._saved_samplers[name])
        super().restore()

    def sync_from(self, root_rank):
        from braid.torch import allgather_object, broadcast_optimizer_state, \
            broadcast_parameters
        if self.model is not None:
            broadcast_parameters(self.model.state_dict(), root_rank=root_rank)
        if self.optimizer is not None:
            broadcast_optimizer_state(self.optimizer, root_rank=root_rank)
        for name, sampler in self._samplers.items():
            gathered = allgather_object(sampler.state_dict(), name=f"elastic.sampler.{name}")
            merged = {"epoch": gathered[root_rank]["epoch"], "processed_indices": set()}
            for s in gathered:
                if s["epoch"] == merged["epoch"]:
                    merged["processed_indices"] |= s["processed_indices"]
            sampler.load_state_dict(merged)
        super().sync_from(root_rank)
