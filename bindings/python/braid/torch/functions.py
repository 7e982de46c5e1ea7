"""Broadcasting model and optimizer state, and Python objects, across ranks.

The Horovod recipe starts every rank from rank 0's weights and optimizer state::

    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
"""

import hashlib

import torch

from .._core import objects as _objects, runtime as _runtime
from .._core.errors import InvalidArgumentError
from . import mpi_ops
from ._handles import check_process_set as _check_process_set


def broadcast_object(obj, root_rank=0, name=None, process_set=None):
    """Returns ``root_rank``'s ``obj`` on every rank (pickled, sent as bytes); the object the
    other ranks pass is ignored. ``name`` defaults to ``"broadcast_object.noname.<n>"`` (not
    the object's type name, as Horovod does: the other ranks usually pass None).
    ``process_set``: a ProcessSet whose ranks alone call it. See
    ``braid.broadcast_object``."""
    _check_process_set("broadcast_object", process_set)
    return _objects.broadcast_object(obj, root_rank, name, _set_or_none(process_set))


def allgather_object(obj, name=None, process_set=None):
    """Returns the list of every rank's ``obj`` in rank order (pickled, sent as bytes).
    ``process_set``: a ProcessSet whose ranks alone call it (the list then holds theirs, in
    the set's order). See ``braid.allgather_object``."""
    _check_process_set("allgather_object", process_set)
    return _objects.allgather_object(obj, name, _set_or_none(process_set))


def _set_or_none(process_set):
    """``process_set``, or None for the global one (checked by the caller)."""
    return None if process_set is None or process_set.process_set_id == 0 else process_set


def _named_tensors(params):
    """[(name or None, tensor)] from a dict (a state_dict) or an iterable of tensors or
    (name, tensor) pairs (named_parameters(), parameters())."""
    if isinstance(params, dict):
        items = sorted(params.items(), key=lambda kv: str(kv[0]))
    else:
        try:
            items = [x if isinstance(x, tuple) else (None, x) for x in params]
        except TypeError:
            raise InvalidArgumentError(
                "broadcast_parameters: params must be a dict (a state_dict) or an iterable of "
                f"tensors or (name, tensor) pairs, got {type(params).__name__}") from None
    for name, t in items:
        if not isinstance(t, torch.Tensor):
            raise InvalidArgumentError(f"broadcast_parameters: '{name}' is a "
                                       f"{type(t).__name__}, not a tensor")
    return items


def broadcast_parameters(params, root_rank, process_set=None):
    """Overwrites every tensor of ``params`` with ``root_rank``'s, in place.

    ``params``: ``model.state_dict()`` (parameters and buffers, such as batch norm's running
    statistics), ``model.named_parameters()`` or ``model.parameters()``. Named tensors are
    broadcast under their names (a dict's keys, sorted), unnamed ones under
    ``"broadcast.noname.<n>"``; every rank must pass the same names, shapes and dtypes. All
    broadcasts run concurrently (the runtime fuses them); the call returns when all are done.
    Before any broadcast, the ranks compare their lists of (name, shape, dtype) by an
    all-gather of a 32-byte digest (as DDP verifies its parameters' shapes across ranks):
    when they differ (a rank with an extra layer, a different shape), every rank raises
    InvalidArgumentError naming the parameters and the ranks that differ from ``root_rank``,
    instead of some ranks returning and others waiting for a broadcast that never comes.
    ``process_set``: a ProcessSet whose ranks alone call it (``root_rank``, a rank of the
    job, among them). Raises InvalidArgumentError for a non-tensor entry and the
    collectives' errors.
    """
    _check_process_set("broadcast_parameters", process_set)
    ps = _set_or_none(process_set)
    items = _named_tensors(params)
    _verify_layout(items, root_rank, process_set=ps)
    handles = [mpi_ops.broadcast_async_(t.data if isinstance(t, torch.nn.Parameter) else t,
                                        root_rank, name=name, process_set=ps)
               for name, t in items]
    for h in handles:
        mpi_ops.synchronize(h)


def _layout(items):
    """[(label, shape, dtype)]: a named tensor's label is its name, an unnamed one's its
    position (``#i``)."""
    return [(f"#{i}" if name is None else str(name), tuple(t.shape), str(t.dtype))
            for i, (name, t) in enumerate(items)]


