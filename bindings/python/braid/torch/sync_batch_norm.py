"""SyncBatchNorm: batch normalization whose batch statistics span every rank's batch.

Horovod's ``hvd.SyncBatchNorm`` (and ``torch.nn.SyncBatchNorm``): in training, the mean and
variance of each channel are those of the concatenation of every rank's batch, as one process
with the combined batch would compute them (Ioffe & Szegedy 2015, "Batch Normalization",
Algorithm 1, over the global mini-batch), so small per-rank batches still normalize with
statistics of the whole batch.

Forward (training): each rank computes, per channel, its count ``n_r``, mean ``m_r`` and sum
of squared deviations ``M2_r``; one all-gather brings every rank's; they combine exactly
(Chan, Golub & LeVeque 1979, the pairwise update of means and M2):
``N = sum n_r``, ``mean = sum n_r m_r / N``, ``M2 = sum (M2_r + n_r (m_r - mean)^2)``,
``var = M2 / N`` (biased, to normalize), ``y = (x - mean) / sqrt(var + eps) * weight + bias``.
The running statistics are updated as ``torch.nn.BatchNorm`` would with the combined batch
(``running_var`` with the unbiased ``M2 / (N - 1)``).

Backward: one all-reduce (Sum) of each channel's ``sum(dy)`` and ``sum(dy * (x - mean))`` over
every rank's batch; the input gradient is the batch-norm gradient with those global sums
(the gradient of the sum of every rank's loss), the weight and bias gradients are this rank's
own (their all-reduce is the optimizer's, as for every other parameter).

Statistics are computed in float64 whatever the input's dtype. Every rank's batch may have a
different size (even zero rows, when another rank has some). In eval mode, or with one rank,
it is ``torch.nn.BatchNorm`` and nothing is communicated (as ``torch.nn.SyncBatchNorm``:
without running statistics, eval mode normalizes with this rank's batch alone), so eval loops
whose ranks run different numbers of batches never wait on each other.

The collectives are named ``sync_batch_norm.stats`` and ``sync_batch_norm.grad``: every rank
must run its SyncBatchNorm layers' training forward (and backward) passes in the same order,
as it runs its model. A rank that skips one leaves the others waiting: the coordinator warns
of the stall after BRAID_STALL_CHECK_S, and the collective fails on every rank with
DeadlineExceededError after BRAID_NEGOTIATION_TIMEOUT_S.
"""

import torch
import torch.nn.functional as F
from torch.nn.modules.batchnorm import _BatchNorm

from .._core import runtime as _runtime
from .._core.errors import InvalidArgumentError, Sum
from .mpi_ops import allgather, allreduce

__all__ = ["SyncBatchNorm"]


def _reduced_dims(x):
    return [0] + list(range(2, x.dim()))


def _channel_view(v, x):
    """A (C,) tensor shaped to broadcast over an (N, C, *) input."""
    return v.view([1, -1] + [1] * (x.dim() - 2))


class _SyncBatchNormFn(torch.autograd.Function):

    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, eps, momentum):
        c = x.shape[1]
        dims = _reduced_dims(x)
        xd = x.detach().to(torch.float64)
        n_local = x.numel() // c if c else 0
        if n_local > 0:
            m_local = xd.mean(dims)
            m2_local = ((xd - _channel_view(m_local, xd)) ** 2).sum(dims)
        else:
            m_local = xd.new_zeros(c)
            m2_local = xd.new_zeros(c)
        row = torch.cat([xd.new_tensor([float(n_local)]), m_local, m2_local]).unsqueeze(0)
        try:
            rows = allgather(row, name="sync_batch_norm.stats")
        except InvalidArgumentError as e:
            if "trailing shape differs" not in str(e):
                raise
            raise InvalidArgumentError(
                f"SyncBatchNorm: the ranks' inputs differ in their number of channels (this "
                f"rank: {c}; each rank sends 1 + 2 x channels statistics): {e}") from e
        counts, means, m2s = rows[:, 0], rows[:, 1:1 + c], rows[:, 1 + c:]
        n = counts.sum()
        if n <= 1:
            raise ValueError("SyncBatchNorm: expected more than 1 value per channel when "
                             f"training over all ranks, got {int(n)} (input shape "
                             f"{list(x.shape)} on rank {_runtime.rank()})")
        mean = (counts.unsqueeze(1) * means).sum(0) / n
        m2 = (m2s + counts.unsqueeze(1) * (means - mean) ** 2).sum(0)
        var = m2 / n
        invstd = torch.rsqrt(var + eps)
        if running_mean is not None:
            with torch.no_grad():
                running_mean.mul_(1 - momentum).add_(mean.to(running_mean.dtype),
                                                     alpha=momentum)
                running_var.mul_(1 - momentum).add_((m2 / (n - 1)).to(running_var.dtype),
                                                    alpha=momentum)
        xhat = (xd - _channel_view(mean, xd)) * _channel_view(invstd, xd)
        y = xhat
        if weight is not None:
            y = y * _channel_view(weight.detach().to(torch.float64), xd)
        if bias is not None:
            y = y + _channel_view(bias.detach().to(torch.float64), xd)
        ctx.save_for_backward(x, weight, mean, invstd)
        ctx.n = n
        ctx.has_bias = bias is not None
        return y.to(x.dtype)

    @staticmethod
    def backward(ctx, dy):
        x, weight, mean, invstd = ctx.saved_tensors
        dims = _reduced_dims(x)
        xd = x.to(torch.float64)
        dyd = dy.to(torch.float64)
        xmu = xd - _channel_view(mean, xd)
        sum_dy_local = dyd.sum(dims)
        sum_dy_xmu_local = (dyd * xmu).sum(dims)
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            c = x.shape[1]
            both = allreduce(torch.cat([sum_dy_local, sum_dy_xmu_local]), op=Sum,
                             name="sync_batch_norm.grad")
            mean_dy = both[:c] / ctx.n
            mean_dy_xmu = both[c:] / ctx.n
            scale = invstd if weight is None else invstd * weight.detach().to(torch.float64)
            grad = (dyd - _channel_view(mean_dy, xd)
                    - xmu * _channel_view(invstd * invstd * mean_dy_xmu, xd))
            grad_x = (grad * _channel_view(scale, xd)).to(x.dtype)
        if weight is not None and ctx.needs_input_grad[1]:
            grad_w = (sum_dy_xmu_local * invstd).to(weight.dtype)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_b = sum_dy_local.to(dy.dtype)
        return grad_x, grad_w, grad_b, None, None, None, None


