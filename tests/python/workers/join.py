"""Rank program: join() for uneven inputs, through braid (NumPy) and braid.torch.

The last rank has 3 batches fewer than the others. Every reference is computed here, in
float64, from every rank's inputs (each rank can build every rank's batch from (step,
rank)): an all-reduce on a step where the short rank has joined is the reduction over the
ranks that still have data (a joined rank contributes zeros), and an Average divides that
sum by the whole world size. The rank that joins last is made deterministic: rank size-2
first runs an all-reduce that can only complete once every other rank has joined (so it
also checks that such an all-reduce is its own data alone), then joins.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import braid  # noqa: E402
import braid.torch as hvd  # noqa: E402
from _common import check, check_array, expect_raises, log, main  # noqa: E402
from _torch_common import check_tensor  # noqa: E402

torch.set_num_threads(1)
STEPS = 6
SHORT_BY = 3
TOL = (1e-4, 1e-5)


def steps_of(rank, size):
    return STEPS - SHORT_BY if rank == size - 1 else STEPS


def has_data(rank, step, size):
    return step < steps_of(rank, size)


def metric(step, rank):
    return np.random.default_rng(100 * step + rank).standard_normal((3, 5))


def join_in_order(join, size, rank, allreduce_sum):
    """Joins so that rank size-2 joins last: it first all-reduces alone (the others have
    joined by the time that completes), then joins. Returns join()'s result."""
    last = size - 2
    if rank == last:
        mine = np.full((4,), 2.5 + rank)
        got = allreduce_sum(mine, "solo")
        check_array(got, mine, "an all-reduce after every other rank joined is this rank's own")
    return join()


def check_numpy(size, rank):
    """braid.join with NumPy arrays: Sum, Average and Max on uneven steps, the result of
    join(), an all-gather refused while a rank is joined, and a normal step afterwards."""
    for step in range(steps_of(rank, size)):
        x = metric(step, rank)
        ranks = [r for r in range(size) if has_data(r, step, size)]
        total = sum(metric(step, r) for r in ranks)
        check_array(braid.allreduce(x, name="m.sum", op=braid.Sum), total, f"numpy sum step {step}")
        check_array(braid.allreduce(x, name="m.avg"), total / size,
                    f"numpy average step {step} (divided by the world size {size})")
        # Max with the joined rank: the max over ranks with data (never a joined rank's 0).
        neg = -np.abs(x) - 1.0
        want = np.max([-np.abs(metric(step, r)) - 1.0 for r in ranks], axis=0)
        check_array(braid.allreduce(neg, name="m.max", op=braid.Max), want,
                    f"numpy max step {step} (joined ranks never win)")
    if rank != size - 1:
        # Rank size-1 has joined by now (the last steps completed without it): an all-gather
        # among the others is refused, on every one of them, naming it.
        expect_raises(
            braid.FailedPreconditionError,
            lambda: braid.allgather(np.zeros((1, 2), np.float32), name="rows"),
            "allgather while a rank is joined",
            exact=(f"tensor 'rows': allgather is not supported while rank {size - 1} has joined "
                   "(join() for uneven inputs covers allreduce and barrier only: a joined rank "
                   "has no data to contribute)"))
    last = join_in_order(braid.join, size, rank,
                         lambda a, n: braid.allreduce(a, name=n, op=braid.Sum))
    check(last == size - 2, f"numpy join() returned {last!r}, expected {size - 2}")
    # A new round: every rank's data counts again.
    check_array(braid.allreduce(np.full((2,), float(rank + 1)), name="after", op=braid.Sum),
                np.full((2,), size * (size + 1) / 2), "numpy all-reduce after the join round")
    log(f"numpy: uneven steps, join() = {last}, and the step after it match the references")


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(10, 8)
        self.fc2 = nn.Linear(8, 3)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x)))


def batch(step, rank, n=5):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(n, 10, generator=g), torch.randint(0, 3, (n,), generator=g)


def new_model():
    torch.manual_seed(7)
    return Net()


def reference(size, steps_after):
    """One process: each uneven step's gradient is the sum of the mean gradients of the ranks
    with data, divided by the world size; then `steps_after` even steps with every rank."""
    model = new_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def step_with(step, ranks):
        opt.zero_grad()
        grads = [torch.zeros_like(p, dtype=torch.float64) for p in model.parameters()]
        for r in ranks:
            model.zero_grad()
            x, y = batch(step, r)
            F.cross_entropy(model(x), y).backward()
            for g, p in zip(grads, model.parameters()):
                g += p.grad.double()
        for g, p in zip(grads, model.parameters()):
            p.grad = (g / size).float()
        opt.step()

    for step in range(STEPS):
        step_with(step, [r for r in range(size) if has_data(r, step, size)])
    uneven = [p.detach().clone() for p in model.parameters()]
    for step in range(STEPS, STEPS + steps_after):
        step_with(step, list(range(size)))
    return uneven, model


def check_torch(size, rank):
    """braid.torch.join under DistributedOptimizer: the ranks with every batch end with the
    reference's parameters; after the join round (the joined rank takes the last joiner's
    parameters and optimizer state) training goes on in step on every rank."""
    model = new_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                   named_parameters=model.named_parameters())
    for step in range(steps_of(rank, size)):
        opt.zero_grad()
        x, y = batch(step, rank)
        F.cross_entropy(model(x), y).backward()
        opt.step()
        loss = hvd.allreduce(torch.tensor([float(step + rank)]), name="loss")
        want = sum(step + r for r in range(size) if has_data(r, step, size)) / size
        check_tensor(loss, torch.tensor([want]), f"torch averaged metric, step {step}")
    last = join_in_order(hvd.join, size, rank,
                         lambda a, n: hvd.allreduce(torch.from_numpy(a), name=n,
                                                    op=hvd.Sum).numpy())
    check(last == size - 2, f"torch join() returned {last!r}, expected {size - 2}")
    uneven, ref = reference(size, steps_after=2)
    if rank != size - 1:
        for (n, p), q in zip(model.named_parameters(), uneven):
            check_tensor(p.detach(), q, f"after {STEPS} uneven steps: {n}", tol=TOL)
    # The joined rank missed the last steps: it takes the last joiner's state (as Horovod's
    # examples do after join), then every rank trains on.
    hvd.broadcast_parameters(model.state_dict(), root_rank=last)
    hvd.broadcast_optimizer_state(opt, root_rank=last)
    for step in range(STEPS, STEPS + 2):
        opt.zero_grad()
        x, y = batch(step, rank)
        F.cross_entropy(model(x), y).backward()
        opt.step()
    for (n, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
        check_tensor(p.detach(), q.detach(), f"2 even steps after join(): {n}", tol=TOL)
    log(f"torch: DistributedOptimizer with rank {size - 1} {SHORT_BY} batches short matches "
        f"the reference, join() = {last}, and training continues")


def body():
    braid.init()
    size, rank = braid.size(), braid.rank()
    check(size >= 2, "run on 2 or more ranks")
    check_numpy(size, rank)
    check_torch(size, rank)
    braid.shutdown()


if __name__ == "__main__":
    main(body)
