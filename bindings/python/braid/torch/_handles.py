"""The machinery under braid.torch's collectives: reduce ops, dtypes, handles, enqueue.

A contiguous tensor reaches the runtime by address (``tensor.data_ptr()``) through the
core's ``enqueue_pointer`` (braid/_core/runtime.py); the Handle keeps every tensor the
runtime reads or writes alive until the collective completes, and its finisher (run once, on
the caller's thread, after success) turns the runtime's output into the caller's result.
"""

import math
import numbers
import threading
import warnings

import torch

from .._core import checks as _checks, handles as _core_handles, runtime as _runtime
from .._core.errors import Average, InvalidArgumentError, Max, Min, Product, ReduceOp, Sum

# --- ops ------------------------------------------------------------------------------------


class _UnimplementedOp:
    """A reduce op that braid names but does not implement (yet)."""

    __slots__ = ("name", "why")

    def __init__(self, name, why):
        self.name = name
        self.why = why

    def __repr__(self):
        return f"braid.torch.{self.name}"


#: Adasum (Maleki et al., "Scaling Distributed Training with Adaptive Summation", MLSys 2021)
#: is not implemented in braid: passing it raises InvalidArgumentError.
Adasum = _UnimplementedOp("Adasum", "Adasum (adaptive summation) is not implemented in braid; "
                                    "use Average or Sum")


def _what(fn, name):
    return f"{fn} '{name}'" if name else fn


def check_op(fn, name, op, average=None):
    """The ReduceOp for Horovod's ``op``/deprecated ``average`` arguments of the call ``fn``
    on the tensor ``name``: Average when both are None. InvalidArgumentError for both
    given, Adasum (not implemented) or an unknown op; a DeprecationWarning for ``average``."""
    if average is not None:
        if op is not None:
            raise InvalidArgumentError(f"{_what(fn, name)}: pass either op or the deprecated "
                                       "average, not both")
        warnings.warn("the 'average' argument is deprecated: use op=Average or op=Sum",
                      DeprecationWarning, stacklevel=3)
        return Average if average else Sum
    if op is None:
        return Average
    if isinstance(op, _UnimplementedOp):
        raise InvalidArgumentError(f"{_what(fn, name)}: {op.why}")
    if not _checks.is_int(op):  # ReduceOp(1.0) would be Average: refused, never truncated
        raise InvalidArgumentError(f"{_what(fn, name)}: unknown reduce op {op!r}: use Sum, "
                                   "Average, Min, Max or Product")
    try:
        return ReduceOp(op)
    except ValueError:
        raise InvalidArgumentError(f"{_what(fn, name)}: unknown reduce op {op!r}: use Sum, "
                                   "Average, Min, Max or Product") from None


# Note [Process sets] (control/process_sets.h): every public collective names its process set
# first (check_process_set), and the enqueues of that call go to it. Kept per thread, so a
# call's set never leaks into another thread's.
_call_set = threading.local()


def check_process_set(fn, process_set):
    """The id of ``process_set`` (None: the global set), which the collectives this thread
    enqueues next belong to; InvalidArgumentError naming ``fn`` for anything but a registered
    ProcessSet."""
    _call_set.id = 0
    _call_set.set = None
    ps_id = _runtime.process_set_id(fn, process_set)
    _call_set.id = ps_id
    _call_set.set = process_set if ps_id != 0 else None
    return ps_id


def call_process_set():
    """The ProcessSet of the current call (None: the global one)."""
    return getattr(_call_set, "set", None)


def call_set_size():
    """The size of the current call's process set (the world's for the global one)."""
    ps = getattr(_call_set, "set", None)
    return _runtime.size() if ps is None else ps.size()


def call_set_rank():
    """This rank's rank in the current call's process set."""
    ps = getattr(_call_set, "set", None)
    return _runtime.rank() if ps is None else ps.rank()


global_process_set = _runtime.global_process_set

# --- compression ----------------------------------------------------------------------------

# What DistributedOptimizer passes for compression=None: the job's default
# (BRAID_COMPRESSION, braidrun --compression). A direct call's None is Horovod's default,
# Compression.none, so a metric averaged with allreduce() is exact under any job default.
JOB_DEFAULT = object()


# --- dtypes ---------------------------------------------------------------------------------

_DTYPE_NAMES = {
    torch.float32: "float32",
    torch.float64: "float64",
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
    torch.int32: "int32",
    torch.int64: "int64",
    torch.uint8: "uint8",
}
#: torch dtype -> the runtime's dtype code.
CODES = {dt: _runtime.dtype_code(n) for dt, n in _DTYPE_NAMES.items()}
_UINT8 = _runtime.dtype_code("uint8")
#: The torch dtypes braid.torch accepts (bool with the rules in the module's docstring).
SUPPORTED_DTYPES = tuple(_DTYPE_NAMES) + (torch.bool,)

