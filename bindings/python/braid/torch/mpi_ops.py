"""Collectives on torch tensors, with Horovod's signatures, over braid's runtime.

Tensors live in host memory (CPU). A contiguous tensor is handed to the runtime by address
(``tensor.data_ptr()``): no staging copy on the way in, and in-place calls write the result
straight into the tensor. A non-contiguous tensor (a transposed view, a slice with a stride)
is copied into a contiguous buffer first and, for in-place calls, the result is copied back
when the collective completes; results are always those of the logical tensor.

Dtypes: float32, float64, float16, bfloat16, int32, int64, uint8 travel as themselves.
torch.bool travels as bytes: all-gather, broadcast and all-to-all move it unchanged;
all-reduce and reduce-scatter combine it logically, Sum and Max as OR, Min and Product as
AND (as torch.distributed does for bool); Average of bool is an InvalidArgumentError. Other
dtypes (int8, int16, complex, ...) raise InvalidArgumentError naming the dtype.

Tensors on a GPU raise InvalidArgumentError for now (host memory only).

Names: every collective is matched across ranks by name; ``name=None`` takes the next
``"<collective>.noname.<n>"``, so ranks must then issue their unnamed collectives in the
same order. Tensors passed to an asynchronous call are kept alive by braid until the
collective completes and must not be modified meanwhile.
"""

import torch

from .._core import checks as _checks, errors as _errors, ndarray as _ndarray, runtime as _runtime
from .._core.errors import *  # noqa: F401,F403  (the errors and ops: errors.__all__)
from .._core.errors import Average, InvalidArgumentError
from ._handles import (  # noqa: F401  (re-exported)
    Adasum,
    Handle,
    SUPPORTED_DTYPES,
    global_process_set,
    poll,
    staging_copies,
    synchronize,
)
from ._handles import (
    CODES as _CODES,
    JOB_DEFAULT as _JOB_DEFAULT,
    MultiHandle as _MultiHandle,
    check_op as _check_op,
    call_process_set as _call_process_set,
    call_set_rank as _call_set_rank,
    call_set_size as _call_set_size,
    check_process_set as _check_process_set,
    check_scale as _check_scale,
    check_writable as _check_writable,
    contiguous as _contiguous,
    direct as _direct,
    empty_like as _empty_like,
    enqueue as _enqueue,
    result_from_bytes as _result_from_bytes,
    wire as _wire,
)
from . import compression as _compression


# Horovod's horovod.torch.mpi_ops exports the ops, errors and handle functions too.
__all__ = sorted(_errors.__all__ + [
    "Adasum", "allgather", "allgather_async", "allreduce", "allreduce_", "allreduce_async",
    "allreduce_async_", "alltoall", "alltoall_async", "barrier", "broadcast", "broadcast_",
    "broadcast_async", "broadcast_async_", "global_process_set", "grouped_allreduce",
    "grouped_allreduce_", "grouped_allreduce_async", "grouped_allreduce_async_", "Handle",
    "join", "poll", "reducescatter", "reducescatter_async", "staging_copies",
    "SUPPORTED_DTYPES", "synchronize",
], key=str.lower)


def _needs_grad(tensor):
    return isinstance(tensor, torch.Tensor) and tensor.requires_grad and torch.is_grad_enabled()


# --- all-reduce -----------------------------------------------------------------------------

def _direct_compression(compression):
    if compression is None:
        return "none"
    return None if compression is _JOB_DEFAULT else compression


def _allreduce_async(fn, tensor, name, op, prescale_factor, postscale_factor, compression,
                     inplace):
    name = _runtime.next_name("allreduce") if name is None else name
    spec, hook = _compression.resolve(compression, f"{fn} '{name}'")
    if hook is not None:
        raise InvalidArgumentError(
            f"{fn} '{name}': a framework-side compressor (compress/decompress) is applied by "
            "allreduce() and DistributedOptimizer, not by the asynchronous calls: pass a spec "
            "string or a braid.torch.Compression member")
    t, code, wop = _wire(fn, name, tensor, op)
    _check_scale(fn, name, tensor, prescale_factor, postscale_factor)
    target = None
    if inplace:
        _check_writable(fn, name, tensor)
        buf = _contiguous(t)
        if buf is not t:
            target = tensor  # reduce a contiguous copy; copy the result back at the end
        if prescale_factor != 1.0:
            buf.mul_(prescale_factor)
        inp = out = buf
    elif prescale_factor != 1.0:
        out = _empty_like(t)
        torch.mul(t, prescale_factor, out=out)
        inp = out
    elif _direct(t):
        inp, out = t, _empty_like(t)
    else:
        inp = out = _contiguous(t)  # the staging copy is the output: reduce it in place

    def finish(native):
        if postscale_factor != 1.0:
            out.mul_(postscale_factor)
        if target is not None:
            target.copy_(out.view(torch.bool) if tensor.dtype == torch.bool else out)
            return target
        if inplace:
            return tensor
        return out.view(torch.bool) if tensor.dtype == torch.bool else out

    return _enqueue("allreduce", name, inp, code, out=out, op=wop, compression=spec,
                    finish=finish, keep=(tensor,),
                    compression_pattern=_compression.pattern_of(compression))


