"""Rank program: DistributedOptimizer when which parameters train changes during training
(layers frozen and unfrozen between steps), and sparse gradients that some ranks lack.

Every check compares with one process training the same model with the plain torch optimizer
on the union of every rank's batches, through the same schedule of freezing, unfreezing and
``zero_grad`` calls: braid must give what that process gives (a frozen parameter keeps
``grad`` None and does not move; a layer unfrozen later is averaged from then on). Run with
BRAID_NEGOTIATION_TIMEOUT_S=2, so a collective that one rank never submits fails in seconds
instead of hanging.
"""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import braid.torch as hvd  # noqa: E402
from _common import check, expect_raises, log, main  # noqa: E402
from _torch_common import check_tensor  # noqa: E402
from torch_optimizer import TOL, batch, make_opt, new_model  # noqa: E402


def _train(schedule, rank, size, distributed, opt_kind="sgd", set_to_none=True,
           frozen_at_wrap=(), **kw):
    """Trains new_model() through `schedule` (per step, a callable called with the model
    before the step's zero_grad, or a pair of callables: before and after it) and returns
    (model, {step: parameters after it}); the layers `frozen_at_wrap` are frozen before the
    optimizer is built; zero_grad runs under torch.no_grad(). Distributed: this rank's batch
    under a DistributedOptimizer; else one process on every rank's batch (the reference)."""
    model = new_model()
    for layer in frozen_at_wrap:
        getattr(model, layer).requires_grad_(False)
    opt = make_opt(opt_kind, model.parameters())
    if distributed:
        opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(), **kw)
    history = {}
    for step, action in enumerate(schedule):
        before, after = action if isinstance(action, tuple) else (action, _keep)
        before(model)
        with torch.no_grad():
            opt.zero_grad(set_to_none=set_to_none)
        after(model)
        if distributed:
            x, y = batch(step, rank)
        else:
            xs, ys = zip(*(batch(step, r) for r in range(size)))
            x, y = torch.cat(xs), torch.cat(ys)
        F.cross_entropy(model(x), y).backward()
        opt.step()
        history[step] = [p.detach().clone() for p in model.parameters()]
    return model, history


def _freeze(layer, frozen=True):
    def action(model):
        for p in getattr(model, layer).parameters():
            p.requires_grad_(not frozen)
    return action


def _keep(model):
    pass


def _same_as_reference(schedule, rank, size, what, **kw):
    model, history = _train(schedule, rank, size, True, **kw)
    ref_kw = {k: v for k, v in kw.items()
              if k in ("opt_kind", "set_to_none", "frozen_at_wrap")}
    ref, ref_history = _train(schedule, rank, size, False, **ref_kw)
    for (n, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
        check_tensor(p.detach(), q.detach(), f"{what}: {n}", tol=TOL)
    return model, history


def check_unfrozen_later_is_averaged(size, rank):
    """fc1 frozen when the optimizer is wrapped, unfrozen after 2 steps (before zero_grad;
    or after it, while fc2 is frozen before it): from then on it is averaged (it matches the
    reference; without averaging the ranks drift apart), and fc2 stays still."""
    swap = (_freeze("fc2"), _freeze("fc1", False))
    for view in (False, True):
        for third in (_freeze("fc1", False), swap):
            what = f"unfrozen later (bucket view={view}, fc2 frozen={third is swap})"
            model, history = _same_as_reference([_keep, _keep, third, _keep, _keep], rank,
                                                size, what, frozen_at_wrap=("fc1",),
                                                gradient_as_bucket_view=view)
            check(all(torch.equal(a, b) for a, b in zip(history[0][2:4], history[1][2:4])),
                  f"{what}: fc1 moved while frozen")
            check(not torch.equal(history[1][2], history[4][2]),
                  f"{what}: fc1 did not move once unfrozen")
            if third is swap:
                check(model.fc2.weight.grad is None and
                      all(torch.equal(history[1][i], history[4][i]) for i in (4, 5)),
                      f"{what}: fc2 moved while frozen, or has a gradient")
    log("a layer frozen at wrapping and unfrozen later is averaged from then on")


def check_frozen_mid_training_stays_still(size, rank):
    """fc1 trained 2 steps, then frozen: with zero_grad(set_to_none=True) its gradient stays
    None and momentum and weight decay do not move it (SGD, Adam; with a bucket view; under
    PowerSGD, whose error-feedback residual must not reach a frozen layer); with
    zero_grad() (zeros kept) it moves exactly as the reference's does."""
    schedule = [_keep, _keep, _freeze("fc1"), _keep, _keep]
    cases = [dict(), dict(opt_kind="adam"), dict(gradient_as_bucket_view=True),
             dict(groups=1), dict(compression="powersgd:rank=1"),
             dict(set_to_none=False)]
    for kw in cases:
        what = f"frozen mid-training {kw}"
        if "compression" in kw:
            model, history = _train(schedule, rank, size, True, **kw)
        else:
            model, history = _same_as_reference(schedule, rank, size, what, **kw)
        if kw.get("set_to_none", True):
            check(model.fc1.weight.grad is None and model.fc1.bias.grad is None,
                  f"{what}: a frozen layer's gradient is not None")
            still = all(torch.equal(history[1][i], history[4][i]) for i in (2, 3))
            check(still, f"{what}: the frozen layer moved")
            moved = not torch.equal(history[1][4], history[4][4])
            check(moved, f"{what}: fc2 (trained) did not move")
        everyone = hvd.allgather_object([p.detach() for p in model.parameters()])
        check(all(torch.equal(a, b) for a, b in zip(everyone[0], everyone[-1])),
              f"{what}: ranks differ")
    log("a layer frozen mid-training keeps grad None and does not move")


def check_unfrozen_layer_starts_fresh(size, rank):
    """Under "fp4:ef=1,start_step=1" (a float32 warm-up step, then 4 bits with error
    feedback), a layer frozen on every rank and unfrozen later starts as a new layer would:
    its first step after unfreezing is the warm-up again, the exact average, not a 4-bit
    step carrying a residual from before it was frozen."""
    model = new_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                   named_parameters=model.named_parameters(),
                                   compression="fp4:ef=1,start_step=1")
    for step in range(4):
        opt.zero_grad(set_to_none=True)
        model.fc1.requires_grad_(step not in (2,))
        x, y = batch(80 + step, rank)
        F.cross_entropy(model(x), y).backward()
        if step < 3:
            opt.step()
    opt.synchronize()  # step 3: fc1's first step since it was unfrozen
    ref = new_model()
    ref.load_state_dict(model.state_dict())
    xs, ys = zip(*(batch(83, r) for r in range(size)))
    F.cross_entropy(ref(torch.cat(xs)), torch.cat(ys)).backward()
    check_tensor(model.fc1.weight.grad, ref.fc1.weight.grad, "first gradient of fc1 after it "
                 "was unfrozen (warm-up: exact)", tol=TOL)
    worst = float((model.fc2.weight.grad - ref.fc2.weight.grad).abs().max())
    check(worst > 1e-4, f"fc2 (never frozen) was not compressed in 4 bits ({worst})")
    with opt.skip_synchronize():
        opt.step()
    log("a layer unfrozen under compression starts with fresh compression state")


