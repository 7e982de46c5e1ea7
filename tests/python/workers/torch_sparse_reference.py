"""Rank program: braid's sparsifiers on torch tensors against a straightforward PyTorch
implementation of the same algorithm, and DistributedOptimizer's groups.

ScaleComp (Chen et al., NeurIPS 2020; compression/sparse.h), written here in plain torch from
the paper's equations, with every rank's memory simulated in this process (every rank can
build every rank's gradients from (case, step, rank)):

    p_r = g_r + m_r;  leader l = step mod n;  I = top-k of |p_l| (k = ceil(N / ratio), over
    the concatenated tensors, or per tensor with granularity=tensor);
    result = zeros, with result[I] = (sum_r p_r[I]) / n;  m_r = p_r with p_r[I] = 0.

Checks, for 6 steps each (memories and the rotating leader included):
- grouped_allreduce_ with scalecomp (granularity=bucket): a group travels as one bucket, so
  the selection covers all its tensors; the result equals the reference (the same non-zero
  positions; the values within float32 rounding: exactly with 2 ranks);
- the same with granularity=tensor;
- DistributedOptimizer with scalecomp: the gradients start as one group by default (the
  optimizer's groups), so the selection covers the whole model: every p.grad equals the
  reference over all the parameters' gradients, step after step; and groups=0 or
  granularity=tensor make no such group;
- groups= for uncompressed training (an integer, lists of parameters) gives the parameters
  one process gets on the union of the batches; bad groups raise InvalidArgumentError.
"""

import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import braid.torch as hvd  # noqa: E402
from _common import check, expect_raises, log, main  # noqa: E402
from _torch_common import check_tensor  # noqa: E402

torch.set_num_threads(1)
RATIO = 50
# Gradient-like shapes with different scales, as a CNN's layers have (the selection over a
# bucket must weigh them against each other).
SHAPES = [((8, 1, 3, 3), 3.0), ((8,), 5.0), ((16, 8, 3, 3), 0.5), ((16,), 1.0),
          ((10, 144), 0.2), ((10,), 2.0)]


def grads(case, step, r):
    g = torch.Generator().manual_seed(100000 * case + 100 * step + r)
    return [scale * torch.randn(shape, generator=g) for shape, scale in SHAPES]


class ScaleCompReference:
    """Every rank's memory and the algorithm above, in float32 torch."""

    def __init__(self, size, counts, granularity):
        self.n = size
        self.offsets = [0]
        for c in counts:
            self.offsets.append(self.offsets[-1] + c)
        self.granularity = granularity
        self.memory = [torch.zeros(self.offsets[-1]) for _ in range(size)]

    def step(self, step, flat_grads):
        p = [flat_grads[r] + self.memory[r] for r in range(self.n)]
        leader = step % self.n
        if self.granularity == "bucket":
            segments = [(0, self.offsets[-1])]
        else:
            segments = list(zip(self.offsets[:-1], self.offsets[1:]))
        picked = []
        for a, b in segments:
            k = min(b - a, max(1, math.ceil((b - a) / RATIO)))
            picked.append(torch.topk(p[leader][a:b].abs(), k).indices + a)
        idx = torch.sort(torch.cat(picked)).values
        total = p[0][idx].clone()
        for r in range(1, self.n):
            total += p[r][idx]
        out = torch.zeros(self.offsets[-1])
        out[idx] = total / self.n
        for r in range(self.n):
            self.memory[r] = p[r].clone()
            self.memory[r][idx] = 0.0
        return out, idx

    def split(self, flat, shapes):
        return [flat[a:b].view(s) for (a, b), s in
                zip(zip(self.offsets[:-1], self.offsets[1:]), shapes)]


def check_result(got, want, idx, size, what):
    """The same non-zero positions as the reference, and its values (bit for bit with two
    ranks, whose sum has one order; within float32 rounding with more)."""
    nonzero = torch.nonzero(got).flatten()
    check(torch.equal(nonzero, idx[want[idx] != 0]),
          f"{what}: {nonzero.numel()} non-zero elements at other positions than the "
          f"reference's {idx.numel()} selected ones")
    if size == 2:
        check(torch.equal(got, want), f"{what}: differs from the reference "
              f"(max |diff| {float((got - want).abs().max()):.3g})")
    else:
        check_tensor(got, want, what, tol=(1e-6, 1e-7))


def check_grouped(size, rank, granularity, case):
    spec = f"scalecomp:ratio={RATIO}" + (",granularity=tensor" if granularity == "tensor" else "")
    counts = [math.prod(s) for s, _ in SHAPES]
    ref = ScaleCompReference(size, counts, granularity)
    for step in range(6):
        mine = grads(case, step, rank)
        got = hvd.grouped_allreduce_([t.clone() for t in mine], name=f"sc{case}", compression=spec)
        want, idx = ref.step(step, [torch.cat([t.flatten() for t in grads(case, step, r)])
                                    for r in range(size)])
        check_result(torch.cat([t.flatten() for t in got]), want, idx, size,
                     f"grouped {spec}, step {step}")
    log(f"grouped_allreduce_ with {spec}: 6 steps equal the torch reference")


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.fc1 = nn.Linear(4 * 4 * 4, 16)
        self.fc2 = nn.Linear(16, 3)

    def forward(self, x):
        h = F.max_pool2d(F.relu(self.conv(x)), 2)
        return self.fc2(F.relu(self.fc1(h.flatten(1))))


