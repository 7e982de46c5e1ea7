"""braid's error classes and reduce ops: the names every frontend re-exports.

This module's ``__all__`` is the one list of them: ``braid`` and ``braid.numpy`` (through
the core's ``__all__``), ``braid.torch`` and ``braid.torch.mpi_ops`` (through a star import
of this module) all take it from here.

The error classes are the native module's (``braid._braid``), one per status code of braid's
error vocabulary; each is a ``BraidError`` and names the tensor and the ranks involved.
"""

import enum

from .. import _braid
from .._braid import (
    AlreadyExistsError,
    BraidError,
    CancelledError,
    DeadlineExceededError,
    FailedPreconditionError,
    InternalError,
    InvalidArgumentError,
    UnavailableError,
)

__all__ = [
    "AlreadyExistsError", "BraidError", "CancelledError", "DeadlineExceededError",
    "FailedPreconditionError", "InternalError", "InvalidArgumentError", "UnavailableError",
    "ReduceOp", "Sum", "Average", "Min", "Max", "Product",
]


class ReduceOp(enum.IntEnum):
    """How all-reduce and reduce-scatter combine the ranks' values.

    ``Average`` (sum divided by the world size) is defined for floating-point dtypes only;
    integer tensors need ``Sum``, ``Min``, ``Max`` or ``Product``.
    """

    Sum = 0
    Average = 1
    Min = 2
    Max = 3
    Product = 4


Sum = ReduceOp.Sum
Average = ReduceOp.Average
Min = ReduceOp.Min
Max = ReduceOp.Max
Product = ReduceOp.Product

for _op in ReduceOp:  # the codes are the C++ enum's (wire protocol): check they agree
    assert _braid.REDUCE_OPS[_op.name.lower()] == int(_op), _op

