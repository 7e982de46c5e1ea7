"""Errors and lifecycle of the braid Python API, on N ranks.

Covers: calls before init (FailedPrecondition), init twice, unsupported dtypes and other local
InvalidArguments, mismatches across ranks (InvalidArgument with the coordinator's message),
AlreadyExists, DeadlineExceeded from synchronize(timeout=), Ctrl-C while synchronizing,
a forked child (no shutdown of the parent's job at its exit), and Cancelled on shutdown with a
collective that the other ranks never submit.
"""

import atexit
import os
import signal
import threading
import time

import numpy as np

import braid
from _common import check, check_array, expect_raises, fail, log, main


def before_init():
    FP = braid.FailedPreconditionError
    check(not braid.is_initialized(), "is_initialized() before init()")
    x = np.ones(3, np.float32)
    calls = {
        "rank": braid.rank, "size": braid.size, "local_rank": braid.local_rank,
        "local_size": braid.local_size,
        "allreduce": lambda: braid.allreduce(x),
        "allreduce_": lambda: braid.allreduce_(x),
        "allreduce_async": lambda: braid.allreduce_async(x, name="a"),
        "allgather": lambda: braid.allgather(x),
        "broadcast": lambda: braid.broadcast(x, 0),
        "broadcast_": lambda: braid.broadcast_(x, 0),
        "reducescatter": lambda: braid.reducescatter(x),
        "alltoall": lambda: braid.alltoall(x),
        "barrier": braid.barrier,
    }
    for what, fn in calls.items():
        expect_raises(FP, fn, f"{what}() before init()", contains="not initialized")
    check(issubclass(FP, braid.BraidError) and issubclass(braid.BraidError, Exception),
          "FailedPreconditionError is a BraidError is an Exception")
    braid.shutdown()  # harmless before init


def local_errors(rank, size):
    IA = braid.InvalidArgumentError
    for dt in [np.complex64, np.bool_, np.int16, np.uint16, np.int8, np.longdouble]:
        name = np.dtype(dt).name
        x = np.zeros(4, dtype=dt)
        for fn_name, fn in [("allreduce", lambda: braid.allreduce(x, name="bad")),
                            ("allreduce_", lambda: braid.allreduce_(x, name="bad")),
                            ("allgather", lambda: braid.allgather(x, name="bad")),
                            ("broadcast", lambda: braid.broadcast(x, 0, name="bad")),
                            ("reducescatter", lambda: braid.reducescatter(x, name="bad")),
                            ("alltoall", lambda: braid.alltoall(x, name="bad"))]:
            expect_raises(IA, fn, f"{fn_name} of {name}",
                          contains=(f"unsupported dtype {name}", "'bad'", "float32"))
    expect_raises(IA, lambda: braid.allreduce(np.array(["a"]), name="s"), "allreduce of str",
                  contains="unsupported dtype")
    ro = np.ones(4, np.float32)
    ro.setflags(write=False)
    expect_raises(IA, lambda: braid.allreduce_(ro, name="ro"), "allreduce_ of a read-only array",
                  contains=("read-only", "'ro'"))
    expect_raises(IA, lambda: braid.broadcast_(ro, 0, name="ro"),
                  "broadcast_ of a read-only array", contains="read-only")
    expect_raises(IA, lambda: braid.allreduce_([1.0, 2.0], name="lst"), "allreduce_ of a list",
                  contains="numpy.ndarray")
    expect_raises(IA, lambda: braid.allreduce(np.ones(2, np.int32), name="ia", op=braid.Average),
                  "average of int32", contains=("'ia'", "int32"))
    expect_raises(IA, lambda: braid.allreduce(np.ones(2, np.float32), name="op", op=42),
                  "unknown reduce op", contains="reduce op")
    expect_raises(IA, lambda: braid.allgather(np.float32(1), name="scalar"),
                  "allgather of a scalar", contains=("'scalar'", "scalar"))
    expect_raises(IA, lambda: braid.alltoall(np.ones((size + 1, 2)), name="uneven"),
                  "alltoall with uneven dim 0", contains=("'uneven'", "divide"))
    expect_raises(IA, lambda: braid.alltoall(np.ones((2, 2)), splits=[2], name="splits"),
                  "alltoall with the wrong number of splits", contains="splits")
    expect_raises(IA, lambda: braid.alltoall(np.ones((4, 2)), splits=[1] * size, name="sum"),
                  "alltoall with splits not summing to dim 0", contains="sum")