@_runtime.reports_failures
def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                    postscale_factor=1.0, process_set=None, compression=None):
    """Starts an all-reduce of ``tensor`` into a new tensor; returns a Handle.

    ``tensor`` (any shape, the same on every rank) is left untouched; ``synchronize``
    returns a new contiguous tensor of its shape and dtype. ``op``: Average (default; the
    sum divided by the world size, floating-point dtypes only), Sum, Min, Max, Product.
    ``prescale_factor``/``postscale_factor`` multiply the input before and the result after
    the reduction (floating-point dtypes). ``compression``: a spec string ("fp16",
    "fp4:ef=1", ...) or a ``Compression`` member, the same on every rank; None (the default)
    is ``none``, as Horovod's ``Compression.none``: the job's default (BRAID_COMPRESSION,
    braidrun --compression) applies to DistributedOptimizer's gradients, never to a direct
    call, so metrics and other values averaged by hand stay exact.
    ``average`` (deprecated, Horovod's): True is Average, False is Sum.
    """
    _check_process_set("allreduce_async", process_set)
    op = _check_op("allreduce_async", name, op, average)
    return _allreduce_async("allreduce_async", tensor, name, op, prescale_factor,
                            postscale_factor, _direct_compression(compression),
                            inplace=False)


@_runtime.reports_failures
def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                     postscale_factor=1.0, process_set=None, compression=None):
    """Starts an in-place all-reduce: ``tensor`` receives the result. See allreduce_async.

    A contiguous tensor is reduced in its own memory (the runtime gets its address); another
    is reduced through a contiguous copy that is copied back when the handle completes. A
    ``prescale_factor`` scales the tensor in place before the collective starts (so a call
    that then fails leaves it scaled).
    """
    _check_process_set("allreduce_async_", process_set)
    op = _check_op("allreduce_async_", name, op, average)
    return _allreduce_async("allreduce_async_", tensor, name, op, prescale_factor,
                            postscale_factor, _direct_compression(compression),
                            inplace=True)


class _AllreduceFn(torch.autograd.Function):
    """All-reduce with a gradient: the gradient of an all-reduce is the all-reduce (same op
    and factors) of the incoming gradients, as in Horovod."""

    @staticmethod
    def forward(ctx, tensor, name, op, prescale_factor, postscale_factor, compression):
        ctx.args = (name, op, prescale_factor, postscale_factor)
        ctx.process_set = _call_process_set()
        return synchronize(_allreduce_async("allreduce", tensor, name, op, prescale_factor,
                                            postscale_factor, compression, inplace=False))

    @staticmethod
    def backward(ctx, grad_output):
        name, op, pre, post = ctx.args
        grad = allreduce(grad_output, name=None if name is None else name + ".grad", op=op,
                         prescale_factor=pre, postscale_factor=post, compression="none",
                         process_set=ctx.process_set)
        return grad, None, None, None, None, None


@_runtime.reports_failures
def allreduce(tensor, average=None, name=None, compression=None, op=None, prescale_factor=1.0,
              postscale_factor=1.0, process_set=None):
    """All-reduces ``tensor`` across ranks and returns the result as a new tensor.

    Differentiable: when ``tensor`` requires grad, the result's gradient is the all-reduce
    of the incoming gradients (a collective in backward, under the name ``NAME.grad``, so
    every rank must run backward through it). Errors as ``synchronize``; see
    allreduce_async for the arguments. A Horovod-style compressor object (compress /
    decompress) is applied around an uncompressed all-reduce.
    """
    _check_process_set("allreduce", process_set)
    op = _check_op("allreduce", name, op, average)
    spec, hook = _compression.resolve(_direct_compression(compression),
                                      f"allreduce '{name}'")
    if hook is not None:
        compressed, ctx = hook.compress(tensor)
        reduced = allreduce(compressed, name=name, op=op, prescale_factor=prescale_factor,
                            postscale_factor=postscale_factor, compression="none",
                            process_set=process_set)
        return hook.decompress(reduced, ctx)
    if _needs_grad(tensor):
        return _AllreduceFn.apply(tensor, name, op, prescale_factor, postscale_factor, spec)
    return synchronize(_allreduce_async("allreduce", tensor, name, op, prescale_factor,
                                        postscale_factor, spec, inplace=False))


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
               postscale_factor=1.0, process_set=None, compression=None):
    """All-reduces ``tensor`` in place and returns it. See allreduce_async_."""
    return synchronize(allreduce_async_(tensor, average, name, op, prescale_factor,
                                        postscale_factor, process_set, compression))


