"""The runtime as braid's frontends see it: joining and leaving the job, the topology, the
names of unnamed calls, and the way a request enters the runtime.

``init``, ``shutdown``, ``is_initialized``, ``size``, ``rank``, ``local_rank`` and
``local_size`` (this module's ``__all__``) are exported by every frontend as they are. The
rest is the core's API for the frontends: ``next_name`` names an unnamed call,
``reports_failures`` wraps a public ``*_async`` call, ``enqueue_array`` /
``enqueue_pointer`` hand a request to the runtime after the checks every request passes, and
``check_process`` / ``forked_child`` guard against use from a forked child.
"""

import atexit
import contextlib
import functools
import inspect
import os
import sys
import threading

from .. import _braid
from .checks import INT32, check_compression, check_int, check_name, is_utf8
from .errors import Average, BraidError, FailedPreconditionError, InvalidArgumentError
from .handles import forget_all

__all__ = ["init", "shutdown", "is_initialized", "size", "rank", "local_rank", "local_size",
           "is_homogeneous", "ProcessSet", "global_process_set", "add_process_set",
           "remove_process_set"]

_COLL = _braid.COLLECTIVES

# --- process-wide state ----------------------------------------------------------------------

_lock = threading.Lock()
_counters = {}       # (collective, process set id) -> next default-name index
_dynamic_sets = False  # init(process_sets="dynamic")
_init_pid = None     # the process that called init() (forked children must not shut it down)
_topology = None     # (rank, size, local_rank, local_size, is_homogeneous) at init, for forked
                     # children
_atexit_registered = False


def forked_child():
    """True in a forked child of the process that called ``init()`` (a DataLoader worker):
    it can neither use nor shut down its parent's job."""
    return _init_pid is not None and _init_pid != os.getpid()


def check_process(fn):
    """FailedPreconditionError naming ``fn`` (the call, e.g. ``"allreduce"``) in a forked
    child of the process that called ``init()``."""
    if forked_child():
        raise FailedPreconditionError(
            f"{fn}: braid was initialized in process {_init_pid}, and this is process "
            f"{os.getpid()} (a fork of it); a forked child cannot use the parent's job")


def next_name(collective, process_set_id=0):
    """The name of this process's next unnamed call of ``collective`` (a str such as
    ``"allreduce"``) in process set ``process_set_id``: ``"<collective>.noname.<n>"`` with n
    counting from 0 per collective and process set since ``init()``, so ranks that issue their
    unnamed calls of a set in the same order agree (ranks outside a set make none of its
    calls, and their counters of the other sets must not move)."""
    with _lock:
        n = _counters.get((collective, process_set_id), 0)
        _counters[(collective, process_set_id)] = n + 1
    return f"{collective}.noname.{n}"


# --- process sets ---------------------------------------------------------------------------

class ProcessSet:
    """A subset of the job's ranks that runs collectives among itself, as Horovod's.

    ``ProcessSet(ranks)``: ``ranks`` a non-empty iterable of distinct ints, the job's ranks of
    the set (any order; kept ascending). It becomes usable once registered: by
    ``init(process_sets=[...])`` or ``add_process_set``; ``process_set_id`` is then its id
    (None before). Pass it as ``process_set=`` to any collective and to
    ``DistributedOptimizer``: only its ranks call those, an average divides by its size, a
    broadcast's ``root_rank`` is a rank of the job in the set, an all-gather's blocks come in
    the order of the set's ranks. A rank outside the set that calls one gets
    InvalidArgumentError.
    """

    def __init__(self, ranks):
        try:
            ranks = sorted(int(r) for r in ranks)
        except TypeError:
            raise InvalidArgumentError(
                f"ProcessSet({ranks!r}): ranks must be an iterable of ints") from None
        # Empty, repeated or out-of-range ranks are refused when the set is registered: then on
        # every rank (the runtime reports one rank's refusal to the others).
        self.ranks = ranks
        self.process_set_id = None

    def _registered(self, fn):
        if self.process_set_id is None:
            same = [i for i, ranks in (_braid.process_sets().items()
                                       if _braid.is_initialized() else ())
                    if ranks == self.ranks]
            hint = (f"; an equal ProcessSet is registered as process set {same[0]}: pass the "
                    "object that was registered (or the one add_process_set returned)"
                    if same else " (pass it to init(process_sets=[...]) or add_process_set)")
            raise InvalidArgumentError(f"{fn}: process set {self.ranks} is not registered{hint}")
        return self.process_set_id

    def size(self):
        """The number of ranks in the set."""
        return len(self.ranks)

    def rank(self):
        """This process's rank in the set (its position among the set's ranks); None when it
        is not in the set."""
        r = rank()
        return self.ranks.index(r) if r in self.ranks else None

    def included(self):
        """True when this process is in the set."""
        return rank() in self.ranks

    def __eq__(self, other):
        return isinstance(other, ProcessSet) and self.ranks == other.ranks

    def __hash__(self):
        return hash(tuple(self.ranks))

    def __repr__(self):
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks})"


