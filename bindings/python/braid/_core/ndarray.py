"""braid's NumPy API: collectives on numpy.ndarray, Horovod style.

Every collective is negotiated by name: each rank must submit a collective with the same
name, collective kind, dtype, (agreeing) shape and op before it runs. Names default to
``"<collective>.noname.<n>"`` from a per-collective counter, so ranks that rely on default
names must issue their unnamed collectives in the same order.

Arrays passed to an asynchronous call are kept alive by braid until the collective completes;
they must not be modified meanwhile (the runtime reads the input and writes the output from
its background thread, without the GIL).

This module's ``__all__`` is exported by ``braid`` and ``braid.numpy``; braid.torch uses its
``barrier`` and ``join`` (they carry no data of the caller's), and the object collectives
(braid._core.objects) are built on its collectives.
"""

import numpy as np

from .checks import MAX_TENSOR_BYTES, check_op, check_splits
from .errors import Average, InvalidArgumentError, ReduceOp
from .handles import HandleBase, keep_alive, poll_handle, wait_handle
from .runtime import dtype_code, enqueue_array, next_name, rank, reports_failures, size
from .runtime import process_set_id as _set_id

__all__ = [
    "Handle", "SUPPORTED_DTYPES", "poll", "synchronize", "allreduce", "allreduce_",
    "allreduce_async", "allreduce_async_", "allgather", "allgather_async", "broadcast",
    "broadcast_", "broadcast_async", "broadcast_async_", "reducescatter", "reducescatter_async",
    "alltoall", "alltoall_async", "barrier", "join",
]

# NumPy dtype (kind, itemsize) -> braid dtype name. bfloat16 is supported by the runtime but
# NumPy has no bfloat16 dtype, so it is reachable from C/C++ only.
_SUPPORTED = {
    ("f", 4): "float32",
    ("f", 8): "float64",
    ("f", 2): "float16",
    ("i", 4): "int32",
    ("i", 8): "int64",
    ("u", 1): "uint8",
}
SUPPORTED_DTYPES = tuple(np.dtype(n) for n in _SUPPORTED.values())


# --- argument conversion --------------------------------------------------------------------

def _dtype_info(fn, name, dt):
    """(braid dtype code, native-byte-order numpy dtype) or InvalidArgumentError."""
    key = (dt.kind, dt.itemsize) if dt.fields is None and dt.subdtype is None else None
    bname = _SUPPORTED.get(key)
    if bname is None:
        raise InvalidArgumentError(
            f"{fn} '{name}': unsupported dtype {dt}: braid supports "
            + ", ".join(_SUPPORTED.values())
            + " (bfloat16 too, but NumPy has no bfloat16 dtype)")
    return dtype_code(bname), np.dtype(bname)


def _check_size(fn, name, arr):
    """Refuses an array beyond the limit of a tensor (2^48 bytes) before anything copies it:
    a zero-strided view can claim petabytes."""
    if arr.size * arr.dtype.itemsize > MAX_TENSOR_BYTES:
        raise InvalidArgumentError(
            f"{fn} '{name}': shape {arr.shape} of {arr.dtype} is {arr.size * arr.dtype.itemsize} "
            f"bytes, more than the limit of a tensor, 2^48 bytes")


def _as_input(fn, name, tensor):
    """A C-contiguous, native-byte-order array with the tensor's values (no copy if it is one)."""
    arr = np.asarray(tensor)
    code, native = _dtype_info(fn, name, arr.dtype)
    _check_size(fn, name, arr)
    if arr.dtype != native or not arr.flags.c_contiguous or not arr.flags.aligned:
        arr = np.ascontiguousarray(arr, dtype=native)
    return arr, code


def _as_inplace(fn, name, tensor):
    """(buffer the runtime reduces in place, array to copy the result back into or None)."""
    if not isinstance(tensor, np.ndarray):
        raise InvalidArgumentError(
            f"{fn} '{name}': in-place collectives need a numpy.ndarray, got "
            f"{type(tensor).__name__}")
    code, native = _dtype_info(fn, name, tensor.dtype)
    _check_size(fn, name, tensor)
    if not tensor.flags.writeable:
        raise InvalidArgumentError(f"{fn} '{name}': the array is read-only")
    if tensor.dtype == native and tensor.flags.c_contiguous and tensor.flags.aligned:
        return tensor, None, code
    # Not usable as is (a strided view, another byte order): reduce a contiguous copy and
    # copy the result back on completion.
    return np.array(tensor, dtype=native, order="C", copy=True), tensor, code


# --- handles --------------------------------------------------------------------------------

