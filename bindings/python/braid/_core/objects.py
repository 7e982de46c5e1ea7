"""Python objects across ranks: pickled, then moved as uint8 arrays by braid's collectives.

Shared by the NumPy API (``braid``, this module's ``__all__``) and ``braid.torch``.

Note [Object failures]
Pickling and unpickling happen outside the runtime, on some ranks only (the root pickles, the
others unpickle), and can fail there: a lambda, an object whose class another rank cannot
import. Such a failure must not leave the other ranks waiting for a collective this rank
skipped, nor shift the names of the next object collectives. So a rank that fails still
takes part in every collective of the call, and says so in-band: its length is -1, and a
last all-reduce (max) of every rank's failure flag (``NAME.status``, one byte) tells every
rank whether any rank failed; only then an all-gather of the ranks' outcomes
(``NAME.causes``: a flag and the first bytes of the error message) tells them which and why.
Every rank then raises the same InvalidArgumentError, and every rank has run the same
collectives under the same names, whatever failed. No failure report to the coordinator is
needed, so no name is left failed for the ranks' next call.
"""

import pickle

import numpy as np

from .checks import check_name
from .errors import InvalidArgumentError, Max
from .ndarray import allgather, allgather_async, allreduce, broadcast_, synchronize
from .runtime import next_name, rank, size
from .runtime import process_set_id as _set_id

__all__ = ["broadcast_object", "allgather_object"]

_STATUS_BYTES = 512  # one rank's outcome: a failure flag, then its UTF-8 message (truncated)


def _default_object_name(kind, name, process_set):
    # Not the object's type name (as some frameworks do): a non-root rank usually passes None,
    # and the names must agree across ranks (of the set: its calls are counted apart).
    if name is None:
        return next_name(kind, _set_id(kind, process_set))
    return check_name(kind, name)  # named as the caller gave it, not as NAME.size


def _pickled(obj):
    """(the pickle of ``obj`` as a uint8 array, None), or (None, the exception) when it cannot
    be pickled."""
    try:
        return np.frombuffer(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), np.uint8), None
    except Exception as e:  # noqa: BLE001 - any failure of a user's __reduce__ is the case
        return None, e


def _unpickled(data, what):
    """(the object, None), or (None, a _Failure saying ``what`` could not be unpickled)."""
    try:
        return pickle.loads(data.tobytes()), None
    except Exception as e:  # noqa: BLE001
        return None, _Failure(f"could not unpickle {what}", e)


class _Failure:
    """A local failure of this rank: a phrase and the exception behind it."""

    def __init__(self, phrase, error):
        self.phrase, self.error = phrase, error

    def message(self):
        return f"rank {rank()} {self.phrase}: {type(self.error).__name__}: {self.error}"


def _ranks(process_set):
    """The job's ranks of ``process_set`` (None: every rank), in the set's order."""
    return list(range(size())) if process_set is None else list(process_set.ranks)


def _agree(kind, name, failure, process_set=None):
    """Every rank's outcome of the call (Note [Object failures]): returns when no rank
    failed, else raises InvalidArgumentError on every rank naming the failed ranks and their
    causes (chained to this rank's own exception)."""
    if len(_ranks(process_set)) == 1:  # nobody to tell
        if failure is None:
            return
        failed, causes = [rank()], failure.message()
    else:
        failed_here = np.array([failure is not None], np.uint8)
        if not allreduce(failed_here, name=name + ".status", op=Max,
                         process_set=process_set)[0]:
            return
        failed, causes = _causes(name, failure, process_set)
    error = InvalidArgumentError(f"{kind} '{name}' failed on rank(s) {failed}: {causes}")
    raise error from (failure.error if failure is not None else None)


def _causes(name, failure, process_set=None):
    """(the failed ranks, their messages joined): an all-gather of every rank's outcome, a
    flag and the start of its message."""
    record = np.zeros(_STATUS_BYTES, np.uint8)
    if failure is not None:
        text = failure.message().encode("utf-8", "replace")[:_STATUS_BYTES - 1]
        record[0] = 1
        record[1:1 + len(text)] = np.frombuffer(text, np.uint8)
    ranks = _ranks(process_set)
    rows = allgather(record, name=name + ".causes",
                     process_set=process_set).reshape(len(ranks), _STATUS_BYTES)
    failed = [i for i in range(len(ranks)) if rows[i, 0]]
    return [ranks[i] for i in failed], "; ".join(
        rows[i, 1:].tobytes().rstrip(b"\0").decode("utf-8", "replace") for i in failed)


