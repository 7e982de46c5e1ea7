"""Rank program for process sets (Note [Process sets] in control/process_sets.h), 4 ranks.

    process_sets.py static DIR init(process_sets=[{0,1}, {2,3}, {1,2,3}]) in Horovod's
                               style: disjoint sets reduce different tensors at once, each
                               with its own exact result, one of them stalled on purpose
                               while the other runs; overlapping sets under load; a rank
                               outside a set; every compression method, broadcast, allgather
                               and join inside a set; DistributedOptimizer on 2 of 4 ranks
    process_sets.py dynamic    init(process_sets="dynamic"): add/remove, mismatched adds
                               (an error on every rank naming the ranks), a set removed while
                               one of its collectives is pending
    process_sets.py leave      one set's ranks leave the job while another set's collective
                               is pending: the other set goes on
"""

import json
import os
import sys
import time

import numpy as np
import torch

import braid
import braid.torch as hvd
from braid._core.compression import compression_methods
from _common import RANK, check, expect_raises, log, main

STEPS_OVERLAP = 1000


def static():
    even, odd = hvd.ProcessSet([0, 1]), hvd.ProcessSet([2, 3])
    upper = hvd.ProcessSet([3, 2, 1])  # any order; kept ascending
    hvd.init(process_sets=[even, odd, upper])
    r = hvd.rank()
    check((even.process_set_id, odd.process_set_id, upper.process_set_id) == (1, 2, 3),
          f"ids {even.process_set_id}, {odd.process_set_id}, {upper.process_set_id}")
    check(upper.ranks == [1, 2, 3] and upper.size() == 3, f"upper {upper!r}")
    check(even.included() == (r < 2) and odd.included() == (r >= 2), "included()")
    check(upper.rank() == (None if r == 0 else r - 1), f"upper.rank() {upper.rank()}")
    mine = even if r < 2 else odd

    # Disjoint sets at once, the same names in both, each its own exact result.
    x = torch.full((5,), float(r + 1))
    got = hvd.allreduce(x, name="grad", op=hvd.Sum, process_set=mine)
    want = 1 + 2 if r < 2 else 3 + 4
    check(torch.equal(got, torch.full((5,), float(want))), f"disjoint sum {got}")
    avg = hvd.allreduce(x, name="grad.avg", process_set=mine)
    check(torch.equal(avg, torch.full((5,), want / 2.0)), f"disjoint average {avg}")

    # A set stalled on purpose does not delay the other: ranks 2, 3 do not call their set's
    # collective until rank 0 has finished 20 all-reduces of set {0, 1} and said so in a
    # file; were set {0, 1} held back by the stalled set, that file would never come.
    marker = os.path.join(sys.argv[2], "pair-done")
    if r >= 2:
        deadline = time.monotonic() + 60
        while not os.path.exists(marker) and time.monotonic() < deadline:
            time.sleep(0.05)
        check(os.path.exists(marker), "set {0,1} never finished while set {2,3} was stalled")
        hvd.allreduce(x, name="late", process_set=odd)
    else:
        for i in range(20):
            hvd.allreduce(x, name=f"quick.{i}", process_set=even)
        if r == 0:
            with open(marker + ".tmp", "w") as f:
                f.write("done")
            os.replace(marker + ".tmp", marker)
    hvd.barrier()

    # Overlapping sets under load: {1,2,3} and {0,1} / {2,3} interleaved, async, every step.
    timeline = os.path.join(sys.argv[2], "overlap.json")
    hvd.start_timeline(timeline)
    for step in range(STEPS_OVERLAP):
        hs = []
        if upper.included():
            hs.append(hvd.allreduce_async(torch.ones(3) * r, name="ov.up", op=hvd.Sum,
                                          process_set=upper))
        hs.append(hvd.allreduce_async(torch.ones(2) * r, name="ov.pair", op=hvd.Sum,
                                      process_set=mine))
        hs.append(hvd.allreduce_async(torch.ones(1), name="ov.world", op=hvd.Sum))
        outs = [hvd.synchronize(h) for h in hs]
        if step == STEPS_OVERLAP - 1:
            if upper.included():
                check(torch.equal(outs[0], torch.full((3,), 6.0)), f"upper {outs[0]}")
            check(torch.equal(outs[-2], torch.full((2,), 1.0 if r < 2 else 5.0)),
                  f"pair {outs[-2]}")
            check(torch.equal(outs[-1], torch.full((1,), 4.0)), f"world {outs[-1]}")
    hvd.stop_timeline()
    if r == 1:  # in {0,1} and {1,2,3}: the sets' cached steps went the fast path's way
        fast = _fast_path_buckets(timeline + ".rank1")
        for name in ("ps1/ov.pair", "ps3/ov.up"):
            check(fast.get(name, 0) > 0, f"no step of '{name}' agreed by the fast path: {fast}")

    # A call one member refuses before the runtime sees it (a dtype braid does not reduce)
    # is reported within the set: the other member fails at once, naming it.
    # (InvalidArgumentError, or FailedPreconditionError naming the same cause when the report
    # came first: docs/failures.md.)
    first = mine.ranks[0]
    bad_in = torch.ones(2, dtype=torch.complex64) if r == first else torch.ones(2)
    try:
        hvd.allreduce(bad_in, name="refused", process_set=mine)
        check(False, "a call one member refused did not raise")
    except (hvd.InvalidArgumentError, hvd.FailedPreconditionError) as e:
        check("unsupported dtype torch.complex64" in str(e) and
              (r == first or f"failed on rank {first}" in str(e)),
              f"a call one member refused: {e}")

    # A rank outside a set.
    if r == 0:
        expect_raises(hvd.InvalidArgumentError,
                      lambda: hvd.allreduce(x, name="outside", process_set=odd),
                      "allreduce on a set without this rank", ("not in process set 2", "2, 3"))

    # Broadcast (root: a rank of the job in the set), allgather (set order), barrier.
    b = hvd.broadcast(torch.full((2,), float(r)), root_rank=3, name="bc", process_set=upper) \
        if upper.included() else None
    if upper.included():
        check(torch.equal(b, torch.full((2,), 3.0)), f"broadcast {b}")
    g = hvd.allgather(torch.full((r + 1, 2), float(r)), name="ag", process_set=mine)
    lo = 0 if r < 2 else 2
    want = torch.cat([torch.full((lo + 1, 2), float(lo)), torch.full((lo + 2, 2), float(lo + 1))])
    check(torch.equal(g, want), f"allgather in a set {g.tolist()}")
    hvd.barrier(process_set=mine)
    if upper.included():
        expect_raises(hvd.InvalidArgumentError,
                      lambda: hvd.broadcast(x, root_rank=0, name="bc.bad", process_set=upper),
                      "broadcast from a root outside the set", "not in process set 3")

    # all-to-all and reduce-scatter go by rank in the set.
    if upper.included():
        k = upper.rank()
        sent = torch.arange(6, dtype=torch.float32) + 10 * k  # rows 2j, 2j+1 go to member j
        got = hvd.alltoall(sent, name="a2a", process_set=upper)
        want = torch.tensor([10.0 * j + 2 * k + i for j in range(3) for i in range(2)])
        check(torch.equal(got, want), f"alltoall in a set {got.tolist()}")
        rs = hvd.reducescatter(torch.ones(7, 2), name="rs", op=hvd.Sum, process_set=upper)
        check(rs.shape == ((3 if k == 0 else 2), 2) and bool((rs == 3).all()),
              f"reducescatter in a set {rs.shape} {rs}")
        # Objects and parameters from a root of the set.
        check(hvd.broadcast_object({"r": r}, root_rank=2, process_set=upper) == {"r": 2},
              "broadcast_object in a set")
        check(hvd.allgather_object(r, process_set=upper) == [1, 2, 3], "allgather_object")
        lin = torch.nn.Linear(2, 2)
        with torch.no_grad():
            lin.weight.fill_(float(r))
        hvd.broadcast_parameters(lin.state_dict(), root_rank=3, process_set=upper)
        check(bool((lin.weight == 3).all()), f"broadcast_parameters in a set {lin.weight}")
    # The NumPy API in a set, on the same runtime.
    a = braid.allreduce(np.full(3, r, np.float64), name="np", op=braid.Sum, process_set=mine)
    check(np.array_equal(a, np.full(3, 1.0 if r < 2 else 5.0)), f"NumPy API in a set {a}")

    # Every compression method inside a set, on every member alike.
    for method in compression_methods():
        t = torch.linspace(-1, 1, 256).reshape(16, 16) * (mine.rank() + 1)
        out = hvd.allreduce(t, name=f"c.{method}", compression=method, process_set=mine)
        others = hvd.allgather(out.reshape(1, -1), name=f"c.{method}.same", process_set=mine)
        check(torch.equal(others[0], others[1]), f"{method}: members differ")
        if method == "none":
            check(torch.allclose(out, torch.linspace(-1, 1, 256).reshape(16, 16) * 1.5),
                  f"none in a set {out[0, :3]}")

    # join inside a set: rank 1 (of {0,1}) runs out of data after 2 steps, rank 0 after 4.
    if r < 2:
        steps = 4 if r == 0 else 2
        for i in range(steps):
            s = hvd.allreduce(torch.ones(3), name="j.step", op=hvd.Sum, process_set=even)
            want = 2.0 if i < 2 else 1.0
            check(torch.equal(s, torch.full((3,), want)), f"join step {i}: {s}")
        last = hvd.join(process_set=even)
        check(last == 0, f"join's last rank {last}")

    # DistributedOptimizer on {2,3} only: averages over those 2.
    if odd.included():
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 1, bias=False)
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1.0),
                                       named_parameters=model.named_parameters(),
                                       process_set=odd)
        w0 = model.weight.detach().clone()
        model(torch.full((1, 4), float(r))).sum().backward()  # gradient: r per weight
        opt.step()
        check(torch.allclose(model.weight, w0 - 2.5), f"optimizer in a set {model.weight}")
    hvd.barrier()
    hvd.shutdown()


