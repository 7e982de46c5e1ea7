"""braid's NumPy API: collectives on numpy.ndarray, Horovod style.

Every collective is negotiated by name: each rank must submit a collective with the same
name, collective kind, dtype, (agreeing) shape and op before it runs. Names default to
``"<collective>.noname.<n>"`` from a per-collective counter, so ranks that rely on default
names must issue their unnamed collectives in the same order.

Arrays passed to an asynchronous call are kept alive by braid until the collective completes;
they must not be modified meanwhile (the runtime reads the input and writes the output from
its background thread, without the GIL).
"""

import atexit
import contextlib
import enum
import functools
import inspect
import math
import numbers
import os
import threading

import numpy as np

from . import _braid
from ._braid import (  # noqa: F401  (re-exported)
    AlreadyExistsError,
    BraidError,
    CancelledError,
    DeadlineExceededError,
    FailedPreconditionError,
    InternalError,
    InvalidArgumentError,
    UnavailableError,
)


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

_COLL = _braid.COLLECTIVES

# --- process-wide state ----------------------------------------------------------------------

_lock = threading.Lock()
_counters = {}       # collective -> next default-name index
_inflight = {}       # id(handle) -> handle: keeps arrays/tensors alive until the runtime is done
_sweep_at = 64       # sweep _inflight for completed handles once it holds this many
_init_pid = None     # the process that called init() (forked children must not shut it down)
_topology = None     # (rank, size, local_rank, local_size) at init, for forked children
_atexit_registered = False


def _forked_child():
    return _init_pid is not None and _init_pid != os.getpid()


def _check_process(fn):
    if _forked_child():
        raise FailedPreconditionError(
            f"{fn}: braid was initialized in process {_init_pid}, and this is process "
            f"{os.getpid()} (a fork of it); a forked child cannot use the parent's job")


def _next_name(collective):
    with _lock:
        n = _counters.get(collective, 0)
        _counters[collective] = n + 1
    return f"{collective}.noname.{n}"


def _keep_alive(handle):
    """Registers an in-flight handle (numpy or torch) so that its buffers outlive the caller's
    references until the runtime is done with them. A handle leaves on completion (its
    ``_finish``); handles the caller dropped without synchronizing are swept out once the
    registry doubles, so a step that enqueues many tensors costs O(1) per enqueue."""
    global _sweep_at
    with _lock:
        _inflight[id(handle)] = handle
        if len(_inflight) >= _sweep_at:
            for k in [k for k, v in _inflight.items() if v._native.poll()]:
                del _inflight[k]
            _sweep_at = max(64, 2 * len(_inflight))


def _forget(handle):
    with _lock:
        _inflight.pop(id(handle), None)


def _atexit_shutdown():
    # Only the process that joined the job leaves it: a forked DataLoader worker inherits
    # this handler and must not shut down its parent's runtime.
    if _init_pid == os.getpid() and _braid.is_initialized():
        try:
            shutdown()
        except BraidError:
            pass


# --- lifecycle ------------------------------------------------------------------------------