def check_changes_within_a_step(size, rank):
    """Freezing after backward on every rank (the gradient exists: it is averaged and
    applied, as torch applies it) and unfreezing after forward (no gradient: none) match
    the reference; a layer no rank used keeps grad None."""
    model, ref = new_model(head=True), new_model(head=True)
    opt = hvd.DistributedOptimizer(make_opt("sgd", model.parameters()),
                                   named_parameters=model.named_parameters())
    ref_opt = make_opt("sgd", ref.parameters())
    xs, ys = zip(*(batch(60, r) for r in range(size)))
    for m, o, x, y in ((model, opt, *batch(60, rank)), (ref, ref_opt, torch.cat(xs),
                                                        torch.cat(ys))):
        o.zero_grad(set_to_none=True)
        m.fc1.requires_grad_(False)
        out = m(x)
        m.fc1.requires_grad_(True)   # unfrozen after forward: no gradient this step
        F.cross_entropy(out, y).backward()
        m.fc2.requires_grad_(False)  # frozen after backward: its gradient is applied
        o.step()
        m.fc2.requires_grad_(True)
    for (n, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
        check_tensor(p.detach(), q.detach(), f"changes within a step: {n}", tol=TOL)
        check((p.grad is None) == (q.grad is None),
              f"changes within a step: {n}.grad is {p.grad is None and 'None' or 'a tensor'}")
    check(model.unused_head.weight.grad is None, "a layer no rank used has a gradient")
    log("freezing after backward and unfreezing after forward match one process")


def check_ranks_that_disagree_fail_together(size, rank):
    """Rank 0 froze fc2, the others did not: every rank raises InvalidArgumentError naming
    the parameter and the ranks at once (no rank waits for the negotiation timeout), and
    training goes on once they agree again."""
    model = new_model()
    opt = hvd.DistributedOptimizer(make_opt("sgd", model.parameters()),
                                   named_parameters=model.named_parameters())
    others = list(range(1, size))
    for layer in ("fc2", "fc1"):
        opt.zero_grad(set_to_none=True)
        getattr(model, layer).requires_grad_(rank != 0)
        x, y = batch(70, rank)
        t0 = time.monotonic()
        expect_raises(hvd.InvalidArgumentError,
                      lambda: (F.cross_entropy(model(x), y).backward(), opt.step()),
                      f"{layer} frozen on rank 0 only",
                      contains=(f"'{layer}.weight'", "requires_grad=False on rank(s) [0]",
                                f"a gradient on rank(s) {others}"))
        took = time.monotonic() - t0
        check(took < 1.5, f"{layer} frozen on rank 0 only: the error took {took:.2f} s")
        getattr(model, layer).requires_grad_(True)
    opt.zero_grad()
    x, y = batch(71, rank)
    F.cross_entropy(model(x), y).backward()
    opt.step()
    everyone = hvd.allgather_object([p.grad for p in model.parameters()])
    check(all(torch.equal(a, b) for a, b in zip(everyone[0], everyone[-1])),
          "averaged gradients differ across ranks after the ranks agreed again")
    log("ranks that disagree on a frozen layer fail together, then train on")


class Tagger(nn.Module):
    """A sparse embedding that some ranks do not use in a step, and a dense layer."""

    def __init__(self, sparse=True):
        super().__init__()
        torch.manual_seed(5)
        self.emb = nn.Embedding(10, 3, sparse=sparse)
        self.fc = nn.Linear(4, 3)

    def forward(self, x, ids):
        out = self.fc(x)
        return out if ids is None else out + self.emb(ids).sum(0)


# ids[step][rank]: which rows rank `rank` looks up in `step` (None: the embedding is unused).
SPARSE_IDS = [[[1, 2], [2, 7], [0]], [[3, 3], None, [9]], [None, [4, 1], None],
              [None, None, None], [[5], [5, 6], None]]


def _sparse_loss(model, step, r):
    ids = SPARSE_IDS[step][r]
    x = torch.full((4,), float(step + r))
    return model(x, None if ids is None else torch.tensor(ids)).square().sum()


def _train_sparse(rank, size, distributed, set_to_none, sparse_as_dense=False):
    model = Tagger()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    if distributed:
        opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                       sparse_as_dense=sparse_as_dense)
    grads = []
    for step in range(len(SPARSE_IDS)):
        opt.zero_grad(set_to_none=set_to_none)
        if distributed:
            _sparse_loss(model, step, rank).backward()
        else:
            (sum(_sparse_loss(model, step, r) for r in range(size)) / size).backward()
        opt.step()
        g = model.emb.weight.grad
        grads.append(None if g is None else g.to_dense().clone())
    return model, grads