def leave():
    """Set {1,3} finishes and leaves the job while a collective of set {0,2} is pending on
    rank 0 (held for the fast path's vote): set {0,2} goes on unharmed."""
    a, b = hvd.ProcessSet([0, 2]), hvd.ProcessSet([1, 3])
    hvd.init(process_sets=[a, b])
    r = hvd.rank()
    mine = a if a.included() else b
    for _ in range(3):  # cached: the next step would go the fast path's way
        hvd.allreduce(torch.ones(1), name="w", process_set=mine)
    hvd.barrier()
    if mine is b:
        time.sleep(0.5)
        hvd.shutdown()
        return
    if r == 2:
        time.sleep(2.0)  # rank 0's call waits meanwhile; set {1,3} leaves
    got = hvd.allreduce(torch.ones(1) * r, name="w", op=hvd.Sum, process_set=a)
    check(torch.equal(got, torch.full((1,), 2.0)), f"set {{0,2}} after {{1,3}} left: {got}")
    got = hvd.allreduce(torch.ones(1), name="w", op=hvd.Sum, process_set=a)
    check(torch.equal(got, torch.full((1,), 2.0)), f"and the step after: {got}")
    hvd.shutdown()


def _fast_path_buckets(path):
    """Per tensor, the buckets of a timeline the ranks agreed without the coordinator (the
    fast path numbers them below 0)."""
    with open(path) as f:
        text = f.read().rstrip()
    events = json.loads(text if text.endswith("]") or text.endswith("}") else
                        text.rstrip(",") + "]")
    events = events["traceEvents"] if isinstance(events, dict) else events
    threads = {e["tid"]: e["args"]["name"] for e in events
               if e.get("ph") == "M" and e.get("name") == "thread_name"}
    out = {}
    for e in events:
        bucket = (e.get("args") or {}).get("bucket")
        if bucket is not None and bucket < 0:
            name = threads.get(e.get("tid"), "?")
            out[name] = out.get(name, 0) + 1
    return out


