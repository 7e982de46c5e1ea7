"""braid.torch: Horovod's PyTorch API over braid.

A script written for ``import horovod.torch as hvd`` runs with ``import braid.torch as hvd``
(under ``braidrun -np N``, or torchrun-style ``RANK``/``WORLD_SIZE`` variables)::

    import braid.torch as hvd

    hvd.init()
    torch.set_num_threads(1)                     # several ranks share the host's cores
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size(), momentum=0.9)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=hvd.Compression.fp16)   # or "fp4:ef=1"
    for x, y in shard:
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()  # all-reduces start as gradients are ready
        optimizer.step()                         # waits for them, then updates
    avg_loss = hvd.allreduce(torch.tensor(loss), name="loss").item()

Contents:

- lifecycle and topology: ``init``, ``shutdown``, ``is_initialized``, ``size``, ``rank``,
  ``local_size``, ``local_rank``, ``cross_size``, ``cross_rank``;
- collectives on CPU tensors (mpi_ops.py): ``allreduce[_][_async]``,
  ``grouped_allreduce[_][_async]``, ``allgather[_async]``, ``broadcast[_][_async]``,
  ``alltoall[_async]``, ``reducescatter[_async]``, ``barrier``, ``join`` (uneven inputs:
  a joined rank contributes zeros to the others' all-reduces, and an ``Average`` divides by
  the whole world size), ``synchronize``, ``poll``;
  ops ``Average`` (default), ``Sum``, ``Min``, ``Max``, ``Product`` (``Adasum`` exists and
  raises InvalidArgumentError: not implemented);
- ``Compression`` (compression.py): the runtime's compression methods;
  ``compression_state``/``load_compression_state``: the compressors' state for checkpoints;
- ``DistributedOptimizer`` (optimizer.py);
- ``SyncBatchNorm`` (sync_batch_norm.py): batch normalization over every rank's batch;
- for PyTorch DDP users: ``ddp_comm_hook`` (ddp_comm_hooks.py), a communication hook that
  all-reduces DDP's buckets with any of braid's methods, and ``braid.torch.distributed``
  (imported explicitly), which registers the ``braid`` torch.distributed backend;
- build and job facts, as Horovod's: ``is_homogeneous``, ``mpi_enabled``, ``gloo_enabled``,
  ``mpi_threads_supported``, ``mpi_built``, ``gloo_built``, ``nccl_built``, ``cuda_built``,
  ``rocm_built``;
- ``broadcast_parameters``, ``broadcast_optimizer_state``, ``broadcast_object``,
  ``allgather_object`` (functions.py);
- ``elastic`` (elastic.py): Horovod's elastic training under ``braidrun --min-np``: ``run``,
  ``TorchState``, ``ObjectState``, ``State``, ``HostsUpdatedInterrupt``, and
  ``ElasticSampler``, which shards an epoch's indices not yet processed over the world as it
  is now.

CUDA tensors (a braid built with CUDA, cuda_built()): all-reduce (so DistributedOptimizer and
the DDP hook), barrier and join; braid's work waits for the tensor's device's current stream
at the call, and the result is in place when the handle completes. The other collectives
refuse them (FailedPreconditionError). See docs/gpu.md.

Not yet: process sets other than the global one.

Errors are the ``braid.BraidError`` subclasses (InvalidArgumentError, FailedPreconditionError,
...), whose messages name the tensor and the ranks involved.
"""

from .._core import compression as _compression, runtime as _runtime, stats as _stats
from .._core.compression import *  # noqa: F401,F403  (compression_state, load_...)
from .._core.runtime import *  # noqa: F401,F403  (init, shutdown, size, rank, ...)
from .._core.stats import *  # noqa: F401,F403  (compression_stats, fusion_stats, timeline)
from . import elastic, mpi_ops  # noqa: F401
from .compression import Compression, Compressor  # noqa: F401
from .ddp_comm_hooks import ddp_comm_hook  # noqa: F401
from .functions import (  # noqa: F401
    allgather_object,
    broadcast_object,
    broadcast_optimizer_state,
    broadcast_parameters,
)
from .mpi_ops import *  # noqa: F401,F403  (the collectives, handles, errors and ops)
from .optimizer import DistributedOptimizer  # noqa: F401
from .sync_batch_norm import SyncBatchNorm  # noqa: F401


def cross_size():
    """The number of hosts, assuming every host runs ``local_size()`` ranks (as braidrun,
    torchrun and Slurm's block distribution start them). FailedPreconditionError before
    ``init()``."""
    return max(1, size() // local_size())


def cross_rank():
    """This host's index among the hosts (0 on a single host), under cross_size()'s
    assumption that ranks are numbered host by host. FailedPreconditionError before
    ``init()``."""
    return rank() // local_size()


def nccl_built():
    """Whether this braid can use NCCL: True when it is built with CUDA, which opens NCCL
    (libnccl.so.2) at run time for all-reduces of CUDA tensors (docs/gpu.md); whether a job
    then runs it depends on BRAID_GPU_DATA_PLANE and on every rank finding the library."""
    return _runtime.cuda_built()


def mpi_built():
    """False: braid does not run on MPI (its coordinator and data plane are its own)."""
    return False


def gloo_built():
    """False: braid does not use Gloo."""
    return False


def cuda_built():
    """Whether this braid was built with CUDA, so that CUDA tensors may be passed (all-reduce,
    barrier and join so far; docs/gpu.md)."""
    return _runtime.cuda_built()


def rocm_built():
    """False: no ROCm support."""
    return False


def mpi_enabled():
    """False: braid's jobs never run on MPI (under mpirun, braid only reads its rank
    variables: docs/launching.md)."""
    return False


def gloo_enabled():
    """False: braid's jobs never run on Gloo."""
    return False


def mpi_threads_supported():
    """False: there is no MPI in braid's jobs, so none whose threads a script could use.
    (Horovod raises ValueError here when it runs without MPI; a script that asks before
    using mpi4py alongside gets a plain False.) braid's own collectives may be called from
    any thread."""
    return False


__all__ = sorted(set(_runtime.__all__ + _stats.__all__ + _compression.__all__ + mpi_ops.__all__ + [
    "allgather_object", "broadcast_object", "broadcast_optimizer_state", "broadcast_parameters",
    "Compression", "Compressor", "cross_rank", "cross_size", "cuda_built", "ddp_comm_hook",
    "DistributedOptimizer",
    "gloo_built", "gloo_enabled", "mpi_built", "mpi_enabled", "mpi_threads_supported",
    "nccl_built", "rocm_built", "SyncBatchNorm",
]), key=str.lower)