def init(comm=None, process_sets=None):
    """Joins the job described by the environment and starts braid's background thread.

    The launcher (``braidrun``, torchrun, srun, mpirun) provides the rank, world size and the
    coordinator's address (``BRAID_COORDINATOR``, ``BRAID_RANK``, ``BRAID_SIZE``, ...); a
    process started without a launcher forms a job of one rank. Calling ``init()`` again
    while initialized does nothing; after ``shutdown()`` it joins a new job.

    Raises InvalidArgumentError (bad configuration), DeadlineExceededError or
    UnavailableError (coordinator or peers unreachable), FailedPreconditionError (called in a
    forked child of an initialized process). Ctrl-C while it waits for the other ranks to
    register raises KeyboardInterrupt promptly and leaves braid uninitialized.

    ``comm`` and ``process_sets`` are Horovod's parameters, so that its calls mean the same
    here: braid always joins the whole job (``comm=None``) and has only the global process
    set (``process_sets`` None or empty); anything else raises InvalidArgumentError before
    joining.
    """
    global _init_pid, _atexit_registered, _topology
    if comm is not None:
        raise InvalidArgumentError(
            f"init(comm={comm!r}): braid always joins the whole job its launcher describes; "
            "communicators and subsets of ranks are not supported (pass comm=None)")
    if process_sets is not None and (isinstance(process_sets, str) or list(process_sets)):
        raise InvalidArgumentError(
            f"init(process_sets={process_sets!r}): process sets other than the global one "
            "are not supported yet (pass process_sets=None)")
    _check_process("init()")
    was = _braid.is_initialized()
    _braid.init()
    if not was:
        with _lock:
            _counters.clear()
    _init_pid = os.getpid()
    _topology = (_braid.rank(), _braid.size(), _braid.local_rank(), _braid.local_size())
    if not _atexit_registered:
        atexit.register(_atexit_shutdown)
        _atexit_registered = True


def shutdown():
    """Leaves the job. Pending collectives fail with CancelledError.

    Harmless when not initialized. In a forked child of an initialized process it does
    nothing (the job belongs to the parent). ``init()`` may be called again afterwards.
    """
    if _forked_child():
        return
    try:
        _braid.shutdown()
    finally:
        with _lock:
            if not _braid.is_initialized():
                _inflight.clear()  # every handle has completed (Cancelled)


def is_initialized():
    """True between ``init()`` and ``shutdown()`` in the process that called ``init()``."""
    return not _forked_child() and _braid.is_initialized()


def _topo(i, native):
    # A forked child (a DataLoader worker) may ask where its parent sits in the job; it gets
    # the values from init() without touching the native runtime, whose locks the fork may
    # have copied in a held state.
    if _forked_child() and _topology is not None:
        return _topology[i]
    return native()


def size():
    """The world size (number of ranks). FailedPreconditionError before ``init()``."""
    return _topo(1, _braid.size)


def rank():
    """This process's rank, 0 <= rank < size(). FailedPreconditionError before ``init()``.

    In a forked child of an initialized process: the parent's rank."""
    return _topo(0, _braid.rank)


def local_rank():
    """This process's rank among the ranks on its host. FailedPreconditionError before init."""
    return _topo(2, _braid.local_rank)


def local_size():
    """The number of ranks on this host. FailedPreconditionError before ``init()``."""
    return _topo(3, _braid.local_size)


# --- statistics -----------------------------------------------------------------------------

def transport_description():
    """The transports this rank's data plane uses to reach its peers (str), as UCX reports
    them at ``init()``: every transport/device pair to any peer after "ucx", e.g.
    ``"ucx tcp/eth0"`` when every peer is on another host, ``"ucx cma/memory sysv/memory"``
    (shared memory) when all are on this one. FailedPreconditionError before ``init()``."""
    return _braid.transport_description()


_BYTE_FIELDS = ("reductions", "uncompressed_bytes", "payload_bytes", "transport_bytes",
                "reference_transport_bytes")


def _with_ratio(d):
    d["compression_ratio"] = (d["uncompressed_bytes"] / d["payload_bytes"]
                              if d["payload_bytes"] else 0.0)
    return d