def batch(step, r, n=6):
    g = torch.Generator().manual_seed(1000 * step + r)
    return torch.randn(n, 1, 8, 8, generator=g), torch.randint(0, 3, (n,), generator=g)


def local_grads(model, step, r):
    model.zero_grad()
    x, y = batch(step, r)
    F.cross_entropy(model(x), y).backward()
    return torch.cat([p.grad.flatten() for p in model.parameters()])


def check_optimizer_selects_over_the_model(size, rank):
    """DistributedOptimizer + scalecomp: one group of every gradient by default, so p.grad
    is the reference's selection over the concatenation of all of them."""
    torch.manual_seed(7)
    model = Net()
    twin = Net()  # computes every rank's local gradients at the same weights
    twin.load_state_dict(model.state_dict())
    params = list(model.parameters())
    opt = hvd.DistributedOptimizer(torch.optim.SGD(params, lr=0.1),
                                   named_parameters=model.named_parameters(),
                                   compression=f"scalecomp:ratio={RATIO}")
    ref = ScaleCompReference(size, [p.numel() for p in params], "bucket")
    for step in range(6):
        opt.zero_grad()
        x, y = batch(step, rank)
        F.cross_entropy(model(x), y).backward()
        opt.synchronize()
        want, idx = ref.step(step, [local_grads(twin, step, r) for r in range(size)])
        got = torch.cat([p.grad.flatten() for p in params])
        check_result(got, want, idx, size, f"DistributedOptimizer scalecomp, step {step}")
        with opt.skip_synchronize():
            opt.step()
        twin.load_state_dict(model.state_dict())
    groups = {id(g) for g in opt._group_of.values()}
    check(len(groups) == 1 and len(opt._group_of) == len(params),
          f"scalecomp: expected one group of all {len(params)} parameters")
    for kw in ({"compression": f"scalecomp:ratio={RATIO}", "groups": 0},
               {"compression": "scalecomp:granularity=tensor"}, {"compression": "fp16"},
               {"compression": "powersgd:rank=2"}):
        o = hvd.DistributedOptimizer(torch.optim.SGD(Net().parameters(), lr=0.1), **kw)
        check(not o._group_of, f"{kw}: no groups expected, got {len(o._group_of)} grouped")
    log("DistributedOptimizer with scalecomp: 6 steps equal the torch reference over the "
        "whole model (one group)")


def train(size, rank, groups, steps=6):
    """SGD with momentum through DistributedOptimizer(groups=...); `groups` may be a function
    of the model (for lists of its parameters)."""
    torch.manual_seed(42)
    model = Net()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                   named_parameters=model.named_parameters(),
                                   groups=groups(model) if callable(groups) else groups)
    for step in range(steps):
        opt.zero_grad()
        x, y = batch(step, rank)
        F.cross_entropy(model(x), y).backward()
        opt.step()
    return model, opt


def train_reference(size, steps=6):
    torch.manual_seed(42)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for step in range(steps):
        opt.zero_grad()
        xs, ys = zip(*(batch(step, r) for r in range(size)))
        F.cross_entropy(model(torch.cat(xs)), torch.cat(ys)).backward()
        opt.step()
    return model


def check_groups(size, rank):
    ref = train_reference(size)
    lists = lambda m: [[m.fc1.weight, m.conv.weight], [m.fc2.bias, m.fc1.bias]]  # noqa: E731
    for groups, grouped in ((1, 6), (2, 6), (100, 0), (lists, 4)):
        model, opt = train(size, rank, groups)
        what = "lists" if callable(groups) else groups
        check(len(opt._group_of) == grouped,
              f"groups={what}: {grouped} grouped parameters expected, got {len(opt._group_of)}")
        for (n, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
            check_tensor(p.detach(), q.detach(), f"groups={what}: {n}", tol=(1e-4, 1e-5))
    probe = Net()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(probe.parameters(), lr=0.1), groups=3)
    sizes = sorted(len(g) for g in {id(g): g for g in opt._group_of.values()}.values())
    check(sizes == [2, 2, 2], f"groups=3 over 6 parameters: group sizes {sizes}")
    sgd = torch.optim.SGD(probe.parameters(), lr=0.1)
    for bad, text in ((-1, "groups must be >= 0"), ("x", "groups must be None"),
                      ([[probe.fc1.weight], [probe.fc1.weight]], "in more than one group"),
                      ([[torch.zeros(3)]], "not a parameter")):
        expect_raises(hvd.InvalidArgumentError,
                      lambda: hvd.DistributedOptimizer(sgd, groups=bad),
                      f"groups={bad!r}", contains=(text,))
    log("groups: integer and list groups train as one process on the union of the batches")


def body():
    hvd.init()
    size, rank = hvd.size(), hvd.rank()
    check_grouped(size, rank, "bucket", 1)
    check_grouped(size, rank, "tensor", 2)
    check_optimizer_selects_over_the_model(size, rank)
    check_groups(size, rank)
    hvd.shutdown()


if __name__ == "__main__":
    main(body)
