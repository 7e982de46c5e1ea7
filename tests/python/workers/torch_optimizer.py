"""Rank program: braid.torch.DistributedOptimizer.

The reference for every training check is one process, in this program, training the same
model with the plain torch optimizer on the union of every rank's batches (each rank can
build every rank's batch from (step, rank)): with equal batches per rank, the average over
ranks of the per-rank mean gradients is the mean gradient of the union.
"""

import gc
import os
import sys
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import braid  # noqa: E402
import braid.torch as hvd  # noqa: E402
from _common import check, expect_raises, log, main  # noqa: E402
from _torch_common import check_tensor  # noqa: E402

torch.set_num_threads(1)
TOL = (1e-4, 1e-5)


class Net(nn.Module):
    def __init__(self, head=False):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.fc1 = nn.Linear(4 * 4 * 4, 16)
        self.fc2 = nn.Linear(16, 3)
        if head:
            self.unused_head = nn.Linear(16, 3)  # used only where a test says so

    def forward(self, x, use_head=False):
        h = F.max_pool2d(F.relu(self.conv(x)), 2)
        h = F.relu(self.fc1(h.flatten(1)))
        out = self.fc2(h)
        return out + self.unused_head(h) if use_head else out


def batch(step, r, n=6):
    g = torch.Generator().manual_seed(1000 * step + r)
    return torch.randn(n, 1, 8, 8, generator=g), torch.randint(0, 3, (n,), generator=g)


def new_model(head=False):
    torch.manual_seed(42)
    return Net(head)


def make_opt(kind, params):
    if kind == "sgd":
        return torch.optim.SGD(params, lr=0.05, momentum=0.9, weight_decay=1e-3)
    return torch.optim.Adam(params, lr=0.01)


def train_distributed(steps, k, kind, size, rank, **kw):
    model = new_model()
    opt = hvd.DistributedOptimizer(make_opt(kind, model.parameters()),
                                   named_parameters=model.named_parameters(),
                                   backward_passes_per_step=k, **kw)
    for step in range(steps):
        opt.zero_grad()
        for j in range(k):
            x, y = batch(step * k + j, rank)
            F.cross_entropy(model(x), y).backward()
        opt.step()
    return model


def train_reference(steps, k, kind, size):
    """One process, the plain optimizer, every rank's batches (micro-batch j of all ranks
    together: its mean loss; k micro-batches accumulate, as backward_passes_per_step does)."""
    model = new_model()
    opt = make_opt(kind, model.parameters())
    for step in range(steps):
        opt.zero_grad()
        for j in range(k):
            xs, ys = zip(*(batch(step * k + j, r) for r in range(size)))
            F.cross_entropy(model(torch.cat(xs)), torch.cat(ys)).backward()
        opt.step()
    return model