def compression_stats():
    """This rank's all-reduce byte counters since ``init()``, per compression method and per
    tensor.

    Returns a dict::

        {"methods": {method: {"tensors", "reductions", "uncompressed_bytes",
                              "payload_bytes", "transport_bytes",
                              "reference_transport_bytes", "compression_ratio"}},
         "tensors": {name: {"method", "reductions", "uncompressed_bytes", "payload_bytes",
                            "transport_bytes", "reference_transport_bytes",
                            "compression_ratio"}}}

    ``method`` is the canonical compression spec ("none", "fp16", "fp4", ...); uncompressed
    all-reduces count under "none". All counts are ints, cumulative over steps, for this rank
    only (``braidctl status`` shows them summed over ranks):

    - ``tensors``: distinct tensor names all-reduced with the method (a name that the
      per-tensor table dropped, below, counts again if it returns);
    - ``reductions``: all-reduces counted (one per tensor per step);
    - ``uncompressed_bytes``: the tensors' size in their own dtype, in bytes;
    - ``payload_bytes``: bytes of the compressed representation this rank contributed
      (e.g. 2 per element for "fp16"; equal to uncompressed_bytes for "none" and for a
      method's warm-up steps);
    - ``transport_bytes``: bytes this rank actually sent on the data plane for them;
    - ``reference_transport_bytes``: bytes a bandwidth-optimal all-reduce of the uncompressed
      tensors sends per rank, 2(n-1)/n * uncompressed_bytes for world size n (0 when n = 1);
    - ``compression_ratio``: uncompressed_bytes / payload_bytes, a float (0.0 when nothing
      was sent).

    A tensor all-reduced with several methods over time (rare) has one entry whose byte
    fields are summed over them and whose ``method`` joins their specs with " + ".
    ``"tensors"`` holds the 4096 names all-reduced most recently at most: a new name drops
    the least recently all-reduced one (so names made up anew every step do not grow it for
    ever), while ``"methods"`` counts every all-reduce.

    Raises FailedPreconditionError before ``init()``, after ``shutdown()`` and in a forked
    child of an initialized process.
    """
    _check_process("compression_stats()")
    methods, tensors = _braid.compression_report()
    out_methods = {}
    for m in methods:
        d = {"tensors": m["tensors"]}
        d.update((k, m[k]) for k in _BYTE_FIELDS)
        out_methods[m["method"]] = _with_ratio(d)
    out_tensors = {}
    for t in tensors:  # sorted by (name, method): a name's entries are adjacent
        d = out_tensors.get(t["name"])
        if d is None:
            d = {"method": t["method"]}
            d.update((k, t[k]) for k in _BYTE_FIELDS)
            out_tensors[t["name"]] = d
        else:
            d["method"] += " + " + t["method"]
            for k in _BYTE_FIELDS:
                d[k] += t[k]
    for d in out_tensors.values():
        _with_ratio(d)
    return {"methods": out_methods, "tensors": out_tensors}


def fusion_stats():
    """This rank's fusion counters since ``init()``: how its all-reduce buckets met the
    fusion buffer. Returns a dict of ints, cumulative over steps:

    - ``buckets``: all-reduce buckets run (a bucket is one tensor, or several fused);
    - ``packed_buckets``: those copied (or converted) into the fusion buffer and back out;
    - ``packed_bytes``: bytes written into the fusion buffer by them (as many are copied
      back out);
    - ``in_place_bytes``: bytes of the buckets reduced where their tensors lie, with no
      copy: a lone tensor, or tensors that lie back to back in memory in the bucket's order
      (``braid.torch.DistributedOptimizer(gradient_as_bucket_view=True)`` lays gradients
      out so).

    Raises FailedPreconditionError before ``init()``, after ``shutdown()`` and in a forked
    child of an initialized process.
    """
    _check_process("fusion_stats()")
    return dict(_braid.fusion_report())


def start_timeline(file_path):
    """Starts recording this rank's timeline while the job runs (as Horovod's
    ``start_timeline``): a Chrome-trace JSON file (open it in Perfetto or chrome://tracing)
    with one row per tensor and its phases (docs/configuration.md: BRAID_TIMELINE). Rank 0 writes ``file_path``,
    rank r writes ``file_path + ".rank<r>"``; the file rotates beyond
    BRAID_TIMELINE_MAX_BYTES. A timeline already recording (BRAID_TIMELINE, or an earlier
    call) is closed first, as valid JSON. Raises InvalidArgumentError (not a non-empty str, or
    not writable), FailedPreconditionError (before ``init()``)."""
    if not isinstance(file_path, (str, bytes, os.PathLike)):
        raise InvalidArgumentError(f"start_timeline: file_path must be a str or path, got "
                                   f"{type(file_path).__name__}")
    # The file system's own bytes: a path Python decoded with surrogates (undecodable bytes in
    # a file name) is not UTF-8, but it is a path.
    _braid.start_timeline(os.fsencode(file_path))


