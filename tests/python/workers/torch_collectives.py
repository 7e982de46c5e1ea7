"""Rank program: every braid.torch collective against a reference built in the test.

Every rank can build every rank's input from (case, rank), so references are computed
locally with plain torch in float64/int64 and compared with what braid returns. Also
checks: in-place forms mutate and out-of-place forms leave the input untouched; contiguous
tensors reach the runtime by address (no staging copy) and transposed views reduce
correctly; bool, bfloat16; the autograd of allreduce / allgather / broadcast; prescale and
postscale; object broadcast / all-gather; optimizer-state broadcast; the errors.
"""

import os
import sys
import zlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import braid  # noqa: E402
import braid.torch as hvd  # noqa: E402
from _common import check, expect_raises, log, main  # noqa: E402
from _torch_common import check_tensor  # noqa: E402

torch.set_num_threads(1)
FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
INTS = [torch.int32, torch.int64, torch.uint8]


def make(case, r, shape, dtype, op=None):
    """Rank r's input of `case`: values whose reductions over a few ranks are exact enough
    (small integers; for Product only 1 and 2; uint8 small enough not to wrap)."""
    g = torch.Generator().manual_seed(zlib.crc32(f"{case}/{r}".encode()))
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if op == hvd.Product:
        return torch.randint(1, 3, shape, generator=g).to(dtype)
    hi = 40 if dtype == torch.uint8 else 50
    lo = 0 if dtype == torch.uint8 else -50
    v = torch.randint(lo, hi, shape, generator=g)
    return (v.to(torch.float64) / 8).to(dtype) if dtype.is_floating_point else v.to(dtype)


def reference(xs, op, dtype):
    if dtype == torch.bool:
        s = torch.stack([x.to(torch.int64) for x in xs])
        if op in (hvd.Sum, hvd.Max):
            return s.max(0).values.bool()
        return s.min(0).values.bool()
    wide = torch.float64 if dtype.is_floating_point else torch.int64
    s = torch.stack([x.to(wide) for x in xs])
    out = {hvd.Sum: lambda: s.sum(0), hvd.Average: lambda: s.sum(0) / len(xs),
           hvd.Min: lambda: s.min(0).values, hvd.Max: lambda: s.max(0).values,
           hvd.Product: lambda: s.prod(0)}[op]()
    return out.to(dtype)


def check_allreduce(size, rank):
    shape = (3, 5)
    cases = [(dt, op) for dt in FLOATS for op in (hvd.Sum, hvd.Average, hvd.Min, hvd.Max,
                                                   hvd.Product)]
    cases += [(dt, op) for dt in INTS for op in (hvd.Sum, hvd.Min, hvd.Max, hvd.Product)]
    cases += [(torch.bool, op) for op in (hvd.Sum, hvd.Min, hvd.Max, hvd.Product)]
    for dt, op in cases:
        case = f"ar/{dt}/{int(op)}"
        xs = [make(case, r, shape, dt, op) for r in range(size)]
        want = reference(xs, op, dt)
        x = xs[rank].clone()
        before = x.clone()
        got = hvd.allreduce(x, name=case, op=op)
        check_tensor(got, want, f"allreduce {dt} {op.name}")
        check(torch.equal(x, before), f"allreduce {dt} {op.name}: input modified")
        y = xs[rank].clone()
        ret = hvd.allreduce_(y, name=case + "/inplace", op=op)
        check(ret is y, f"allreduce_ {dt} {op.name}: did not return its tensor")
        check_tensor(y, want, f"allreduce_ {dt} {op.name} (in place)")
        # A transposed view, out of place and in place.
        xt = xs[rank].clone().t()
        got = hvd.allreduce(xt, name=case + "/t", op=op)
        check_tensor(got, want.t(), f"allreduce {dt} {op.name} of a transposed view")
        hvd.allreduce_(xt, name=case + "/t_inplace", op=op)
        check_tensor(xt, want.t(), f"allreduce_ {dt} {op.name} of a transposed view")
    # Average is the default op; scalars (0-d tensors) work.
    v = torch.tensor(float(rank + 1))
    check_tensor(hvd.allreduce(v, name="scalar"), torch.tensor((size + 1) / 2),
                 "allreduce of a 0-d tensor")


