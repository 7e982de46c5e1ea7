"""The compression stage's state and registry, as braid's frontends reach them.

``compression_state`` and ``load_compression_state`` (this module's ``__all__``) are the
NumPy API's. The rest is the core's API for the frontends: ``canonical_compression`` and
``compression_methods`` ask the runtime's registry, ``forget_compression_state`` drops the
state of some tensors, and ``release_names`` / ``forget_released`` let a new
DistributedOptimizer start afresh on the names of a dropped one (braid.torch).
"""

from .. import _braid
from .runtime import check_process

__all__ = ["compression_state", "load_compression_state"]


def compression_state():
    """This rank's compression state, as ``bytes``, to keep in a training checkpoint.

    It holds what compressors carry from one step to the next -- PowerSGD's Q matrices and
    the error-feedback memory of powersgd, scalecomp, topk, randomk and fp4/int4 with ef=1
    (float32, one residual per tensor, as large as the tensor) -- and each tensor's step
    counter and shape, so that ``load_compression_state()`` after a restart continues
    bit-identically. The state is per rank: save every rank's (e.g. to
    ``ckpt.rank{braid.rank()}``). The byte format is versioned and documented in
    ``compression/stage.h`` (CompressionStage::SaveState).

    Call it between steps, once every all-reduce of the step was synchronized: raises
    FailedPreconditionError while a compressed all-reduce is in flight on this rank, before
    ``init()`` and after ``shutdown()``.
    """
    check_process("compression_state()")
    return _braid.compression_state()


# Names of all-reduces whose DistributedOptimizer (braid.torch) was dropped: their compression
# state is forgotten when a new optimizer takes them (release_names, forget_released). A
# loaded state is the one wanted, so load_compression_state() empties it.
_released_names = set()


def load_compression_state(state):
    """Restores a ``compression_state()`` result (``bytes``) on this rank, typically right
    after ``init()`` when resuming from a checkpoint, before the first step.

    Collective: every rank calls it with its own state, and the ranks compare what they
    restored before any applies it. Methods in ``state`` restart from their saved state;
    methods not in it are untouched. Either every rank applies its state, or none does and
    every rank raises the same error: InvalidArgumentError naming the ranks and what differs
    (states taken at different steps, of another model, of a job of another world size, one
    rank's state loaded on two ranks) or naming the rank whose state is malformed and the
    field; FailedPreconditionError when a compressed all-reduce was in flight on a rank.
    A ``state`` that is not bytes is refused the same way (InvalidArgumentError on every
    rank, naming this rank). Raised on this rank only: FailedPreconditionError before
    ``init()`` and after ``shutdown()``.
    """
    check_process("load_compression_state()")
    if not isinstance(state, (bytes, bytearray, memoryview)):
        # Still collective: every rank fails at once with this reason, none waits for it.
        _braid.refuse_compression_state(
            f"load_compression_state(): state must be bytes, got {type(state).__name__}")
    _braid.load_compression_state(bytes(state))
    _released_names.clear()


def release_names(names):
    """Records ``names`` (all-reduce names, str) as released: a DistributedOptimizer that
    used them was dropped, so their compression state is stale. ``forget_released`` forgets
    it when a new optimizer takes them, unless ``load_compression_state()`` comes first."""
    _released_names.update(names)


def forget_released(names):
    """Forgets the runtime's compression state of those of ``names`` (all-reduce names) that
    were released, and takes them off the record. FailedPreconditionError (naming the
    tensor) when one of their all-reduces is still in flight."""
    stale = sorted(set(names) & _released_names)
    if not stale:
        return
    if _braid.is_initialized():
        _braid.forget_compression_state(stale)
    _released_names.difference_update(stale)


def forget_compression_state(names):
    """Forgets the runtime's compression state (residuals, PowerSGD's Q, warm-up step
    counts) of the all-reduces named ``names`` (a list of str), so that their next
    all-reduce starts afresh; returns how many entries it forgot (int).
    FailedPreconditionError before ``init()`` or when one of them is in flight."""
    return _braid.forget_compression_state(names)


def canonical_compression(spec, test_methods=False):
    """The canonical form (str) of the compression spec ``spec`` (a str such as
    ``"fp4:ef=1"``), as every rank passes it to the runtime. InvalidArgumentError naming the
    valid methods or options for an unknown one. ``test_methods``: also accept the
    registry's test-only methods."""
    return _braid.canonical_compression(spec, test_methods)


def compression_plan_spec(plan, name, shape, dtype, op, test_methods=False):
    """``(spec, pattern)``: the canonical spec (str) the compression plan ``plan`` (its JSON
    text, as ``canonical_compression`` returns it) gives the tensor ``name`` of ``shape`` (a
    sequence of ints), braid dtype code ``dtype`` and op code ``op`` -- the spec of the first
    pattern that matches the whole name, or ``"none"`` where none does, where the method does
    not apply, or where the tensor is too small or too flat for it to pay
    (docs/compression.md) -- and that pattern (str, "" when none matched).
    InvalidArgumentError for a bad plan."""
    spec, pattern = _braid.compression_plan_spec(plan, name, list(shape), int(dtype), int(op),
                                                 test_methods)
    return spec, pattern


def compression_methods(test_methods=False):
    """The names (str) of the runtime's compression methods, in the registry's order
    (with ``test_methods``, the test-only ones too)."""
    return _braid.compression_methods(test_methods)
