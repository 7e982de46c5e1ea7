"""Rank program: object collectives whose object fails to pickle or unpickle on one rank
(docs/failures.md). Run with BRAID_NEGOTIATION_TIMEOUT_S=2.

Every failure is an InvalidArgumentError on every rank, at once (well within the negotiation
timeout), naming the collective, the rank that failed and its cause; afterwards the next
object collectives (generated names and the same explicit name again) return the right
objects, so no rank's names shifted.
"""

import time

import numpy as np

import braid
from _common import check, check_array, expect_raises, log, main


def _explode():
    raise ValueError("this object cannot be rebuilt")


class Unpicklable:
    """Pickles fine; unpickling it raises (as a class missing on the receiving side does)."""

    def __reduce__(self):
        return (_explode, ())


def fails_everywhere(what, fn, contains, within=1.5):
    t0 = time.monotonic()
    msg = expect_raises(braid.InvalidArgumentError, fn, what, contains=contains)
    took = time.monotonic() - t0
    log(f"{what}: failed after {took:.2f} s: {msg}")
    check(took < within, f"{what}: failed after {took:.2f} s, more than {within} s")


def body():
    braid.init()
    rank, size = braid.rank(), braid.size()
    last = size - 1
    # The root cannot pickle its object (a lambda): every rank fails at once.
    fails_everywhere("broadcast_object of a lambda",
                     lambda: braid.broadcast_object((lambda: 1) if rank == 0 else None),
                     ("broadcast_object 'broadcast_object.noname.0'",
                      "rank 0 could not pickle its object", "lambda"))
    got = braid.broadcast_object({"step": 3} if rank == 0 else None)
    check(got == {"step": 3}, f"broadcast_object after a failure: {got!r}")
    # The same explicit name again after its failure.
    fails_everywhere("broadcast_object 'config' of a lambda",
                     lambda: braid.broadcast_object((lambda: 2) if rank == last else None,
                                                    root_rank=last, name="config"),
                     ("broadcast_object 'config'", f"rank {last} could not pickle"))
    got = braid.broadcast_object([rank] if rank == last else None, root_rank=last,
                                 name="config")
    check(got == [last], f"broadcast_object 'config' after its failure: {got!r}")
    # The receivers cannot unpickle what the root sent: the root fails too.
    fails_everywhere("broadcast_object that cannot be unpickled",
                     lambda: braid.broadcast_object(Unpicklable() if rank == 0 else None),
                     ("broadcast_object 'broadcast_object.noname.2'",
                      f"rank {last} could not unpickle", "this object cannot be rebuilt"))
    # allgather_object: the last rank cannot pickle its object; then nobody can unpickle.
    fails_everywhere("allgather_object with a lambda on one rank",
                     lambda: braid.allgather_object((lambda: 3) if rank == last else rank),
                     ("allgather_object 'allgather_object.noname.0'",
                      f"rank {last} could not pickle its object"))
    fails_everywhere("allgather_object that cannot be unpickled",
                     lambda: braid.allgather_object(Unpicklable() if rank == 0 else rank),
                     ("allgather_object 'allgather_object.noname.1'", "rank 0 could not "
                      "unpickle rank 0's object", "this object cannot be rebuilt"))
    got = braid.allgather_object({"rank": rank})
    check(got == [{"rank": r} for r in range(size)], f"allgather_object after failures: {got}")
    got = braid.allreduce(np.full(4, rank + 1, np.float32), name="after.objects", op=braid.Sum)
    check_array(got, np.full(4, size * (size + 1) / 2, np.float32), "all-reduce afterwards")
    braid.shutdown()


if __name__ == "__main__":
    main(body)