def cross_rank_errors(rank, size):
    IA = braid.InvalidArgumentError
    # Shape mismatch: rank 1 passes [3], the others [2].
    x = np.ones(3 if rank == 1 else 2, np.float32)
    want = ("tensor 'x': shape differs across ranks: [2] on rank 0; [3] on rank 1"
            if size == 2 else
            "tensor 'x': shape differs across ranks: [2] on ranks 0, 2; [3] on rank 1")
    expect_raises(IA, lambda: braid.allreduce(x, name="x"), "allreduce shape mismatch",
                  exact=want)
    # The name is free again afterwards.
    check_array(braid.allreduce(np.ones(2, np.float32), name="x"), np.ones(2, np.float32),
                "allreduce reusing a name after its error")
    # dtype mismatch
    y = np.ones(2, np.float64 if rank == 0 else np.float32)
    expect_raises(IA, lambda: braid.allreduce(y, name="y", op=braid.Sum),
                  "allreduce dtype mismatch",
                  contains=("tensor 'y'", "dtype differs across ranks", "float64 on rank 0"))
    # op mismatch
    expect_raises(IA, lambda: braid.allreduce(np.ones(2), name="o",
                                              op=braid.Sum if rank == 0 else braid.Max),
                  "allreduce op mismatch", contains=("tensor 'o'", "reduce op differs"))
    # compression mismatch
    expect_raises(IA, lambda: braid.allreduce(np.ones(2, np.float32), name="c",
                                              compression="fp16" if rank == 0 else None),
                  "allreduce compression mismatch",
                  contains=("tensor 'c'", "compression differs across ranks", "fp16 on rank 0"))
    expect_raises(IA, lambda: braid.allreduce(np.ones(2, np.float32), name="c2", compression=3),
                  "compression that is not a string", contains="compression")
    # allgather: trailing dims must agree
    z = np.ones((2, 3 if rank == 0 else 4), np.float32)
    expect_raises(IA, lambda: braid.allgather(z, name="z"), "allgather trailing mismatch",
                  contains=("tensor 'z'", "trailing shape differs"))
    # broadcast: root ranks must agree and exist
    expect_raises(IA, lambda: braid.broadcast(np.ones(2), root_rank=rank, name="r"),
                  "broadcast root mismatch", contains=("tensor 'r'", "root rank differs"))
    expect_raises(IA, lambda: braid.broadcast(np.ones(2), root_rank=size, name="r2"),
                  "broadcast root out of range", contains=("tensor 'r2'", "root rank"))
    # Async form: the error arrives through synchronize.
    h = braid.allreduce_async(np.ones(2 + (rank == 1), np.float32), name="xa")
    expect_raises(IA, lambda: braid.synchronize(h), "allreduce_async shape mismatch",
                  contains="tensor 'xa': shape differs across ranks")
    check(braid.poll(h), "poll() after a failed collective")
    expect_raises(IA, lambda: braid.synchronize(h), "synchronize again raises again",
                  contains="tensor 'xa'")


def staggered(rank, size, tag, on_own_turn):
    """For each rank k in turn: rank k starts collective tag.k and runs on_own_turn(h) while
    the others have not submitted it yet (so it cannot complete); then an all-reduce lets the
    others submit it (not a barrier: what some ranks submitted before a barrier never pairs
    with what others submit after it). Returns the handles to synchronize."""
    handles = []
    go = np.zeros(1, np.float32)
    for k in range(size):
        name = f"{tag}.{k}"
        x = np.full(3, float(k), np.float32)
        if rank == k:
            h = braid.allreduce_async(x, name=name, op=braid.Sum)
            on_own_turn(h, name)
            braid.allreduce(go, name=f"{name}.go")
        else:
            braid.allreduce(go, name=f"{name}.go")
            h = braid.allreduce_async(x, name=name, op=braid.Sum)
        handles.append((h, np.full(3, float(k * size), np.float32)))
    for h, want in handles:
        check_array(braid.synchronize(h), want, f"{tag}: {h.name} completes afterwards")


def already_exists(rank, size):
    def own(h, name):
        msg = expect_raises(
            braid.AlreadyExistsError,
            lambda: braid.allreduce_async(np.ones(3, np.float32), name=name, op=braid.Sum),
            "a second async collective with the same name",
            contains=(f"tensor '{name}' is already in flight on rank {rank}",))
        check(msg is None or issubclass(braid.AlreadyExistsError, braid.BraidError),
              "AlreadyExistsError is a BraidError")
        check(not braid.poll(h), f"{name} still pending")
    staggered(rank, size, "dup", own)


