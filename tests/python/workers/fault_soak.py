"""A randomized fault soak: no error ever makes braid return a wrong value, hang, or fail on
one side (docs/failures.md: "No error shifts a step").

Every rank runs the same schedule, drawn from --seed: steps of a mixed workload (all-reduce of
every dtype and op and with every compression method, all-gather, broadcast, reduce-scatter,
all-to-all, broadcast_object, allgather_object), with the same tensor names step after step
(so the response cache and the fast path are exercised), and now and then a fault on one
random rank, in one random collective of the step:

  name      the rank calls it under another name (for this step only)
  refuse    the rank makes a call braid refuses locally (fp16 on an int32 tensor)
  mismatch  the rank's tensor has one element more
  delay     the rank starts the step late (no error may follow)
  object    the rank's object cannot be pickled (an object collective)
  skip      the rank does not make the call

After a fault step every rank calls barrier() (the documented resynchronization), either
after waiting for the step's handles or before (then a call the others skipped fails as the
barrier completes instead of at the negotiation deadline). The next step repeats the faulted
collective. Checks, on every rank:
- every call that returns is checked against the exact value of that step on that rank (the
  data names the step: a call paired with another rank's other step gives another value);
  PowerSGD (rank-1 data, reconstructed exactly up to float rounding; without error feedback,
  which would accumulate that rounding) to a relative 1e-4; fp4 and int4 take values on their
  grids, so their stochastic rounding has nothing to round;
- every call a fault touched fails on this rank, within the configured bounds; every other
  call returns;
- no wait outlives its bound (a hang), and no step outlives the watchdog.
It stops at the first violation, printing the seed and the step, and exits 1. At the end it
prints one summary line per rank: collectives, the share that returned, and the faults of
each kind injected.

Run under a launcher: braidrun -np N python3 fault_soak.py --seed S --steps K. The job's
bounds come from the environment (BRAID_NEGOTIATION_TIMEOUT_S, BRAID_STALL_CHECK_S, both 2 s
or less for a soak), and BRAID_FAST_PATH / BRAID_FUSION_THRESHOLD choose the paths.
"""

import argparse
import os
import random
import signal
import sys
import threading
import time

import numpy as np

import braid

KINDS = ("name", "refuse", "mismatch", "delay", "object", "skip")


class Violation(Exception):
    pass


# ---- the workload ----------------------------------------------------------------------------

def base(step, salt):
    """A value in 1..31 that names the step (so a call paired across steps is wrong)."""
    return (step * 7 + salt) % 31 + 1


def pow2_parts(size):
    """Powers of two, one per rank, whose sum is a power of two: fp4 (and int4, times 7) then
    reduce them exactly (every chunk's values and their sum sit on the format's grid)."""
    parts, total = [1] * size, size
    while total & (total - 1):
        parts[-1] *= 2
        total = sum(parts)
    return parts