class Handle(HandleBase):
    """An asynchronous collective in flight. Pass it to ``synchronize()`` or ``poll()``.

    It holds references to the collective's input and output arrays until the collective
    completes, so they stay valid while the runtime uses them.
    """

    __slots__ = ("_output", "_target", "_dtype")

    def __init__(self, native, collective, keep, output, target, dtype):
        super().__init__(native, collective, keep)
        self._output = output      # pre-allocated result array, or None: the runtime's
        self._target = target      # array the result is copied back into (in-place copies)
        self._dtype = dtype

    def _result_of(self):
        if self._collective == "barrier":
            return None
        if self._collective == "join":
            return int(self._native.output(np.dtype(np.int32)))
        result = self._output if self._output is not None else self._native.output(self._dtype)
        if self._target is not None:
            np.copyto(self._target, result.reshape(self._target.shape), casting="unsafe")
            result = self._target
        return result

    def _release(self):
        self._output = None


def _enqueue(collective, name, arr, code, output=None, op=ReduceOp.Average, root_rank=0,
             splits=(), target=None, compression=None, process_set_id=0):
    native = enqueue_array(collective, name, arr, code, output, op, root_rank, splits,
                           compression, process_set_id)
    h = Handle(native, collective, (arr, output, target), output, target, arr.dtype)
    keep_alive(h)  # the arrays of a running collective outlive a dropped Handle
    return h


def poll(handle):
    """True once the collective behind ``handle`` has completed (successfully or not).

    Never blocks and never raises the collective's error (``synchronize`` does).
    InvalidArgumentError if ``handle`` is not a Handle."""
    return poll_handle("poll", handle, Handle)


def synchronize(handle, timeout=None):
    """Waits for an asynchronous collective and returns its result array.

    The GIL is released while waiting (in 100 ms slices, so Ctrl-C raises
    KeyboardInterrupt; the collective keeps running and the handle stays valid).
    ``timeout`` (seconds, None = forever): raises DeadlineExceededError if the collective is
    still running then; the handle stays valid and may be synchronized again.

    Raises the collective's error: InvalidArgumentError (mismatch across ranks),
    CancelledError (shut down meanwhile), UnavailableError (a peer was lost),
    DeadlineExceededError (no progress for BRAID_TIMEOUT_S), InternalError. Calling it again
    on a completed handle returns the same result (or raises the same error), and
    InvalidArgumentError if ``handle`` is not a Handle.
    """
    return wait_handle("synchronize", handle, timeout, Handle)


# --- all-reduce -----------------------------------------------------------------------------

@reports_failures
def allreduce_async(tensor, name=None, op=Average, compression=None, process_set=None):
    """Starts an all-reduce of ``tensor`` into a new array; returns a Handle.

    ``tensor``: any array-like of dtype float32, float64, float16, int32, int64 or uint8, of
    the same shape on every rank (non-contiguous arrays are copied first). ``synchronize``
    returns a new C-contiguous array of the same shape and dtype; ``tensor`` is not modified.
    ``op``: braid.Sum, braid.Average (float dtypes only), braid.Min, braid.Max, braid.Product.
    ``compression``: this tensor's compression spec, the same on every rank: "none", "fp16",
    "bf16" (cast to 16 bits, 1/2 of float32's bytes), "fp4" (radix-4 FP4 with per-chunk
    GradScale, Sun et al. 2020) or "int4" (4-bit integers), about 1/7.5 of the bytes, with
    options such as "fp4:chunk=128,ef=1" or "int4:start_step=100", or a sparsifier that
    sends 1/ratio of the elements and keeps the rest in an error-feedback memory:
    "scalecomp:ratio=100" (ScaleCom, Chen et al. 2020), "topk", "randomk"
    (docs/compression.md). The result is then approximate, within the bound each method documents,
    and identical on every rank. None uses the job's default (BRAID_COMPRESSION), which
    applies only to floating-point tensors with op Sum or Average. Raises
    InvalidArgumentError for an unknown method or option, a method on an integer tensor or
    another op, or (from ``synchronize``) ranks asking for different methods or, with a
    sparsifier, a NaN or infinity in any rank's gradient.
    """
    name = next_name("allreduce") if name is None else name
    op = check_op(op)
    arr, code = _as_input("allreduce", name, tensor)
    out = np.empty_like(arr)
    return _enqueue("allreduce", name, arr, code, output=out, op=op, compression=compression,
                    process_set_id=_set_id("allreduce", process_set))