class _GlobalProcessSet(ProcessSet):
    """The process set of every rank (id 0), always registered."""

    def __init__(self):
        self.process_set_id = 0

    @property
    def ranks(self):
        return list(range(size()))

    def __eq__(self, other):
        return other is self

    def __hash__(self):
        return 0

    def __repr__(self):
        return f"ProcessSet(process_set_id=0, ranks={self.ranks})"


global_process_set = _GlobalProcessSet()


def process_set_id(fn, process_set):
    """The id of ``process_set`` (None: the global set) for a call of ``fn``;
    InvalidArgumentError naming ``fn`` for anything but a registered ProcessSet."""
    if process_set is None:
        return 0
    if not isinstance(process_set, ProcessSet):
        raise InvalidArgumentError(
            f"{fn}: process_set must be a ProcessSet (or None for the global one), got "
            f"{type(process_set).__name__}")
    return process_set._registered(fn)


def _add(process_set, members_only=False):
    check_process("add_process_set")
    before = _braid.process_sets()
    ps_id = _braid.add_process_set(process_set.ranks, members_only)
    if before.get(ps_id) != process_set.ranks:
        # A new set (perhaps under a removed one's id): its unnamed calls count from 0 on
        # every member alike, whatever the removed set's members had counted.
        with _lock:
            for key in [k for k in _counters if k[1] == ps_id]:
                del _counters[key]
    process_set.process_set_id = ps_id
    return process_set


def _check_dynamic(fn):
    if not _dynamic_sets:
        raise FailedPreconditionError(
            f"{fn}: dynamic process sets are off; call init(process_sets=\"dynamic\") (or set "
            "BRAID_DYNAMIC_PROCESS_SETS=1) to add and remove sets while the job runs")


def members_process_set(ranks):
    """The ProcessSet of ``ranks``, agreed among those ranks alone (the core's API for
    torch.distributed's new_group, which only the new group's members enter): an existing
    set with these ranks is returned rather than refused. Blocks until every one of ``ranks``
    called it; the errors of add_process_set."""
    return _add(ProcessSet(ranks), members_only=True)


def add_process_set(process_set):
    """Registers a process set while the job runs, as Horovod's (``init(process_sets=
    "dynamic")`` first). ``process_set``: a ProcessSet or an iterable of ranks. Collective:
    every rank calls it, in the same order as every other add and remove, with the same ranks;
    returns the registered ProcessSet once every rank agreed. Raises, on every rank:
    InvalidArgumentError (ranks outside the world; a rank that added or removed something
    else at this point, naming the ranks and what each asked for), AlreadyExistsError (a set
    with these ranks is registered), FailedPreconditionError (31 sets exist besides the
    global one); FailedPreconditionError when dynamic process sets were not enabled."""
    _check_dynamic("add_process_set")
    if not isinstance(process_set, ProcessSet):
        process_set = ProcessSet(process_set)
    if process_set.process_set_id is not None:
        raise InvalidArgumentError(f"add_process_set: {process_set!r} is already registered")
    return _add(process_set)