def check_zero_copy(size, rank):
    """A contiguous tensor is handed to the runtime by address; a view is staged."""
    x = torch.full((1000,), float(rank))
    copies = hvd.staging_copies()
    h = hvd.allreduce_async_(x, name="zc.inplace", op=hvd.Sum)
    check(h._native.input_address == x.data_ptr() and h._native.output_address == x.data_ptr(),
          "allreduce_async_: the runtime did not get the tensor's own memory")
    hvd.synchronize(h)
    y = torch.full((1000,), float(rank))
    h = hvd.allreduce_async(y, name="zc.out", op=hvd.Sum)
    check(h._native.input_address == y.data_ptr(),
          "allreduce_async: the runtime did not read the tensor's own memory")
    out = hvd.synchronize(h)
    check(h._native.output_address == out.data_ptr(), "allreduce_async: result not in place")
    want = float(sum(range(size)))
    check(bool((x == want).all()) and bool((out == want).all()), "zero-copy all-reduce values")
    b = torch.arange(10, dtype=torch.bfloat16)
    h = hvd.broadcast_async_(b, 0, name="zc.bcast")
    check(h._native.input_address == b.data_ptr(), "broadcast_async_: staged a contiguous tensor")
    hvd.synchronize(h)
    check(hvd.staging_copies() == copies,
          f"contiguous tensors were staged: {hvd.staging_copies() - copies} copies")
    v = torch.ones(8, 4)[:, 1]  # strided
    hvd.allreduce_(v, name="zc.view", op=hvd.Sum)
    check(hvd.staging_copies() == copies + 1, "a strided view was not staged exactly once")
    check(bool((v == size).all()), "strided in-place all-reduce values")


def check_async_and_grouped(size, rank):
    xs = [torch.full((4,), float(rank + i)) for i in range(3)]
    hs = [hvd.allreduce_async(x, name=f"async.{i}", op=hvd.Sum) for i, x in enumerate(xs)]
    for i, h in enumerate(hs):
        out = hvd.synchronize(h)
        check_tensor(out, torch.full((4,), float(sum(r + i for r in range(size)))),
                     f"allreduce_async {i}")
        check(hvd.poll(h), "poll() false after synchronize")
    ts = [torch.full((2, 3), float(rank)), torch.arange(5, dtype=torch.float64) * rank]
    outs = hvd.grouped_allreduce(ts, name="grouped", op=hvd.Sum)
    check(len(outs) == 2, "grouped_allreduce: wrong number of results")
    tot = float(sum(range(size)))
    check_tensor(outs[0], torch.full((2, 3), tot), "grouped_allreduce[0]")
    check_tensor(outs[1], torch.arange(5, dtype=torch.float64) * tot, "grouped_allreduce[1]")
    check(bool((ts[0] == rank).all()), "grouped_allreduce modified its input")
    h = hvd.grouped_allreduce_async_(ts, name="grouped_")
    res = hvd.synchronize(h)
    check(res[0] is ts[0], "grouped_allreduce_ did not return its tensors")
    check_tensor(ts[0], torch.full((2, 3), tot / size), "grouped_allreduce_ (Average)")


def check_scale_factors(size, rank):
    x = torch.full((6,), float(rank + 1))
    got = hvd.allreduce(x, name="scale", op=hvd.Sum, prescale_factor=0.5, postscale_factor=3.0)
    want = torch.full((6,), 1.5 * sum(r + 1 for r in range(size)))
    check_tensor(got, want, "prescale/postscale")
    check(bool((x == rank + 1).all()), "prescale modified the input of an out-of-place call")
    y = x.clone()
    hvd.allreduce_(y, name="scale_", op=hvd.Average, prescale_factor=2.0)
    check_tensor(y, torch.full((6,), 2.0 * (size + 1) / 2), "prescale in place")
    expect_raises(hvd.InvalidArgumentError,
                  lambda: hvd.allreduce(torch.ones(2, dtype=torch.int32), name="iscale",
                                        op=hvd.Sum, prescale_factor=2.0),
                  "prescale on int32", contains=("iscale", "floating-point"))