def allreduce(tensor, name=None, op=Average, compression=None, process_set=None):
    """All-reduces ``tensor`` across ranks and returns the result as a new array.

    Same shape and dtype as ``tensor``, which is left untouched. Every rank must pass the
    same shape, dtype and op (else InvalidArgumentError naming the ranks). Average is the
    sum divided by the world size and needs a floating-point dtype. See allreduce_async.
    """
    return synchronize(allreduce_async(tensor, name=name, op=op, compression=compression,
                                       process_set=process_set))


@reports_failures
def allreduce_async_(tensor, name=None, op=Average, compression=None, process_set=None):
    """Starts an in-place all-reduce of ``tensor`` (a writeable numpy.ndarray).

    A C-contiguous tensor is reduced in place; any other (a transposed view, another byte
    order) is copied in and the result copied back when ``synchronize`` is called.
    Raises InvalidArgumentError for a read-only array or an unsupported dtype.
    """
    name = next_name("allreduce") if name is None else name
    op = check_op(op)
    buf, target, code = _as_inplace("allreduce_", name, tensor)
    return _enqueue("allreduce", name, buf, code, output=buf, op=op, target=target,
                    compression=compression,
                    process_set_id=_set_id("allreduce_", process_set))


def allreduce_(tensor, name=None, op=Average, compression=None, process_set=None):
    """All-reduces ``tensor`` in place and returns it. See allreduce_async_."""
    return synchronize(allreduce_async_(tensor, name=name, op=op, compression=compression,
                                        process_set=process_set))


# --- all-gather -----------------------------------------------------------------------------

@reports_failures
def allgather_async(tensor, name=None, process_set=None):
    """Starts an all-gather of ``tensor`` (at least 1-D); returns a Handle.

    The first dimension may differ across ranks; the trailing dimensions and dtype must
    agree. The result concatenates every rank's tensor along dim 0 in rank order: shape
    ``(sum of dim 0 over ranks,) + tensor.shape[1:]``.
    """
    name = next_name("allgather") if name is None else name
    arr, code = _as_input("allgather", name, tensor)
    return _enqueue("allgather", name, arr, code,
                    process_set_id=_set_id("allgather", process_set))


def allgather(tensor, name=None, process_set=None):
    """All-gathers ``tensor`` along dim 0 and returns a new array. See allgather_async."""
    return synchronize(allgather_async(tensor, name=name, process_set=process_set))


# --- broadcast ------------------------------------------------------------------------------

@reports_failures
def broadcast_async(tensor, root_rank, name=None, process_set=None):
    """Starts a broadcast of ``root_rank``'s tensor into a new array on every rank.

    Every rank passes a tensor of the same shape and dtype; ``tensor`` itself is left
    untouched. The result is a new array holding the root's values.
    """
    name = next_name("broadcast") if name is None else name
    arr, code = _as_input("broadcast", name, tensor)
    out = np.empty_like(arr)
    return _enqueue("broadcast", name, arr, code, output=out, root_rank=root_rank,
                    process_set_id=_set_id("broadcast", process_set))


def broadcast(tensor, root_rank, name=None, process_set=None):
    """Returns a new array with ``root_rank``'s ``tensor``. See broadcast_async."""
    return synchronize(broadcast_async(tensor, root_rank, name=name, process_set=process_set))


@reports_failures
def broadcast_async_(tensor, root_rank, name=None, process_set=None):
    """Starts an in-place broadcast: ``tensor`` (a writeable ndarray) receives the root's."""
    name = next_name("broadcast") if name is None else name
    buf, target, code = _as_inplace("broadcast_", name, tensor)
    return _enqueue("broadcast", name, buf, code, output=buf, root_rank=root_rank,
                    target=target, process_set_id=_set_id("broadcast_", process_set))


def broadcast_(tensor, root_rank, name=None, process_set=None):
    """Overwrites ``tensor`` with ``root_rank``'s values and returns it."""
    return synchronize(broadcast_async_(tensor, root_rank, name=name, process_set=process_set))


# --- reduce-scatter -------------------------------------------------------------------------

@reports_failures
def reducescatter_async(tensor, name=None, op=Average, process_set=None):
    """Starts a reduce-scatter of ``tensor`` (at least 1-D, same shape on every rank).

    The reduced tensor is split along dim 0: with ``n = tensor.shape[0]`` and world size
    ``s``, rank ``r`` receives ``n // s`` rows, plus one when ``r < n % s``, in rank order.
    """
    name = next_name("reducescatter") if name is None else name
    op = check_op(op)
    ps_id = _set_id("reducescatter", process_set)
    arr, code = _as_input("reducescatter", name, tensor)
    out = None
    if arr.ndim > 0:
        s, r = (size(), rank()) if ps_id == 0 else (process_set.size(), process_set.rank())
        rows = arr.shape[0] // s + (1 if r < arr.shape[0] % s else 0)
        out = np.empty((rows,) + arr.shape[1:], dtype=arr.dtype)
    return _enqueue("reducescatter", name, arr, code, output=out, op=op, process_set_id=ps_id)