def check_same(model, ref, what, tol=TOL):
    for (n, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
        check_tensor(p.detach(), q.detach(), f"{what}: {n}", tol=tol)


def check_equivalence(size, rank):
    for k, kind in ((1, "sgd"), (2, "sgd"), (2, "adam")):
        model = train_distributed(8, k, kind, size, rank)
        ref = train_reference(8, k, kind, size)
        check_same(model, ref, f"{kind}, backward_passes_per_step={k}")
        log(f"{kind} k={k}: parameters match one process on the union of the batches")
    # Compressed: fp16 close to the reference, counted under fp16.
    model = train_distributed(4, 1, "sgd", size, rank, compression=hvd.Compression.fp16)
    check_same(model, train_reference(4, 1, "sgd", size), "fp16", tol=(1e-2, 1e-3))
    methods = hvd.compression_stats()["tensors"]["grad.fc1.weight"]["method"].split(" + ")
    check("fp16" in methods, f"fp16 gradients not counted under fp16: {methods}")
    # Compression per layer (a dict: pattern -> spec, first match wins): fc1.weight (1024
    # elements) gets bf16 by its pattern, fc1.bias (16) by "*.bias"; conv.bias (4) and
    # fc2.bias (3) match "*.bias" but have fewer than $min_elements (10) elements, so they
    # go uncompressed, as everything "*" maps to none.
    plan = {"fc1.weight": "bf16", "*.bias": hvd.Compression.bf16, "*": "none",
            "$min_elements": 10}
    model = train_distributed(4, 1, "sgd", size, rank, compression=plan)
    check_same(model, train_reference(4, 1, "sgd", size), "per-layer plan", tol=(1e-2, 1e-3))
    tensors = hvd.compression_stats()["tensors"]
    check("bf16" in tensors["grad.fc1.weight"]["method"].split(" + "),
          f"fc1.weight not under bf16: {tensors['grad.fc1.weight']['method']}")
    check("bf16" in tensors["grad.fc1.bias"]["method"].split(" + "),
          f"fc1.bias not under bf16: {tensors['grad.fc1.bias']['method']}")
    for name in ("grad.fc2.bias", "grad.fc2.weight", "grad.conv.bias"):
        check("bf16" not in tensors[name]["method"].split(" + "),
              f"{name} compressed against the plan: {tensors[name]['method']}")
    # Each gradient counts in the group of the pattern that gave its method (4 steps each):
    # what braidctl status shows summed over ranks. The runs before had no plan (pattern "").
    groups = {(g["method"], g["pattern"]): g for g in hvd.compression_stats()["groups"]}
    want = {("bf16", "fc1.weight"): ["fc1.weight"], ("bf16", "*.bias"): ["fc1.bias"],
            ("none", "*.bias"): ["conv.bias", "fc2.bias"], ("none", "*"): ["conv.weight",
                                                                       "fc2.weight"]}
    for key, names in want.items():
        g = groups.get(key, {})
        check(g.get("tensors") == len(names) and g.get("reductions") == 4 * len(names),
              f"group {key}: {g}, expected {names} 4 times each")
    check(set(groups) - set(want) <= {("fp16", ""), ("none", "")},
          f"groups besides the plan's and the runs without one: {sorted(groups)}")
    for name in ("fc1.weight", "fc1.bias", "conv.weight"):
        pattern = tensors[f"grad.{name}"]["pattern"].split(" + ")
        check(next(k[1] for k, v in want.items() if name in v) in pattern,
              f"{name}'s pattern {pattern}")
    # A Horovod-style compressor object, gradient_predivide_factor, op=Sum.
    model = train_distributed(4, 1, "sgd", size, rank, compression=_HalfCompressor,
                              gradient_predivide_factor=2.0)
    check_same(model, train_reference(4, 1, "sgd", size), "framework compressor + predivide",
               tol=(1e-2, 1e-3))
    model = new_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.0),
                                   named_parameters=model.named_parameters(), op=hvd.Sum)
    x, y = batch(0, rank)
    F.cross_entropy(model(x), y).backward()
    opt.synchronize()
    ref = new_model()
    for r in range(size):
        xr, yr = batch(0, r)
        F.cross_entropy(ref(xr), yr).backward()
    check_tensor(model.fc1.weight.grad, ref.fc1.weight.grad, "op=Sum gradient", tol=TOL)
    with opt.skip_synchronize():
        opt.step()


class _HalfCompressor:
    """Horovod's compressor interface: cast to float16 for the wire and back."""

    @staticmethod
    def compress(tensor):
        return tensor.half(), tensor.dtype

    @staticmethod
    def decompress(tensor, ctx):
        return tensor.to(ctx)


def check_unused_and_synchronize(size, rank):
    # Only rank 0 uses the extra head: the others send zeros for it in step() and nobody hangs.
    model = new_model(head=True)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    x, y = batch(7, rank)
    F.cross_entropy(model(x, use_head=(rank == 0)), y).backward()
    check((model.unused_head.weight.grad is None) == (rank != 0), "unexpected unused grad")
    opt.synchronize()
    ref = new_model(head=True)
    x0, y0 = batch(7, 0)
    F.cross_entropy(ref(x0, use_head=True), y0).backward()
    check_tensor(model.unused_head.weight.grad, ref.unused_head.weight.grad / size,
                 "gradient of a layer only rank 0 used", tol=TOL)
    # synchronize() + skip_synchronize(): clip the averaged gradients, then step without a
    # second all-reduce.
    before = hvd.compression_stats()["tensors"]["grad.fc1.weight"]["reductions"]
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
    with opt.skip_synchronize():
        opt.step()
    after = hvd.compression_stats()["tensors"]["grad.fc1.weight"]["reductions"]
    check(after == before, f"skip_synchronize: step() all-reduced again ({before} -> {after})")
    params = [p.detach().clone() for p in model.parameters()]
    gathered = hvd.allgather_object(params)
    check(all(torch.equal(a, b) for a, b in zip(params, gathered[0])),
          "ranks' parameters differ after a step with an unused layer")


