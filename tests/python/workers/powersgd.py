"""braid's PowerSGD against an independent NumPy implementation of the paper's algorithm, and
checkpoints of its state.

Usage: powersgd.py reference
       powersgd.py checkpoint DIR save|resume

reference: the initial Q of every compressed tensor is injected with
load_compression_state() (the bytes are built here from the documented format), then five
steps of ``powersgd:rank=2`` (error feedback and warm start on) must equal, within float
tolerance, the NumPy reference below in float64 (then compression_state() must refuse while
a compressed all-reduce is in flight): Vogels et al. 2019, Algorithm 1 inside
Algorithm 2 -- M_w = G_w + E_w; P = sum_w M_w Q; P^ = orthonormal basis of P's columns
(np.linalg.qr, signs fixed so that R has a positive diagonal, as Gram-Schmidt gives);
Q = mean_w M_w^T P^; result P^ Q^T; E_w = M_w - P^ Q^T; the next step starts from this Q.
Tensors too small to compress (1-D, 4x4) must be the exact mean. Payload bytes are checked.

checkpoint save: 15 steps; after step 10 every rank writes compression_state() to
DIR/state.rank<R>, and its results of steps 11-15 to DIR/steps.rank<R>.npy. Then in the same
job the state is loaded back and steps 11-15 rerun: bit-identical.
checkpoint resume (a new job): loads DIR/state.rank<R> and runs steps 11-15: bit-identical to
what the first job wrote.
"""

import os
import struct
import sys

import numpy as np

import braid
from _common import check, expect_raises, log, main

SPEC = "powersgd:rank=2"
R = 2
TENSORS = [("layer.weight", (40, 24)), ("conv.weight", (16, 4, 3, 3)), ("layer.bias", (16,)),
           ("tiny.weight", (4, 4))]


def compressed(shape):
    if len(shape) < 2:
        return False
    n, m = shape[0], int(np.prod(shape[1:]))
    return (n + m) * R * 2 < n * m


def grad(tag, rank, step, t, shape):
    seed = {"ref": 0, "ck": 1}[tag] * 100000 + 1000 * step + 10 * rank + t
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def state_bytes(rank, size, qs):
    """A compression state holding the given Q (name -> cols x R float32) and no residuals,
    in version 1 of the format of compression/stage.h (still read; it has no digest to
    compute, nor shapes) around the one of compression/powersgd.h."""
    def s(text):
        b = text.encode()
        return struct.pack("<Q", len(b)) + b

    psgd = b"PSGD" + struct.pack("<II", 1, len(qs))
    for name, (rows, cols, q) in sorted(qs.items()):
        psgd += s(name) + struct.pack("<qqI", rows, cols, R)
        psgd += struct.pack("<Q", q.size) + q.astype("<f4").tobytes()
        psgd += struct.pack("<Q", 0)  # no residual yet
    out = b"BRDCMPST" + struct.pack("<IiiI", 1, rank, size, 1) + s(SPEC)
    out += struct.pack("<I", 0)  # no step counters: every tensor at step 0
    return out + struct.pack("<Q", len(psgd)) + psgd


def orthonormal(p):
    q, r = np.linalg.qr(p)
    return q * np.where(np.diag(r) < 0, -1.0, 1.0)


def run_step(tag, step, rank):
    """One step of every tensor through braid (all enqueued before waiting)."""
    handles, outs = [], []
    for t, (name, shape) in enumerate(TENSORS):
        g = grad(tag, rank, step, t, shape)
        outs.append(g)
        handles.append(braid.allreduce_async_(g, name=f"{tag}.{name}", compression=SPEC))
    for h in handles:
        braid.synchronize(h)
    return outs