def deadline(rank, size):
    def own(h, name):
        t0 = time.monotonic()
        expect_raises(braid.DeadlineExceededError, lambda: braid.synchronize(h, timeout=0.3),
                      "synchronize(timeout=0.3) of a collective the others have not submitted",
                      contains=(f"'{name}'", "still running"))
        dt = time.monotonic() - t0
        check(0.25 <= dt < 5, f"synchronize(timeout=0.3) returned after {dt:.2f} s")
    staggered(rank, size, "late", own)


def interrupt(rank, size):
    def own(h, name):
        timer = threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGINT))
        t0 = time.monotonic()
        timer.start()
        expect_raises(KeyboardInterrupt, lambda: braid.synchronize(h),
                      "Ctrl-C while synchronizing")
        dt = time.monotonic() - t0
        timer.join()
        check(dt < 5, f"KeyboardInterrupt took {dt:.2f} s")
        check(not braid.poll(h), "the collective is still pending after Ctrl-C")
    staggered(rank, size, "intr", own)


def fork_child(rank, size):
    """A forked child (like a DataLoader worker) cannot use the job and must not end it."""
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            if braid.is_initialized():
                print("child: is_initialized() is True in a forked child", flush=True)
                code = 3
            try:
                braid.allreduce(np.ones(2, np.float32), name="child")
                print("child: allreduce did not raise", flush=True)
                code = 4
            except braid.FailedPreconditionError as e:
                if "fork" not in str(e):
                    print(f"child: unexpected message {e}", flush=True)
                    code = 5
            if (braid.rank(), braid.size()) != (rank, size):
                print(f"child: rank/size {(braid.rank(), braid.size())}", flush=True)
                code = 7
            braid.shutdown()  # a no-op in the child
            atexit._run_exitfuncs()  # what a normal interpreter exit does
        except BaseException as e:  # noqa: B902
            print(f"child: {type(e).__name__}: {e}", flush=True)
            code = 6
        os._exit(code)
    deadline_t = time.monotonic() + 20
    status = None
    while time.monotonic() < deadline_t:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.02)
    else:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        fail("forked child hung (did its exit shut down the parent's runtime?)")
        return
    check(os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0,
          f"forked child exit status {status:#x}")
    check(braid.is_initialized(), "parent still initialized after the child exited")
    check_array(braid.allreduce(np.ones(2, np.float32), name="after-fork", op=braid.Sum),
                np.full(2, float(size), np.float32), "allreduce after a child exited")


def cancelled(rank, size):
    h = None
    braid.barrier(name="before-shutdown")
    if rank == 0:  # after the barrier: one submitted before it would fail as it completed
        h = braid.allreduce_async(np.ones(5, np.float32), name="lonely")
    if rank != 0:
        time.sleep(0.5)  # rank 0 leaves first, so nothing else can fail 'lonely'
    t0 = time.monotonic()
    braid.shutdown()
    dt = time.monotonic() - t0
    check(dt < 5, f"shutdown took {dt:.2f} s")
    check(not braid.is_initialized(), "is_initialized() after shutdown()")
    if rank == 0:
        check(braid.poll(h), "pending collective completed by shutdown")
        expect_raises(braid.CancelledError, lambda: braid.synchronize(h),
                      "synchronize of a collective pending at shutdown",
                      exact="braid was shut down before 'lonely' completed")
    expect_raises(braid.FailedPreconditionError, braid.rank, "rank() after shutdown",
                  contains="shut down")
    expect_raises(braid.FailedPreconditionError,
                  lambda: braid.allreduce(np.ones(2, np.float32)), "allreduce after shutdown",
                  contains="shut down")
    braid.shutdown()  # harmless twice


def body():
    before_init()
    braid.init()
    braid.init()  # harmless
    check(braid.is_initialized(), "is_initialized() after init()")
    rank, size = braid.rank(), braid.size()
    log(f"rank {rank} of {size}")
    local_errors(rank, size)
    braid.barrier()
    cross_rank_errors(rank, size)
    already_exists(rank, size)
    deadline(rank, size)
    interrupt(rank, size)
    fork_child(rank, size)
    # Everything still works after the errors above.
    check_array(braid.allreduce(np.full(4, rank, np.int64), op=braid.Sum, name="sanity"),
                np.full(4, size * (size - 1) // 2, np.int64), "allreduce after the errors")
    cancelled(rank, size)


if __name__ == "__main__":
    main(body)