def check_sparse(size, rank):
    results = []
    for dense in (False, True):
        torch.manual_seed(3)
        emb = nn.Embedding(10, 4, sparse=True)
        opt = hvd.DistributedOptimizer(torch.optim.SGD(emb.parameters(), lr=0.5),
                                       named_parameters=[(f"emb{int(dense)}", emb.weight)],
                                       sparse_as_dense=dense)
        ids = torch.tensor([rank, rank + 1, 7])
        emb(ids).sum().backward()
        opt.step()
        results.append(emb.weight.detach().clone())
    torch.manual_seed(3)
    ref = nn.Embedding(10, 4)
    for r in range(size):
        (ref(torch.tensor([r, r + 1, 7])).sum() / size).backward()
    with torch.no_grad():
        ref.weight -= 0.5 * ref.weight.grad
    check_tensor(results[0], ref.weight.detach(), "sparse gradient (all-gather)", tol=TOL)
    check_tensor(results[1], ref.weight.detach(), "sparse_as_dense", tol=TOL)


def check_rewrap(size, rank):
    """A model wrapped again after its first DistributedOptimizer was dropped: the old hooks
    are inert at once, without waiting for the garbage collector (no second all-reduce of the
    same names, no stale optimizer stepping)."""
    gc.disable()  # no collection may rescue broken code: refcounts alone must do it
    try:
        _rewrap(size, rank)
    finally:
        gc.enable()


def _rewrap(size, rank):
    model = new_model()
    first = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                     named_parameters=model.named_parameters())
    del first
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    x, y = batch(11, rank)
    F.cross_entropy(model(x), y).backward()
    opt.synchronize()
    ref = new_model()
    xs, ys = zip(*(batch(11, r) for r in range(size)))
    F.cross_entropy(ref(torch.cat(xs)), torch.cat(ys)).backward()
    check_tensor(model.fc1.weight.grad, ref.fc1.weight.grad, "gradient after re-wrapping",
                 tol=TOL)
    with opt.skip_synchronize():
        opt.step()


def check_misuse(size, rank):
    E, P = hvd.InvalidArgumentError, hvd.FailedPreconditionError
    model = new_model()
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    named = list(model.named_parameters())
    dup = named[:1] + [(named[0][0], p) for _, p in named[1:]]
    expect_raises(E, lambda: hvd.DistributedOptimizer(sgd, named_parameters=dup),
                  "duplicate names", contains=("unique", "conv.weight"))
    expect_raises(E, lambda: hvd.DistributedOptimizer(sgd, named_parameters=named[:2]),
                  "unnamed parameters", contains=("not in named_parameters",))
    expect_raises(E, lambda: hvd.DistributedOptimizer(sgd, compression={"fc*": "fp5"}),
                  "a plan with a bad spec", contains=("key 'fc*'", "unknown method 'fp5'"))
    expect_raises(E, lambda: hvd.DistributedOptimizer(sgd, compression={"*": 4}),
                  "a plan with a number for a spec", contains=("key '*'", "must be a string"))
    expect_raises(E, lambda: hvd.DistributedOptimizer(sgd, op=hvd.Adasum), "Adasum",
                  contains=("Adasum", "not implemented"))
    expect_raises(E, lambda: hvd.DistributedOptimizer(sgd, backward_passes_per_step=0),
                  "k=0", contains=("backward_passes_per_step",))
    expect_raises(E, lambda: hvd.DistributedOptimizer(sgd, op=hvd.Sum,
                                                      gradient_predivide_factor=2.0),
                  "predivide with Sum", contains=("gradient_predivide_factor",))
    opt = hvd.DistributedOptimizer(sgd, named_parameters=named)
    x, y = batch(1, rank)
    F.cross_entropy(model(x), y).backward()
    expect_raises(P, opt.zero_grad, "zero_grad between backward and step",
                  contains=("zero_grad()", "before step()", "call synchronize() first"))
    # A second backward pass with backward_passes_per_step=1 fails from backward() itself.
    expect_raises(P, lambda: F.cross_entropy(model(x), y).backward(), "too many passes",
                  contains=("backward_passes_per_step=1", "computed 2 times"))
    opt.step()  # the job goes on: every rank completes the step
    opt.zero_grad()
    F.cross_entropy(model(x), y).backward()
    opt.step()
    # The recovery the error names: synchronize(), then zero_grad() drops the pass.
    F.cross_entropy(model(x), y).backward()
    expect_raises(P, opt.zero_grad, "zero_grad between backward and step, again")
    opt.synchronize()
    opt.zero_grad()
    check(all(p.grad is None or not p.grad.any() for p in model.parameters()),
          "zero_grad() after synchronize() cleared the gradients")
    # step() after synchronize() warns that it reduces the same gradients twice, unless a
    # backward pass came in between (a skipped step): then it reduces the new ones once.
    for new_pass, warns in ((True, False), (False, True)):
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.synchronize()
        # Counted before the new pass: its hooks start its all-reduces during backward().
        before = hvd.compression_stats()["tensors"]["grad.fc1.weight"]["reductions"]
        if new_pass:
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            opt.step()
        after = hvd.compression_stats()["tensors"]["grad.fc1.weight"]["reductions"]
        warned = any("all-reduced twice" in str(w.message) for w in caught)
        check(warned == warns, f"step() after synchronize() (new backward pass: {new_pass}) "
              f"warned {warned}")
        check(after == before + 1, f"step() after synchronize() (new backward pass: "
              f"{new_pass}) reduced {after - before} times")
    log("misuse errors raised; training continued")


