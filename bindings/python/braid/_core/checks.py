"""Argument checks shared by braid's frontends, and the limits they enforce.

Every wrong argument is refused here, before anything reaches the native layer, as an
InvalidArgumentError naming the call and the argument: never a TypeError of the binding, and
never a value silently truncated to an integer. The limits are the runtime's
(common/limits.h).
"""

import math
import numbers

import numpy as np

from .errors import InvalidArgumentError, ReduceOp

#: Bytes of a collective's name in UTF-8, at most.
MAX_NAME_BYTES = 1024
#: Bytes of one tensor, at most (2^48); also bounds element counts and alltoall splits.
MAX_TENSOR_BYTES = 1 << 48
#: The range of a C int32 (root ranks), as (lowest, highest).
INT32 = (-(1 << 31), (1 << 31) - 1)
#: Bytes of a compression spec in UTF-8, at most.
MAX_COMPRESSION_SPEC_BYTES = 256
#: Bytes of a compression plan (a JSON object of name patterns to specs) in UTF-8, at most.
MAX_COMPRESSION_PLAN_BYTES = 64 * 1024


def is_int(value):
    """True for an integer that is not a bool (a bool is an int in Python, but never meant as
    one): a Python int or a NumPy integer scalar."""
    return isinstance(value, (numbers.Integral, np.integer)) and not isinstance(
        value, (bool, np.bool_))


def check_int(what, field, value, lo, hi):
    """``value`` as an int in [lo, hi], or InvalidArgumentError naming ``field``. Floats are
    refused, even integral ones: a rank or a count given as 1.5 is a bug, and truncating it
    would hide one."""
    if not is_int(value):
        raise InvalidArgumentError(f"{what}: {field} must be an integer, got "
                                   f"{type(value).__name__} {value!r}")
    v = int(value)
    if not lo <= v <= hi:
        raise InvalidArgumentError(f"{what}: {field} must be in [{lo}, {hi}], got {v}")
    return v


def utf8(what, field, text):
    """``text`` (a str) in UTF-8 (bytes), as the native module takes every string. A str that
    has no UTF-8 form (a lone surrogate such as ``'g\\udc80'``, which ``os.fsdecode`` makes
    of undecodable bytes) raises InvalidArgumentError naming ``field``, where the native
    module would raise a bare TypeError."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise InvalidArgumentError(
            f"{what}: {field} is not valid UTF-8: {text!r:.64} holds {text[e.start]!r} at "
            f"index {e.start} ({e.reason})") from None


def is_utf8(text):
    """True when the str ``text`` has a UTF-8 form (no lone surrogates); never raises."""
    try:
        text.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False


def check_name(fn, name):
    """``name`` when it is a collective's name: a non-empty str of at most MAX_NAME_BYTES
    bytes in UTF-8; else InvalidArgumentError naming ``fn``."""
    if not isinstance(name, str):
        raise InvalidArgumentError(f"{fn}: name must be a str, got {type(name).__name__} "
                                   f"{name!r:.64}")
    n = len(utf8(fn, "name", name))
    if n == 0:
        raise InvalidArgumentError(f"{fn}: name is empty")
    if n > MAX_NAME_BYTES:
        raise InvalidArgumentError(f"{fn}: name is {n} bytes long, more than the limit of "
                                   f"{MAX_NAME_BYTES} (it starts {name[:64]!r})")
    return name


def check_splits(what, splits, rows, size):
    """alltoall splits as a list of ints: ``size`` non-negative integers (a sequence or an
    integer ndarray) summing to ``rows`` (exactly, in Python's unbounded integers: no sum can
    wrap); else InvalidArgumentError naming ``what``."""
    if isinstance(splits, (str, bytes)) or not hasattr(splits, "__iter__"):
        raise InvalidArgumentError(f"{what}: splits must be a sequence of integers, got "
                                   f"{type(splits).__name__}")
    if isinstance(splits, np.ndarray) and splits.dtype.kind not in "iu":
        raise InvalidArgumentError(f"{what}: splits must hold integers, got dtype {splits.dtype}")
    out = [check_int(what, f"splits[{i}]", x, 0, MAX_TENSOR_BYTES)
           for i, x in enumerate(np.asarray(splits).reshape(-1).tolist()
                                 if isinstance(splits, np.ndarray) else splits)]
    if len(out) != size:
        raise InvalidArgumentError(f"{what}: splits has {len(out)} entries for {size} ranks")
    if sum(out) != rows:
        raise InvalidArgumentError(f"{what}: splits sum to {sum(out)} but dim 0 is {rows}")
    return out


def check_compression(what, compression):
    """A compression spec: None (the job's default) or a str of at most
    MAX_COMPRESSION_SPEC_BYTES bytes in UTF-8 (MAX_COMPRESSION_PLAN_BYTES for a plan, a JSON
    object); else InvalidArgumentError naming ``what``. The method and its options are
    checked by the runtime."""
    if compression is None:
        return
    if not isinstance(compression, str):
        raise InvalidArgumentError(f"{what}: compression must be a string such as 'fp16' or "
                                   f"'fp4:ef=1', got {type(compression).__name__} "
                                   f"{compression!r:.64}")
    limit = (MAX_COMPRESSION_PLAN_BYTES if compression.lstrip().startswith("{")
             else MAX_COMPRESSION_SPEC_BYTES)
    if len(utf8(what, "compression", compression)) > limit:
        raise InvalidArgumentError(f"{what}: compression is {len(compression)} characters "
                                   f"long, more than the limit of {limit}")


def check_timeout(timeout):
    """A wait's timeout in seconds (float): None (forever) or a finite number >= 0; else
    InvalidArgumentError."""
    if timeout is None:
        return None
    if not isinstance(timeout, numbers.Real) or isinstance(timeout, bool):
        raise InvalidArgumentError(f"timeout must be a number of seconds or None, got "
                                   f"{type(timeout).__name__} {timeout!r}")
    t = float(timeout)
    if math.isnan(t) or t < 0:
        raise InvalidArgumentError(f"timeout must be >= 0 seconds, got {timeout!r}")
    return t


def check_op(op):
    """The ReduceOp of ``op`` (a ReduceOp or its integer code); else InvalidArgumentError
    naming the valid ops."""
    if not is_int(op):  # ReduceOp(1.0) would be Average: a float is refused, not truncated
        raise InvalidArgumentError(f"unknown reduce op {op!r}: use braid.Sum, braid.Average, "
                                   "braid.Min, braid.Max or braid.Product")
    try:
        return ReduceOp(op)
    except ValueError:
        raise InvalidArgumentError(f"unknown reduce op {op!r}: use braid.Sum, braid.Average, "
                                   "braid.Min, braid.Max or braid.Product") from None