def _layout_differences(mine, root, rank, root_rank, limit=4):
    """What differs between rank ``rank``'s layout and the root's, as phrases (at most
    ``limit``, then a count of the rest)."""
    a, b = {n: (s, d) for n, s, d in root}, {n: (s, d) for n, s, d in mine}

    def described(s, d):  # an entry without a shape (None) is described by d alone
        return d if s is None else f"shape {list(s)}, {d}"

    out = []
    for n, (s, d) in b.items():
        if n not in a:
            out.append(f"rank {rank} has '{n}' ({described(s, d)}), which rank {root_rank} "
                       "lacks")
        elif a[n] != (s, d):
            out.append(f"'{n}' is {described(*a[n])} on rank {root_rank} but "
                       f"{described(s, d)} on rank {rank}")
    out += [f"rank {rank} lacks '{n}' ({described(s, d)}), which rank {root_rank} has"
            for n, (s, d) in a.items() if n not in b]
    if not out:  # the same entries in another order
        out.append(f"rank {rank} passes them in another order than rank {root_rank}")
    if len(out) > limit:
        out = out[:limit] + [f"{len(out) - limit} more"]
    return out


def _verify_layout(items, root_rank, what="broadcast_parameters", extra=(), process_set=None):
    """Raises InvalidArgumentError on every rank when the ranks' (name, shape, dtype) lists
    differ: first an all-gather of each rank's 32-byte digest (cheap, the usual case), and
    only on a mismatch an all-gather of the lists themselves, to name what differs. ``what``
    is the calling function, named in the error and in the collectives' names; ``extra``:
    more (label, None, description) entries that must agree too. In ``process_set`` (None:
    the whole job), among its ranks."""
    ranks = list(range(_runtime.size())) if process_set is None else list(process_set.ranks)
    size = len(ranks)
    if size == 1:
        return
    name = _runtime.next_name(what, 0 if process_set is None else process_set.process_set_id)
    layout = _layout(items) + list(extra)
    digest = hashlib.sha256(repr(layout).encode()).digest()
    digests = mpi_ops.allgather(torch.tensor(list(digest), dtype=torch.uint8),
                                name=name + ".layout_digest",
                                process_set=process_set).view(size, len(digest))
    if all(torch.equal(digests[r], digests[0]) for r in range(1, size)):
        return
    by_rank = dict(zip(ranks, _objects.allgather_object(layout, name=name + ".layouts",
                                                        process_set=process_set)))
    if root_rank not in by_rank:
        raise InvalidArgumentError(f"{what}: root_rank {root_rank} is not a rank of "
                                   + (f"this job (size {size})" if process_set is None
                                      else f"the process set {ranks}"))
    layouts = by_rank
    differ = [r for r in ranks if layouts[r] != layouts[root_rank]]
    details = "; ".join(d for r in differ
                        for d in _layout_differences(layouts[r], layouts[root_rank], r,
                                                     root_rank))
    raise InvalidArgumentError(
        f"{what}: the parameters of rank(s) {differ} differ from root rank "
        f"{root_rank}'s (every rank must pass the same names, shapes and dtypes): {details}")


class _TensorSlot:
    """Where a tensor sat in a broadcast state dict: its index among the tensors, shape and
    dtype (what the other ranks need to allocate it)."""

    __slots__ = ("index", "shape", "dtype")

    def __init__(self, index, shape, dtype):
        self.index, self.shape, self.dtype = index, shape, dtype


def _skeleton(obj, tensors):
    """``obj`` with every tensor replaced by a _TensorSlot (appended to ``tensors``)."""
    if isinstance(obj, torch.Tensor):
        tensors.append(obj)
        return _TensorSlot(len(tensors) - 1, tuple(obj.shape), obj.dtype)
    if isinstance(obj, dict):
        return type(obj)((k, _skeleton(v, tensors)) for k, v in obj.items())
    if isinstance(obj, (list, tuple)):
        return type(obj)(_skeleton(v, tensors) for v in obj)
    return obj


def _fill(skel, tensors):
    if isinstance(skel, _TensorSlot):
        return tensors[skel.index]
    if isinstance(skel, dict):
        return type(skel)((k, _fill(v, tensors)) for k, v in skel.items())
    if isinstance(skel, (list, tuple)):
        return type(skel)(_fill(v, tensors) for v in skel)
    return skel