def _group_names(name, n):
    base = _runtime.next_name("grouped_allreduce") if name is None else name
    return [f"{base}.{i}" for i in range(n)]


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                            postscale_factor=1.0, process_set=None, compression=None):
    """Starts an all-reduce of every tensor of ``tensors`` (a list); ``synchronize`` returns
    the list of new tensors. Tensor i travels as ``NAME.i``. As in Horovod, the group goes
    to the coordinator at once, so the tensors travel fused in one bucket (when they share a
    dtype and fit under BRAID_FUSION_THRESHOLD; braid._core.runtime.group). See allreduce_async."""
    _check_process_set("grouped_allreduce_async", process_set)
    op = _check_op("grouped_allreduce_async", name, op, average)
    compression = _direct_compression(compression)
    with _runtime.group():
        hs = [_allreduce_async("grouped_allreduce_async", t, n, op, prescale_factor,
                               postscale_factor, compression, inplace=False)
              for t, n in zip(tensors, _group_names(name, len(tensors)))]
    return _MultiHandle(hs, list, "grouped_allreduce")


def grouped_allreduce(tensors, average=None, name=None, compression=None, op=None,
                      prescale_factor=1.0, postscale_factor=1.0, process_set=None):
    """All-reduces every tensor of ``tensors`` and returns the list of results."""
    return synchronize(grouped_allreduce_async(tensors, average, name, op, prescale_factor,
                                               postscale_factor, process_set, compression))


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                             postscale_factor=1.0, process_set=None, compression=None):
    """In-place grouped all-reduce (fused as grouped_allreduce_async); ``synchronize``
    returns ``tensors``."""
    _check_process_set("grouped_allreduce_async_", process_set)
    op = _check_op("grouped_allreduce_async_", name, op, average)
    compression = _direct_compression(compression)
    with _runtime.group():
        hs = [_allreduce_async("grouped_allreduce_async_", t, n, op, prescale_factor,
                               postscale_factor, compression, inplace=True)
              for t, n in zip(tensors, _group_names(name, len(tensors)))]
    return _MultiHandle(hs, list, "grouped_allreduce")


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                       postscale_factor=1.0, process_set=None, compression=None):
    """All-reduces every tensor of ``tensors`` in place and returns them."""
    return synchronize(grouped_allreduce_async_(tensors, average, name, op, prescale_factor,
                                                postscale_factor, process_set, compression))


# --- all-gather -----------------------------------------------------------------------------

def _allgather_async(fn, tensor, name):
    name = _runtime.next_name("allgather") if name is None else name
    t, code, _ = _wire(fn, name, tensor)
    if t.dim() == 0:
        raise InvalidArgumentError(f"{fn} '{name}': needs at least one dimension, got a "
                                   "scalar (use tensor.reshape(1))")
    return _enqueue("allgather", name, _contiguous(t), code,
                    finish=_result_from_bytes(tensor.dtype), keep=(tensor,))


@_runtime.reports_failures
def allgather_async(tensor, name=None, process_set=None):
    """Starts an all-gather of ``tensor`` (at least 1-D); returns a Handle.

    Dim 0 may differ across ranks; the other dimensions and the dtype must agree. The result
    concatenates every rank's tensor along dim 0 in rank order: shape
    ``(sum of dim 0 over ranks,) + tensor.shape[1:]``. ``tensor`` is left untouched.
    """
    _check_process_set("allgather_async", process_set)
    return _allgather_async("allgather_async", tensor, name)


