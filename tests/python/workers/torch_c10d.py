"""Rank program for the `braid` torch.distributed backend (braid.torch.distributed).

    torch_c10d.py collectives [URL]    every collective of the backend vs a reference
                                       computed here from every rank's known inputs; the
                                       errors (unsupported calls, a refusal on one rank);
                                       with URL (tcp://...), init_process_group(rank=
                                       TEST_RANK, world_size=TEST_WORLD_SIZE) and no
                                       launcher, as mp.spawn scripts
    torch_c10d.py ddp BACKEND OUT [OPTION...]
                                       20 steps of the Fashion-MNIST CNN under DDP over
                                       BACKEND (braid or gloo); writes OUT.rank<r>.pt
                                       (parameters, losses, braid's byte counters). Options:
                                       hook=SPEC (braid.torch.ddp_comm_hook with SPEC),
                                       lr=LR (0.01), bucket_cap_mb=MB, bucket_view (DDP's
                                       gradient_as_bucket_view), static_graph, no_sync (odd
                                       steps accumulate under no_sync(): 10 updates),
                                       torch_powersgd (torch's powerSGD_hook, rank 2)
    torch_c10d.py reference N OUT      (one process, no launcher) what `ddp braid` on N ranks
                                       must give: every rank's gradient computed here, scaled
                                       by 1/N as DDP scales it, summed in braid's canonical
                                       order (transport/canonical_reduce.h); writes OUT.pt
    torch_c10d.py last_reference       the group's last reference is dropped by a future's
                                       callback, on the group's own thread (where torch's
                                       powerSGD_hook may drop it after the main thread has
                                       destroyed the group): no self-join, a clean exit
    torch_c10d.py killed               DDP steps over braid; the last rank kills itself
                                       (SIGKILL) at step 3; the others must raise

Started by the test launcher (braid's variables, not torch's): env:// forms torch's store
through braid (braid.torch.distributed), for gloo as for braid.
"""

import gc
import os
import signal
import sys
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn.functional as F

from _common import RANK, check, fail, log, main

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "examples"))

import braid.torch as hvd  # noqa: E402
import braid.torch.distributed  # noqa: E402,F401  (registers the backend)

STEPS = 20
BATCH = 16  # per rank


def base(r, n, dtype=torch.float32):
    """Rank r's input: distinct per rank and element."""
    return (torch.arange(n, dtype=torch.float64) * (r + 1) + r * 0.5).to(dtype)


def expect_equal(got, want, what):
    if got.dtype != want.dtype or got.shape != want.shape or not torch.equal(got, want):
        fail(f"{what}: got {got!r}, expected {want!r}")


def expect_runtime_error(fn, what, contains):
    try:
        fn()
    except RuntimeError as e:
        for c in contains:
            if c not in str(e):
                fail(f"{what}: message {str(e)!r} lacks {c!r}")
        return str(e)
    fail(f"{what}: did not raise RuntimeError")
    return ""