def stop_timeline():
    """Stops recording the timeline and closes its file (valid JSON). Nothing happens when
    none is recording. Raises FailedPreconditionError before ``init()``."""
    _braid.stop_timeline()


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
    _check_process("compression_state()")
    return _braid.compression_state()


# Names of all-reduces whose DistributedOptimizer (braid.torch) was dropped: their compression
# state is forgotten when a new optimizer takes them (braid/torch/_naming.py). A loaded state
# is the one wanted, so load_compression_state() empties it.
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
    _check_process("load_compression_state()")
    if not isinstance(state, (bytes, bytearray, memoryview)):
        # Still collective: every rank fails at once with this reason, none waits for it.
        _braid.refuse_compression_state(
            f"load_compression_state(): state must be bytes, got {type(state).__name__}")
    _braid.load_compression_state(bytes(state))
    _released_names.clear()


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
    return _braid.DTYPES[bname], np.dtype(bname)


def _check_size(fn, name, arr):
    """Refuses an array beyond the limit of a tensor (2^48 bytes) before anything copies it:
    a zero-strided view can claim petabytes."""
    if arr.size * arr.dtype.itemsize > _MAX_TENSOR_BYTES:
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


# Limits the runtime states (common/limits.h): refused here, before anything reaches the
# native layer, so every wrong argument is an InvalidArgumentError naming it, never a
# TypeError of the binding or a value silently truncated to an integer.
MAX_NAME_BYTES = 1024
_MAX_TENSOR_BYTES = 1 << 48  # bytes of one tensor; also bounds element counts
_INT32 = (-(1 << 31), (1 << 31) - 1)


def _is_int(value):
    """An integer that is not a bool (a bool is an int in Python, but never meant as one)."""
    return isinstance(value, (numbers.Integral, np.integer)) and not isinstance(
        value, (bool, np.bool_))


def _check_int(what, field, value, lo, hi):
    """``value`` as an int in [lo, hi], or InvalidArgumentError naming ``field``. Floats are
    refused, even integral ones: a rank or a count given as 1.5 is a bug, and truncating it
    would hide one."""
    if not _is_int(value):
        raise InvalidArgumentError(f"{what}: {field} must be an integer, got "
                                   f"{type(value).__name__} {value!r}")
    v = int(value)
    if not lo <= v <= hi:
        raise InvalidArgumentError(f"{what}: {field} must be in [{lo}, {hi}], got {v}")
    return v


def _utf8(what, field, text):
    """``text`` (a str) in UTF-8, as the native module takes every string. A str that has no
    UTF-8 form (a lone surrogate such as ``'g\\udc80'``, which ``os.fsdecode`` makes of
    undecodable bytes) raises InvalidArgumentError naming ``field``, where the native module
    would raise a bare TypeError."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise InvalidArgumentError(
            f"{what}: {field} is not valid UTF-8: {text!r:.64} holds {text[e.start]!r} at "
            f"index {e.start} ({e.reason})") from None


def _is_utf8(text):
    try:
        text.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False


def _check_name(fn, name):
    """A collective's name: a str of at most MAX_NAME_BYTES bytes in UTF-8."""
    if not isinstance(name, str):
        raise InvalidArgumentError(f"{fn}: name must be a str, got {type(name).__name__} "
                                   f"{name!r:.64}")
    n = len(_utf8(fn, "name", name))
    if n == 0:
        raise InvalidArgumentError(f"{fn}: name is empty")
    if n > MAX_NAME_BYTES:
        raise InvalidArgumentError(f"{fn}: name is {n} bytes long, more than the limit of "
                                   f"{MAX_NAME_BYTES} (it starts {name[:64]!r})")
    return name