class _AllgatherFn(torch.autograd.Function):
    """All-gather with a gradient, as Horovod defines it: the incoming gradient is averaged
    over ranks and each rank keeps the rows of its own input."""

    @staticmethod
    def forward(ctx, tensor, name):
        ctx.name = name
        ctx.rows = tensor.shape[0]
        ctx.process_set = _call_process_set()
        return synchronize(_allgather_async("allgather", tensor, name))

    @staticmethod
    def backward(ctx, grad_output):
        name = ctx.name
        _check_process_set("allgather (backward)", ctx.process_set)
        h_grad = _allreduce_async("allgather", grad_output,
                                  None if name is None else name + ".grad", Average, 1.0, 1.0,
                                  "none", inplace=False)
        rows = synchronize(_allgather_async(
            "allgather", torch.tensor([ctx.rows], dtype=torch.int64),
            None if name is None else name + ".grad_rows"))
        grad = synchronize(h_grad)
        offset = int(rows[:_runtime.rank()].sum())
        return grad.narrow(0, offset, ctx.rows), None


@_runtime.reports_failures
def allgather(tensor, name=None, process_set=None):
    """All-gathers ``tensor`` along dim 0 and returns a new tensor. See allgather_async.

    Differentiable (when ``tensor`` requires grad): see _AllgatherFn."""
    _check_process_set("allgather", process_set)
    if _needs_grad(tensor):
        return _AllgatherFn.apply(tensor, name)
    return synchronize(_allgather_async("allgather", tensor, name))


# --- broadcast ------------------------------------------------------------------------------

def _broadcast_async(fn, tensor, root_rank, name, inplace):
    name = _runtime.next_name("broadcast") if name is None else name
    t, code, _ = _wire(fn, name, tensor)
    target = None
    if inplace:
        _check_writable(fn, name, tensor)
        inp = out = _contiguous(t)
        if inp is not t:
            target = tensor
    else:
        inp, out = _contiguous(t), _empty_like(t)

    def finish(native):
        if target is not None:
            target.copy_(out.view(torch.bool) if tensor.dtype == torch.bool else out)
            return target
        if inplace:
            return tensor
        return out.view(torch.bool) if tensor.dtype == torch.bool else out

    return _enqueue("broadcast", name, inp, code, out=out, root_rank=root_rank, finish=finish,
                    keep=(tensor,))


@_runtime.reports_failures
def broadcast_async(tensor, root_rank, name=None, process_set=None):
    """Starts a broadcast of ``root_rank``'s ``tensor`` into a new tensor on every rank.

    Every rank passes a tensor of the same shape and dtype; ``tensor`` is left untouched.
    """
    _check_process_set("broadcast_async", process_set)
    return _broadcast_async("broadcast_async", tensor, root_rank, name, inplace=False)


@_runtime.reports_failures
def broadcast_async_(tensor, root_rank, name=None, process_set=None):
    """Starts an in-place broadcast: ``tensor`` receives ``root_rank``'s values."""
    _check_process_set("broadcast_async_", process_set)
    return _broadcast_async("broadcast_async_", tensor, root_rank, name, inplace=True)


class _BroadcastFn(torch.autograd.Function):
    """Broadcast with a gradient, as Horovod defines it: the root receives the average of
    every rank's incoming gradient, the other ranks zero."""

    @staticmethod
    def forward(ctx, tensor, root_rank, name):
        ctx.root_rank, ctx.name = root_rank, name
        ctx.process_set = _call_process_set()
        return synchronize(_broadcast_async("broadcast", tensor, root_rank, name, False))

    @staticmethod
    def backward(ctx, grad_output):
        name = ctx.name
        grad = allreduce(grad_output, name=None if name is None else name + ".grad",
                         op=Average, compression="none", process_set=ctx.process_set)
        if _runtime.rank() != ctx.root_rank:
            grad.zero_()
        return grad, None, None


@_runtime.reports_failures
def broadcast(tensor, root_rank, name=None, process_set=None):
    """Returns a new tensor holding ``root_rank``'s ``tensor``. See broadcast_async.

    Differentiable (when ``tensor`` requires grad): see _BroadcastFn."""
    _check_process_set("broadcast", process_set)
    if _needs_grad(tensor):
        return _BroadcastFn.apply(tensor, root_rank, name)
    return synchronize(_broadcast_async("broadcast", tensor, root_rank, name, False))


@_runtime.reports_failures
def broadcast_(tensor, root_rank, name=None, process_set=None):
    """Overwrites ``tensor`` with ``root_rank``'s values and returns it."""
    return synchronize(broadcast_async_(tensor, root_rank, name, process_set))


# --- all-to-all -----------------------------------------------------------------------------