def _train_bits(rank, steps, **kw):
    """Trains new_model() `steps` SGD steps; returns its parameters' bits (int32 views) and
    the fusion counters the steps added on this rank."""
    model = new_model()
    opt = hvd.DistributedOptimizer(make_opt("sgd", model.parameters()),
                                   named_parameters=model.named_parameters(), **kw)
    before = hvd.fusion_stats()
    for step in range(steps):
        opt.zero_grad()
        x, y = batch(step, rank)
        F.cross_entropy(model(x), y).backward()
        opt.step()
    after = hvd.fusion_stats()
    bits = [p.detach().clone().view(torch.int32) for p in model.parameters()]
    return model, opt, bits, {k: after[k] - before[k] for k in after}


def check_bucket_view(size, rank):
    """gradient_as_bucket_view=True gives the same parameters bit for bit as without it. With
    groups=1 each step's gradients travel as one bucket: without the option it is packed
    every step; with it the gradients lie in a flat buffer, in that bucket's order from the
    second step on (the layout follows the first step's order), so only the first step packs;
    under fp16 too (it takes float32 gradients as they are)."""
    steps = 4
    for groups, compression in ((1, None), (None, None), (1, "fp16")):
        kw = dict(groups=groups, compression=compression)
        _, _, off_bits, off = _train_bits(rank, steps, **kw)
        model, opt, on_bits, on = _train_bits(rank, steps, gradient_as_bucket_view=True, **kw)
        same = all(torch.equal(a, b) for a, b in zip(off_bits, on_bits))
        check(same, f"groups={groups}, compression={compression}: parameters differ with "
              "gradient_as_bucket_view")
        flat = opt._flat[0]
        lo, hi = flat.data_ptr(), flat.data_ptr() + flat.numel() * flat.element_size()
        check(all(lo <= p.grad.data_ptr() < hi for p in model.parameters()),
              "every gradient is a view into the flat buffer")
        if groups == 1:  # fp16 takes float32 as it is: nothing converted, so the same counts
            figures = (off["packed_bytes"], on["packed_bytes"])
            total = sum(p.numel() * p.element_size() for p in model.parameters())
            # Each step also all-reduces its agreement on what it reduces, a lone tensor of
            # 4 bytes per parameter (reduced in place).
            agreement = steps * 4 * len(list(model.parameters()))
            check(off["packed_bytes"] == steps * total,
                  f"without views every step packs {total} bytes: {off}")
            check(on["packed_bytes"] == total and
                  on["in_place_bytes"] == (steps - 1) * total + agreement,
                  f"with views only the first step packs {total} bytes: {on}")
    # set_to_none keeps the views; a replaced gradient is copied back into its view.
    opt.zero_grad(set_to_none=True)
    check(all(p.grad is not None and lo <= p.grad.data_ptr() < hi and not p.grad.any()
              for p in model.parameters()), "zero_grad(set_to_none=True) zeroes the views")
    model.fc2.bias.grad = None  # backward allocates a new tensor for it
    x, y = batch(0, rank)
    F.cross_entropy(model(x), y).backward()
    opt.step()
    check(lo <= model.fc2.bias.grad.data_ptr() < hi, "a replaced gradient returns to its view")
    log(f"gradient_as_bucket_view: same bits; packed bytes {figures[0]} -> {figures[1]}")