def _check_splits(what, splits, rows, size):
    """alltoall splits: ``size`` non-negative integers summing to ``rows`` (exactly, in
    Python's unbounded integers: no sum can wrap)."""
    if isinstance(splits, (str, bytes)) or not hasattr(splits, "__iter__"):
        raise InvalidArgumentError(f"{what}: splits must be a sequence of integers, got "
                                   f"{type(splits).__name__}")
    if isinstance(splits, np.ndarray) and splits.dtype.kind not in "iu":
        raise InvalidArgumentError(f"{what}: splits must hold integers, got dtype {splits.dtype}")
    out = [_check_int(what, f"splits[{i}]", x, 0, _MAX_TENSOR_BYTES)
           for i, x in enumerate(np.asarray(splits).reshape(-1).tolist()
                                 if isinstance(splits, np.ndarray) else splits)]
    if len(out) != size:
        raise InvalidArgumentError(f"{what}: splits has {len(out)} entries for {size} ranks")
    if sum(out) != rows:
        raise InvalidArgumentError(f"{what}: splits sum to {sum(out)} but dim 0 is {rows}")
    return out


MAX_COMPRESSION_SPEC_BYTES = 256


def _check_compression(what, compression):
    """A compression spec: None (the job's default) or a str of at most 256 bytes."""
    if compression is None:
        return
    if not isinstance(compression, str):
        raise InvalidArgumentError(f"{what}: compression must be a string such as 'fp16' or "
                                   f"'fp4:ef=1', got {type(compression).__name__} "
                                   f"{compression!r:.64}")
    if len(_utf8(what, "compression", compression)) > MAX_COMPRESSION_SPEC_BYTES:
        raise InvalidArgumentError(f"{what}: compression is {len(compression)} characters "
                                   f"long, more than the limit of {MAX_COMPRESSION_SPEC_BYTES}")


def _check_timeout(timeout):
    """A wait's timeout in seconds: None (forever) or a finite number >= 0."""
    if timeout is None:
        return None
    if not isinstance(timeout, numbers.Real) or isinstance(timeout, bool):
        raise InvalidArgumentError(f"timeout must be a number of seconds or None, got "
                                   f"{type(timeout).__name__} {timeout!r}")
    t = float(timeout)
    if math.isnan(t) or t < 0:
        raise InvalidArgumentError(f"timeout must be >= 0 seconds, got {timeout!r}")
    return t


def _check_op(op):
    if not _is_int(op):  # ReduceOp(1.0) would be Average: a float is refused, not truncated
        raise InvalidArgumentError(f"unknown reduce op {op!r}: use braid.Sum, braid.Average, "
                                   "braid.Min, braid.Max or braid.Product")
    try:
        return ReduceOp(op)
    except ValueError:
        raise InvalidArgumentError(f"unknown reduce op {op!r}: use braid.Sum, braid.Average, "
                                   "braid.Min, braid.Max or braid.Product") from None


# --- handles --------------------------------------------------------------------------------

class _HandleBase:
    """What the NumPy and torch handles share: the native handle, the objects the runtime
    reads and writes (kept until completion), and the result or error once it completed.
    Subclasses set ``_label`` and compute their result in ``_result_of()`` (called once, on
    success) and drop their buffers in ``_release()``."""

    __slots__ = ("_native", "_collective", "_keep", "_result", "_error", "_done",
                 "__weakref__")
    _label = "braid.Handle"

    def __init__(self, native, collective, keep):
        self._native = native
        self._collective = collective
        self._keep = keep          # objects the runtime reads or writes
        self._result = None
        self._error = None
        self._done = False

    @property
    def name(self):
        """The collective's name (the one negotiated across ranks)."""
        return self._native.name

    def __repr__(self):
        state = "done" if self._poll() else "pending"
        return f"<{self._label} {self._collective} '{self.name}' {state}>"

    def _poll(self):
        return self._done or self._native.poll()

    def _wait(self, timeout):
        """The result (or the collective's error) once completed; DeadlineExceededError when
        still running after ``timeout`` seconds (None: no limit; the handle stays valid)."""
        if not self._done:
            if not self._native.wait(timeout, 0.1):
                raise DeadlineExceededError(
                    f"{self._collective} '{self.name}' is still running after {timeout} s")
            self._finish()
        if self._error is not None:
            raise self._error
        return self._result

    def _finish(self):
        """Called once the native handle completed: result or stored error."""
        if self._done:
            return
        try:
            self._native.check()
            self._result = self._result_of()
        except BraidError as e:
            self._error = e
        finally:
            self._done = True
            self._keep = None
            self._release()
            _forget(self)

    def _result_of(self):
        raise NotImplementedError

    def _release(self):
        pass


