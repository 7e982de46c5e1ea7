"""braid: collective communication for data-parallel training (Horovod-style API).

Typical use, under ``braidrun -np 4 python3 train.py``::

    import numpy as np
    import braid

    braid.init()
    grad = np.ones(1000, dtype=np.float32)
    avg = braid.allreduce(grad, name="grad")          # new array, the average over ranks
    braid.allreduce_(grad, op=braid.Sum)              # in place
    h = braid.allgather_async(np.arange(braid.rank() + 1))
    everything = braid.synchronize(h)                  # ranks' rows concatenated
    braid.compression_stats()["methods"]               # bytes sent, per compression method
    braid.shutdown()                                   # also done at exit

PyTorch: ``import braid.torch as hvd`` gives Horovod's PyTorch API (tensors, a
DistributedOptimizer, state broadcast) over the same runtime; see braid/torch/__init__.py.

Supported NumPy dtypes: float32, float64, float16, int32, int64, uint8. The runtime also
supports bfloat16, but NumPy has no bfloat16 dtype, so it is not reachable from here (use the
C API or a framework binding). Other dtypes (bool, int16, complex, ...) raise
InvalidArgumentError naming the dtype. Non-contiguous arrays are copied to contiguous memory
first, so results are always correct.

Names: every collective is matched across ranks by name. When ``name`` is None a name is
generated per collective kind from a counter ("allreduce.noname.0", "allreduce.noname.1",
...), so ranks must issue their unnamed collectives in the same order. Names of collectives in
flight at the same time must be distinct (AlreadyExistsError otherwise).

Errors are ``braid.BraidError`` subclasses named after braid's status vocabulary:
InvalidArgumentError, AlreadyExistsError, FailedPreconditionError (not initialized),
CancelledError (shut down), DeadlineExceededError, UnavailableError (peer or coordinator
lost), InternalError. Their message is the runtime's and names the tensor and the ranks.

Processes: ``shutdown()`` runs at interpreter exit, but only in the process that called
``init()``: a forked child (e.g. a DataLoader worker) neither shuts down its parent's job nor
can use it.
"""

from ._core import *  # noqa: F401,F403
from ._core import __all__  # noqa: F401  (the NumPy API, listed once, in braid/_core)

__version__ = "0.1.0"