def _replace_grads(model, what):
    """Replaces every parameter's .grad with a new tensor of the same values (the user
    code of the pattern: ``p.grad = p.grad * 1.0``, ``p.grad = p.grad / k``)."""
    for p in model.parameters():
        old = p.grad
        p.grad = p.grad * 1.0 if what == "copy" else p.grad.clone()
        check(p.grad is not old, "the gradient was replaced")


def check_replaced_grad(size, rank):
    """``p.grad`` replaced between backward() and step(): step() still uses the average over
    ranks (the result lands in the replacement, or with gradient_as_bucket_view in the view
    p.grad returns to), for backward_passes_per_step 1 and 2; a replacement of another
    layout raises InvalidArgumentError naming the parameter on every rank, and the job goes
    on."""
    for k, view in ((1, False), (2, False), (1, True), (2, True)):
        model = new_model()
        opt = hvd.DistributedOptimizer(make_opt("sgd", model.parameters()),
                                       named_parameters=model.named_parameters(),
                                       backward_passes_per_step=k,
                                       gradient_as_bucket_view=view)
        for step in range(3):
            opt.zero_grad()
            for j in range(k):
                x, y = batch(step * k + j, rank)
                F.cross_entropy(model(x), y).backward()
                if j == k - 1:
                    _replace_grads(model, "copy" if step % 2 else "clone")
            opt.step()
        check_same(model, train_reference(3, k, "sgd", size),
                   f"replaced .grad, backward_passes_per_step={k}, bucket view={view}")
        # The replacement holds the average after synchronize().
        opt.zero_grad()
        x, y = batch(50, rank)
        for _ in range(k):  # the same batch k times: the reference takes it k times too
            F.cross_entropy(model(x), y).backward()
        ref = [t.detach().clone() for t in model.parameters()]
        kept = model.fc1.weight.grad = model.fc1.weight.grad * 1.0
        opt.synchronize()
        refm = new_model()
        refm.load_state_dict({n: t for n, t in zip(dict(model.named_parameters()), ref)})
        xs, ys = zip(*(batch(50, r) for r in range(size)))
        for _ in range(k):
            F.cross_entropy(refm(torch.cat(xs)), torch.cat(ys)).backward()
        check_tensor(model.fc1.weight.grad, refm.fc1.weight.grad, "replaced grad after "
                     "synchronize()", tol=TOL)
        if not view:
            check(model.fc1.weight.grad is kept, "the replacement stays p.grad")
        with opt.skip_synchronize():
            opt.step()
        # A replacement of another layout (torch itself refuses another shape, dtype or
        # device): a clear error on every rank, then training goes on.
        opt.zero_grad()
        for _ in range(k):  # the all-reduce starts in the last pass, before the replacement
            F.cross_entropy(model(x), y).backward()
        model.fc2.bias.grad = model.fc2.bias.grad.to_sparse()
        expect_raises(hvd.InvalidArgumentError, opt.step, "replaced grad of another layout",
                      contains=("'fc2.bias'", "replaced", "sparse"))
        model.fc2.bias.grad = None
        opt.zero_grad()
        for _ in range(k):
            F.cross_entropy(model(x), y).backward()
        opt.step()
    log("replaced .grad: averaged; a sparse replacement is an error naming the parameter")


def _train_gan_like(rank, names, steps=4):
    """Two models trained in turn by two DistributedOptimizers under scalecomp (error
    feedback kept per tensor name by the runtime); `names(model_index, name)` names them."""
    models, opts = [], []
    for i in range(2):
        torch.manual_seed(42 + i)
        m = Net()
        models.append(m)
        opts.append(hvd.DistributedOptimizer(
            torch.optim.SGD(m.parameters(), lr=0.05),
            named_parameters=[(names(i, n), p) for n, p in m.named_parameters()],
            compression="scalecomp:ratio=4"))
    for step in range(steps):
        for i, (m, opt) in enumerate(zip(models, opts)):
            opt.zero_grad()
            x, y = batch(100 * i + step, rank)
            F.cross_entropy(m(x), y).backward()
            opt.step()
    return models, opts