class Spec:
    """One collective of the menu: how rank r builds its input at a step, the result it
    expects, and how to call it."""

    def __init__(self, name, kind, dtype=np.float32, op=None, compression=None, rtol=0.0):
        self.name, self.kind, self.dtype, self.op = name, kind, dtype, op
        self.compression, self.rtol = compression, rtol

    # Inputs and the expected result ------------------------------------------------------
    def data(self, rank, size, step):
        b = base(step, len(self.name))
        if self.kind == "allreduce":
            if self.compression and self.compression.startswith(("fp4", "int4")):
                # int4's scale is max/7: with 7·2^k it is 2^k, and x/scale exactly 7 (else a
                # 6.9999995 rounds stochastically to 6 once in millions).
                seven = 7 if self.compression.startswith("int4") else 1
                return np.full(256, float(seven * 2 ** (step % 6) * pow2_parts(size)[rank]),
                               np.float32)
            if self.compression and self.compression.startswith("powersgd"):
                u = np.arange(1, 17, dtype=np.float32) / 16
                v = (np.arange(12, dtype=np.float32) % 3 + 1) / 4
                return (float((step % 5 + 1) * (rank + 1)) * np.outer(u, v)).astype(np.float32)
            if self.op is braid.Average:
                return np.full(5, size * (b + rank), self.dtype)
            if self.compression in ("fp16", "bf16"):
                return np.full(7, b + rank, np.float32)
            return (b * (rank + 1) + np.arange(6)).astype(self.dtype)
        if self.kind == "allgather":
            return (b + 10 * rank + np.arange(3 * (rank + 1))).reshape(rank + 1, 3).astype(np.int32)
        if self.kind == "broadcast":
            root = step % size
            return (b + np.arange(6)).astype(np.float32) if rank == root else np.zeros(6, np.float32)
        if self.kind == "reducescatter":
            return (b * (rank + 1) + np.arange(2 * size * 3)).reshape(2 * size, 3).astype(np.float32)
        if self.kind == "alltoall":
            splits = [1 + (rank + p) % 2 for p in range(size)]
            out = [1000 * (step % 9) + 100 * rank + 10 * p + i
                   for p in range(size) for i in range(splits[p])]
            return np.array(out, np.int64), splits
        if self.kind == "bcast_object":
            return {"step": step, "from": step % size, "v": [b] * 3}
        if self.kind == "gather_object":
            return (step, rank, b)
        raise ValueError(self.kind)

    def expected(self, rank, size, step):
        if self.kind == "allreduce":
            xs = [self.data(r, size, step) for r in range(size)]
            if self.op is braid.Max:
                return np.max(xs, axis=0)
            if self.op is braid.Min:
                return np.min(xs, axis=0)
            total = np.sum(np.array(xs, np.float64 if self.dtype == np.float64 else None), axis=0)
            if self.op is braid.Average:
                return (total / size).astype(self.dtype)
            return total.astype(self.dtype)
        if self.kind == "allgather":
            return np.concatenate([self.data(r, size, step) for r in range(size)])
        if self.kind == "broadcast":
            return self.data(step % size, size, step)
        if self.kind == "reducescatter":
            total = np.sum([self.data(r, size, step) for r in range(size)], axis=0)
            return total[2 * rank:2 * rank + 2].astype(np.float32)
        if self.kind == "alltoall":
            got = []
            for p in range(size):
                sp = [1 + (p + q) % 2 for q in range(size)]
                got += [1000 * (step % 9) + 100 * p + 10 * rank + i for i in range(sp[rank])]
            return np.array(got, np.int64)
        if self.kind == "bcast_object":
            return self.data(step % size, size, step)
        if self.kind == "gather_object":
            return [self.data(r, size, step) for r in range(size)]
        raise ValueError(self.kind)

    # Calls ---------------------------------------------------------------------------------
    def start(self, name, x, step, size):
        """Starts the asynchronous collectives: returns a handle."""
        if self.kind == "allreduce":
            return braid.allreduce_async(x, name=name, op=self.op,
                                         compression=self.compression or "none")
        if self.kind == "allgather":
            return braid.allgather_async(x, name=name)
        if self.kind == "broadcast":
            return braid.broadcast_async(x, step % size, name=name)
        if self.kind == "reducescatter":
            return braid.reducescatter_async(x, name=name, op=braid.Sum)
        if self.kind == "alltoall":
            return braid.alltoall_async(x[0], splits=x[1], name=name)
        raise ValueError(self.kind)

    def call_object(self, name, obj, step):
        if self.kind == "bcast_object":
            return braid.broadcast_object(obj, root_rank=step % braid.size(), name=name)
        return braid.allgather_object(obj, name=name)

    @property
    def is_object(self):
        return self.kind.endswith("_object")

    def matches(self, got, want):
        if self.is_object:
            return got == want
        if not isinstance(got, np.ndarray) or got.shape != want.shape or got.dtype != want.dtype:
            return False
        if self.rtol:
            return bool(np.allclose(got, want, rtol=self.rtol, atol=self.rtol))
        return bool(np.array_equal(got, want))