def _broadcast_state(state, root_rank, name, process_set=None):
    """``root_rank``'s ``state`` (nested dicts/lists/tuples of tensors and picklable values)
    on every rank: the structure and non-tensor values exactly (pickled), the tensors by
    broadcast (a rank allocates them from the root's shapes and dtypes)."""
    tensors = []
    skel = _objects.broadcast_object(_skeleton(state, tensors), root_rank, name=name + ".layout",
                                     process_set=process_set)
    if _runtime.rank() == root_rank:
        bufs = [t.detach() for t in tensors]
    else:
        slots = []
        _collect_slots(skel, slots)
        bufs = [None] * len(slots)
        for s in slots:
            bufs[s.index] = torch.empty(s.shape, dtype=s.dtype)
    handles = [mpi_ops.broadcast_async_(b, root_rank, name=f"{name}.{i}",
                                        process_set=process_set)
               for i, b in enumerate(bufs)]
    for h in handles:
        mpi_ops.synchronize(h)
    return _fill(skel, bufs)


def _collect_slots(skel, out):
    if isinstance(skel, _TensorSlot):
        out.append(skel)
    elif isinstance(skel, dict):
        for v in skel.values():
            _collect_slots(v, out)
    elif isinstance(skel, (list, tuple)):
        for v in skel:
            _collect_slots(v, out)


def _optimizer_kind(optimizer):
    """(label, None, description) entries for the optimizer's class (torch's, under a
    DistributedOptimizer) and each parameter group's option names: an SGD state loaded
    into an Adam would silently drop its betas."""
    cls = next((c for c in type(optimizer).__mro__ if c.__module__.startswith("torch.optim.")),
               type(optimizer))
    return [("optimizer", None, cls.__qualname__)] + [
        (f"param_groups[{g}] options", None,
         "options " + ", ".join(sorted(k for k in group if k != "params")))
        for g, group in enumerate(optimizer.param_groups)]


def broadcast_optimizer_state(optimizer, root_rank, model=None, process_set=None,
                              lr_scheduler=None):
    """Makes every rank's optimizer state ``root_rank``'s: per-parameter state (momentum
    buffers, Adam's moments and step counts, scalars included) and the parameter groups'
    options (learning rate, momentum, betas, ... and what LR schedulers keep there, such as
    ``initial_lr``), exactly: options and scalars keep their Python types and values (they
    are pickled), tensors are broadcast in their own dtype.

    ``optimizer``: a torch optimizer or a DistributedOptimizer, with the same parameter
    groups (sizes and order) on every rank. A rank whose optimizer has no state yet gets the
    root's; nothing is stepped or initialised to make the state exist. ``lr_scheduler``
    (optional; one scheduler or a list): their ``state_dict()`` (epoch counters, ...) is
    broadcast too. ``model`` is accepted for Horovod's signature and unused (no step is
    taken to create state, so no model is needed); ``process_set``: a ProcessSet whose
    ranks alone call it.
    Before any state moves, the ranks compare their optimizers' classes, each parameter
    group's option names and parameters' shapes and dtypes, in order, as
    ``broadcast_parameters`` compares its tensors: when they differ, every rank raises
    InvalidArgumentError naming what differs (``optimizer``, ``param_groups[g] options``,
    ``param_groups[g][i]``) and the ranks that differ from ``root_rank``. Raises the
    collectives' errors.
    """
    del model
    _check_process_set("broadcast_optimizer_state", process_set)
    ps = _set_or_none(process_set)
    _verify_layout([(f"param_groups[{g}][{i}]", p)
                    for g, group in enumerate(optimizer.param_groups)
                    for i, p in enumerate(group["params"])],
                   root_rank, "broadcast_optimizer_state", _optimizer_kind(optimizer), ps)
    name = _runtime.next_name("broadcast_optimizer_state", 0 if ps is None else ps.process_set_id)
    state = _broadcast_state(optimizer.state_dict(), root_rank, name, ps)
    if _runtime.rank() != root_rank:
        optimizer.load_state_dict(state)
    if lr_scheduler is None:
        return
    schedulers = lr_scheduler if isinstance(lr_scheduler, (list, tuple)) else [lr_scheduler]
    for i, s in enumerate(schedulers):
        sd = _broadcast_state(s.state_dict(), root_rank, f"{name}.lr_scheduler.{i}", ps)
        if _runtime.rank() != root_rank:
            s.load_state_dict(sd)