def remove_process_set(process_set):
    """Removes a registered process set, as Horovod's (collective: every rank calls it in
    the same order as every other add and remove). Its collectives still pending fail on
    every member with FailedPreconditionError naming the set. Returns True, or False (with no
    collective) for a set that is not registered (removed already, or never added), as
    Horovod's; raises InvalidArgumentError for the global set or what is not a ProcessSet,
    and FailedPreconditionError when dynamic process sets were not enabled."""
    _check_dynamic("remove_process_set")
    if process_set is global_process_set:
        raise InvalidArgumentError("remove_process_set: the global process set cannot be removed")
    check_process("remove_process_set")
    if isinstance(process_set, ProcessSet) and process_set.process_set_id is None:
        return False
    _braid.remove_process_set(process_set_id("remove_process_set", process_set))
    process_set.process_set_id = None
    return True


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
    register raises KeyboardInterrupt promptly and leaves braid uninitialized. In an elastic
    job (``braidrun --min-np``) a process that braidrun drained (its host left the discovery
    output) says so on stderr and exits 0 here: ``SystemExit(0)``.

    ``comm`` and ``process_sets`` are Horovod's parameters: braid always joins the whole job
    (``comm=None``, else InvalidArgumentError). ``process_sets``: a list of ProcessSet to
    register (in that order, on every rank alike: their ids are 1, 2, ...), or ``"dynamic"``
    to allow ``add_process_set`` / ``remove_process_set`` while the job runs (so does
    ``BRAID_DYNAMIC_PROCESS_SETS=1``, as Horovod's ``HOROVOD_DYNAMIC_PROCESS_SETS``).
    """
    global _init_pid, _atexit_registered, _topology, _dynamic_sets
    if comm is not None:
        raise InvalidArgumentError(
            f"init(comm={comm!r}): braid always joins the whole job its launcher describes; "
            "communicators and subsets of ranks are not supported (pass comm=None)")
    dynamic = isinstance(process_sets, str)
    if dynamic and process_sets != "dynamic":
        raise InvalidArgumentError(
            f"init(process_sets={process_sets!r}): pass a list of ProcessSet or \"dynamic\"")
    env = os.environ.get("BRAID_DYNAMIC_PROCESS_SETS", "0")  # Horovod's variable, braid's name
    if env not in ("0", "1"):
        raise InvalidArgumentError(
            f"BRAID_DYNAMIC_PROCESS_SETS={env!r}: expected 0 or 1")
    dynamic = dynamic or env == "1"
    static_sets = ([] if isinstance(process_sets, str) or process_sets is None
                   else list(process_sets))
    for ps in static_sets:
        if not isinstance(ps, ProcessSet) or ps is global_process_set:
            raise InvalidArgumentError(
                f"init(process_sets=...): {ps!r} is not a ProcessSet of some ranks")
    check_process("init()")
    was = _braid.is_initialized()
    try:
        _braid.init()
    except FailedPreconditionError as e:
        if _braid.ELASTIC_LEAVE not in str(e):
            raise
        # braidrun's elastic job drained this process (its host left the discovery output):
        # leaving is its normal end, not an error (docs/elastic.md).
        print(f"braid: {e}", file=sys.stderr)
        raise SystemExit(0) from e
    if not was:
        with _lock:
            _counters.clear()
        _dynamic_sets = dynamic
        for ps in static_sets:
            _add(ps)
    _init_pid = os.getpid()
    _topology = (_braid.rank(), _braid.size(), _braid.local_rank(), _braid.local_size(),
                 _braid.is_homogeneous())
    if not _atexit_registered:
        atexit.register(_atexit_shutdown)
        _atexit_registered = True


def shutdown():
    """Leaves the job. Pending collectives fail with CancelledError.

    Harmless when not initialized. In a forked child of an initialized process it does
    nothing (the job belongs to the parent). ``init()`` may be called again afterwards.
    """
    if forked_child():
        return
    try:
        _braid.shutdown()
    finally:
        if not _braid.is_initialized():
            forget_all()  # every handle has completed (Cancelled)


def rejoin():
    """Leaves the job and joins the next (braid.torch.elastic, at a membership change):
    ``shutdown()`` then ``init()``, with dynamic process sets allowed again when they were;
    process sets themselves are dropped (their ranks may be gone): re-add them in a reset
    callback. Raises what ``init()`` raises."""
    dynamic = _dynamic_sets
    shutdown()
    init(process_sets="dynamic" if dynamic else None)


def is_initialized():
    """True between ``init()`` and ``shutdown()`` in the process that called ``init()``."""
    return not forked_child() and _braid.is_initialized()


def _topo(i, native):
    # A forked child (a DataLoader worker) may ask where its parent sits in the job; it gets
    # the values from init() without touching the native runtime, whose locks the fork may
    # have copied in a held state.
    if forked_child() and _topology is not None:
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


def ranks_waiting():
    """Elastic jobs (braid.torch.elastic): processes registered to join the next membership
    as of this rank's last heartbeat (every BRAID_HEARTBEAT_TIMEOUT_S / 4); 0 otherwise.
    FailedPreconditionError when not initialized."""
    check_process("ranks_waiting()")
    return _braid.ranks_waiting()


def ranks_leaving():
    """Elastic jobs: ranks of this membership that leave the job at its end (braidrun
    drains them: their host left the discovery script's output), as of this rank's last
    heartbeat; 0 otherwise. FailedPreconditionError when not initialized."""
    check_process("ranks_leaving()")
    return _braid.ranks_leaving()


def is_homogeneous():
    """True when every host runs the same number of ranks (every rank's ``local_size()`` is
    the same), as Horovod's. FailedPreconditionError before ``init()``."""
    return _topo(4, _braid.is_homogeneous)


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
    check_process("group")
    _braid.begin_group()
    try:
        yield
    finally:
        _braid.end_group()


# --- requests -------------------------------------------------------------------------------

def dtype_code(name):
    """The runtime's code (int) of the dtype called ``name`` ("float32", "bfloat16", ...)."""
    return _braid.DTYPES[name]


def reports_failures(fn):
    """Wraps a public ``*_async`` call: an InvalidArgumentError it raises before the runtime
    saw the request (a wrong type, dtype or split checked here) is also reported to the
    coordinator under the call's name, so the ranks that did submit the tensor fail at once
    with this rank's message instead of waiting for it (the runtime reports its own
    refusals itself; docs/failures.md). An unnamed call takes its generated name here,
    before anything can be refused: the refusal is reported under the name the other ranks
    generated for the same call, and every rank's counter advances alike."""
    collective = fn.__name__.split("_async")[0]  # allreduce_async_ -> allreduce
    params = list(inspect.signature(fn).parameters)
    pos = params.index("name")
    set_pos = params.index("process_set") if "process_set" in params else None

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        name = kwargs["name"] if "name" in kwargs else args[pos] if pos < len(args) else None
        ps = (kwargs.get("process_set") if "process_set" in kwargs
              else args[set_pos] if set_pos is not None and set_pos < len(args) else None)
        # Note [Process sets]: a set's calls are named and reported within the set; a call
        # with a bad process_set, or on a set without this rank, concerns no other rank.
        ps_id = (ps.process_set_id if isinstance(ps, ProcessSet) else 0) if ps is not None else 0
        member = ps is None or (isinstance(ps, ProcessSet) and ps_id is not None
                                and (ps_id == 0 or rank() in ps.ranks))
        if name is None:
            name = next_name(collective, ps_id if member else -1)
            if pos < len(args):
                args = args[:pos] + (name,) + args[pos + 1:]
            else:
                kwargs["name"] = name
        try:
            return fn(*args, **kwargs)
        except InvalidArgumentError as e:
            # A name without a UTF-8 form cannot travel, so no rank can have submitted it.
            if (isinstance(name, str) and is_utf8(name) and member
                    and not getattr(e, "_braid_reported", False)
                    and not forked_child() and _braid.is_initialized()):
                try:
                    _braid.report_failure(_braid.qualified_name(ps_id, name),
                                          _INVALID_ARGUMENT, str(e))
                except BraidError:
                    pass  # a name that cannot travel, or one in flight: nothing to tell
                e._braid_reported = True  # once: an outer wrapped call must not again
            raise
    return wrapper


_INVALID_ARGUMENT = 3  # absl::StatusCode::kInvalidArgument


def _checked_root(collective, name, root_rank, compression):
    """The checks every request passes before it reaches the runtime; the root rank as an
    int."""
    check_process(collective)
    check_name(collective, name)
    root_rank = check_int(f"{collective} '{name}'", "root_rank", root_rank, *INT32)
    check_compression(f"{collective} '{name}'", compression)
    return root_rank


def _enqueued(enqueue, *args):
    try:
        return enqueue(*args)
    except BraidError as e:
        e._braid_reported = True  # the runtime reported its refusal itself
        raise


def enqueue_array(collective, name, arr, code, output=None, op=Average, root_rank=0,
                  splits=(), compression=None, process_set_id=0):
    """Hands a collective on NumPy arrays to the runtime; returns the native handle.

    ``collective``: "allreduce", "allgather", "broadcast", "reducescatter", "alltoall",
    "barrier" or "join"; ``arr``: a C-contiguous, aligned, native-byte-order ndarray whose
    dtype has the runtime's code ``code`` (dtype_code); ``output``: an ndarray of the
    result's shape and dtype to write into (possibly ``arr`` itself), or None for a result
    the runtime allocates; ``op``: a ReduceOp; ``splits``: alltoall's rows per rank (ints);
    ``compression``: a spec or None (the job's default). The caller keeps ``arr`` and
    ``output`` alive, unmodified, until the handle completes (HandleBase and keep_alive).
    Raises FailedPreconditionError (a forked child, not initialized), InvalidArgumentError
    (a bad name, root rank or spec, or the runtime's refusal) and AlreadyExistsError (the
    name is in flight); the runtime reports its own refusals to the other ranks.
    """
    root_rank = _checked_root(collective, name, root_rank, compression)
    return _enqueued(_braid.enqueue, _COLL[collective], name, code, arr, output, int(op),
                     root_rank, list(splits), compression or "", process_set_id)


def enqueue_pointer(collective, name, code, data, shape, out_data=0, out_bytes=0,
                    op=Average, root_rank=0, splits=(), compression=None, process_set_id=0,
                    device_type=0, device_id=0, stream=0, compression_pattern=""):
    """Hands a collective on memory given by address to the runtime (a framework's tensor,
    ``tensor.data_ptr()``); returns the native handle.

    ``data``: the address (int) of the C-contiguous input of ``shape`` (ints) and the dtype
    of code ``code``; ``out_data``, ``out_bytes``: the address and size in bytes of the
    output to write into (possibly ``data``), or 0, 0 for a result the runtime allocates.
    ``device_type`` (0: host memory, 1: a CUDA device's), ``device_id`` and ``stream`` (the
    caller's ``cudaStream_t`` as an int, 0: the default stream) say where the memory is;
    braid's work waits for what that stream queued before the call.
    ``compression_pattern``: the plan pattern a frontend that resolved a plan itself matched
    to choose the spec ``compression`` (str, "" for none), so the tensor counts in that group
    of ``compression_stats()`` and ``braidctl status``. Everything else, the lifetime rule
    and the errors are as for enqueue_array; a device this build or machine cannot use is
    the runtime's FailedPreconditionError, naming it (docs/gpu.md).
    """
    root_rank = _checked_root(collective, name, root_rank, compression)
    return _enqueued(_braid.enqueue_ptr, _COLL[collective], name, code, data, list(shape),
                     out_data, out_bytes, int(op), root_rank, list(splits), compression or "",
                     process_set_id, device_type, device_id, stream, compression_pattern)


def cuda_built():
    """Whether this braid was built with its CUDA device path (and so opens NCCL at run
    time): GPU tensors may then be passed (docs/gpu.md)."""
    return bool(_braid.cuda_built())