MENU = [
    Spec("ar.f32.sum", "allreduce", np.float32, braid.Sum),
    Spec("ar.f64.avg", "allreduce", np.float64, braid.Average),
    Spec("ar.i32.max", "allreduce", np.int32, braid.Max),
    Spec("ar.i64.min", "allreduce", np.int64, braid.Min),
    Spec("ar.fp16", "allreduce", np.float32, braid.Sum, "fp16"),
    Spec("ar.bf16", "allreduce", np.float32, braid.Sum, "bf16"),
    Spec("ar.fp4", "allreduce", np.float32, braid.Sum, "fp4:ef=1"),
    Spec("ar.int4", "allreduce", np.float32, braid.Sum, "int4"),
    # Without error feedback: the rounding of each step's rank-1 reconstruction, fed back,
    # would build up outside the rank-1 subspace step after step (after 3,000 steps 1e-4 of
    # the values), which no tolerance of one step can allow for.
    Spec("ar.powersgd", "allreduce", np.float32, braid.Sum, "powersgd:rank=1,ef=0", rtol=1e-4),
    Spec("ar.scalecomp", "allreduce", np.float32, braid.Sum, "scalecomp:ratio=1"),
    Spec("ar.topk", "allreduce", np.float32, braid.Sum, "topk:ratio=1"),
    Spec("ar.randomk", "allreduce", np.float32, braid.Sum, "randomk:ratio=1"),
    Spec("ag", "allgather"),
    Spec("bc", "broadcast"),
    Spec("rs", "reducescatter"),
    Spec("a2a", "alltoall"),
    Spec("obj.bc", "bcast_object"),
    Spec("obj.ag", "gather_object"),
]


# ---- the schedule (the same on every rank) -----------------------------------------------------

class Step:
    def __init__(self, specs, fault=None, target=-1, victim=None, barrier_first=False, delay=0.0):
        self.specs, self.fault, self.target, self.victim = specs, fault, target, victim
        self.barrier_first, self.delay = barrier_first, delay


def schedule(seed, steps, size, fault_rate):
    rng = random.Random(seed)
    kinds = list(KINDS)
    owed = []  # each kind at least 3 times: taken first, in a random order
    for _ in range(3):
        rng.shuffle(kinds)
        owed += kinds
    repeat = []
    for k in range(steps):
        specs = rng.sample(MENU, rng.randint(3, 6))
        for s in repeat:  # the faulted collective comes back in the next step
            if s not in specs:
                specs.append(s)
        repeat = []
        fault = None
        if k > 2 and (rng.random() < fault_rate or (owed and steps - k <= 2 * len(owed))):
            fault = owed.pop(0) if owed else rng.choice(KINDS)
        if fault is None:
            yield Step(specs)
            continue
        target = rng.randrange(size)
        pool = [s for s in specs if s.is_object] if fault == "object" else \
            [s for s in specs if s.kind == "allreduce"] if fault in ("refuse", "mismatch") else \
            [s for s in specs if not s.is_object]
        if not pool:
            pool = [s for s in MENU if s.is_object] if fault == "object" else \
                [s for s in MENU if s.kind == "allreduce"]
            victim = rng.choice(pool)
            specs.append(victim)
        else:
            victim = rng.choice(pool)
        if fault == "object" and victim.kind == "bcast_object":
            target = k % size  # only the root pickles
        repeat.append(victim)
        yield Step(specs, fault, target, victim, rng.random() < 0.5, rng.uniform(0.1, 0.5))


# ---- running it ----------------------------------------------------------------------------------

class Unpicklable:
    def __reduce__(self):
        raise TypeError("this object refuses to be pickled (an injected fault)")