def check_allgather(size, rank):
    for dt in FLOATS + INTS + [torch.bool]:
        case = f"ag/{dt}"
        xs = [make(case, r, (r + 1, 3), dt) for r in range(size)]
        x = xs[rank].clone()
        got = hvd.allgather(x, name=case)
        check_tensor(got, torch.cat(xs), f"allgather {dt}")
        check(torch.equal(x, xs[rank]), f"allgather {dt}: input modified")
    h = hvd.allgather_async(torch.arange(rank + 1), name="ag.async")
    check_tensor(hvd.synchronize(h), torch.cat([torch.arange(r + 1) for r in range(size)]),
                 "allgather_async")
    # Strided input.
    xt = torch.arange(6.0).reshape(2, 3).t() + rank
    check_tensor(hvd.allgather(xt, name="ag.t"),
                 torch.cat([torch.arange(6.0).reshape(2, 3).t() + r for r in range(size)]),
                 "allgather of a transposed view")


def check_broadcast(size, rank):
    root = size - 1
    for dt in FLOATS + INTS + [torch.bool]:
        case = f"bc/{dt}"
        xs = [make(case, r, (4, 2), dt) for r in range(size)]
        x = xs[rank].clone()
        got = hvd.broadcast(x, root, name=case)
        check_tensor(got, xs[root], f"broadcast {dt}")
        check(torch.equal(x, xs[rank]), f"broadcast {dt}: input modified")
        y = xs[rank].clone().t()
        ret = hvd.broadcast_(y, root, name=case + "/inplace")
        check(ret is y, f"broadcast_ {dt}: did not return its tensor")
        check_tensor(y, xs[root].t(), f"broadcast_ {dt} of a transposed view")


def check_alltoall_reducescatter(size, rank):
    # Rank r sends (r + j + 1) rows to rank j; row values encode (sender, receiver).
    splits = [rank + j + 1 for j in range(size)]
    rows = torch.cat([torch.full((n, 2), float(100 * rank + j)) for j, n in enumerate(splits)])
    out, received = hvd.alltoall(rows, splits=torch.tensor(splits), name="a2a")
    want = torch.cat([torch.full((r + rank + 1, 2), float(100 * r + rank)) for r in range(size)])
    check_tensor(out, want, "alltoall with splits")
    check_tensor(received, torch.tensor([r + rank + 1 for r in range(size)], dtype=torch.int32),
                 "alltoall received splits")
    even = torch.arange(2 * size, dtype=torch.int64) + 10 * rank
    got = hvd.alltoall(even, name="a2a.even")
    check_tensor(got, torch.tensor([10 * r + 2 * rank + k for r in range(size) for k in (0, 1)]),
                 "alltoall even")
    n = 2 * size + 1
    xs = [make("rs", r, (n, 3), torch.float32) for r in range(size)]
    full = reference(xs, hvd.Sum, torch.float32)
    start = sum(n // size + (1 if r < n % size else 0) for r in range(rank))
    share = n // size + (1 if rank < n % size else 0)
    got = hvd.reducescatter(xs[rank], name="rs", op=hvd.Sum)
    check_tensor(got, full[start:start + share], "reducescatter Sum")
    got = hvd.reducescatter(xs[rank], name="rs.avg")
    check_tensor(got, full[start:start + share] / size, "reducescatter Average")


def check_autograd(size, rank):
    # d/dx sum(w_rank * allreduce_avg(x)) = allreduce_avg over ranks of w_r.
    x = torch.arange(4.0, requires_grad=True)
    w = torch.full((4,), float(rank + 1))
    (hvd.allreduce(x, name="ad.ar") * w).sum().backward()
    check_tensor(x.grad, torch.full((4,), (size + 1) / 2), "allreduce gradient")
    # allgather: Horovod's gradient, the average of the incoming gradients, own rows.
    a = torch.ones(rank + 1, 2, requires_grad=True)
    g = hvd.allgather(a, name="ad.ag")
    coeff = torch.arange(float(g.shape[0])).unsqueeze(1) * (rank + 1)
    (g * coeff).sum().backward()
    offset = sum(r + 1 for r in range(rank))
    avg = torch.arange(float(g.shape[0])).unsqueeze(1) * (size + 1) / 2
    check_tensor(a.grad, avg[offset:offset + rank + 1].expand(rank + 1, 2), "allgather gradient")
    # broadcast: the root gets the average of the incoming gradients, the others zero.
    b = torch.ones(3, requires_grad=True)
    (hvd.broadcast(b, 0, name="ad.bc") * (rank + 1)).sum().backward()
    want = torch.full((3,), (size + 1) / 2) if rank == 0 else torch.zeros(3)
    check_tensor(b.grad, want, "broadcast gradient")


def check_objects_and_state(size, rank):
    obj = {"rank": rank, "payload": list(range(rank + 3))} if rank == 1 else None
    got = hvd.broadcast_object(obj, root_rank=1)
    check(got == {"rank": 1, "payload": [0, 1, 2, 3]}, f"broadcast_object: {got!r}")
    got = hvd.allgather_object(("r", rank, "x" * rank))
    check(got == [("r", r, "x" * r) for r in range(size)], f"allgather_object: {got!r}")
    got = braid.allgather_object({rank})  # the NumPy API has them too
    check(got == [{r} for r in range(size)], f"braid.allgather_object: {got!r}")
    # Optimizer state: rank 0 has trained (Adam moments, step counts, a scheduler's lr); the
    # others are fresh, with other hyper-parameters. After the broadcast all equal rank 0's.
    torch.manual_seed(rank)
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.Adam(model.parameters(), lr=0.01 * (rank + 1), betas=(0.8, 0.95))
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    if rank == 0:
        for _ in range(3):
            opt.zero_grad()
            model(torch.ones(2, 4)).pow(2).sum().backward()
            opt.step()
            sched.step()
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0, lr_scheduler=sched)
    sd = opt.state_dict()
    ref = hvd.broadcast_object(sd if rank == 0 else None, root_rank=0)
    check(len(sd["state"]) == 2, f"optimizer state has {len(sd['state'])} entries, expected 2")
    for pid, st in ref["state"].items():
        for k, v in st.items():
            mine = sd["state"][pid][k]
            if isinstance(v, torch.Tensor):
                check(torch.equal(mine, v), f"optimizer state {pid}.{k} differs from rank 0's")
            else:
                check(mine == v and type(mine) is type(v), f"optimizer state {pid}.{k}: {mine!r}")
    g = sd["param_groups"][0]
    check(g["lr"] == 0.01 * 0.5 ** 3 and g["initial_lr"] == 0.01 and g["betas"] == (0.8, 0.95),
          f"param group options not rank 0's exactly: {g}")
    check(sched.last_epoch == 3, f"scheduler state not broadcast: last_epoch {sched.last_epoch}")
    p0 = hvd.broadcast_object([p.detach().clone() for p in model.parameters()], root_rank=0)
    check(all(torch.equal(a, b) for a, b in zip(model.parameters(), p0)),
          "broadcast_parameters: parameters differ from rank 0's")