def _splits_list(fn, name, splits, rows):
    """The splits as ints: ``size()`` non-negative integers summing to ``rows`` (floats are
    refused, never truncated)."""
    if splits is None:
        return None
    if isinstance(splits, torch.Tensor):
        if splits.is_floating_point() or splits.is_complex() or splits.dim() > 1:
            raise InvalidArgumentError(f"{fn} '{name}': splits must be a 1-D integer tensor "
                                       "or a list of ints")
        splits = splits.tolist()
    return _checks.check_splits(f"{fn} '{name}'", splits, rows, _call_set_size())


@_runtime.reports_failures
def alltoall_async(tensor, splits=None, name=None, process_set=None):
    """Starts an all-to-all of ``tensor`` (at least 1-D); returns a Handle.

    ``splits``: rows of dim 0 sent to each rank (a list or 1-D integer tensor of ``size()``
    non-negative values summing to ``tensor.shape[0]``); None splits dim 0 evenly (it must
    then divide by the world size). In a ``process_set``, ranks are the set's (its size, its
    members in ascending order). ``synchronize`` returns the rows every rank sent to this
    one, concatenated in rank order; when ``splits`` is given, as Horovod does, the pair
    ``(tensor, received_splits)`` with ``received_splits`` an int32 tensor of rows received
    from each rank (exchanged by a second, small all-to-all named ``NAME.splits``).
    """
    _check_process_set("alltoall_async", process_set)
    name = _runtime.next_name("alltoall") if name is None else name
    t, code, _ = _wire("alltoall_async", name, tensor)
    if t.dim() == 0:
        raise InvalidArgumentError(f"alltoall_async '{name}': needs at least one dimension, "
                                   "got a scalar")
    sp = _splits_list("alltoall_async", name, splits, t.shape[0])
    h = _enqueue("alltoall", name, _contiguous(t), code, splits=sp or (),
                 finish=_result_from_bytes(tensor.dtype), keep=(tensor,))
    if sp is None:
        return h
    counts = torch.tensor(sp, dtype=torch.int64)
    h_counts = _enqueue("alltoall", name + ".splits", counts, _CODES[torch.int64],
                        finish=_result_from_bytes(torch.int64))
    return _MultiHandle([h, h_counts], lambda r: (r[0], r[1].to(torch.int32)), "alltoall")


class _AlltoallFn(torch.autograd.Function):
    """All-to-all with a gradient: the incoming gradient's rows go back where they came from
    (an all-to-all with the received splits)."""

    @staticmethod
    def forward(ctx, tensor, splits, name, process_set):
        ctx.name = name
        ctx.process_set = process_set
        out, received = synchronize(alltoall_async(tensor, splits, name, process_set))
        ctx.received = received
        ctx.mark_non_differentiable(received)
        return out, received

    @staticmethod
    def backward(ctx, grad_output, _):
        grad, _ = synchronize(alltoall_async(
            grad_output, ctx.received, None if ctx.name is None else ctx.name + ".grad",
            ctx.process_set))
        return grad, None, None, None


@_runtime.reports_failures
def alltoall(tensor, splits=None, name=None, process_set=None):
    """Exchanges slices of ``tensor`` with every rank; see alltoall_async for the result.

    Differentiable (when ``tensor`` requires grad): the gradient travels back by an
    all-to-all with the received splits."""
    _check_process_set("alltoall", process_set)
    if _needs_grad(tensor):
        n = _call_set_size()
        if splits is None:
            rows = tensor.shape[0] // n if tensor.dim() else 0
            out, _ = _AlltoallFn.apply(tensor, [rows] * n, name, process_set)
            return out
        return _AlltoallFn.apply(tensor, splits, name, process_set)
    return synchronize(alltoall_async(tensor, splits, name, process_set))


# --- reduce-scatter -------------------------------------------------------------------------

def _share(rows, size, rank):
    return rows // size + (1 if rank < rows % size else 0)


