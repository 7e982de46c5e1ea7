"""Rank program: braid.torch.SyncBatchNorm against one process's torch.nn.BatchNorm over the
concatenation of every rank's batch.

Every rank builds the whole batch from a seed, takes its own rows (batch sizes may differ by
rank, one rank may have none), and checks, over two training steps and then in eval mode:
the forward output equals the reference's rows; the input gradient equals the reference's
rows when the reference's loss is the sum of every rank's loss; the weight and bias
gradients, summed over ranks, equal the reference's; the running statistics and
num_batches_tracked equal the reference's. Then a Horovod-style training script (only the
import differs from Horovod's) with hvd.SyncBatchNorm and DistributedOptimizer ends with the
parameters of one process training on the whole batch. Last, ranks that disagree on the
number of channels get an error on every rank.
"""

import os
import sys
import zlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import braid.torch as hvd  # noqa: E402
from _common import check, expect_raises, log, main  # noqa: E402
from _torch_common import check_tensor  # noqa: E402

TOL = {torch.float32: (1e-4, 1e-5), torch.float64: (1e-10, 1e-12)}


def _rows(sizes, rank):
    start = sum(sizes[:rank])
    return slice(start, start + sizes[rank])


def _case(what, bn_cls, shape_tail, sizes, rank, size, dtype=torch.float32, affine=True,
          momentum=0.1, track=True):
    """Two training steps and one eval step of SyncBatchNorm vs bn_cls on the whole batch."""
    gen = torch.Generator().manual_seed(zlib.crc32(what.encode()))
    c = shape_tail[0]
    ref = bn_cls(c, momentum=momentum, affine=affine, track_running_stats=track).to(dtype)
    sbn = hvd.SyncBatchNorm(c, momentum=momentum, affine=affine,
                            track_running_stats=track).to(dtype)
    if affine:
        with torch.no_grad():
            w = torch.rand(c, generator=gen, dtype=dtype) + 0.5
            b = torch.randn(c, generator=gen, dtype=dtype)
            ref.weight.copy_(w)
            ref.bias.copy_(b)
            sbn.weight.copy_(w)
            sbn.bias.copy_(b)
    tol = TOL[dtype]
    mine = _rows(sizes, rank)
    for step in range(2):
        total = sum(sizes)
        x_all = (torch.randn((total,) + tuple(shape_tail), generator=gen, dtype=dtype) * 3 + 1.5)
        g_all = torch.randn((total,) + tuple(shape_tail), generator=gen, dtype=dtype)
        xr = x_all.clone().requires_grad_(True)
        yr = ref(xr)
        (yr * g_all).sum().backward()  # the sum of every rank's loss (yr_r * g_r).sum()

        x = x_all[mine].clone().requires_grad_(True)
        y = sbn(x)
        (y * g_all[mine]).sum().backward()
        at = f"{what} step {step}"
        check_tensor(y.detach(), yr.detach()[mine], f"{at}: output", tol)
        check_tensor(x.grad, xr.grad[mine], f"{at}: input gradient", tol)
        if affine:
            check_tensor(hvd.allreduce(sbn.weight.grad, op=hvd.Sum, name=f"{at}.w"),
                         ref.weight.grad, f"{at}: weight gradient summed over ranks", tol)
            check_tensor(hvd.allreduce(sbn.bias.grad, op=hvd.Sum, name=f"{at}.b"),
                         ref.bias.grad, f"{at}: bias gradient summed over ranks", tol)
            ref.weight.grad = ref.bias.grad = None
            sbn.weight.grad = sbn.bias.grad = None
        if track:
            check_tensor(sbn.running_mean, ref.running_mean, f"{at}: running_mean", tol)
            check_tensor(sbn.running_var, ref.running_var, f"{at}: running_var", tol)
            check(int(sbn.num_batches_tracked) == int(ref.num_batches_tracked) == step + 1,
                  f"{at}: num_batches_tracked {int(sbn.num_batches_tracked)}, reference "
                  f"{int(ref.num_batches_tracked)}")
    # Eval: the running statistics, or, untracked, this rank's batch alone; no communication
    # either way (as torch.nn.SyncBatchNorm), so ranks may run different numbers of eval
    # batches: rank 0 runs one more here.
    ref.eval()
    sbn.eval()
    x_all = torch.randn((sum(sizes),) + tuple(shape_tail), generator=gen, dtype=dtype)
    with torch.no_grad():
        want = ref(x_all)[mine] if track else ref(x_all[mine]) if sizes[rank] > 1 else None
        if want is not None:
            check_tensor(sbn(x_all[mine]), want, f"{what} eval: output", tol)
            if rank == 0:
                sbn(x_all[mine])


