"""Gradient compression for braid.torch: ``Compression.<method>`` and spec strings.

braid compresses inside its runtime (on the wire, per bucket, with per-tensor state such as
error feedback), not in the framework: a compressor here only names the method. The members
of ``Compression`` come from the runtime's compression registry when this module is imported,
so every method the registry knows is there (``none``, ``fp16``, ``bf16``, ``fp4``, ``int4``,
and any method added later), each with its default options. Options go through a spec
string or ``Compression.spec``::

    hvd.DistributedOptimizer(opt, compression=hvd.Compression.fp16)
    hvd.DistributedOptimizer(opt, compression="fp4:chunk=64,ef=1")
    hvd.DistributedOptimizer(opt, compression=hvd.Compression.spec("int4:start_step=100"))

The spec grammar, the methods and their error bounds are the runtime's (docs/compression.md).

Horovod-style compressor classes (objects with ``compress(tensor) -> (tensor, ctx)`` and
``decompress(tensor, ctx) -> tensor``) are accepted too: braid calls them around an
uncompressed all-reduce, as Horovod does.
"""

import json
import os

from .._core import checks as _checks, compression as _core_compression, errors as _errors


def _test_methods():
    # The runtime reads BRAID_TEST_COMPRESSORS (0/1) the same way.
    return os.environ.get("BRAID_TEST_COMPRESSORS", "0").strip() == "1"


class Compressor:
    """A compression method of braid's runtime, named by its canonical spec.

    ``spec``: the canonical spec string (e.g. ``"fp16"``, ``"fp4:ef=1"``), what every rank
    passes to the runtime. ``compress``/``decompress`` exist for scripts that call them the
    way Horovod's compressors are called; they return the tensor unchanged, because the
    runtime compresses on the wire.
    """

    __slots__ = ("spec",)

    def __init__(self, spec):
        self.spec = spec

    def __repr__(self):
        return f"braid.torch.Compression.spec({self.spec!r})"

    def __eq__(self, other):
        return isinstance(other, Compressor) and other.spec == self.spec

    def __hash__(self):
        return hash(self.spec)

    @staticmethod
    def compress(tensor):
        """Returns ``(tensor, None)``: the runtime compresses on the wire."""
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        """Returns ``tensor``: the runtime decompresses before it hands the result back."""
        return tensor


class _CompressionNamespace:
    """``Compression.<method>`` for every method of braid's compression registry.

    ``Compression.methods()`` lists them in the registry's order; ``Compression.spec(s)``
    validates a spec string with options and returns its Compressor (InvalidArgumentError
    naming the valid methods or options otherwise).
    """

    def __init__(self):
        for method in _core_compression.compression_methods(False):
            setattr(self, method, Compressor(method))

    @staticmethod
    def methods():
        """The registry's method names (test-only ones with BRAID_TEST_COMPRESSORS=1)."""
        return list(_core_compression.compression_methods(_test_methods()))

    @staticmethod
    def spec(spec):
        """The Compressor of a spec string such as ``"fp4:chunk=64,ef=1"``."""
        spec = str(spec)
        _checks.utf8("Compression.spec", "spec", spec)
        return Compressor(_core_compression.canonical_compression(spec, _test_methods()))

    def __repr__(self):
        return "braid.torch.Compression(" + ", ".join(self.methods()) + ")"


Compression = _CompressionNamespace()


def resolve(compression, what):
    """``(spec for the runtime or None, Horovod-style compressor or None)``.

    None: the job's default (BRAID_COMPRESSION). A string or a Compressor: that method,
    validated here so that a typo fails at once on the calling rank. A dict: a plan of
    parameter-name patterns to specs (each a string or a Compressor), e.g.
    ``{"*.bias": "none", "embedding.*": "scalecomp:ratio=100", "*": "powersgd:rank=4"}``:
    each tensor gets the spec of the first pattern (fnmatch glob, in the dict's order) that
    matches its whole name, ``none`` when none does or when the tensor is too small (fewer
    than ``"$min_elements"``, default 1024) or too flat for its method to pay (an estimated
    compression rate below ``"$min_compression_rate"``, default 2, as PowerSGD's); the rule is
    docs/compression.md's. Another object with
    ``compress``/``decompress``: a framework-side compressor run around an uncompressed
    all-reduce. Anything else raises InvalidArgumentError naming ``what``.
    """
    if compression is None:
        return None, None
    if isinstance(compression, Compressor):
        return compression.spec, None
    if isinstance(compression, str):
        _checks.utf8(what, "compression", compression)
        return _core_compression.canonical_compression(compression, _test_methods()), None
    if isinstance(compression, dict):
        return _plan_text(compression, what), None
    if callable(getattr(compression, "compress", None)) and \
            callable(getattr(compression, "decompress", None)):
        return "none", compression
    raise _errors.InvalidArgumentError(
        f"{what}: compression must be None, a spec string such as 'fp16' or 'fp4:ef=1', "
        f"a braid.torch.Compression member, a dict of name patterns to specs or an object "
        f"with compress/decompress, got {compression!r}")


class PlanChoice(Compressor):
    """The method a plan gave one tensor (a Compressor of its spec) and the pattern that
    matched (``pattern``, str; "" when none did), which travels with the all-reduce so that
    ``compression_stats()`` and ``braidctl status`` count the tensor in its group."""

    __slots__ = ("pattern",)

    def __init__(self, spec, pattern):
        super().__init__(spec)
        self.pattern = pattern


def pattern_of(compression):
    """The plan pattern (str) of a ``compression`` argument: a PlanChoice's, else ""."""
    return compression.pattern if isinstance(compression, PlanChoice) else ""


def plan_spec(plan, name, shape, dtype_code, op):
    """What the plan ``plan`` (its canonical JSON text) gives the tensor ``name`` of
    ``shape``, braid dtype code ``dtype_code``, reduced with ``op`` (docs/compression.md,
    compression per layer): a PlanChoice of its canonical spec and the pattern that matched."""
    spec, pattern = _core_compression.compression_plan_spec(plan, name, shape, dtype_code,
                                                            int(op), _test_methods())
    return PlanChoice(spec, pattern)


def _plan_text(plan, what):
    """The canonical text of a plan given as a dict (checked by the runtime's parser)."""
    rules = {}
    for key, value in plan.items():
        if not isinstance(key, str):
            raise _errors.InvalidArgumentError(
                f"{what}: a compression plan's keys are name patterns (str), got {key!r}")
        if isinstance(value, Compressor):
            value = value.spec
        _checks.utf8(what, "compression", key)
        rules[key] = value
    try:
        text = json.dumps(rules)
    except (TypeError, ValueError) as e:
        raise _errors.InvalidArgumentError(f"{what}: compression plan: {e}") from None
    return _core_compression.canonical_compression(text, _test_methods())