def check_same_names(size, rank):
    """Two live DistributedOptimizers whose parameters have the same names (a GAN's G and D)
    train exactly as with distinct names: the second one's all-reduces get a prefix, so the
    runtime's per-name compression state (error feedback) is not shared. Fresh names per
    run, so no run sees another's state."""
    same, opts = _train_gan_like(rank, lambda i, n: f"same.{n}")
    distinct, _ = _train_gan_like(rank, lambda i, n: f"distinct{i}.{n}")
    for a, b in zip(same, distinct):
        check_same(a, b, "same names vs distinct names under scalecomp", tol=(0, 0))
    tensors = hvd.compression_stats()["tensors"]
    check("grad.same.fc1.weight" in tensors and "grad.opt1/same.fc1.weight" in tensors,
          f"collective names: {sorted(t for t in tensors if 'same.' in t)}")
    del opts
    # Once the others are gone, a new optimizer of the same names keeps its plain names.
    model = new_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=[(f"same.{n}", p)
                                                     for n, p in model.named_parameters()])
    check(getattr(opt, "_prefix", None) == "", "a lone optimizer keeps its plain names")
    log("two optimizers with the same parameter names: same results as distinct names")


def _first_grads(rank, spec, step):
    """A new model and DistributedOptimizer named "drop.<name>" under `spec`; one backward on
    batch `step`, synchronized. Returns (optimizer, model, {name: averaged gradient})."""
    model = new_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=[(f"drop.{n}", p)
                                                     for n, p in model.named_parameters()],
                                   compression=spec)
    x, y = batch(step, rank)
    F.cross_entropy(model(x), y).backward()
    opt.synchronize()
    return opt, model, {n: p.grad.clone() for n, p in model.named_parameters()}


def check_fresh_state_after_drop(size, rank):
    """A new DistributedOptimizer taking the names of a dropped one starts with fresh
    compression state, as in a new job: under "fp4:ef=1,start_step=1" its first step is the
    warm-up, a float32 all-reduce equal to the exact average, not a 4-bit step carrying the
    dropped optimizer's residuals. A state restored by load_compression_state() is kept."""
    spec = "fp4:ef=1,start_step=1"
    ref = new_model()
    xs, ys = zip(*(batch(500, r) for r in range(size)))
    F.cross_entropy(ref(torch.cat(xs)), torch.cat(ys)).backward()
    exact = {n: p.grad for n, p in ref.named_parameters()}

    def trained_and_dropped():
        opt, model, _ = _first_grads(rank, spec, 400)
        with opt.skip_synchronize():
            opt.step()
        for step in (401, 402):
            opt.zero_grad()
            x, y = batch(step, rank)
            F.cross_entropy(model(x), y).backward()
            opt.step()
        del opt, model

    trained_and_dropped()
    opt, _, grads = _first_grads(rank, spec, 500)
    check(opt._prefix == "", f"prefix {opt._prefix!r}: the dropped optimizer's names are free")
    for n, g in grads.items():
        check_tensor(g, exact[n], f"first step after a dropped optimizer's names: {n}",
                     tol=TOL)
    with opt.skip_synchronize():
        opt.step()
    del opt
    # Restoring a state (resuming from a checkpoint) keeps it for the new optimizer.
    trained_and_dropped()
    braid.load_compression_state(braid.compression_state())
    opt, _, grads = _first_grads(rank, spec, 500)
    worst = max(float((g - exact[n]).abs().max()) for n, g in grads.items())
    check(worst > 1e-3, f"after load_compression_state the step was not compressed ({worst})")
    with opt.skip_synchronize():
        opt.step()
    log("a dropped optimizer's names start fresh; a loaded state is kept")


