"""The ``braid`` torch.distributed backend: torch.distributed, and DDP on top, over braid.

Importing this module registers the backend; a DDP script changes one line::

    import braid.torch.distributed  # noqa: F401  (registers the "braid" backend)
    dist.init_process_group("braid")            # was: dist.init_process_group("gloo")
    model = DistributedDataParallel(model)      # unchanged

Every torch.distributed collective of a ``braid`` group is then a braid collective: it is
negotiated by braid's coordinator, all-reduced on braid's data plane, counted in
``braidctl status`` and ``braid.torch.compression_stats()``, and fails as braid's do (a lost
rank raises on every other rank within braid's timeouts instead of hanging).

Rendezvous: under torchrun, srun or mpirun, ``env://`` works as for gloo (``MASTER_ADDR``,
``MASTER_PORT``, ``RANK``, ``WORLD_SIZE``), and braid finds its coordinator from the same
variables (docs/launching.md); so does ``init_process_group("braid", rank=r,
world_size=n)`` in processes started by ``mp.spawn`` and ``init_method="tcp://..."``
(braid takes torch's rank, world size and store address). Under ``braidrun``, which sets
braid's variables, importing this module also sets torchrun's (``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``) where unset, and ``env://`` without ``MASTER_ADDR``
forms torch's store itself: rank 0 starts a TCPStore on a free port of its address towards
braid's coordinator and broadcasts the address over braid; this serves
``init_process_group`` for any backend (gloo included).

Supported, on CPU tensors (one tensor per call, as gloo on the CPU): ``all_reduce`` (SUM,
AVG, MIN, MAX, PRODUCT), ``all_reduce_coalesced``, ``broadcast``, ``all_gather``,
``all_gather_into_tensor``/``_all_gather_base``, ``gather``, ``scatter``, ``reduce``,
``reduce_scatter``, ``reduce_scatter_tensor``/``_reduce_scatter_base``, ``all_to_all``,
``all_to_all_single``, ``barrier``. Point-to-point calls (``send``, ``recv``,
``isend``/``irecv``), bitwise reduce ops and ``PREMUL_SUM`` raise RuntimeError naming the
operation. Dtypes braid reduces: float32/64, float16, bfloat16, int32, int64, uint8; other
dtypes travel as bytes for the collectives that only move data. ``new_group(ranks)``
runs in a braid process set of ``ranks`` (docs/process-sets.md), agreed among them.

Names (the backend's collectives have none): a group's n-th call is named
``"c10d.<group>.<n>"``, a barrier ``"c10d.<group>.barrier"``; a call one rank refuses still
takes its number, and the refusal is reported to the other ranks under that name, so an
error never shifts later calls' pairing (docs/failures.md: No error shifts a step); after
ranks made different numbers of calls, ``barrier()`` realigns them. The group's timeout
(``init_process_group(timeout=...)``) bounds each call on the rank that waits, as gloo's.

Compression: the group's floating-point sums and averages use the method
``BRAID_C10D_COMPRESSION`` names, else the job's (``BRAID_COMPRESSION``, ``braidrun
--compression``); integer all-reduces and MIN, MAX, PRODUCT stay exact. Because every
call has a name of its own, only methods that keep no state per tensor apply here (none,
fp16, bf16, fp4/int4 without error feedback); a method with error feedback or PowerSGD's
factors needs a name that returns every step, which ``braid.torch.ddp_comm_hook`` gives
each gradient. Creating a group with such a method raises InvalidArgumentError saying so.

Errors: ``work.wait()`` and the work's future raise RuntimeError whose message starts with
braid's error class (``braid.UnavailableError: ...``), as torch's backends raise theirs.
"""

import atexit
import importlib
import os
import socket
import weakref
from datetime import timedelta

import torch.distributed as dist

from .._core import runtime as _runtime
from .._core.compression import canonical_compression
from .._core.errors import InvalidArgumentError
from .._core.objects import broadcast_object
from .process_group import ProcessGroupBraid

__all__ = ["BACKEND", "backend_compression"]

BACKEND = "braid"

# Methods whose compressors keep state per tensor name (error feedback, PowerSGD's factors,
# sparsifiers' residuals): they need a name that returns every step.
_STATEFUL_METHODS = ("powersgd", "scalecomp", "topk", "randomk")


