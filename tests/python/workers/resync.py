"""Recovering after an error, on 2 ranks, as a user of the Python API does it
(docs/failures.md: "No error shifts a step"). Run with
BRAID_NEGOTIATION_TIMEOUT_S=1.

1. A rank late by more than the negotiation deadline: the other's barrier() fails, it calls
   barrier() again, and the late rank's single barrier() pairs with that retry (an unnamed
   barrier has one name on every rank, so a failed one does not shift the next).
2. An unnamed call refused in the Python layer on one rank (NumPy: complex64; torch: int8)
   fails the other rank's unnamed call at once, naming the rank and the cause: the refusal
   is reported under the name the other rank generated for the same call.
3. A message quoting a name with a NUL byte arrives whole.
4. An object collective with a name that is not a str is InvalidArgumentError on every rank.
"""

import time

import numpy as np
import torch

import braid
import braid.torch as hvd
from _common import check, check_array, expect_raises, log, main


def late_rank_then_barrier(rank, size):
    x = np.full(4, float(rank + 1), np.float32)
    if rank == 1:
        time.sleep(2.5)  # beyond the 1 s deadline, and beyond rank 0's first barrier's
    try:
        braid.allreduce(x, name="late", op=braid.Sum)
        check(False, "'late' returned although rank 1 came 2.5 s late")
    except braid.BraidError as e:
        log(f"rank {rank}: 'late' failed: {type(e).__name__}")
    tries = 0
    while True:
        tries += 1
        try:
            braid.barrier()
            break
        except braid.BraidError as e:
            log(f"rank {rank}: barrier try {tries} failed: {type(e).__name__}")
            check(tries < 4, "barrier() did not resynchronize within 4 tries")
            if tries >= 4:
                return
    check_array(braid.allreduce(x, name="late", op=braid.Sum),
                np.full(4, 3.0, np.float32), "'late' after the barrier")


def peer_fails_at_once(rank, call, refuse, what):
    t0 = time.monotonic()
    if rank == 1:
        expect_raises(braid.InvalidArgumentError, refuse, f"{what} on rank 1")
        return
    # The report itself, or (rank 0's call came after it) the poisoned name's error quoting it.
    try:
        call()
        msg = None
        check(False, f"{what}: rank 0's call returned")
    except (braid.InvalidArgumentError, braid.FailedPreconditionError) as e:
        msg = str(e)
        check("failed on rank 1" in msg, f"{what}: {msg!r} does not name rank 1's failure")
    took = time.monotonic() - t0
    log(f"{what}: rank 0 failed after {took:.2f} s: {msg}")
    check(took < 0.9, f"{what}: rank 0 waited {took:.2f} s (the deadline is 1 s)")


def body():
    braid.init()
    rank, size = braid.rank(), braid.size()
    late_rank_then_barrier(rank, size)
    braid.barrier()
    peer_fails_at_once(
        rank, lambda: braid.allreduce(np.zeros(8, np.float32), op=braid.Sum),
        lambda: braid.allreduce(np.zeros(8, np.complex64), op=braid.Sum), "NumPy unnamed")
    braid.barrier()
    peer_fails_at_once(
        rank, lambda: hvd.allreduce(torch.zeros(8), op=hvd.Sum),
        lambda: hvd.allreduce(torch.zeros(8, dtype=torch.int8), op=hvd.Sum), "torch unnamed")
    braid.barrier()
    # 3. The name's NUL byte and what follows it reach the exception's message.
    name = "g\x00h"
    if rank == 0:  # refused by the runtime: its message crosses into Python
        expect_raises(braid.InvalidArgumentError,
                      lambda: braid.allreduce(np.zeros(2, np.int32), name=name, op=braid.Sum,
                                              compression="fp16"),
                      "a refused call named 'g\\x00h'",
                      contains="allreduce 'g\x00h' on rank 0: compression 'fp16' applies only")
    braid.barrier()
    # 4. Every rank refuses the name before any collective: nobody waits.
    expect_raises(braid.InvalidArgumentError, lambda: braid.broadcast_object(1, 0, name=5),
                  "broadcast_object(name=5)", contains="name must be a str, got int 5")
    check(braid.broadcast_object(rank, 0) == 0, "broadcast_object after a refused name")
    braid.shutdown()


if __name__ == "__main__":
    main(body)
