"""A failure anywhere reaches every rank, on 2 real ranks (docs/failures.md).
Run with BRAID_NEGOTIATION_TIMEOUT_S=5.

1. Rank 1 asks for fp16 on an int32 tensor: the runtime refuses it locally and reports it;
   rank 0, which submitted the same tensor correctly, gets InvalidArgumentError within 2 s
   naming the tensor, rank 1 and the cause. Rank 1 goes on at once.
2. The same with a refusal of the Python layer (an unsupported dtype on rank 0).
3. The ranks call a collective under different names: both names fail on every rank with
   DeadlineExceededError within 10 s, naming the rank that submitted and the one that did not.
After each, a valid all-reduce returns the exact sum (the job goes on; after the deadline,
which leaves the job out of step, once the ranks called barrier()). Last,
start_timeline / stop_timeline record exactly what ran between them (rank r > 0 into
PATH.rank<r>).
"""

import os
import time

import numpy as np

import braid
from _common import check, check_array, expect_raises, fail, log, main


def sum_works(rank, size, name):
    got = braid.allreduce(np.full(8, rank + 1, np.float32), name=name, op=braid.Sum)
    check_array(got, np.full(8, size * (size + 1) / 2, np.float32), f"{name} after a failure")


def peer_waits_for(name, fn, within, cls, contains):
    """A refusal reported by the peer reaches this rank as the report's error (this rank's
    call was at the coordinator first) or, when its call came after the report, as the
    poisoned name's FailedPreconditionError quoting it (docs/failures.md: No error shifts a
    step): which one depends on timing, the cause named is the same."""
    t0 = time.monotonic()
    try:
        fn()
        msg = None
        fail(f"'{name}' on the waiting rank returned normally")
    except braid.BraidError as e:
        msg = str(e)
        check(type(e) in (cls, braid.FailedPreconditionError),
              f"'{name}': {type(e).__name__}, expected {cls.__name__}")
        for c in (contains,) if isinstance(contains, str) else contains:
            check(c in msg, f"'{name}': {c!r} not in {msg!r}")
    took = time.monotonic() - t0
    log(f"'{name}' failed after {took:.2f} s: {msg}")
    check(took < within, f"'{name}' failed after {took:.2f} s, more than {within} s")


def body():
    braid.init()
    rank, size = braid.rank(), braid.size()
    IA = braid.InvalidArgumentError
    # 1. The runtime refuses: fp16 applies to floating-point tensors only.
    if rank == 1:
        expect_raises(IA, lambda: braid.allreduce(np.arange(8, dtype=np.int32), name="grad.w",
                                                  op=braid.Sum, compression="fp16"),
                      "fp16 on int32", contains=("'grad.w'", "rank 1", "compression 'fp16'"))
    else:
        peer_waits_for("grad.w", lambda: braid.allreduce(np.arange(8, dtype=np.int32),
                                                         name="grad.w", op=braid.Sum),
                       2.0, IA, ("tensor 'grad.w' failed on rank 1", "compression 'fp16'"))
    sum_works(rank, size, "after.runtime")
    # 2. The Python layer refuses: complex64 is not a dtype braid reduces.
    if rank == 0:
        expect_raises(IA, lambda: braid.allreduce(np.zeros(8, np.complex64), name="grad.b"),
                      "complex64", contains="unsupported dtype complex64")
    else:
        peer_waits_for("grad.b", lambda: braid.allreduce(np.zeros(8, np.float32), name="grad.b"),
                       2.0, IA, ("tensor 'grad.b' failed on rank 0", "unsupported dtype"))
    sum_works(rank, size, "after.python")
    # 3. Different names: nobody can see it but the coordinator's deadline. The tensor that
    # waited longest expires (DeadlineExceededError); the other rank's, a moment younger,
    # fails with the same deadline quoted (FailedPreconditionError): which is which depends
    # on which rank submitted first.
    mine = f"step.rank{rank}"
    peer_waits_for(mine, lambda: braid.allreduce(np.ones(8, np.float32), name=mine), 10.0,
                   braid.DeadlineExceededError,
                   (f"tensor '{mine}'", "was not negotiated within 5s",
                    f"submitted by rank {rank}", f"by rank {1 - rank}"))
    # A deadline leaves the job out of step: every call fails until a barrier.
    expect_raises(braid.FailedPreconditionError,
                  lambda: braid.allreduce(np.ones(8, np.float32), name="after.deadline"),
                  "a call after the deadline", contains="the ranks are out of step")
    braid.barrier()
    sum_works(rank, size, "after.deadline")
    timeline(rank, size)
    braid.shutdown()


def timeline(rank, size):
    expect_raises(braid.InvalidArgumentError, lambda: braid.start_timeline(3), "a path of 3",
                  contains="file_path must be a str")
    path = f"/tmp/braid-failures-timeline-{os.getppid()}.json"  # the launcher's, shared
    mine = path if rank == 0 else f"{path}.rank{rank}"
    braid.start_timeline(path)
    sum_works(rank, size, "timeline.on")
    braid.stop_timeline()
    sum_works(rank, size, "timeline.off")
    with open(mine) as f:
        text = f.read()
    os.remove(mine)
    check('"timeline.on"' in text and "timeline.off" not in text,
          f"{mine} holds what ran while recording only: {text[:300]}")
    check(text.rstrip().endswith("]"), f"{mine} is closed: {text[-100:]}")


if __name__ == "__main__":
    main(body)