def check_parameter_mismatch(size, rank):
    """Models that differ across ranks: broadcast_parameters fails at once on every rank,
    naming the parameter and the ranks, and the job goes on (no broadcast left pending)."""
    E = hvd.InvalidArgumentError
    last = size - 1
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    if rank == last:
        model.add_module("extra", torch.nn.Linear(2, 2))  # one rank has an extra layer
    expect_raises(E, lambda: hvd.broadcast_parameters(model.state_dict(), root_rank=0),
                  "an extra layer on one rank",
                  contains=(f"rank(s) [{last}]", f"rank {last} has 'extra.weight' (shape [2, 2], "
                            "torch.float32), which rank 0 lacks", "'extra.bias'"))
    model = torch.nn.Linear(4, 3 + (rank == 1))  # another shape on rank 1
    expect_raises(E, lambda: hvd.broadcast_parameters(model.named_parameters(), root_rank=1),
                  "a parameter of another shape",
                  contains=("root rank 1", "'weight' is shape [4, 4], torch.float32 on rank 1 "
                            "but shape [3, 4], torch.float32 on rank 0", "'bias'"))
    # Optimizers whose parameter groups differ: every rank raises, the root included (it
    # used to return while the others failed in load_state_dict).
    opt_model = torch.nn.Linear(4, 3)
    groups = [{"params": [opt_model.weight]}, {"params": [opt_model.bias]}]
    if rank == last:
        groups = [{"params": [opt_model.weight, opt_model.bias]}]  # one group, not two
    opt = torch.optim.SGD(groups, lr=0.1, momentum=0.9)
    expect_raises(E, lambda: hvd.broadcast_optimizer_state(opt, root_rank=0),
                  "optimizers with other parameter groups",
                  contains=("broadcast_optimizer_state", f"rank(s) [{last}]",
                            f"rank {last} lacks 'param_groups[1][0]' (shape [3], "
                            "torch.float32), which rank 0 has"))
    # Optimizers of another class (SGD's state would replace Adam's options, betas lost).
    opt = (torch.optim.SGD(opt_model.parameters(), lr=0.1, momentum=0.9) if rank == 0 else
           torch.optim.Adam(opt_model.parameters(), lr=0.01))
    expect_raises(E, lambda: hvd.broadcast_optimizer_state(opt, root_rank=0),
                  "optimizers of another class",
                  contains=("broadcast_optimizer_state", "'optimizer' is SGD on rank 0 but Adam "
                            "on rank 1", "'param_groups[0] options' is options "))
    # Unnamed parameters are compared by position; after the errors the job still works.
    model = torch.nn.Linear(4, 3)
    torch.nn.init.constant_(model.weight, float(rank))
    hvd.broadcast_parameters(model.parameters(), root_rank=last)
    check(bool((model.weight == last).all()), "broadcast_parameters after a mismatch")