def collectives(init_method=None):
    if init_method is None:
        dist.init_process_group("braid")
    else:  # as mp.spawn scripts do: no launcher's variables, torch's rank and world size
        dist.init_process_group("braid", init_method=init_method,
                                rank=int(os.environ["TEST_RANK"]),
                                world_size=int(os.environ["TEST_WORLD_SIZE"]))
    rank, size = dist.get_rank(), dist.get_world_size()
    check(dist.get_backend() == "braid", f"backend {dist.get_backend()}")
    check((rank, size) == (hvd.rank(), hvd.size()), "torch's rank and size are braid's")
    n = 10
    everyone = [base(r, n) for r in range(size)]

    # all_reduce, every op, float and int dtypes; in place.
    for op, ref in ((dist.ReduceOp.SUM, lambda xs: sum(xs[1:], xs[0].clone())),
                    (dist.ReduceOp.MIN, lambda xs: torch.stack(xs).min(0).values),
                    (dist.ReduceOp.MAX, lambda xs: torch.stack(xs).max(0).values),
                    (dist.ReduceOp.PRODUCT, lambda xs: torch.stack(xs).prod(0))):
        for dtype in (torch.float32, torch.float64, torch.int64, torch.int32):
            t = base(rank, n, dtype)
            dist.all_reduce(t, op=op)
            want = ref([base(r, n, dtype) for r in range(size)]).to(dtype)
            expect_equal(t, want, f"all_reduce {op} {dtype}")
    t = base(rank, n)
    dist.all_reduce(t, op=dist.ReduceOp.AVG)
    torch.testing.assert_close(t, sum(everyone) / size)
    # A strided (non-contiguous) view: reduced through a copy, written back in place.
    m = torch.stack([base(rank, n), -base(rank, n)], 1)  # (n, 2)
    col = m[:, 1]
    dist.all_reduce(col)
    expect_equal(m[:, 1], -sum(everyone[1:], everyone[0].clone()), "all_reduce of a view")
    expect_equal(m[:, 0], base(rank, n), "the view's neighbour column untouched")
    # Asynchronous, with the future DDP uses.
    t = base(rank, n)
    work = dist.all_reduce(t, async_op=True)
    got = work.get_future().wait()[0]
    check(work.is_completed(), "the work completed")
    expect_equal(got, sum(everyone[1:], everyone[0].clone()), "async all_reduce's future")
    # all_reduce_coalesced
    a, b = base(rank, 3), base(rank, 5) * 2
    dist.all_reduce_coalesced([a, b])
    expect_equal(a, sum(base(r, 3) for r in range(size)), "all_reduce_coalesced [0]")
    expect_equal(b, sum(base(r, 5) * 2 for r in range(size)), "all_reduce_coalesced [1]")

    # broadcast from every root, a float and a bool tensor (bool travels as bytes).
    for root in range(size):
        t = base(rank, n)
        dist.broadcast(t, src=root)
        expect_equal(t, everyone[root], f"broadcast from {root}")
    flags = torch.tensor([rank % 2 == 0, True, rank == 0])
    dist.broadcast(flags, src=0)
    expect_equal(flags, torch.tensor([True, True, True]), "broadcast of bool")

    # all_gather, all_gather_into_tensor, gather
    outs = [torch.empty(n) for _ in range(size)]
    dist.all_gather(outs, base(rank, n))
    for r in range(size):
        expect_equal(outs[r], everyone[r], f"all_gather [{r}]")
    flat = torch.empty(size * n)
    dist.all_gather_into_tensor(flat, base(rank, n))
    expect_equal(flat, torch.cat(everyone), "all_gather_into_tensor")
    c = [torch.empty(2, dtype=torch.complex64) for _ in range(size)]  # travels as bytes
    dist.all_gather(c, torch.tensor([complex(rank, 1), complex(0, rank)], dtype=torch.complex64))
    expect_equal(torch.stack(c), torch.tensor([[complex(r, 1), complex(0, r)]
                                               for r in range(size)], dtype=torch.complex64),
                 "all_gather of complex64")
    root = size - 1
    gl = [torch.empty(n) for _ in range(size)] if rank == root else None
    dist.gather(base(rank, n), gather_list=gl, dst=root)
    if rank == root:
        for r in range(size):
            expect_equal(gl[r], everyone[r], f"gather [{r}]")

    # scatter, reduce
    sc = [base(r, n) * 7 for r in range(size)] if rank == 1 % size else None
    out = torch.empty(n)
    dist.scatter(out, scatter_list=sc, src=1 % size)
    expect_equal(out, base(rank, n) * 7, "scatter")
    t = base(rank, n)
    dist.reduce(t, dst=0, op=dist.ReduceOp.MAX)
    expect_equal(t, torch.stack(everyone).max(0).values if rank == 0 else base(rank, n),
                 "reduce (the root gets the result; the others keep theirs)")

    # reduce_scatter, reduce_scatter_tensor
    ins = [base(rank, n) + 100 * j for j in range(size)]
    out = torch.empty(n)
    dist.reduce_scatter(out, ins)
    expect_equal(out, sum(base(r, n) + 100 * rank for r in range(size)), "reduce_scatter")
    out = torch.empty(n)
    dist.reduce_scatter_tensor(out, torch.cat(ins))
    expect_equal(out, sum(base(r, n) + 100 * rank for r in range(size)),
                 "reduce_scatter_tensor")

    # all_to_all (lists), all_to_all_single with uneven splits
    ins = [torch.full((j + 1,), float(10 * rank + j)) for j in range(size)]
    outs = [torch.empty(rank + 1) for _ in range(size)]
    dist.all_to_all(outs, ins)
    for r in range(size):
        expect_equal(outs[r], torch.full((rank + 1,), float(10 * r + rank)), f"all_to_all [{r}]")
    # Rank r sends j+1 rows of 2 to rank j; each row holds (sender, receiver).
    rows = torch.cat([torch.tensor([[rank, j]] * (j + 1), dtype=torch.int64)
                      for j in range(size)])
    got = torch.empty((rank + 1) * size, 2, dtype=torch.int64)
    dist.all_to_all_single(got, rows, output_split_sizes=[rank + 1] * size,
                           input_split_sizes=[j + 1 for j in range(size)])
    want = torch.cat([torch.tensor([[r, rank]] * (rank + 1), dtype=torch.int64)
                      for r in range(size)])
    expect_equal(got, want, "all_to_all_single")
    dist.barrier()

    # Unsupported calls: a clear error naming the operation, no collective used.
    expect_runtime_error(lambda: dist.send(torch.zeros(1), dst=(rank + 1) % size),
                         "send", ("braid backend", "send is not supported"))
    expect_runtime_error(lambda: dist.all_reduce(torch.ones(2, dtype=torch.int64),
                                                 op=dist.ReduceOp.BOR),
                         "a bitwise op", ("reduce op", "not supported"))
    # A refusal on one rank only (a dtype braid cannot reduce): every rank raises, naming
    # rank 1's reason, and the names stay aligned for the calls after it.
    t = torch.ones(3, dtype=torch.bool if rank == 1 else torch.float32)
    expect_runtime_error(lambda: dist.all_reduce(t), "a refusal on rank 1",
                         ("dtype Bool cannot be reduced",) if rank == 1 else
                         ("rank 1", "dtype Bool cannot be reduced"))
    t = base(rank, n)
    dist.all_reduce(t)
    expect_equal(t, sum(everyone[1:], everyone[0].clone()), "the all_reduce after a refusal")
    # All-gathers of unequal sizes (torch's take equal ones): every rank raises, none is
    # handed parts cut at the wrong places.
    outs = [torch.empty(2 + rank) for _ in range(size)]
    expect_runtime_error(lambda: dist.all_gather(outs, torch.ones(2 + rank)),
                         "all_gather of unequal sizes",
                         ("trailing shape differs", "rank 0", f"rank {size - 1}"))
    # A group of the whole job is a group of its own; a subset runs in a braid process set
    # (only its members enter the creator): its sums are its members', its roots are group
    # ranks (group rank 0 is job rank 1 here), and the rank outside it is not held back.
    world = dist.new_group()
    t = base(rank, n)
    dist.all_reduce(t, group=world)
    expect_equal(t, sum(everyone[1:], everyone[0].clone()), "all_reduce on new_group()")
    members = list(range(1, size))
    subset = dist.new_group(members)
    again = dist.new_group(members)  # the same ranks again: the same process set
    if rank in members:
        t = base(rank, n)
        dist.all_reduce(t, group=subset)
        expect_equal(t, sum(everyone[2:], everyone[1].clone()), "all_reduce on a subset")
        b = torch.full((3,), float(rank))
        dist.broadcast(b, src=members[0], group=subset)  # torch passes group rank 0
        expect_equal(b, torch.full((3,), 1.0), "broadcast on a subset")
        parts = [torch.empty(2) for _ in members]
        dist.all_gather(parts, torch.full((2,), float(rank)), group=subset)
        expect_equal(torch.stack(parts), torch.tensor([[float(m)] * 2 for m in members]),
                     "all_gather on a subset")
        dist.barrier(group=subset)
        t = torch.ones(2)
        dist.all_reduce(t, group=again)
        expect_equal(t, torch.full((2,), float(len(members))), "a second group of the ranks")
    dist.barrier(group=world)
    # A barrier realigns the group's names: rank 0 makes a call the others do not make;
    # the barrier fails it (braid's pairing boundary), and the calls after it pair again.
    extra = dist.all_reduce(torch.ones(3), async_op=True) if rank == 0 else None
    dist.barrier()
    if extra is not None:
        expect_runtime_error(extra.wait, "a call only rank 0 made",
                             ("InvalidArgumentError", "before barrier"))
    t = base(rank, n)
    dist.all_reduce(t)
    expect_equal(t, sum(everyone[1:], everyone[0].clone()), "the all_reduce after a barrier")
    # init_process_group's / new_group's timeout: a call the others make late fails on the
    # waiting rank at the timeout (as gloo's), and completes once they make it.
    timed = dist.new_group(timeout=timedelta(seconds=2))
    if rank == 0:
        t0 = time.monotonic()
        expect_runtime_error(lambda: dist.all_reduce(torch.ones(2), group=timed),
                             "a call past the group's timeout",
                             ("DeadlineExceededError", "timeout (2 s"))
        waited = time.monotonic() - t0
        check(1.9 < waited < 10, f"the timeout came after {waited:.1f} s, not 2")
    else:
        time.sleep(3)
        late = torch.ones(2)
        dist.all_reduce(late, group=timed)
        expect_equal(late, torch.full((2,), float(size)), "the late call, paired")
    dist.barrier(group=timed)
    # The group's method (here fp16) applies to floating-point sums and averages only:
    # integer sums, min/max/product stay exact.
    os.environ["BRAID_C10D_COMPRESSION"] = "fp16"
    half = dist.new_group()
    del os.environ["BRAID_C10D_COMPRESSION"]
    big = torch.full((3,), 2.0**40 + 1, dtype=torch.float64) * (rank + 1)
    dist.all_reduce(big, group=half, op=dist.ReduceOp.MAX)
    expect_equal(big, torch.full((3,), 2.0**40 + 1, dtype=torch.float64) * size, "MAX under fp16")
    ints = torch.full((3,), 2**40 + rank, dtype=torch.int64)
    dist.all_reduce(ints, group=half)
    expect_equal(ints, torch.full((3,), size * 2**40 + sum(range(size)), dtype=torch.int64),
                 "int64 SUM under fp16")
    x = torch.full((4,), 1.0 + 2.0**-12)  # fp16 rounds it to 1
    dist.all_reduce(x, group=half)
    expect_equal(x, torch.full((4,), float(size)), "a float32 SUM compressed to fp16")
    # braid's own counters saw the backend's all-reduces.
    stats = hvd.compression_stats()["methods"]
    check("none" in stats and stats["none"]["reductions"] >= 20, f"braid's counters: {stats}")
    dist.destroy_process_group()