class Handle(_HandleBase):
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


def _reports_failures(fn):
    """Wraps a public ``*_async`` call: an InvalidArgumentError it raises before the runtime
    saw the request (a wrong type, dtype or split checked here) is also reported to the
    coordinator under the call's name, so the ranks that did submit the tensor fail at once
    with this rank's message instead of waiting for it (the runtime reports its own
    refusals itself; docs/failures.md). An unnamed call takes its generated name here,
    before anything can be refused: the refusal is reported under the name the other ranks
    generated for the same call, and every rank's counter advances alike."""
    collective = fn.__name__.split("_async")[0]  # allreduce_async_ -> allreduce
    pos = list(inspect.signature(fn).parameters).index("name")

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        name = kwargs["name"] if "name" in kwargs else args[pos] if pos < len(args) else None
        if name is None:
            name = _next_name(collective)
            if pos < len(args):
                args = args[:pos] + (name,) + args[pos + 1:]
            else:
                kwargs["name"] = name
        try:
            return fn(*args, **kwargs)
        except InvalidArgumentError as e:
            # A name without a UTF-8 form cannot travel, so no rank can have submitted it.
            if (isinstance(name, str) and _is_utf8(name)
                    and not getattr(e, "_braid_reported", False)
                    and not _forked_child() and _braid.is_initialized()):
                try:
                    _braid.report_failure(name, _INVALID_ARGUMENT, str(e))
                except BraidError:
                    pass  # a name that cannot travel, or one in flight: nothing to tell
                e._braid_reported = True  # once: an outer wrapped call must not again
            raise
    return wrapper


_INVALID_ARGUMENT = 3  # absl::StatusCode::kInvalidArgument


def _enqueue(collective, name, arr, code, output=None, op=ReduceOp.Average, root_rank=0,
             splits=(), target=None, compression=None):
    _check_process(collective)
    _check_name(collective, name)
    root_rank = _check_int(f"{collective} '{name}'", "root_rank", root_rank, *_INT32)
    _check_compression(f"{collective} '{name}'", compression)
    try:
        native = _braid.enqueue(_COLL[collective], name, code, arr, output, int(op),
                                root_rank, list(splits), compression or "")
    except BraidError as e:
        e._braid_reported = True  # the runtime reported its refusal itself
        raise
    h = Handle(native, collective, (arr, output, target), output, target, arr.dtype)
    _keep_alive(h)  # the arrays of a running collective outlive a dropped Handle
    return h


@contextlib.contextmanager
def group():
    """Within it, the collectives this process starts are held back and sent to the
    coordinator together when the outermost ``group()`` exits: on ranks that start the same
    collectives inside a group, they become ready together, and the all-reduces among them of
    one dtype, op and compression travel in one fusion bucket (up to
    BRAID_FUSION_THRESHOLD), as Horovod's grouped all-reduces do. Groups nest. What other
    threads start meanwhile is held too. Internal (grouped all-reduces and
    DistributedOptimizer's groups use it): a group only starts collectives, it never waits
    for one of its own, which could not finish before the group ends."""
    _check_process("group")
    _braid.begin_group()
    try:
        yield
    finally:
        _braid.end_group()