# bool all-reduce: the op on 0/1 bytes that gives the logical result.
_BOOL_OPS = {Sum: Max, Max: Max, Min: Min, Product: Min}


def _check_tensor(fn, name, tensor):
    if not isinstance(tensor, torch.Tensor):
        raise InvalidArgumentError(f"{fn} '{name}': expected a torch.Tensor, got "
                                   f"{type(tensor).__name__}")
    if tensor.device.type == "cuda":
        if not _runtime.cuda_built():
            raise InvalidArgumentError(f"{fn} '{name}': tensor is on {tensor.device}; this "
                                       "braid is built without CUDA (docs/gpu.md)")
    elif tensor.device.type != "cpu":
        raise InvalidArgumentError(f"{fn} '{name}': tensor is on {tensor.device}; braid.torch "
                                   "takes CPU and CUDA tensors")
    if tensor.is_sparse:
        raise InvalidArgumentError(f"{fn} '{name}': sparse tensors are not supported: pass "
                                   "indices and values separately (or .to_dense())")
    if tensor.numel() * tensor.element_size() > _checks.MAX_TENSOR_BYTES:  # before any copy
        raise InvalidArgumentError(
            f"{fn} '{name}': shape {tuple(tensor.shape)} of {tensor.dtype} is "
            f"{tensor.numel() * tensor.element_size()} bytes, more than the limit of a "
            "tensor, 2^48 bytes")


def wire(fn, name, tensor, op=None):
    """(tensor as the runtime sees it, dtype code, op): bool becomes uint8 (a view), with
    the op on 0/1 bytes that gives the logical result. InvalidArgumentError naming ``fn``
    and ``name`` for a non-tensor, a GPU or sparse tensor, one over 2^48 bytes, an
    unsupported dtype, or Average of bool."""
    _check_tensor(fn, name, tensor)
    code = CODES.get(tensor.dtype)
    if code is not None:
        return tensor, code, op
    if tensor.dtype == torch.bool:
        if op is not None:
            if op == Average:
                raise InvalidArgumentError(f"{fn} '{name}': op Average is not defined for "
                                           "torch.bool: use Sum/Max (logical or) or "
                                           "Min/Product (logical and)")
            op = _BOOL_OPS[op]
        return tensor.view(torch.uint8), _UINT8, op
    raise InvalidArgumentError(
        f"{fn} '{name}': unsupported dtype {tensor.dtype}: braid supports "
        + ", ".join(str(d) for d in SUPPORTED_DTYPES))


def check_scale(fn, name, tensor, prescale_factor, postscale_factor):
    """InvalidArgumentError unless both factors are finite numbers, and 1.0 for a tensor
    that is not floating-point."""
    for field, f in (("prescale_factor", prescale_factor), ("postscale_factor", postscale_factor)):
        if isinstance(f, bool) or not isinstance(f, numbers.Real) or not math.isfinite(f):
            raise InvalidArgumentError(f"{fn} '{name}': {field} must be a finite number, got "
                                       f"{type(f).__name__} {f!r}")
    if (prescale_factor != 1.0 or postscale_factor != 1.0) and not tensor.is_floating_point():
        raise InvalidArgumentError(f"{fn} '{name}': prescale_factor/postscale_factor need a "
                                   f"floating-point tensor, got {tensor.dtype}")


_staging_copies = 0  # contiguous staging copies made for non-contiguous tensors


def staging_copies():
    """How many non-contiguous tensors this process copied into contiguous staging buffers
    (and back, for in-place calls) since import. Contiguous tensors are never copied, so a
    training step whose gradients are contiguous adds nothing here."""
    return _staging_copies


def direct(t):
    """Whether the runtime may read and write ``t``'s memory as it is: contiguous, and
    without PyTorch's lazy negation bit (``is_neg()``: a view such as ``x._neg_view()`` or
    the imaginary part of a conjugate, whose memory holds the values' negatives)."""
    return t.is_contiguous() and not t.is_neg()


def contiguous(t):
    """``t`` itself when the runtime can use its memory (direct), else a contiguous copy of
    its values (the negation bit resolved), counted in staging_copies()."""
    global _staging_copies
    if direct(t):
        return t
    _staging_copies += 1
    return t.resolve_neg().contiguous()


def check_writable(fn, name, tensor):
    """An in-place collective writes every element: refuse a tensor whose elements share
    memory (a stride of 0 over a dimension of size > 1, as expand() makes), which PyTorch
    itself refuses to write with a RuntimeError naming no tensor."""
    if any(st == 0 and sz > 1 for st, sz in zip(tensor.stride(), tensor.shape)):
        raise InvalidArgumentError(
            f"{fn} '{name}': in-place on a tensor whose elements share memory (shape "
            f"{list(tensor.shape)}, strides {list(tensor.stride())}, as expand() makes): "
            "reduce a copy (tensor.clone()) or use the out-of-place form")