def check_negative_views(size, rank):
    """Tensors with PyTorch's lazy negation bit (contiguous, memory holding the negatives):
    every collective sees their values, not their memory; in-place forms write values."""
    vals = [make("neg", r, (5,), torch.float32) for r in range(size)]
    neg = [(-v).clone()._neg_view() for v in vals]  # values vals[r], memory -vals[r]
    mine = neg[rank]
    check(mine.is_neg() and mine.is_contiguous() and torch.equal(mine, vals[rank]),
          "the test's negative view is not what it means to be")
    check_tensor(hvd.allreduce(mine, name="neg.sum", op=hvd.Sum), sum(vals), "neg-view Sum")
    check_tensor(hvd.allreduce(mine, name="neg.max", op=hvd.Max),
                 torch.stack(vals).max(0).values, "neg-view Max")
    check_tensor(hvd.allgather(mine, name="neg.gather"), torch.cat(vals), "neg-view allgather")
    check_tensor(hvd.broadcast(mine, 0, name="neg.bcast"), vals[0], "neg-view broadcast")
    inplace = (-vals[rank]).clone()._neg_view()
    hvd.allreduce_(inplace, name="neg.sum_", op=hvd.Sum)
    check_tensor(inplace, sum(vals), "neg-view in-place Sum")
    inplace = (-vals[rank]).clone()._neg_view()
    hvd.broadcast_(inplace, size - 1, name="neg.bcast_")
    check_tensor(inplace, vals[size - 1], "neg-view in-place broadcast")


# A plan for BRAID_COMPRESSION (test_torch.py sets it): parameter-name patterns.
JOB_PLAN = '{"weight": "fp4", "*": "fp16"}'


def check_job_default_skips_direct_calls(size, rank):
    """Under a job default (BRAID_COMPRESSION=fp4, or the plan JOB_PLAN, set by the test), a
    direct allreduce with compression=None is exact (Horovod's Compression.none) while
    DistributedOptimizer's gradients take the default: under the plan, by parameter name
    (the gradients' names carry a prefix), the bias too small for its method."""
    default = os.environ.get("BRAID_COMPRESSION")
    if default not in ("fp4", JOB_PLAN):
        return
    got = [hvd.allreduce(torch.tensor(0.3), name=f"metric.{i}").item() for i in range(4)]
    check(got == [torch.tensor(0.3).item()] * 4, f"a metric under a 4-bit job default: {got}")
    model = torch.nn.Linear(64, 64)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    model(torch.ones(2, 64)).sum().backward()
    opt.step()
    tensors = hvd.compression_stats()["tensors"]
    check(tensors["metric.0"]["method"] == "none", f"metric counted as {tensors['metric.0']}")
    check(tensors["grad.weight"]["method"] == "fp4",
          f"the optimizer's gradient did not take the job default: {tensors['grad.weight']}")
    bias = "none" if default == JOB_PLAN else "fp4"  # the plan's rule: 64 < 1024 elements
    check(tensors["grad.bias"]["method"] == bias,
          f"the bias under {default}: {tensors['grad.bias']}, expected {bias}")