def broadcast_object(obj, root_rank=0, name=None, process_set=None):
    """Returns ``root_rank``'s ``obj`` on every rank (pickled, sent as bytes).

    Every rank calls it; the object other ranks pass is ignored (None is usual). ``obj``
    must be picklable (the standard ``pickle`` module; lambdas and local classes are not).
    Collectives, named ``NAME.size``, ``NAME.bytes`` and ``NAME.status``: a broadcast of the
    pickle's length (int64), one of its bytes (uint8), and an all-reduce of the ranks'
    failure flags (after a failure, ``NAME.causes`` gathers the messages); ``name``
    defaults to ``"broadcast_object.noname.<n>"``. Ranks unpickle what
    the root sends: use it only among the ranks of one job, which trust each other.
    ``process_set``: a ProcessSet whose ranks alone call it (``root_rank`` one of them).

    Raises InvalidArgumentError on every rank, naming ``name``, the ranks that failed and
    why, when the root cannot pickle ``obj`` or a rank cannot unpickle it (its class is
    missing there, ...); the ranks' next object collectives are unaffected. Also raises the
    collectives' errors (InvalidArgumentError for a bad root rank).
    """
    name = _default_object_name("broadcast_object", name, process_set)
    payload, failure = None, None
    length = np.zeros(1, np.int64)
    if rank() == root_rank:
        payload, error = _pickled(obj)
        if error is not None:
            failure = _Failure("could not pickle its object", error)
        length[0] = -1 if payload is None else payload.size
    broadcast_(length, root_rank, name=name + ".size", process_set=process_set)
    out = obj
    if length[0] >= 0:  # the root pickled it: the same decision on every rank
        buf = np.array(payload) if payload is not None else np.empty(int(length[0]), np.uint8)
        data = broadcast_(buf, root_rank, name=name + ".bytes", process_set=process_set)
        if rank() != root_rank:
            out, failure = _unpickled(data, f"rank {root_rank}'s object")
    _agree("broadcast_object", name, failure, process_set)
    return out


def allgather_object(obj, name=None, process_set=None):
    """Returns the list of every rank's ``obj``, in rank order (pickled, sent as bytes); in a
    ``process_set``, of its ranks' objects, in the set's order.

    Two all-gathers run concurrently: the pickles' lengths (int64) and their bytes (uint8),
    named ``NAME.size`` and ``NAME.bytes``; then an all-reduce of the ranks' failure flags,
    ``NAME.status`` (and ``NAME.causes`` after a failure); ``name`` defaults to
    ``"allgather_object.noname.<n>"``. ``obj`` must be picklable. As with broadcast_object,
    ranks unpickle each other's bytes: use it only within one job. Raises
    InvalidArgumentError on every rank, naming ``name``, the ranks that failed and why, when
    a rank cannot pickle its object or cannot unpickle another's; and the collectives'
    errors.
    """
    name = _default_object_name("allgather_object", name, process_set)
    payload, error = _pickled(obj)
    failure = None if error is None else _Failure("could not pickle its object", error)
    mine = np.array([-1 if payload is None else payload.size], np.int64)
    h_len = allgather_async(mine, name=name + ".size", process_set=process_set)
    h_bytes = allgather_async(np.empty(0, np.uint8) if payload is None else payload,
                              name=name + ".bytes", process_set=process_set)
    lengths = synchronize(h_len).tolist()
    data = synchronize(h_bytes)
    out = []
    if all(n >= 0 for n in lengths):  # every rank pickled its object
        offset = 0
        for r, n in zip(_ranks(process_set), lengths):
            value, failure = _unpickled(data[offset:offset + n], f"rank {r}'s object")
            if failure is not None:
                break
            out.append(value)
            offset += n
    _agree("allgather_object", name, failure, process_set)
    return out