def poll(handle):
    """True once the collective behind ``handle`` has completed (successfully or not).

    Never blocks and never raises the collective's error (``synchronize`` does).
    InvalidArgumentError if ``handle`` is not a Handle."""
    _check_handle("poll", handle)
    return handle._poll()


def _check_handle(fn, handle, kinds=None):
    """InvalidArgumentError naming ``fn`` unless ``handle`` is one of ``kinds`` (default: this
    module's Handle; braid.torch passes its own)."""
    if not isinstance(handle, kinds or Handle):
        raise InvalidArgumentError(f"{fn}: expected a handle returned by an *_async call, "
                                   f"got {type(handle).__name__} {handle!r}")


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
    _check_handle("synchronize", handle)
    return handle._wait(_check_timeout(timeout))


# --- all-reduce -----------------------------------------------------------------------------

@_reports_failures
def allreduce_async(tensor, name=None, op=Average, compression=None):
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
    name = _next_name("allreduce") if name is None else name
    op = _check_op(op)
    arr, code = _as_input("allreduce", name, tensor)
    out = np.empty_like(arr)
    return _enqueue("allreduce", name, arr, code, output=out, op=op, compression=compression)


def allreduce(tensor, name=None, op=Average, compression=None):
    """All-reduces ``tensor`` across ranks and returns the result as a new array.

    Same shape and dtype as ``tensor``, which is left untouched. Every rank must pass the
    same shape, dtype and op (else InvalidArgumentError naming the ranks). Average is the
    sum divided by the world size and needs a floating-point dtype. See allreduce_async.
    """
    return synchronize(allreduce_async(tensor, name=name, op=op, compression=compression))


@_reports_failures
def allreduce_async_(tensor, name=None, op=Average, compression=None):
    """Starts an in-place all-reduce of ``tensor`` (a writeable numpy.ndarray).

    A C-contiguous tensor is reduced in place; any other (a transposed view, another byte
    order) is copied in and the result copied back when ``synchronize`` is called.
    Raises InvalidArgumentError for a read-only array or an unsupported dtype.
    """
    name = _next_name("allreduce") if name is None else name
    op = _check_op(op)
    buf, target, code = _as_inplace("allreduce_", name, tensor)
    return _enqueue("allreduce", name, buf, code, output=buf, op=op, target=target,
                    compression=compression)


def allreduce_(tensor, name=None, op=Average, compression=None):
    """All-reduces ``tensor`` in place and returns it. See allreduce_async_."""
    return synchronize(allreduce_async_(tensor, name=name, op=op, compression=compression))


# --- all-gather -----------------------------------------------------------------------------

@_reports_failures
def allgather_async(tensor, name=None):
    """Starts an all-gather of ``tensor`` (at least 1-D); returns a Handle.

    The first dimension may differ across ranks; the trailing dimensions and dtype must
    agree. The result concatenates every rank's tensor along dim 0 in rank order: shape
    ``(sum of dim 0 over ranks,) + tensor.shape[1:]``.
    """
    name = _next_name("allgather") if name is None else name
    arr, code = _as_input("allgather", name, tensor)
    return _enqueue("allgather", name, arr, code)


def allgather(tensor, name=None):
    """All-gathers ``tensor`` along dim 0 and returns a new array. See allgather_async."""
    return synchronize(allgather_async(tensor, name=name))


# --- broadcast ------------------------------------------------------------------------------

@_reports_failures
def broadcast_async(tensor, root_rank, name=None):
    """Starts a broadcast of ``root_rank``'s tensor into a new array on every rank.

    Every rank passes a tensor of the same shape and dtype; ``tensor`` itself is left
    untouched. The result is a new array holding the root's values.
    """
    name = _next_name("broadcast") if name is None else name
    arr, code = _as_input("broadcast", name, tensor)
    out = np.empty_like(arr)
    return _enqueue("broadcast", name, arr, code, output=out, root_rank=root_rank)


def broadcast(tensor, root_rank, name=None):
    """Returns a new array with ``root_rank``'s ``tensor``. See broadcast_async."""
    return synchronize(broadcast_async(tensor, root_rank, name=name))