def check_add_param_group(size, rank):
    """Parameters added by add_param_group() are averaged like the others (named from the
    construction's named_parameters, or "param.<group>.<i>" without names; with and
    without gradient_as_bucket_view), and a group without lr takes the wrapped optimizer's."""
    for named, view, lr in ((False, False, 0.05), (True, True, 0.05), (True, False, None)):
        model = new_model()
        first = list(model.conv.parameters()) + list(model.fc1.parameters())
        opt = hvd.DistributedOptimizer(
            make_opt("sgd", first),
            named_parameters=model.named_parameters() if named else None,
            gradient_as_bucket_view=view)
        group = {"params": list(model.fc2.parameters())}
        if lr is not None:
            group["lr"] = lr
        opt.add_param_group(group)
        check(opt.param_groups[1]["lr"] == 0.05 and opt.param_groups[1]["momentum"] == 0.9,
              f"added group's options: {opt.param_groups[1]}")
        for step in range(3):
            opt.zero_grad()
            x, y = batch(step, rank)
            F.cross_entropy(model(x), y).backward()
            opt.step()
        check_same(model, train_reference(3, 1, "sgd", size),
                   f"add_param_group (named={named}, bucket view={view}, lr={lr})")
        name = "grad.fc2.weight" if named else "grad.param.1.0"
        check(name in hvd.compression_stats()["tensors"], f"{name} was all-reduced")
    # A new parameter the construction's names do not cover: an error, or names given.
    model = new_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.fc1.parameters(), lr=0.1),
                                   named_parameters=model.fc1.named_parameters())
    extra = nn.Linear(2, 2)
    expect_raises(hvd.InvalidArgumentError, lambda: opt.add_param_group(
        {"params": extra.parameters()}), "unnamed added parameter", contains=("no name",))
    expect_raises(hvd.InvalidArgumentError, lambda: opt.add_param_group(
        {"params": [extra.weight], "named_parameters": [("weight", extra.weight)]}),
        "added name in use", contains=("weight",))
    check(len(opt.param_groups) == 1, "a refused group is not added")
    opt.add_param_group({"params": extra.parameters(),
                         "named_parameters": [("extra." + n, p)
                                              for n, p in extra.named_parameters()]})
    check("named_parameters" not in opt.param_groups[1], "named_parameters left in the group")
    log("add_param_group: new parameters averaged; lr from the wrapped optimizer")


class _Gate(torch.autograd.Function):
    """The identity; its backward, which autograd runs once the layers after it have their
    gradients (their accumulators run first) and before the layers before it get theirs,
    calls ``wait()`` first."""

    @staticmethod
    def forward(ctx, x, wait):
        ctx.wait = wait
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        ctx.wait()
        return g, None


def check_first_bucket_overlaps_backward(size, rank):
    """Overlap: the first bucket of a DistributedOptimizer step (the last layer's gradients,
    which backward produces first) is all-reduced while backward is still running. A gate
    between fc1 and fc2 holds backward there until this rank's counters show fc2's
    all-reduce done (its reduction counted, its bytes sent): event order, no timing. A
    runtime that held the gradients back until backward ended would keep the gate shut,
    and the check fails at the gate's deadline (a liveness bound only). The step's result
    is still the one-process reference's."""
    model, ref = new_model(), new_model()
    opt = hvd.DistributedOptimizer(make_opt("sgd", model.parameters()),
                                   named_parameters=model.named_parameters())
    ref_opt = make_opt("sgd", ref.parameters())
    seen = []

    def counts():
        t = braid.compression_stats()["tensors"].get("grad.fc2.weight", {})
        return t.get("reductions", 0), t.get("transport_bytes", 0)

    for step in range(3):
        before = counts()

        def wait():
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                now = counts()
                if now[0] > before[0] and now[1] > before[1]:
                    seen.append(step)
                    return
                time.sleep(0.001)

        def forward(net, x, gated):
            h = F.max_pool2d(F.relu(net.conv(x)), 2)
            h = F.relu(net.fc1(h.flatten(1)))
            return net.fc2(_Gate.apply(h, wait) if gated else h)

        opt.zero_grad()
        x, y = batch(step, rank)
        F.cross_entropy(forward(model, x, True), y).backward()
        opt.step()
        ref_opt.zero_grad()
        xs, ys = zip(*(batch(step, r) for r in range(size)))
        F.cross_entropy(forward(ref, torch.cat(xs), False), torch.cat(ys)).backward()
        ref_opt.step()
    check(seen == [0, 1, 2],
          f"rank {rank}: fc2's all-reduce finished before backward ended in steps {seen} of "
          "[0, 1, 2]")
    check_same(model, ref, "overlap")
    log("first bucket: all-reduced while backward runs")


def body():
    hvd.init()
    size, rank = hvd.size(), hvd.rank()
    only = os.environ.get("TORCH_OPTIMIZER_CHECKS")  # comma-separated names, for debugging
    for fn in (check_equivalence, check_unused_and_synchronize, check_sparse, check_rewrap,
               check_misuse, check_bucket_view, check_replaced_grad, check_same_names,
               check_add_param_group, check_fresh_state_after_drop,
               check_first_bucket_overlaps_backward):
        if not only or fn.__name__ in only.split(","):
            fn(size, rank)
    hvd.shutdown()


if __name__ == "__main__":
    main(body)