def check_errors(size, rank):
    E = hvd.InvalidArgumentError
    expect_raises(E, lambda: hvd.allreduce(torch.ones(2, dtype=torch.int8), name="e.i8"),
                  "int8", contains=("e.i8", "unsupported dtype torch.int8", "torch.bfloat16"))
    expect_raises(E, lambda: hvd.allreduce(torch.ones(2, dtype=torch.bool), name="e.bool"),
                  "bool average", contains=("e.bool", "Average", "torch.bool"))
    expect_raises(E, lambda: hvd.allreduce(torch.ones(2), name="e.ada", op=hvd.Adasum),
                  "Adasum", contains=("e.ada", "Adasum", "not implemented"))
    expect_raises(E, lambda: hvd.allreduce(torch.ones(2), name="e.comp", compression="fp5"),
                  "unknown compression", contains=("fp5", "fp16"))
    expect_raises(E, lambda: hvd.allgather(torch.tensor(1.0), name="e.scalar"),
                  "allgather of a scalar", contains=("e.scalar", "dimension"))
    expect_raises(E, lambda: hvd.allreduce([1.0, 2.0], name="e.list"), "a list",
                  contains=("e.list", "torch.Tensor"))
    for fn in (hvd.allreduce_, lambda t, name: hvd.broadcast_(t, 0, name=name)):
        expect_raises(E, lambda: fn(torch.ones(1).expand(4), name="e.expand"),
                      "in place on an expanded tensor",
                      contains=("e.expand", "share memory", "strides [0]"))
    for fn in (hvd.poll, hvd.synchronize, braid.poll, braid.synchronize):
        expect_raises(E, lambda: fn(12345), f"{fn.__module__}.{fn.__name__} of an int",
                      contains=(fn.__name__, "*_async", "int 12345"))
    expect_raises(E, lambda: hvd.allreduce(torch.ones(2), process_set=object()),
                  "process set", contains=("process_set must be a ProcessSet", "object"))
    # Devices: a tensor on neither the CPU nor a GPU is refused here, naming both kinds; a
    # GPU's memory reaches the runtime with its device (here an address of host memory
    # labelled cuda:0: refused on every rank, naming the tensor and why this machine has no
    # usable CUDA device: no CUDA in the build, no verified CUDA path, or no driver).
    expect_raises(E, lambda: hvd.allreduce(torch.empty(2, device="meta"), name="e.meta"),
                  "a meta tensor", contains=("e.meta", "tensor is on meta", "CPU and CUDA"))
    check(hvd.cuda_built() is hvd.nccl_built() is braid._core.runtime.cuda_built(),
          "cuda_built and nccl_built disagree")
    x = torch.ones(4)
    msg = expect_raises(
        braid.FailedPreconditionError,
        lambda: braid._core.runtime.enqueue_pointer(
            "allreduce", "e.cuda", 0, x.data_ptr(), [4], x.data_ptr(), 16, device_type=1,
            device_id=0, stream=0),
        "host memory labelled cuda:0", contains=("allreduce 'e.cuda'", "cuda:0 tensors: "))
    log(f"cuda:0 refusal: {msg}")
    hvd.barrier()  # the refused name is clean again
    # A mismatch across ranks is reported on every rank, naming the tensor.
    msg = expect_raises(E, lambda: hvd.allreduce(torch.ones(rank + 1), name="e.shape"),
                        "shape mismatch", contains=("e.shape",))
    log(f"shape mismatch message: {msg}")


def body():
    hvd.init()
    size, rank = hvd.size(), hvd.rank()
    check((hvd.cross_size(), hvd.cross_rank()) == (1, 0), "cross_size/cross_rank on one host")
    check(set(hvd.Compression.methods()) >= {"none", "fp16", "bf16", "fp4", "int4"} and
          all(getattr(hvd.Compression, m).spec == m
              for m in braid._braid.compression_methods(False)),
          f"Compression is not the registry's: {hvd.Compression}")
    for fn in (check_allreduce, check_zero_copy, check_async_and_grouped, check_scale_factors,
               check_allgather, check_broadcast, check_alltoall_reducescatter, check_autograd,
               check_objects_and_state, check_parameter_mismatch, check_negative_views,
               check_job_default_skips_direct_calls, check_errors):
        fn(size, rank)
    # A compressed all-reduce is close to the exact one (fp16 rounds once per addition).
    x = make("fp16", rank, (1000,), torch.float32)
    want = reference([make("fp16", r, (1000,), torch.float32) for r in range(size)],
                     hvd.Average, torch.float32)
    check_tensor(hvd.allreduce(x, name="c.fp16", compression=hvd.Compression.fp16), want,
                 "fp16 all-reduce", tol=(2e-3, 2e-3))
    check(hvd.compression_stats()["tensors"]["c.fp16"]["method"] == "fp16",
          "the fp16 all-reduce was not counted under fp16")
    hvd.shutdown()


if __name__ == "__main__":
    main(body)