class Soak:
    def __init__(self, args):
        self.args = args
        self.rank, self.size = braid.rank(), braid.size()
        neg = float(os.environ.get("BRAID_NEGOTIATION_TIMEOUT_S", "1800"))
        stall = float(os.environ.get("BRAID_STALL_CHECK_S", "60"))
        # A failure arrives within the negotiation deadline, plus the fast path's fallback
        # (at most half the stall check), plus scheduling slack on a loaded machine.
        self.bound = neg + min(1.0, stall / 2) + args.slack
        self.calls = self.ok = 0
        self.faults = {k: 0 for k in KINDS}
        self.step = -1
        self.last_progress = time.monotonic()

    def violation(self, what):
        raise Violation(f"seed {self.args.seed}, step {self.step}, rank {self.rank}: {what}")

    def outcome(self, spec, name, fn, want, touched, t0):
        """Runs fn() (a wait or a synchronous call) and checks its outcome."""
        self.calls += 1
        try:
            got = fn()
        except braid.BraidError as e:
            if "is still running after" in str(e):
                self.violation(f"'{name}' hung: no answer within {self.bound:.1f} s")
            if not touched:
                self.violation(f"'{name}' failed, but no fault touched it: "
                               f"{type(e).__name__}: {e}")
            took = time.monotonic() - t0
            if took > self.bound:
                self.violation(f"'{name}' failed after {took:.1f} s, beyond {self.bound:.1f} s")
            return
        if touched:
            self.violation(f"'{name}' returned although a fault touched it: {got!r}"[:400])
        if not spec.matches(got, want):
            self.violation(f"'{name}' returned a wrong value: got {got!r}, expected "
                           f"{want!r}"[:600])
        self.ok += 1

    def run_step(self, st):
        me, size, step = self.rank, self.size, self.step
        mine = st.target == me
        if st.fault:
            self.faults[st.fault] += 1
        if st.fault == "delay" and mine:
            time.sleep(st.delay)
        t0 = time.monotonic()
        handles = []
        for spec in st.specs:
            if spec.is_object:
                continue
            name, x = spec.name, spec.data(me, size, step)
            touched = st.victim is spec and st.fault in ("name", "refuse", "mismatch", "skip")
            if touched and mine:
                if st.fault == "skip":
                    continue
                if st.fault == "name":
                    name = spec.name + ".renamed"
                if st.fault == "mismatch":
                    x = np.append(x, x[:1])
                if st.fault == "refuse":
                    self.calls += 1
                    try:
                        braid.allreduce_async(np.zeros(4, np.int32), name=name, op=braid.Sum,
                                              compression="fp16")
                    except braid.InvalidArgumentError:
                        continue
                    self.violation(f"'{name}': the refusal was not refused")
            handles.append((spec, name, spec.start(name, x, step, size), touched))
        if st.fault and st.barrier_first:
            self.barrier()
        for spec, name, h, touched in handles:
            want = spec.expected(me, size, step)
            self.outcome(spec, name, lambda: braid.synchronize(h, timeout=self.bound), want,
                         touched, t0)
        # The object collectives (synchronous) after the resynchronization: a rank that
        # skipped a call would otherwise meet them while the others still wait in it.
        if st.fault and not st.barrier_first and st.fault != "object":
            self.barrier()
        for spec in st.specs:
            if not spec.is_object:
                continue
            obj = spec.data(me, size, step)
            touched = st.victim is spec and st.fault == "object"
            if touched and mine:
                obj = Unpicklable()
            self.outcome(spec, spec.name, lambda: spec.call_object(spec.name, obj, step),
                         spec.expected(me, size, step), touched, time.monotonic())
        if st.fault == "object" and not st.barrier_first:
            self.barrier()

    def barrier(self):
        self.calls += 1
        try:
            braid.barrier()
        except braid.BraidError as e:
            self.violation(f"the resynchronizing barrier failed: {type(e).__name__}: {e}")
        self.ok += 1

    def run(self):
        for self.step, st in enumerate(schedule(self.args.seed, self.args.steps, self.size,
                                                self.args.fault_rate)):
            self.run_step(st)
            self.last_progress = time.monotonic()
        share = self.ok / max(self.calls, 1)
        faults = " ".join(f"{k}={v}" for k, v in self.faults.items())
        print(f"soak seed {self.args.seed} rank {self.rank}/{self.size}: {self.args.steps} steps, "
              f"{self.calls} collectives, {self.ok} returned ({100 * share:.1f}%), "
              f"faults: {faults}; 0 wrong values, 0 hangs, 0 one-sided errors", flush=True)
        if min(self.faults.values()) < 3:
            self.violation(f"too few faults of a kind: {self.faults}")
        if share < 0.8:
            self.violation(f"only {100 * share:.1f}% of the collectives returned")


def watchdog(soak, limit):
    """Ends the process if a step makes no progress for `limit` seconds (a hang)."""
    while True:
        time.sleep(1.0)
        if time.monotonic() - soak.last_progress > limit:
            print(f"FAIL: seed {soak.args.seed}, step {soak.step}, rank {soak.rank}: hang, no "
                  f"step finished for {limit:.0f} s", flush=True)
            os._exit(3)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--fault-rate", type=float, default=0.04, help="per step")
    p.add_argument("--slack", type=float, default=4.0,
                   help="seconds added to the bounds for a loaded machine")
    args = p.parse_args()
    signal.signal(signal.SIGTERM, lambda *a: os._exit(4))
    braid.init()
    soak = Soak(args)
    threading.Thread(target=watchdog, args=(soak, 4 * soak.bound + 10), daemon=True).start()
    try:
        soak.run()
    except Violation as v:
        print(f"FAIL: {v}", flush=True)
        os._exit(1)  # the other ranks may be waiting: the launcher ends them
    braid.shutdown()


if __name__ == "__main__":
    sys.exit(main())
