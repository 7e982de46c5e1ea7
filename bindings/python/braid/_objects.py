"""Python objects across ranks: pickled, then moved as uint8 arrays by braid's collectives.

Shared by the NumPy API (``braid``) and ``braid.torch``.
"""

import pickle

import numpy as np

from ._ops import _next_name, _utf8, allgather_async, broadcast_, rank, synchronize


def _default_object_name(kind, name):
    # Not the object's type name (as some frameworks do): a non-root rank usually passes None,
    # and the names must agree across ranks.
    if isinstance(name, str):
        _utf8(kind, "name", name)  # named as the caller gave it, not as NAME.size
    return _next_name(kind) if name is None else name


def broadcast_object(obj, root_rank=0, name=None):
    """Returns ``root_rank``'s ``obj`` on every rank (pickled, sent as bytes).

    Every rank calls it; the object other ranks pass is ignored (None is usual). ``obj``
    must be picklable (the standard ``pickle`` module; lambdas and local classes are not).
    Two broadcasts travel: the pickle's length (int64), then its bytes (uint8), named
    ``NAME.size`` and ``NAME.bytes``; ``name`` defaults to ``"broadcast_object.noname.<n>"``.
    Ranks unpickle what the root sends: use it only among the ranks of one job, which trust
    each other. Raises the collectives' errors (InvalidArgumentError for a bad root rank).
    """
    name = _default_object_name("broadcast_object", name)
    if rank() == root_rank:
        payload = np.frombuffer(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), np.uint8)
        length = np.array([payload.size], np.int64)
    else:
        payload, length = None, np.zeros(1, np.int64)
    broadcast_(length, root_rank, name=name + ".size")
    if payload is None:
        payload = np.empty(int(length[0]), np.uint8)
    out = broadcast_(np.array(payload), root_rank, name=name + ".bytes")
    return obj if rank() == root_rank else pickle.loads(out.tobytes())


def allgather_object(obj, name=None):
    """Returns the list of every rank's ``obj``, in rank order (pickled, sent as bytes).

    Two all-gathers run concurrently: the pickles' lengths (int64) and their bytes (uint8),
    named ``NAME.size`` and ``NAME.bytes``; ``name`` defaults to
    ``"allgather_object.noname.<n>"``. ``obj`` must be picklable. As with broadcast_object,
    ranks unpickle each other's bytes: use it only within one job.
    """
    name = _default_object_name("allgather_object", name)
    payload = np.frombuffer(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), np.uint8)
    h_len = allgather_async(np.array([payload.size], np.int64), name=name + ".size")
    h_bytes = allgather_async(payload, name=name + ".bytes")
    lengths = synchronize(h_len)
    data = synchronize(h_bytes)
    out, offset = [], 0
    for n in lengths.tolist():
        out.append(pickle.loads(data[offset:offset + n].tobytes()))
        offset += n
    return out