def empty_like(t):
    """A new uninitialized tensor of ``t``'s shape, dtype and device (contiguous)."""
    return torch.empty(t.shape, dtype=t.dtype, device=t.device)


def _nbytes(t):
    return t.numel() * t.element_size()


# --- handles --------------------------------------------------------------------------------

class Handle(_core_handles.HandleBase):
    """An asynchronous collective in flight; pass it to ``synchronize()`` or ``poll()``.

    It holds the tensors the runtime reads and writes until the collective completes.
    """

    __slots__ = ("_finish_fn",)
    _label = "braid.torch.Handle"

    def __init__(self, native, collective, keep, finish_fn):
        super().__init__(native, collective, keep)
        self._finish_fn = finish_fn  # native -> result tensor (after success)

    def _result_of(self):
        with torch.no_grad():
            return self._finish_fn(self._native)

    def _release(self):
        self._finish_fn = None


class MultiHandle(_core_handles.MultiHandle):
    """Several collectives that complete together (grouped all-reduce, all-to-all with its
    received splits): one handle for ``synchronize()`` and ``poll()``."""

    __slots__ = ()
    _label = "braid.torch.Handle"


def enqueue(collective, name, inp, code, out=None, op=Average, root_rank=0, splits=(),
            compression=None, finish=None, keep=(), compression_pattern=""):
    """Hands a collective on the tensor ``inp`` (contiguous, CPU or CUDA, of the dtype code ``code``)
    to the runtime by address; returns its Handle. ``out``: the contiguous tensor the result
    is written into (possibly ``inp``), or None for a result the runtime allocates;
    ``finish``: native handle -> the caller's result, run once after success; ``keep``: more
    objects to keep alive until completion; ``compression_pattern``: the plan pattern that
    chose ``compression`` (str). Errors as braid._core.runtime.enqueue_pointer."""
    device_type = device_id = stream = 0
    if inp.device.type == "cuda":
        # Horovod's semantics: braid's work waits for what the current stream of the
        # tensor's device queued before this call (an event, never a host wait), and the
        # result is in place when the handle completes.
        device_type, device_id = 1, inp.device.index
        stream = torch.cuda.current_stream(inp.device).cuda_stream
    native = _runtime.enqueue_pointer(
        collective, name, code, inp.data_ptr(), inp.shape, 0 if out is None else out.data_ptr(),
        0 if out is None else _nbytes(out), op, root_rank, splits, compression,
        getattr(_call_set, "id", 0), device_type, device_id, stream, compression_pattern)
    h = Handle(native, collective, (inp, out) + tuple(keep), finish)
    _core_handles.keep_alive(h)  # the tensors of a running collective outlive a dropped Handle
    return h


def poll(handle):
    """True once the collective behind ``handle`` has completed (successfully or not).

    Never blocks and never raises the collective's error (``synchronize`` does).
    InvalidArgumentError if ``handle`` is not a handle an ``*_async`` call returned."""
    return _core_handles.poll_handle("poll", handle, (Handle, MultiHandle))


def synchronize(handle, timeout=None):
    """Waits for an asynchronous collective and returns its result.

    The result is a tensor (a list of tensors for grouped calls; ``(tensor, received_splits)``
    for an all-to-all given splits). The GIL is released while waiting, in 100 ms slices so
    that Ctrl-C raises KeyboardInterrupt. ``timeout`` (seconds, None = forever): raises
    DeadlineExceededError if the collective is still running then; the handle stays valid.

    Raises the collective's error: InvalidArgumentError (mismatch across ranks, named),
    CancelledError (shut down meanwhile), UnavailableError (a peer was lost),
    DeadlineExceededError (no progress for BRAID_TIMEOUT_S), InternalError. Calling it again
    on a completed handle returns the same result (or raises the same error), and
    InvalidArgumentError if ``handle`` is not a handle an ``*_async`` call returned.
    """
    return _core_handles.wait_handle("synchronize", handle, timeout, (Handle, MultiHandle))


def result_from_bytes(dtype):
    """A finisher for runtime-owned results (all-gather, all-to-all): the bytes as a tensor
    of ``dtype`` and the runtime's output shape, without a copy."""
    def finish(native):
        shape = native.output_shape()
        raw = native.output_bytes()
        if raw.size == 0:
            return torch.empty(shape, dtype=dtype)
        t = torch.from_numpy(raw)
        return (t if dtype == torch.uint8 else t.view(dtype)).reshape(shape)
    return finish