def backend_compression():
    """The canonical compression spec (str) the ``braid`` backend's all-reduces use:
    ``BRAID_C10D_COMPRESSION`` if set, else the job's (``BRAID_COMPRESSION``, default
    ``"none"``; ``"none"`` when the job's is a plan of name patterns, which names the
    framework's tensors, not the backend's). InvalidArgumentError for a method that keeps
    state per tensor (see the module's docstring), a plan in BRAID_C10D_COMPRESSION, or an
    unknown method."""
    var = "BRAID_C10D_COMPRESSION" if "BRAID_C10D_COMPRESSION" in os.environ else \
        "BRAID_COMPRESSION"
    spec = canonical_compression(os.environ.get(var, "none") or "none",
                                 bool(os.environ.get("BRAID_TEST_COMPRESSORS")))
    if spec.startswith("{"):  # a plan (docs/compression.md, compression per layer)
        if var == "BRAID_COMPRESSION":
            return "none"
        raise InvalidArgumentError(
            "the braid torch.distributed backend cannot all-reduce with a compression plan "
            "(BRAID_C10D_COMPRESSION): its collectives have a new name every call, which no "
            "pattern can follow; set one method without state, such as fp16, and pass a plan "
            "to DistributedOptimizer or braid.torch.ddp_comm_hook's model instead")
    method, _, params = spec.partition(":")
    if method in _STATEFUL_METHODS or "ef=1" in params.split(","):
        raise InvalidArgumentError(
            f"the braid torch.distributed backend cannot all-reduce with {var}={spec}: it "
            "keeps state per tensor, and the backend's collectives have a new name every call; "
            "register braid.torch.ddp_comm_hook(compression=...) on the DDP model instead "
            "(it names each DDP bucket), and set BRAID_C10D_COMPRESSION=none (or a method "
            "without state, such as fp16) for the group")
    return spec


def _create(opts, pg_options):
    """torch's creator (extended API): a ProcessGroupBraid for the group ``opts`` describes.
    The whole job, or a subset of it (``dist.new_group(ranks)``), which runs in a braid
    process set (Note [Process sets] in control/process_sets.h) agreed among its members
    (torch calls the creator on them only). A group whose ranks are not in ascending order
    is created, and every call on it raises RuntimeError saying so: raising here would leave
    the ranks outside the group waiting in new_group()'s store barrier until its timeout."""
    _join_as(opts)
    _runtime.init()
    size, rank = _runtime.size(), _runtime.rank()
    ranks = list(opts.global_ranks_in_group) or list(range(opts.group_size))
    timeout_s = opts.timeout.total_seconds()
    if (ranks != sorted(ranks) or len(ranks) != opts.group_size
            or ranks[opts.group_rank] != rank):
        refusal = (
            f"braid backend: group '{opts.group_id}' has ranks {ranks} (this process, rank "
            f"{rank} of the job, is its rank {opts.group_rank} of {opts.group_size}); braid "
            "runs groups whose ranks are the job's in ascending order")
        return ProcessGroupBraid(opts.group_rank, opts.group_size, str(opts.group_id), "none",
                                 refusal, timeout_s)
    ps_id = 0
    if ranks != list(range(size)):
        ps_id = _runtime.members_process_set(ranks).process_set_id
    group = ProcessGroupBraid(opts.group_rank, opts.group_size, str(opts.group_id),
                              backend_compression(), "", timeout_s, ps_id,
                              ranks if ps_id else [])
    _groups.add(group)
    return group


_groups = weakref.WeakSet()  # the braid groups alive in this process


@atexit.register
def _drain_groups():
    """At interpreter exit (after braid's own shutdown, registered later by init(), has
    completed what was pending): waits, 10 s at most, for the groups' last callbacks, which
    must not run Python while the interpreter finalizes."""
    for group in list(_groups):
        group.drain(10.0)


# The variables by which a launcher gives braid a rank (docs/launching.md).
_LAUNCHER_RANKS = ("BRAID_RANK", "RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID")


