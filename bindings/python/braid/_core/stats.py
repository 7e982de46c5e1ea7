"""Statistics and the timeline: what a rank can learn about its own part in the job.

Every name here is exported as it is by every frontend (this module's ``__all__``).
"""

import os

from .. import _braid
from .errors import InvalidArgumentError
from .runtime import check_process

__all__ = ["transport_description", "compression_stats", "fusion_stats", "start_timeline",
           "stop_timeline"]


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
    """This rank's all-reduce byte counters since ``init()``, per compression method, per
    group of tensors (method and plan pattern) and per tensor.

    Returns a dict::

        {"methods": {method: {"tensors", "reductions", "uncompressed_bytes",
                              "payload_bytes", "transport_bytes",
                              "reference_transport_bytes", "compression_ratio"}},
         "groups": [{"method", "pattern", "tensors", "reductions", "uncompressed_bytes",
                     "payload_bytes", "transport_bytes", "reference_transport_bytes",
                     "compression_ratio"}, ...],
         "tensors": {name: {"method", "pattern", "reductions", "uncompressed_bytes",
                            "payload_bytes", "transport_bytes", "reference_transport_bytes",
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

    ``"groups"``, sorted by (method, pattern), splits each method's counts by the pattern of
    the compression plan that gave it (docs/compression.md, compression per layer), e.g.
    ``{"method": "fp16", "pattern": "emb.*", ...}``: ``pattern`` is "" when no plan did (a
    single spec, the job's or the call's), the plan's pattern with " (auto)" after it, or
    "(auto)" alone, for the method ``auto`` chose, and "(other patterns)" for the patterns
    beyond the bound: 64 groups of a pattern of their own, over all methods, in the order
    their first all-reduce ran (each method's totals stay exact). A tensor's ``pattern`` is
    its group's.

    A tensor all-reduced with several methods over time (under ``auto`` whenever it changes
    its choice, e.g. "none + powersgd:rank=4") has one entry whose byte fields are summed
    over them and whose ``method`` (and ``pattern``, where they differ) joins their specs
    with " + ", sorted.
    ``"tensors"`` holds the 4096 names all-reduced most recently at most: a new name drops
    the least recently all-reduced one (so names made up anew every step do not grow it for
    ever), while ``"methods"`` counts every all-reduce.

    Raises FailedPreconditionError before ``init()``, after ``shutdown()`` and in a forked
    child of an initialized process.
    """
    check_process("compression_stats()")
    methods, tensors, groups = _braid.compression_report()
    out_methods = {}
    for m in methods:
        d = {"tensors": m["tensors"]}
        d.update((k, m[k]) for k in _BYTE_FIELDS)
        out_methods[m["method"]] = _with_ratio(d)
    out_groups = []
    for g in groups:  # sorted by (method, pattern)
        d = {"method": g["method"], "pattern": g["pattern"], "tensors": g["tensors"]}
        d.update((k, g[k]) for k in _BYTE_FIELDS)
        out_groups.append(_with_ratio(d))
    out_tensors = {}
    for t in tensors:  # sorted by (name, method, pattern): a name's entries are adjacent
        d = out_tensors.get(t["name"])
        if d is None:
            d = out_tensors[t["name"]] = {"method": [], "pattern": []}
            d.update((k, 0) for k in _BYTE_FIELDS)
        for k in ("method", "pattern"):
            if t[k] not in d[k]:
                d[k].append(t[k])
        for k in _BYTE_FIELDS:
            d[k] += t[k]
    for d in out_tensors.values():
        d["method"] = " + ".join(d["method"])
        d["pattern"] = " + ".join(d["pattern"])
        _with_ratio(d)
    return {"methods": out_methods, "groups": out_groups, "tensors": out_tensors}


def fusion_stats():
    """This rank's fusion counters since ``init()``: how its all-reduce buckets met the
    fusion buffer. Returns a dict of ints, cumulative over steps:

    - ``buckets``: all-reduce buckets run (a bucket is one tensor, or several fused);
    - ``packed_buckets``: those copied (or converted) into the fusion buffer and back out,
      or, for scattered tensors under ``none``, gathered through it (only the pipeline
      pieces that span two tensors are copied: ``BRAID_PIPELINED_COPY``);
    - ``packed_bytes``: the bytes of those buckets (what the three-pass copy writes into
      the fusion buffer, and copies back out);
    - ``in_place_bytes``: bytes of the buckets reduced where their tensors lie, with no
      copy: a lone tensor, or tensors that lie back to back in memory in the bucket's order
      (``braid.torch.DistributedOptimizer(gradient_as_bucket_view=True)`` lays gradients
      out so).

    Raises FailedPreconditionError before ``init()``, after ``shutdown()`` and in a forked
    child of an initialized process.
    """
    check_process("fusion_stats()")
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