def reducescatter(tensor, name=None, op=Average, process_set=None):
    """Reduces ``tensor`` across ranks and returns this rank's share of dim 0.

    See reducescatter_async for the split."""
    return synchronize(reducescatter_async(tensor, name=name, op=op, process_set=process_set))


# --- all-to-all -----------------------------------------------------------------------------

@reports_failures
def alltoall_async(tensor, splits=None, name=None, process_set=None):
    """Starts an all-to-all of ``tensor`` (at least 1-D); returns a Handle.

    ``splits``: rows of dim 0 sent to each rank (``size()`` non-negative integers summing to
    ``tensor.shape[0]``); None splits dim 0 evenly (it must then divide by the world size).
    The result concatenates, in rank order, the rows every rank sent to this one: shape
    ``(rows received,) + tensor.shape[1:]``; trailing dimensions must agree across ranks.
    """
    name = next_name("alltoall") if name is None else name
    ps_id = _set_id("alltoall", process_set)
    arr, code = _as_input("alltoall", name, tensor)
    sp = ()
    if splits is not None:
        rows = arr.shape[0] if arr.ndim > 0 else 0
        sp = check_splits(f"alltoall '{name}'", splits, rows,
                          size() if ps_id == 0 else process_set.size())
    return _enqueue("alltoall", name, arr, code, splits=sp, process_set_id=ps_id)


def alltoall(tensor, splits=None, name=None, process_set=None):
    """Exchanges slices of ``tensor`` with every rank and returns the rows received.

    See alltoall_async."""
    return synchronize(alltoall_async(tensor, splits=splits, name=name,
                                      process_set=process_set))


# --- barrier --------------------------------------------------------------------------------

_BARRIER_NAME = "barrier"


def barrier(name=None, process_set=None):
    """Returns once every rank has called barrier() (with the same name).

    An unnamed barrier is named ``"barrier"`` on every rank (no counter), so barriers pair
    in the order the ranks call them, also after one failed on some ranks and not others:
    it is how the ranks resynchronize after an error (docs/failures.md: No error shifts a
    step)."""
    name = _BARRIER_NAME if name is None else name
    ps_id = _set_id("barrier", process_set)
    arr = np.empty((0,), dtype=np.uint8)
    synchronize(_enqueue("barrier", name, arr, dtype_code("uint8"), op=ReduceOp.Sum,
                         process_set_id=ps_id))


# --- join -----------------------------------------------------------------------------------

_JOIN_NAME = "braid.join"  # the same on every rank: one join() round at a time


def join(process_set=None):
    """Uneven inputs (Horovod's ``join``): call it on a rank that has run out of data.

    Blocks until every rank has called ``join()`` and returns, on every rank, the rank that
    joined last (an int). Meanwhile this rank takes part in the other ranks' collectives
    without data of its own:

    - ``allreduce`` (every form): it contributes the op's identity in a buffer of the
      negotiated shape and dtype: zeros for ``Sum`` and ``Average``, the dtype's largest
      value for ``Min``, its lowest for ``Max``, one for ``Product``. An ``Average`` still
      divides by the whole world size ``size()``, not by the ranks that had data (as
      Horovod, and DDP's ``divide_by_initial_world_size``, do): with 3 ranks of which one
      joined, the result is ``(x0 + x1 + 0) / 3``.
    - ``barrier``: it takes part.
    - ``allgather``, ``broadcast``, ``reducescatter``, ``alltoall``: they fail on the ranks
      that called them with FailedPreconditionError naming the joined ranks (a joined rank
      has no data to contribute to them), as Horovod refuses them.

    A rank waiting in ``join()`` is never a stalled rank: it may wait as long as the others
    train. After every rank has joined, collectives work as before, and ``join()`` may be
    called again for the next epoch.

    Raises FailedPreconditionError (not initialized, or a rank shut down without joining),
    AlreadyExistsError (this rank is already in ``join()`` on another thread), and the errors
    of ``synchronize``.
    """
    arr = np.empty((0,), dtype=np.uint8)
    return synchronize(_enqueue("join", _JOIN_NAME, arr, dtype_code("uint8"),
                                op=ReduceOp.Sum, process_set_id=_set_id("join", process_set)))