def reference():
    rank, size = braid.rank(), braid.size()
    rng = np.random.default_rng(42)
    injected = {}
    for name, shape in TENSORS:
        if compressed(shape):
            rows, cols = shape[0], int(np.prod(shape[1:]))
            injected[f"ref.{name}"] = (rows, cols, rng.standard_normal((cols, R)).astype(np.float32))
    braid.load_compression_state(state_bytes(rank, size, injected))
    q = {n[len("ref."):]: v[2].astype(np.float64) for n, v in injected.items()}
    e = {(w, n): 0.0 for w in range(size) for n, _ in TENSORS}
    for step in range(5):
        got = run_step("ref", step, rank)
        for t, (name, shape) in enumerate(TENSORS):
            g = [grad("ref", w, step, t, shape).astype(np.float64) for w in range(size)]
            what = f"step {step} {name}"
            if not compressed(shape):
                want = (sum(x.astype(np.float32) for x in g) / np.float32(size)).astype(np.float32)
                check(np.array_equal(got[t], want), f"{what}: not the exact mean")
                continue
            rows = shape[0]
            m = [(g[w] + e[(w, name)]).reshape(rows, -1) for w in range(size)]
            p_hat = orthonormal(sum(mw @ q[name] for mw in m))
            q[name] = sum(mw.T @ p_hat for mw in m) / size
            out = p_hat @ q[name].T
            for w in range(size):
                e[(w, name)] = (m[w] - out).reshape(shape)
            scale = np.abs(out).max()
            err = np.abs(got[t].astype(np.float64) - out.reshape(shape)).max()
            check(err <= 1e-4 * scale, f"{what}: max error {err:.3g} vs the reference (scale "
                                       f"{scale:.3g})")
    stats = braid.compression_stats()["tensors"]
    for name, shape in TENSORS:
        n = int(np.prod(shape))
        per_step = (shape[0] + n // shape[0]) * R * 4 if compressed(shape) else 4 * n
        got = stats[f"ref.{name}"]
        check(got["method"] == SPEC and got["payload_bytes"] == 5 * per_step
              and got["uncompressed_bytes"] == 5 * 4 * n,
              f"{name}: stats {got}, expected payload {5 * per_step}")
    log(f"rank {rank}: reference matched over 5 steps")

    # The state cannot be taken while a compressed all-reduce is in flight: rank 0 submits
    # one that rank 1 holds back until rank 0 says go (an all-reduce: a barrier would end
    # the pairing of what was submitted before it, docs/failures.md: No error shifts a step).
    x = np.ones((40, 24), np.float32)
    go = np.zeros(1, np.float32)
    if rank == 0:
        h = braid.allreduce_async(x, name="inflight", compression=SPEC)
        expect_raises(braid.FailedPreconditionError, braid.compression_state,
                      "compression_state() in flight", contains="'inflight' is in flight")
    braid.allreduce(go, name="inflight.go", compression="none")
    if rank != 0:
        h = braid.allreduce_async(x, name="inflight", compression=SPEC)
    braid.synchronize(h)
    # Loading is collective even when one rank's state is not bytes: every rank fails at
    # once with that rank's reason (rank 0 passes a str, rank 1 a valid state).
    state = braid.compression_state()
    expect_raises(braid.InvalidArgumentError,
                  lambda: braid.load_compression_state("x" if rank == 0 else state),
                  "load_compression_state(str) on rank 0",
                  contains=("rank 0", "load_compression_state(): state must be bytes, got str"))
    expect_raises(braid.InvalidArgumentError, lambda: braid.load_compression_state(b"BRDCMPST"),
                  "load_compression_state(truncated)", contains="truncated")
    # 2^32 - 1 tensors declared in 51 bytes: refused by that count on every rank, before
    # anything is allocated for them (not a MemoryError from a loader that believed it).
    crafted = (b"BRDCMPST" + struct.pack("<IiiIQ", 1, rank, size, 1, len(SPEC)) + SPEC.encode()
               + struct.pack("<I", 0xFFFFFFFF))
    expect_raises(braid.InvalidArgumentError, lambda: braid.load_compression_state(crafted),
                  "load_compression_state(crafted)",
                  exact="load_compression_state: rank 0: compression state: tensor count of "
                        "'powersgd:rank=2' 4294967295 declared, but the 0 bytes left hold at most "
                        "0 (at byte 51); rank 1: compression state: tensor count of "
                        "'powersgd:rank=2' 4294967295 declared, but the 0 bytes left hold at most "
                        "0 (at byte 51); no rank loaded its state (every rank keeps the one it "
                        "had)")


def checkpoint(directory, mode):
    rank = braid.rank()
    state_path = os.path.join(directory, f"state.rank{rank}")
    steps_path = os.path.join(directory, f"steps.rank{rank}.npy")
    if mode == "save":
        for step in range(1, 11):
            run_step("ck", step, rank)
        state = braid.compression_state()
        check(isinstance(state, bytes) and state.startswith(b"BRDCMPST"), "state is bytes")
        with open(state_path, "wb") as f:
            f.write(state)
        first = [np.concatenate([x.ravel() for x in run_step("ck", s, rank)]) for s in range(11, 16)]
        np.save(steps_path, np.stack(first))
        braid.load_compression_state(state)  # and again, in this job
        again = [np.concatenate([x.ravel() for x in run_step("ck", s, rank)]) for s in range(11, 16)]
        check(np.array_equal(np.stack(again).view(np.uint32), np.stack(first).view(np.uint32)),
              "steps 11-15 after reloading the state in the same job are not bit-identical")
    else:
        with open(state_path, "rb") as f:
            braid.load_compression_state(f.read())
        first = np.load(steps_path)
        resumed = np.stack([np.concatenate([x.ravel() for x in run_step("ck", s, rank)])
                            for s in range(11, 16)])
        for i in range(5):
            check(np.array_equal(resumed[i].view(np.uint32), first[i].view(np.uint32)),
                  f"resumed step {11 + i} is not bit-identical to the first job's")
    log(f"rank {rank}: checkpoint {mode} done")


def body():
    braid.init()
    if sys.argv[1] == "reference":
        reference()
    else:
        checkpoint(sys.argv[2], sys.argv[3])
    braid.shutdown()


if __name__ == "__main__":
    main(body)