def dynamic():
    hvd.init(process_sets="dynamic")
    r = hvd.rank()
    ps = hvd.add_process_set([0, 2])
    check(ps.process_set_id == 1 and ps.ranks == [0, 2], f"added {ps!r}")
    if ps.included():
        s = hvd.allreduce(torch.ones(2) * r, name="d", op=hvd.Sum, process_set=ps)
        check(torch.equal(s, torch.full((2,), 2.0)), f"dynamic set sum {s}")
        hvd.allreduce(torch.ones(2), op=hvd.Sum, process_set=ps)  # unnamed, counted in set 1
    expect_raises(hvd.AlreadyExistsError, lambda: hvd.add_process_set(hvd.ProcessSet([0, 2])),
                  "a duplicate set", "already exists as process set 1")
    if ps.included():
        expect_raises(hvd.InvalidArgumentError,
                      lambda: hvd.allreduce(torch.ones(1), process_set=hvd.ProcessSet([2, 0])),
                      "an equal but unregistered ProcessSet", "registered as process set 1")
    # Mismatched adds: rank 3 asks for another set; every rank fails, naming both.
    want = [1, 3] if r == 3 else [1, 2]
    expect_raises(hvd.InvalidArgumentError, lambda: hvd.add_process_set(want),
                  "mismatched add_process_set", ("add_process_set([1, 2]) on ranks 0, 1, 2",
                                                 "add_process_set([1, 3]) on rank 3"))
    # A set removed while one of its collectives is pending: rank 0 submits, rank 2 never
    # does; the removal fails it on rank 0 naming the set.
    pending = None
    if r == 0:
        pending = hvd.allreduce_async(torch.ones(2), name="never", process_set=ps)
        time.sleep(0.5)
    check(hvd.remove_process_set(ps) is True, "remove_process_set")
    if r == 0:
        expect_raises(hvd.FailedPreconditionError, lambda: hvd.synchronize(pending),
                      "a collective of a removed set", ("process set 1", "removed"))
    expect_raises(hvd.InvalidArgumentError,
                  lambda: hvd.allreduce(torch.ones(1), name="gone", process_set=ps),
                  "a removed set", "not registered")
    check(hvd.remove_process_set(ps) is False, "removing a removed set again")
    ps2 = hvd.add_process_set(hvd.ProcessSet([0, 3]))  # the freed id again
    check(ps2.process_set_id == 1, f"reused id {ps2.process_set_id}")
    if ps2.included():
        s = hvd.allreduce(torch.ones(1) * r, name="d", op=hvd.Sum, process_set=ps2)
        check(torch.equal(s, torch.full((1,), 3.0)), f"reused id's sum {s}")
        # Unnamed calls count from 0 in the new set: rank 0 made unnamed calls in the removed
        # set 1, rank 3 none; they must still pair.
        s = hvd.allreduce(torch.ones(1), op=hvd.Sum, process_set=ps2)
        check(torch.equal(s, torch.full((1,), 2.0)), f"an unnamed call in the reused id {s}")
    # One rank's refused change (repeated ranks) fails on every rank, and the next change
    # pairs as before.
    # (InvalidArgumentError where the change was submitted before rank 1's report came,
    # FailedPreconditionError naming the same cause where it came after: docs/failures.md.)
    bad = [2, 2] if r == 1 else [1, 2]
    try:
        hvd.add_process_set(bad)
        check(False, "a change one rank refused did not raise")
    except (hvd.InvalidArgumentError, hvd.FailedPreconditionError) as e:
        check("rank 1" in str(e) and "ascending and distinct" in str(e),
              f"a change one rank refused: {e}")
    ps3 = hvd.add_process_set([1, 2])
    check(ps3.process_set_id == 2 and ps3.ranks == [1, 2], f"the change after a refusal {ps3!r}")
    hvd.barrier()
    hvd.shutdown()


if __name__ == "__main__":
    main({"static": static, "dynamic": dynamic, "leave": leave}[sys.argv[1]])