@_runtime.reports_failures
def reducescatter_async(tensor, name=None, op=Average, process_set=None, prescale_factor=1.0,
                        postscale_factor=1.0):
    """Starts a reduce-scatter of ``tensor`` (at least 1-D, same shape on every rank).

    The reduced tensor is split along dim 0: with ``n = tensor.shape[0]`` and world size
    ``s``, rank ``r`` receives ``n // s`` rows, plus one when ``r < n % s``, in rank order.
    ``op`` and the scale factors as in allreduce_async. ``tensor`` is left untouched.
    """
    _check_process_set("reducescatter_async", process_set)
    name = _runtime.next_name("reducescatter") if name is None else name
    op = _check_op("reducescatter_async", name, op)
    t, code, wop = _wire("reducescatter_async", name, tensor, op)
    _check_scale("reducescatter_async", name, tensor, prescale_factor, postscale_factor)
    if t.dim() == 0:
        raise InvalidArgumentError(f"reducescatter_async '{name}': needs at least one "
                                   "dimension, got a scalar")
    inp = t.mul(prescale_factor).contiguous() if prescale_factor != 1.0 else _contiguous(t)
    out = torch.empty((_share(t.shape[0], _call_set_size(), _call_set_rank()),)
                      + tuple(t.shape[1:]), dtype=t.dtype)

    def finish(native):
        if postscale_factor != 1.0:
            out.mul_(postscale_factor)
        return out.view(torch.bool) if tensor.dtype == torch.bool else out

    return _enqueue("reducescatter", name, inp, code, out=out, op=wop, finish=finish,
                    keep=(tensor,))


class _ReducescatterFn(torch.autograd.Function):
    """Reduce-scatter with a gradient: the all-gather of the incoming gradients (divided by
    the world size for Average)."""

    @staticmethod
    def forward(ctx, tensor, name, op, pre, post, process_set):
        ctx.args = (name, op, pre, post, process_set)
        return synchronize(reducescatter_async(tensor, name, op, process_set, pre, post))

    @staticmethod
    def backward(ctx, grad_output):
        name, op, pre, post, process_set = ctx.args
        grad = allgather(grad_output, None if name is None else name + ".grad",
                         process_set=process_set)
        n = _runtime.size() if process_set is None else process_set.size()
        scale = pre * post / (n if op == Average else 1)
        return (grad * scale if scale != 1 else grad), None, None, None, None, None


@_runtime.reports_failures
def reducescatter(tensor, name=None, compression=None, op=Average, process_set=None,
                  prescale_factor=1.0, postscale_factor=1.0):
    """Reduces ``tensor`` across ranks and returns this rank's share of dim 0 (a new tensor).

    See reducescatter_async. ``compression`` must be None or none: reduce-scatter travels
    uncompressed. Differentiable (when ``tensor`` requires grad).
    """
    _check_process_set("reducescatter", process_set)
    spec, hook = _compression.resolve(compression, f"reducescatter '{name}'")
    if hook is not None or spec not in (None, "none"):
        raise InvalidArgumentError(f"reducescatter '{name}': compression applies to "
                                   "all-reduce only")
    if _needs_grad(tensor):
        return _ReducescatterFn.apply(tensor, name, op, prescale_factor, postscale_factor,
                                      process_set)
    return synchronize(reducescatter_async(tensor, name, op, process_set, prescale_factor,
                                           postscale_factor))


# --- barrier --------------------------------------------------------------------------------

def barrier(process_set=None, name=None):
    """Returns once every rank (of ``process_set``) has called barrier()."""
    _check_process_set("barrier", process_set)
    _ndarray.barrier(name, process_set)


# --- join -----------------------------------------------------------------------------------

def join(device=-1, process_set=None):
    """Uneven inputs, as Horovod's ``hvd.join()``: call it on a rank that has run out of
    data. Blocks until every rank has called it and returns the rank that joined last (an
    int, the same on every rank).

    Until then this rank takes part in the other ranks' all-reduces (``allreduce`` in every
    form, ``grouped_allreduce``, and so ``DistributedOptimizer``'s gradient all-reduces) with
    zeros in the negotiated shape and dtype (the op's identity for ``Min``, ``Max``,
    ``Product``), and an ``Average`` divides by the whole world size ``size()`` (as Horovod
    and DDP's ``divide_by_initial_world_size`` do): with 3 ranks of which one joined, an
    averaged gradient is ``(g0 + g1) / 3``. Barriers take it too; ``allgather``,
    ``broadcast``, ``alltoall`` and ``reducescatter`` raise FailedPreconditionError on the
    ranks that call them, naming the joined rank. After every rank joined, everything works
    as before (call ``join()`` again at the end of the next epoch).

    ``device`` is accepted for Horovod's signature and ignored: a joined rank contributes
    the op's identity on each bucket's own device.
    ``process_set``: join within a ProcessSet (None: the whole world): the set's all-reduces
    take this rank with the op's identity until every member joined, and an average divides
    by the set's size.
    """
    del device
    _check_process_set("join", process_set)
    return _ndarray.join(process_set)