def _horovod_style_script(rank, size):
    """Horovod's PyTorch recipe with a SyncBatchNorm, vs one process on the whole batch."""
    torch.manual_seed(0)

    def model_of(bn):
        return nn.Sequential(nn.Conv2d(1, 4, 3), bn(4), nn.ReLU(), nn.Flatten(),
                             nn.Linear(4 * 6 * 6, 3))

    model = model_of(hvd.SyncBatchNorm)
    torch.manual_seed(0)
    single = model_of(nn.BatchNorm2d)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    single_opt = torch.optim.SGD(single.parameters(), lr=0.1, momentum=0.9)
    gen = torch.Generator().manual_seed(7)
    per_rank = 5
    for step in range(4):
        x = torch.randn(per_rank * size, 1, 8, 8, generator=gen)
        y = torch.randint(0, 3, (per_rank * size,), generator=gen)
        mine = slice(rank * per_rank, (rank + 1) * per_rank)
        model.train()
        optimizer.zero_grad()
        F.cross_entropy(model(x[mine]), y[mine]).backward()
        optimizer.step()
        single_opt.zero_grad()
        F.cross_entropy(single(x), y).backward()
        single_opt.step()
    for (name, p), q in zip(model.state_dict().items(), single.state_dict().values()):
        check_tensor(p, q, f"Horovod-style script: {name} after 4 steps", (1e-4, 1e-5))


def body():
    hvd.init()
    torch.set_num_threads(1)
    rank, size = hvd.rank(), hvd.size()
    check(hvd.is_homogeneous() is True, f"is_homogeneous() {hvd.is_homogeneous()}")
    for fn in (hvd.mpi_enabled, hvd.gloo_enabled, hvd.mpi_threads_supported, hvd.mpi_built,
               hvd.gloo_built):
        check(fn() is False, f"{fn.__name__}() {fn()}")

    even = [4] * size
    uneven = [3 + r for r in range(size)]
    one_empty = [0] + [5] * (size - 1)
    _case("1d (N, C)", nn.BatchNorm1d, (6,), even, rank, size)
    _case("1d (N, C, L) uneven", nn.BatchNorm1d, (3, 5), uneven, rank, size)
    _case("2d uneven", nn.BatchNorm2d, (4, 3, 3), uneven, rank, size)
    _case("2d one rank empty", nn.BatchNorm2d, (2, 2, 2), one_empty, rank, size)
    _case("3d float64", nn.BatchNorm3d, (2, 2, 2, 2), even, rank, size, dtype=torch.float64)
    _case("2d no affine", nn.BatchNorm2d, (3, 2, 2), even, rank, size, affine=False)
    _case("2d cumulative average", nn.BatchNorm2d, (3, 2, 2), uneven, rank, size,
          momentum=None)
    _case("2d untracked", nn.BatchNorm2d, (3, 2, 2), uneven, rank, size, track=False)

    converted = hvd.SyncBatchNorm.convert_sync_batchnorm(
        nn.Sequential(nn.Conv2d(1, 2, 1), nn.Sequential(nn.BatchNorm2d(2))))
    check(type(converted[1][0]) is hvd.SyncBatchNorm,
          f"convert_sync_batchnorm gave {type(converted[1][0]).__name__}")

    _horovod_style_script(rank, size)
    log(f"rank {rank}: SyncBatchNorm matches one process's BatchNorm")

    # Ranks that disagree on the channels: an error on every rank, naming the collective.
    bad = hvd.SyncBatchNorm(2 + rank)
    expect_raises(hvd.InvalidArgumentError, lambda: bad(torch.randn(4, 2 + rank)),
                  "channels differing across ranks",
                  contains=("SyncBatchNorm: the ranks' inputs differ in their number of channels "
                            f"(this rank: {2 + rank};", "sync_batch_norm.stats"))
    expect_raises(ValueError, lambda: hvd.SyncBatchNorm(3)(torch.randn(3)), "1-D input",
                  contains=("expected at least 2D input",))


if __name__ == "__main__":
    main(body)
