"""Names of DistributedOptimizer's all-reduces: from named_parameters, and unique among the
DistributedOptimizers alive in the process (the runtime keeps per-tensor state by name).

A new optimizer that takes the names of a dropped one starts with fresh compression state
(error-feedback residuals, PowerSGD's Q, warm-up step counts), as a new optimizer in a new
job would: what the runtime kept for those names is forgotten when the new optimizer is
constructed (not when the old one is dropped: construction is at the same point of every
rank's sequence of collectives, a garbage collection is not). A state restored by
``braid.load_compression_state()`` is kept: loading it clears the record of dropped names.
"""

import gc
import weakref

from .._core import compression as _core_compression
from .._core.errors import InvalidArgumentError


def parameter_names(param_groups, named_parameters):
    """({parameter: name} for every parameter of `param_groups`, {id(parameter): name} of
    every pair in `named_parameters` or None, the pairs themselves (they hold the
    parameters, so an id stays theirs)). Raises InvalidArgumentError for pairs that are
    not pairs, duplicated names, and parameters without a name."""
    params = [p for g in param_groups for p in g["params"]]
    if named_parameters is None:
        return {p: f"param.{gi}.{i}" for gi, g in enumerate(param_groups)
                for i, p in enumerate(g["params"])}, None, ()
    named = list(named_parameters)
    if any(not isinstance(x, tuple) or len(x) != 2 for x in named):
        raise InvalidArgumentError(
            "DistributedOptimizer: named_parameters must be (name, parameter) pairs, as "
            "model.named_parameters() gives")
    seen, dups = set(), []
    for name, _ in named:
        if name in seen and name not in dups:
            dups.append(name)
        seen.add(name)
    if dups:
        raise InvalidArgumentError(
            "DistributedOptimizer: parameter names must be unique (they name the "
            f"all-reduces across ranks); duplicated: {', '.join(map(str, dups))}")
    by_id = {id(p): n for n, p in named}
    unnamed = [p for p in params if id(p) not in by_id]
    if unnamed:
        shapes = ", ".join(str(tuple(p.shape)) for p in unnamed[:5])
        raise InvalidArgumentError(
            f"DistributedOptimizer: {len(unnamed)} parameter(s) of the optimizer are not in "
            f"named_parameters (shapes {shapes}{', ...' if len(unnamed) > 5 else ''}): pass "
            "model.named_parameters() of the model the optimizer trains")
    return {p: by_id[id(p)] for p in params}, by_id, named


def added_names(opt, new, named, group_index):
    """{parameter: name} for the parameters `new` that add_param_group adds to `opt` as
    group `group_index`: from `named` ((name, parameter) pairs, or None), else from opt's
    construction's named_parameters, else (opt constructed without names)
    "param.<group>.<i>". Raises InvalidArgumentError for a parameter without a name and
    for a name opt or another live optimizer uses."""
    constructed_with_names = opt._name_of_id is not None
    by_id = dict(opt._name_of_id) if constructed_with_names else {}
    if named is not None:
        named = list(named)
        if any(not isinstance(x, tuple) or len(x) != 2 for x in named):
            raise InvalidArgumentError(
                "DistributedOptimizer.add_param_group: named_parameters must be (name, "
                "parameter) pairs")
        by_id.update({id(p): n for n, p in named})
    names = {}
    for i, p in enumerate(new):
        if id(p) in by_id:
            names[p] = by_id[id(p)]
        elif not constructed_with_names and named is None:
            names[p] = f"param.{group_index}.{i}"
        else:
            raise InvalidArgumentError(
                "DistributedOptimizer.add_param_group: a new parameter of shape "
                f"{tuple(p.shape)} has no name: it is not in the named_parameters given at "
                "construction; pass the group's names as param_group['named_parameters']")
    used = set(opt._names.values())
    dups = sorted({n for n in names.values() if n in used} |
                  {n for n in names.values() if list(names.values()).count(n) > 1})
    clash = sorted(n for n in names.values() if opt._prefix + n in names_in_use(opt))
    if dups or clash:
        raise InvalidArgumentError(
            "DistributedOptimizer.add_param_group: parameter names must be unique (they "
            f"name the all-reduces across ranks); already in use: {', '.join(dups + clash)}")
    return names


# The DistributedOptimizers alive in this process: id -> (weak reference, the names their
# all-reduces use, prefix included). The runtime keeps per-tensor state (error-feedback
# residuals, PowerSGD's Q) by tensor name, so two live optimizers must never use one name.
_live = {}


def names_in_use(exclude=None):
    """The names (prefix included) of the live DistributedOptimizers other than `exclude`."""
    used = set()
    for key, (ref, names) in list(_live.items()):
        opt = ref()
        if opt is None:
            _forget(key)
        elif opt is not exclude:
            used |= names
    return used


def claim_prefix(opt, names):
    """The prefix of opt's all-reduce names: "" when its names are not in use by another live
    DistributedOptimizer (the single-optimizer case keeps its names), else "opt<i>/" for the
    smallest i >= 1 whose names are free. On every rank the same program constructs and keeps
    the same optimizers, so every rank picks the same prefix; a collection first makes sure an
    optimizer that is unreachable but not yet collected (a reference cycle) counts as gone on
    every rank alike."""
    used = names_in_use(opt)
    if used & names:
        gc.collect()
        used = names_in_use(opt)
    i = 0
    while True:
        prefix = f"opt{i}/" if i else ""
        if not any(prefix + n in used for n in names):
            break
        i += 1
    full = {prefix + n for n in names}
    _forget_released(full)
    _live[id(opt)] = (weakref.ref(opt, lambda _, key=id(opt): _forget(key)), full)
    return prefix


def _forget(key):
    """A DistributedOptimizer was dropped: its names are free, and their runtime state is
    stale (forgotten when a new optimizer takes them)."""
    entry = _live.pop(key, None)
    if entry is not None:
        _core_compression.release_names(ALLREDUCE_PREFIX + n for n in entry[1])


ALLREDUCE_PREFIX = "grad."  # a gradient's all-reduce is named "grad.<prefix><name>"


def _forget_released(names):
    """Forgets the runtime's compression state of the `names` (prefix included) that a
    dropped optimizer used. FailedPreconditionError (naming the tensor) when one of their
    all-reduces is still in flight: synchronize the dropped optimizer's step first."""
    _core_compression.forget_released({ALLREDUCE_PREFIX + n for n in names})


def update_names(opt):
    """Records opt's names again (after add_param_group)."""
    full = {opt._prefix + n for n in opt._names.values()}
    _forget_released(full)
    ref = _live[id(opt)][0] if id(opt) in _live else weakref.ref(opt)
    _live[id(opt)] = (ref, full)