def check_sparse_unused_on_some_ranks(size, rank):
    """An nn.Embedding(sparse=True) that some ranks (or all) do not use in a step, with
    zero_grad(set_to_none=True) and with zero_grad(): the parameters equal one process's on
    the average of the ranks' losses, with and without sparse_as_dense, and a step where no
    rank used it leaves its gradient as one process leaves it."""
    for set_to_none in (True, False):
        ref, ref_grads = _train_sparse(rank, size, False, set_to_none)
        for dense in (False, True):
            what = f"sparse, set_to_none={set_to_none}, sparse_as_dense={dense}"
            model, grads = _train_sparse(rank, size, True, set_to_none, dense)
            for (n, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
                check_tensor(p.detach(), q.detach(), f"{what}: {n}", tol=TOL)
            if set_to_none:
                check(grads[3] is None, f"{what}: gradient of a step where no rank used it")
            for step, (g, want) in enumerate(zip(grads, ref_grads)):
                if g is not None and want is not None:
                    check_tensor(g, want, f"{what}: step {step} gradient", tol=TOL)
    log("sparse gradients that some ranks lack: same as one process")


def check_sparse_and_dense_disagree(size, rank):
    """Rank 0's embedding makes sparse gradients, the others' dense ones: every rank raises
    InvalidArgumentError naming the parameter and the ranks of each kind, at once."""
    weight = nn.Parameter(torch.ones(10, 3))
    opt = hvd.DistributedOptimizer(torch.optim.SGD([weight], lr=0.1),
                                   named_parameters=[("table", weight)])
    t0 = time.monotonic()
    F.embedding(torch.tensor([rank]), weight, sparse=(rank == 0)).sum().backward()
    expect_raises(hvd.InvalidArgumentError, opt.step, "sparse on rank 0, dense elsewhere",
                  contains=("'table'", "sparse gradient on rank(s) [0]",
                            f"dense one on rank(s) {list(range(1, size))}"))
    took = time.monotonic() - t0
    check(took < 1.5, f"sparse/dense disagreement: the error took {took:.2f} s")
    log("a sparse gradient on one rank and a dense one on another: an error on every rank")


def body():
    hvd.init()
    size, rank = hvd.size(), hvd.rank()
    only = os.environ.get("TORCH_TRAINABLE_CHECKS")  # comma-separated names, for debugging
    for fn in (check_unfrozen_later_is_averaged, check_frozen_mid_training_stays_still,
               check_unfrozen_layer_starts_fresh, check_changes_within_a_step,
               check_ranks_that_disagree_fail_together, check_sparse_unused_on_some_ranks,
               check_sparse_and_dense_disagree):
        if not only or fn.__name__ in only.split(","):
            fn(size, rank)
    hvd.shutdown()


if __name__ == "__main__":
    main(body)