def _join_as(opts):
    """Before braid joins the job for torch's default group, when no launcher gave it a rank:
    torch's rank and world size (``init_process_group(rank=..., world_size=...)``, as
    ``mp.spawn`` scripts pass them) as ``RANK``/``WORLD_SIZE``, and torch's store's address
    as ``MASTER_ADDR``/``MASTER_PORT`` when unset (``init_method="tcp://..."``), from which
    braid finds its coordinator as under torchrun."""
    if (_runtime.is_initialized() or list(opts.global_ranks_in_group)
            or any(v in os.environ for v in _LAUNCHER_RANKS)):
        return
    os.environ["RANK"], os.environ["WORLD_SIZE"] = str(opts.group_rank), str(opts.group_size)
    store = opts.store
    while hasattr(store, "underlying_store"):
        store = store.underlying_store
    if "MASTER_ADDR" not in os.environ and hasattr(store, "host"):
        os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = store.host, str(store.port)


# --- env:// under braidrun -------------------------------------------------------------------

# (torch.distributed's `rendezvous` attribute is the function, not the module.)
_rendezvous = importlib.import_module("torch.distributed.rendezvous")
_torch_env_handler = _rendezvous._rendezvous_handlers["env"]
_stores = []  # rank 0's TCPStore servers, alive as long as the process


def _address_towards(host, port):
    """This host's address on the route to (host, port): what other hosts reach it by."""
    family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)[0]
    with socket.socket(family, kind, proto) as s:
        s.connect(addr)  # UDP: picks the route, sends nothing
        return s.getsockname()[0]


def _serve_store(size, timeout):
    """Rank 0: a TCPStore server on a free port of the address the other ranks reach it by
    (its route towards braid's coordinator; loopback for a coordinator on loopback).
    Returns (the store, its address)."""
    host, _, port = os.environ.get("BRAID_COORDINATOR", "127.0.0.1:1").rpartition(":")
    host = host.strip("[]")
    me = _address_towards(host, int(port))
    store = dist.TCPStore(me, 0, size, True, timeout, wait_for_workers=False)
    return store, (me, store.port)


def _env_handler(url, timeout=timedelta(minutes=30), **kwargs):
    """torch's ``env://`` rendezvous, and under braidrun (``BRAID_RANK`` set, torch's
    ``MASTER_ADDR`` not) a store that rank 0 serves and braid's broadcast makes known; when
    rank 0 cannot serve one, every rank raises RuntimeError with its reason."""
    if "MASTER_ADDR" in os.environ or "BRAID_RANK" not in os.environ:
        yield from _torch_env_handler(url, timeout=timeout, **kwargs)
        return
    _runtime.init()
    rank, size = _runtime.rank(), _runtime.size()
    served = None
    if rank == 0:
        try:
            store, address = _serve_store(size, timeout)
            _stores.append(store)
            served = ("ok", address)
        except (OSError, RuntimeError, ValueError) as e:
            served = ("error", f"{type(e).__name__}: {e}")
    status, detail = broadcast_object(served, root_rank=0, name="torch.distributed.rendezvous")
    if status != "ok":
        raise RuntimeError(f"env:// under braidrun: rank 0 could not serve torch's store: {detail}")
    store = _stores[-1] if rank == 0 else dist.TCPStore(detail[0], detail[1], size, False,
                                                         timeout)
    yield store, rank, size
    raise RuntimeError("the env:// rendezvous under braidrun is not restartable")


def _torchrun_variables():
    """Under braidrun, torchrun's rank variables for the scripts that read them
    (``LOCAL_RANK`` to pick a device, ``RANK``, or ``env://`` with a ``MASTER_ADDR`` the
    script sets itself), from braid's; braid itself reads its own first."""
    pairs = (("RANK", "BRAID_RANK"), ("WORLD_SIZE", "BRAID_SIZE"),
             ("LOCAL_RANK", "BRAID_LOCAL_RANK"), ("LOCAL_WORLD_SIZE", "BRAID_LOCAL_SIZE"))
    if "BRAID_RANK" in os.environ and "RANK" not in os.environ:
        for torch_name, braid_name in pairs:
            if braid_name in os.environ:
                os.environ.setdefault(torch_name, os.environ[braid_name])


_torchrun_variables()
if not hasattr(dist.Backend, BACKEND.upper()):
    dist.Backend.register_backend(BACKEND, _create, extended_api=True)
    # torch offers no way to extend an existing scheme: the handler wraps torch's own and
    # defers to it whenever torch's variables are set.
    _rendezvous._rendezvous_handlers["env"] = _env_handler