class SyncBatchNorm(_BatchNorm):
    """Batch normalization with statistics over every rank's batch (Horovod's
    ``hvd.SyncBatchNorm``, ``torch.nn.SyncBatchNorm``'s semantics; see the module's
    docstring for the equations).

    Args: as ``torch.nn.BatchNorm2d``: ``num_features`` (C), ``eps`` (1e-5), ``momentum``
    (0.1; None: a cumulative moving average), ``affine`` (True), ``track_running_stats``
    (True). Input: (N, C, *) on the CPU, any floating dtype; output the same shape and dtype.
    Raises ValueError for an input of fewer than 2 dimensions, or for a single value per
    channel over all ranks in training; InvalidArgumentError on every rank, naming the
    channels and the ranks, when ranks' inputs differ in C; the collectives' other braid
    errors (a rank that skips a layer: see the module's docstring).
    """

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True,
                 track_running_stats=True, device=None, dtype=None):
        super().__init__(num_features, eps, momentum, affine, track_running_stats,
                         device=device, dtype=dtype)

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def forward(self, input):
        self._check_input_dim(input)
        if input.is_cuda:
            raise InvalidArgumentError("SyncBatchNorm: braid.torch supports host (CPU) "
                                       "tensors only so far")
        if input.shape[1] != self.num_features:
            raise ValueError(f"SyncBatchNorm: input has {input.shape[1]} channels, the layer "
                             f"{self.num_features}")
        # Momentum and the batch counter as torch.nn.BatchNorm keeps them.
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            factor = (1.0 / float(self.num_batches_tracked) if self.momentum is None
                      else self.momentum)
        # Batch statistics in training, or in eval without running statistics; the running
        # statistics are used in eval, and updated in training when tracked. Only training
        # synchronizes (as torch.nn.SyncBatchNorm; Horovod's also synchronizes an eval pass
        # without running statistics, which hangs eval loops of uneven length).
        bn_training = self.training or (self.running_mean is None and self.running_var is None)
        use_running = not self.training or self.track_running_stats
        running_mean = self.running_mean if use_running else None
        running_var = self.running_var if use_running else None
        if not self.training or _runtime.size() == 1:
            return F.batch_norm(input, running_mean, running_var, self.weight, self.bias,
                                bn_training, factor, self.eps)
        return _SyncBatchNormFn.apply(input, self.weight, self.bias, running_mean, running_var,
                                      self.eps, factor)

    @classmethod
    def convert_sync_batchnorm(cls, module):
        """Returns ``module`` with every ``torch.nn.BatchNorm*d`` in it replaced by a
        SyncBatchNorm holding the same parameters and running statistics (as
        ``torch.nn.SyncBatchNorm.convert_sync_batchnorm``)."""
        out = module
        if isinstance(module, _BatchNorm) and not isinstance(module, cls):
            out = cls(module.num_features, module.eps, module.momentum, module.affine,
                      module.track_running_stats)
            if module.affine:
                with torch.no_grad():
                    out.weight = module.weight
                    out.bias = module.bias
            out.running_mean = module.running_mean
            out.running_var = module.running_var
            out.num_batches_tracked = module.num_batches_tracked
            out.train(module.training)
        for name, child in module.named_children():
            out.add_module(name, cls.convert_sync_batchnorm(child))
        del module
        return out