def ddp(backend, out, *options):
    opts = dict(o.partition("=")[::2] for o in options)
    hook = opts.get("hook")
    import fashion_mnist_data as fmnist
    from train_fashion_mnist import Net
    torch.set_num_threads(1)
    dist.init_process_group(backend)
    rank, size = dist.get_rank(), dist.get_world_size()
    images, labels = fmnist.load("train")
    images = fmnist.normalize(images[:STEPS * BATCH * size])
    labels = labels[:STEPS * BATCH * size]
    torch.manual_seed(0)
    model = Net()
    kwargs = {"gradient_as_bucket_view": "bucket_view" in opts,
              "static_graph": "static_graph" in opts}
    if "bucket_cap_mb" in opts:
        kwargs["bucket_cap_mb"] = float(opts["bucket_cap_mb"])
    ddp_model = torch.nn.parallel.DistributedDataParallel(model, **kwargs)
    if hook:
        ddp_model.register_comm_hook(*hvd.ddp_comm_hook(
            compression=hook, named_parameters=model.named_parameters()))
    if "torch_powersgd" in opts:
        # torch's own hook, whose callbacks wait on further collectives of the group.
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as ps
        ddp_model.register_comm_hook(ps.PowerSGDState(
            process_group=None, matrix_approximation_rank=2, start_powerSGD_iter=2,
            random_seed=0), ps.powerSGD_hook)
    # lr 0.01: DDP over gloo and over braid then stay within 1e-7 (relative) of each other
    # at 3-4 ranks after 20 steps, where they sum in different orders; at 0.05 with momentum
    # the rounding differences grow to 1e-3 in 20 steps.
    opt = torch.optim.SGD(ddp_model.parameters(), lr=float(opts.get("lr", 0.01)), momentum=0.9)
    losses = []
    for step in range(STEPS):
        lo = (step * size + rank) * BATCH
        x, y = images[lo:lo + BATCH], labels[lo:lo + BATCH]
        opt.zero_grad()
        loss = F.cross_entropy(ddp_model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    result = {"params": {k: v.clone() for k, v in model.state_dict().items()},
              "losses": losses,
              "param_bytes": sum(p.numel() * p.element_size() for p in model.parameters())}
    if hvd.is_initialized():
        result["stats"] = hvd.compression_stats()
    torch.save(result, f"{out}.rank{rank}.pt")
    log(f"rank {rank}: losses {losses[0]:.3f} .. {losses[-1]:.3f}")
    if backend == "gloo":
        # Debian's gloo sometimes aborts or hangs at interpreter exit (torch_ddp_compare.py).
        log(f"rank {RANK}: all checks passed")
        sys.stdout.flush()
        os._exit(0)
    dist.destroy_process_group()


def canonical_sum(xs):
    """xs[0] + ... + xs[n-1] in braid's canonical order (Note [Canonical reduction order]):
    with p2 the largest power of two <= n and rem = n - p2, pairs (2i, 2i+1) for i < rem
    first, then the p2 values as a balanced tree, lower ranks' operand first."""
    p2 = 1
    while p2 * 2 <= len(xs):
        p2 *= 2
    rem = len(xs) - p2
    vals = [xs[2 * i] + xs[2 * i + 1] for i in range(rem)] + list(xs[2 * rem:])
    while len(vals) > 1:
        vals = [vals[i] + vals[i + 1] for i in range(0, len(vals), 2)]
    return vals[0]


def reference(size, out):
    """DDP's arithmetic on `size` ranks in one process (see the module's docstring). Run
    with the ranks' environment (OMP_NUM_THREADS=1): oneDNN's kernels round differently
    with another thread setting, and the comparison is bit for bit."""
    import fashion_mnist_data as fmnist
    from train_fashion_mnist import Net
    size = int(size)
    torch.set_num_threads(1)
    images, labels = fmnist.load("train")
    images = fmnist.normalize(images[:STEPS * BATCH * size])
    labels = labels[:STEPS * BATCH * size]
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    params = list(model.parameters())
    for step in range(STEPS):
        grads = []
        for r in range(size):
            lo = (step * size + r) * BATCH
            model.zero_grad()
            F.cross_entropy(model(images[lo:lo + BATCH]), labels[lo:lo + BATCH]).backward()
            # DDP multiplies each gradient by 1/world size as it copies it into its bucket.
            grads.append(torch.cat([p.grad.reshape(-1) for p in params]) * (1.0 / size))
        total = canonical_sum(grads)
        at = 0
        for p in params:
            p.grad = total[at:at + p.numel()].view_as(p).clone()
            at += p.numel()
        opt.step()
    torch.save({"params": {k: v.clone() for k, v in model.state_dict().items()}}, f"{out}.pt")
    log(f"rank {RANK}: all checks passed")


def last_reference():
    dist.init_process_group("braid")
    rank = dist.get_rank()
    group = dist.distributed_c10d._get_default_group()
    check(len(braid.torch.distributed._groups) == 1, "one braid group alive")
    t = torch.ones(4)
    # Rank 0's all-reduce cannot complete before rank 1 submits its own, so rank 0 adds its
    # callback before the completion, always; a later rank's may complete first, and then
    # torch runs the callback at once on the calling thread (nothing of the group's to test).
    if rank > 0:
        time.sleep(0.3)
    fut = dist.all_reduce(t, async_op=True).get_future()
    released, returned = threading.Event(), threading.Event()
    inline = []

    def hold(_, group=group):  # the callback's closure keeps the group alive
        if threading.current_thread() is threading.main_thread():
            inline.append(True)  # the future was complete already
        else:
            released.wait(30)
        returned.set()

    fut.add_done_callback(hold)
    del hold
    fut.wait()  # marked complete before its callbacks run: hold() is waiting now
    expect_equal(t, torch.full((4,), float(dist.get_world_size())), "all_reduce")
    check(rank > 0 or not inline, "rank 0's callback was added before its all-reduce ended")
    dist.destroy_process_group()
    del group
    gc.collect()
    if inline:
        log(f"rank {rank}: all checks passed (its all-reduce ended before the callback came)")
        return
    check(len(braid.torch.distributed._groups) == 1, "the callback holds the group")
    released.set()  # hold() returns; its closure, the group's last reference, goes with it
    check(returned.wait(30), "the callback returned")
    deadline = time.monotonic() + 30
    while braid.torch.distributed._groups and time.monotonic() < deadline:
        time.sleep(0.05)
    check(not braid.torch.distributed._groups,
          "the group was destroyed (on its own thread) once the callback let it go")
    log(f"rank {rank}: all checks passed")


def killed():
    from train_fashion_mnist import Net
    torch.set_num_threads(1)
    dist.init_process_group("braid")
    rank, size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(Net())
    x, y = torch.randn(BATCH, 1, 28, 28), torch.randint(0, 10, (BATCH,))
    lost = size - 1
    t0 = None
    # braidrun stops the job with SIGTERM (then SIGKILL 3 s later) once a rank died: the
    # survivors stay to show that they raise.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        for step in range(1000):
            if step == 3:
                if rank == lost:
                    log(f"rank {rank}: killing itself")
                    os.kill(os.getpid(), signal.SIGKILL)
                t0 = time.monotonic()
            F.cross_entropy(model(x), y).backward()
    except RuntimeError as e:
        dt = time.monotonic() - t0
        log(f"rank {rank}: raised after {dt:.2f} s: {e}")
        check("braid.UnavailableError" in str(e) and f"rank {lost}" in str(e),
              f"the error names braid's class and the lost rank: {e}")
        check(dt < 30, f"the loss was noticed after {dt:.1f} s")
        return
    fail("the steps went on after a rank was killed")


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "collectives":
        main(lambda: collectives(*sys.argv[2:]))
    elif mode == "ddp":
        main(lambda: ddp(*sys.argv[2:]))
    elif mode == "reference":
        reference(*sys.argv[2:])
    elif mode == "last_reference":
        main(last_reference)
    else:
        main(killed)
