"""A DistributedDataParallel communication hook that all-reduces DDP's buckets with braid.

DDP users apply compression through ``model.register_comm_hook(state, hook)``
(``powerSGD_hook``, ``fp16_compress_hook``); braid's hook is used the same way, with any of
braid's methods::

    import braid.torch as hvd
    hvd.init()
    model = DistributedDataParallel(model)          # over any process group (gloo, braid)
    model.register_comm_hook(*hvd.ddp_comm_hook(compression="powersgd:rank=2"))

Each bucket DDP hands the hook is averaged on braid's data plane one gradient at a time (the
bucket's per-parameter views, each with its parameter's shape, so PowerSGD sees matrices
and leaves vectors uncompressed, as DDP's own ``powerSGD_hook`` does), in place in the
bucket's buffer, so ``gradient_as_bucket_view=True`` keeps its views; braid's runtime fuses
the gradients again into its own buckets. The hook returns the ``torch.futures.Future`` DDP
waits on, completed by a thread of the hook's state when braid's collectives complete. The
process group DDP was built on (gloo, braid) only serves DDP's own start-up broadcasts.

Names and compression state: a parameter's gradient is all-reduced under one name every
step, ``"ddp<k>.<parameter name>"`` when ``named_parameters`` is given, else
``"ddp<k>.param.<i>"``, i numbering the parameters in the order DDP first hands them over
(the same on every rank); k numbers the hooks this process created, from 0. State kept per
tensor (error feedback, PowerSGD's Q and residuals) therefore follows its parameter from one
step to the next, also across DDP's rebuild of its buckets after the first iteration (other
buckets, other order), where state keyed by bucket index would be applied to the wrong
gradients (pytorch#48670 was that failure in DDP's own PowerSGD hook). ``no_sync()`` skips
the hook, as it skips DDP's own all-reduce; ``static_graph=True`` changes nothing here.
"""

import itertools
import queue
import threading

import torch

from .._core import runtime as _runtime
from .._core.compression import canonical_compression
from .._core.errors import BraidError, FailedPreconditionError, InvalidArgumentError
from . import mpi_ops

__all__ = ["ddp_comm_hook", "BraidHookState"]

_hook_numbers = itertools.count()


class BraidHookState:
    """The state of one model's hook: its compression spec (canonical str), the prefix of its
    bucket names, and the thread that completes its futures (started on first use, a
    daemon)."""

    def __init__(self, compression, names=None):
        self.compression = compression
        self.prefix = f"ddp{next(_hook_numbers)}"
        self._names = dict(names or {})  # id(parameter) -> name
        self._numbered = not self._names
        self._queue = queue.Queue()
        self._thread = None
        self._lock = threading.Lock()

    def __getstate__(self):
        raise TypeError("BraidHookState cannot be pickled (it holds a thread)")

    def name_of(self, parameter):
        """The all-reduce name of ``parameter``'s gradient (see the module's docstring)."""
        key = id(parameter)
        if key not in self._names:
            if not self._numbered:
                raise InvalidArgumentError(
                    f"ddp_comm_hook: a parameter of shape {tuple(parameter.shape)} is not in "
                    "the named_parameters given: pass model.named_parameters() of the DDP "
                    "model's module")
            self._names[key] = f"param.{len(self._names)}"
        return f"{self.prefix}.{self._names[key]}"

    def submit(self, handles, future, result):
        """Completes ``future`` with ``result`` (the bucket's tensor) once every handle of
        ``handles`` completes, or with the first error."""
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._complete, daemon=True,
                                                name=f"braid-{self.prefix}-hook")
                self._thread.start()
        self._queue.put((handles, future, result))

    def _complete(self):
        while True:
            handles, future, buffer = self._queue.get()
            error = None
            for h in handles:  # every one, also after an error: they hold the tensors
                try:
                    mpi_ops.synchronize(h)
                except BaseException as e:  # noqa: BLE001  (DDP raises it from the future)
                    error = error or e
            future.set_result(buffer if error is None else error)


def _raise_error(future):
    """The bucket's tensor, or the braid error its future holds raised. torch 1.13's
    Future.set_exception keeps the exception as the future's value, which DDP's C++ side then
    fails to read as a tensor ("Unable to cast ... to Tensor"); raised in a callback of
    ``then``, it becomes the chained future's error, with braid's class and message."""
    value = future.value()
    if isinstance(value, BaseException):
        raise value
    return value


def _hook(state, bucket):
    """DDP's hook: starts the average of the bucket's gradients and returns its future."""
    future = torch.futures.Future()
    result = future.then(_raise_error)
    buffer = bucket.buffer()
    if buffer.is_sparse:
        future.set_result(InvalidArgumentError(
            f"ddp_comm_hook: bucket {bucket.index()} holds a sparse gradient (an "
            "nn.Embedding(sparse=True)?), which braid does not all-reduce: use dense gradients"))
        return result
    params = bucket.parameters()
    if sum(p.numel() for p in params) != buffer.numel():
        future.set_result(InvalidArgumentError(
            f"ddp_comm_hook: bucket {bucket.index()} holds {buffer.numel()} elements, its "
            f"parameters {sum(p.numel() for p in params)}: a layout this hook does not know"))
        return result
    handles, at = [], 0
    try:
        # The buffer holds the gradients one after another, in this order: each is reduced
        # in place as the buffer's slice with its parameter's shape.
        for param in params:
            grad = buffer[at:at + param.numel()].view(param.shape)
            handles.append(mpi_ops.allreduce_async_(
                grad, name=state.name_of(param), op=mpi_ops.Average,
                compression=state.compression))
            at += param.numel()
    except BraidError as e:
        for h in handles:  # let the started ones finish before DDP reuses the buffer
            try:
                mpi_ops.synchronize(h)
            except BraidError:
                pass
        future.set_result(e)
        return result
    state.submit(handles, future, buffer)
    return result


def ddp_comm_hook(compression="none", named_parameters=None):
    """``(state, hook)`` for ``DistributedDataParallel.register_comm_hook(state, hook)``:
    DDP's buckets averaged by braid with ``compression`` (a spec string such as
    ``"powersgd:rank=2"``, ``"fp16"``, ``"scalecomp:ratio=100"``, or a
    ``braid.torch.Compression`` member), the same on every rank.

    ``named_parameters``: the DDP model's ``module.named_parameters()``, to name the
    all-reduces (and what ``braidctl status`` lists) after the parameters; without it they
    are numbered. braid must be initialized (``braid.torch.init()``, or a ``braid`` process
    group): FailedPreconditionError otherwise. Raises InvalidArgumentError for an unknown
    method. Errors of a step (a lost rank, a
    mismatch) are raised by DDP from the bucket's future, as braid's error classes.
    """
    if not _runtime.is_initialized():
        raise FailedPreconditionError(
            "ddp_comm_hook: braid is not initialized: call braid.torch.init() first (or "
            "create the process group with dist.init_process_group(\"braid\"))")
    spec = getattr(compression, "spec", compression)
    if not isinstance(spec, str):
        raise InvalidArgumentError(
            f"ddp_comm_hook: compression must be a spec string or a Compression member, got "
            f"{compression!r}")
    names = None
    if named_parameters is not None:
        names = {id(p): n for n, p in named_parameters}
    return BraidHookState(canonical_compression(spec), names), _hook