@_reports_failures
def broadcast_async_(tensor, root_rank, name=None):
    """Starts an in-place broadcast: ``tensor`` (a writeable ndarray) receives the root's."""
    name = _next_name("broadcast") if name is None else name
    buf, target, code = _as_inplace("broadcast_", name, tensor)
    return _enqueue("broadcast", name, buf, code, output=buf, root_rank=root_rank,
                    target=target)


def broadcast_(tensor, root_rank, name=None):
    """Overwrites ``tensor`` with ``root_rank``'s values and returns it."""
    return synchronize(broadcast_async_(tensor, root_rank, name=name))


# --- reduce-scatter -------------------------------------------------------------------------

@_reports_failures
def reducescatter_async(tensor, name=None, op=Average):
    """Starts a reduce-scatter of ``tensor`` (at least 1-D, same shape on every rank).

    The reduced tensor is split along dim 0: with ``n = tensor.shape[0]`` and world size
    ``s``, rank ``r`` receives ``n // s`` rows, plus one when ``r < n % s``, in rank order.
    """
    name = _next_name("reducescatter") if name is None else name
    op = _check_op(op)
    arr, code = _as_input("reducescatter", name, tensor)
    out = None
    if arr.ndim > 0:
        s, r = size(), rank()
        rows = arr.shape[0] // s + (1 if r < arr.shape[0] % s else 0)
        out = np.empty((rows,) + arr.shape[1:], dtype=arr.dtype)
    return _enqueue("reducescatter", name, arr, code, output=out, op=op)


def reducescatter(tensor, name=None, op=Average):
    """Reduces ``tensor`` across ranks and returns this rank's share of dim 0.

    See reducescatter_async for the split."""
    return synchronize(reducescatter_async(tensor, name=name, op=op))


# --- all-to-all -----------------------------------------------------------------------------

@_reports_failures
def alltoall_async(tensor, splits=None, name=None):
    """Starts an all-to-all of ``tensor`` (at least 1-D); returns a Handle.

    ``splits``: rows of dim 0 sent to each rank (``size()`` non-negative integers summing to
    ``tensor.shape[0]``); None splits dim 0 evenly (it must then divide by the world size).
    The result concatenates, in rank order, the rows every rank sent to this one: shape
    ``(rows received,) + tensor.shape[1:]``; trailing dimensions must agree across ranks.
    """
    name = _next_name("alltoall") if name is None else name
    arr, code = _as_input("alltoall", name, tensor)
    sp = ()
    if splits is not None:
        rows = arr.shape[0] if arr.ndim > 0 else 0
        sp = _check_splits(f"alltoall '{name}'", splits, rows, size())
    return _enqueue("alltoall", name, arr, code, splits=sp)


def alltoall(tensor, splits=None, name=None):
    """Exchanges slices of ``tensor`` with every rank and returns the rows received.

    See alltoall_async."""
    return synchronize(alltoall_async(tensor, splits=splits, name=name))


# --- barrier --------------------------------------------------------------------------------

_BARRIER_NAME = "barrier"


def barrier(name=None):
    """Returns once every rank has called barrier() (with the same name).

    An unnamed barrier is named ``"barrier"`` on every rank (no counter), so barriers pair
    in the order the ranks call them, also after one failed on some ranks and not others:
    it is how the ranks resynchronize after an error (docs/failures.md: No error shifts a
    step)."""
    name = _BARRIER_NAME if name is None else name
    arr = np.empty((0,), dtype=np.uint8)
    synchronize(_enqueue("barrier", name, arr, _braid.DTYPES["uint8"], op=ReduceOp.Sum))


# --- join -----------------------------------------------------------------------------------

_JOIN_NAME = "braid.join"  # the same on every rank: one join() round at a time


def join():
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
    return synchronize(_enqueue("join", _JOIN_NAME, arr, _braid.DTYPES["uint8"],
                                op=ReduceOp.Sum))

