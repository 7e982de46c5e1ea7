"""braid.compression_stats() on N ranks: exact byte counts per tensor and per method.

A 1,000,000-element float32 tensor is all-reduced once with "fp16", once with "fp4" and a
small one uncompressed. Expected, per rank (runtime/statistics.h defines the counters):
  fp16: payload 2 bytes per element;
  fp4:  per 128-element chunk 64 code bytes (4 bits each) + one float32 scale, so
        7812 full chunks + one of 64 elements -> 7812 * 68 + (32 + 4) bytes, and the bytes
        actually sent at most 1/7 of a bandwidth-optimal uncompressed all-reduce's;
  none: payload = uncompressed;
  every method: reference transport = 2(n-1)/n * uncompressed bytes.
"""

import numpy as np

import braid
import braid.numpy as bnp
from _common import check, expect_raises, log, main

N = 1_000_000
CHUNK = 128
FP4_PAYLOAD = (N // CHUNK) * (CHUNK // 2 + 4) + ((N % CHUNK) // 2 + 4)  # 531,252 bytes
SMALL = 1000
BYTE_FIELDS = ("reductions", "uncompressed_bytes", "payload_bytes", "transport_bytes",
               "reference_transport_bytes", "compression_ratio")


def reference(nbytes, n):
    return 2 * nbytes * (n - 1) // n


def expect_entry(got, want, what):
    """`want` holds the exact values of some fields of `got` (a dict)."""
    if not check(isinstance(got, dict), f"{what}: missing (got {got!r})"):
        return
    for k, v in want.items():
        check(got.get(k) == v and type(got.get(k)) is type(v),
              f"{what}[{k!r}] = {got.get(k)!r}, expected {v!r}")


def body():
    FP = braid.FailedPreconditionError
    expect_raises(FP, braid.compression_stats, "compression_stats() before init()",
                  contains="not initialized")
    braid.init()
    rank, n = braid.rank(), braid.size()
    check(braid.compression_stats() == {"methods": {}, "groups": [], "tensors": {}},
          f"nothing counted before any all-reduce: {braid.compression_stats()}")

    x = (np.linspace(-1.0, 1.0, N, dtype=np.float32) * (rank + 1)).astype(np.float32)
    want_sum = np.linspace(-1.0, 1.0, N, dtype=np.float64) * (n * (n + 1) / 2)
    y16 = braid.allreduce(x, name="grad.fp16", op=braid.Sum, compression="fp16")
    y4 = braid.allreduce(x, name="grad.fp4", op=braid.Sum, compression="fp4")
    braid.allreduce(x[:SMALL], name="grad.none", op=braid.Sum)
    # The counters are the point here; tests/mp/compression_mp_test.cc checks the values of
    # every method against its error bound. fp16 is close; fp4 is at least well-formed.
    check(np.max(np.abs(y16 - want_sum)) < 1e-2 * n, "fp16 all-reduce values")
    check(y4.shape == x.shape and bool(np.all(np.isfinite(y4))), "fp4 all-reduce result")

    stats = braid.compression_stats()
    log(f"rank {rank}: {stats}")
    check(set(stats) == {"methods", "groups", "tensors"}, f"keys {sorted(stats)}")
    check(set(stats["methods"]) == {"fp16", "fp4", "none"}, f"methods {sorted(stats['methods'])}")
    check(set(stats["tensors"]) == {"grad.fp16", "grad.fp4", "grad.none"},
          f"tensors {sorted(stats['tensors'])}")
    ref = reference(4 * N, n)

    t16 = stats["tensors"].get("grad.fp16")
    expect_entry(t16, {"method": "fp16", "reductions": 1, "uncompressed_bytes": 4 * N,
                       "payload_bytes": 2 * N, "reference_transport_bytes": ref,
                       "compression_ratio": 2.0}, "tensors['grad.fp16']")
    t4 = stats["tensors"].get("grad.fp4")
    expect_entry(t4, {"method": "fp4", "reductions": 1, "uncompressed_bytes": 4 * N,
                      "payload_bytes": FP4_PAYLOAD, "reference_transport_bytes": ref,
                      "compression_ratio": 4 * N / FP4_PAYLOAD}, "tensors['grad.fp4']")
    if t4:
        check(0 < t4["transport_bytes"] and 7 * t4["transport_bytes"] <= ref,
              f"fp4 transport_bytes {t4['transport_bytes']} > 1/7 of the reference {ref}")
    if t16:
        check(0 < t16["transport_bytes"] <= ref,
              f"fp16 transport_bytes {t16['transport_bytes']} not in (0, {ref}]")
    expect_entry(stats["tensors"].get("grad.none"),
                 {"method": "none", "reductions": 1, "uncompressed_bytes": 4 * SMALL,
                  "payload_bytes": 4 * SMALL, "compression_ratio": 1.0,
                  "reference_transport_bytes": reference(4 * SMALL, n)},
                 "tensors['grad.none']")

    # Per method: the same numbers with the distinct tensor count; field sets are complete.
    for method, tensor in (("fp16", "grad.fp16"), ("fp4", "grad.fp4"), ("none", "grad.none")):
        m = stats["methods"].get(method)
        t = stats["tensors"].get(tensor)
        if not (m and t):
            continue
        check(set(m) == {"tensors"} | set(BYTE_FIELDS), f"methods[{method!r}] keys {sorted(m)}")
        check(set(t) == {"method", "pattern"} | set(BYTE_FIELDS),
              f"tensors[{tensor!r}] keys {sorted(t)}")
        expect_entry(m, dict({k: t[k] for k in BYTE_FIELDS}, tensors=1), f"methods[{method!r}]")
    # Per group (method, plan pattern): no plan here, so one group of pattern "" per method,
    # in method order, with the method's numbers.
    check([(g["method"], g["pattern"]) for g in stats["groups"]] ==
          [("fp16", ""), ("fp4", ""), ("none", "")], f"groups {stats['groups']}")
    for g in stats["groups"]:
        expect_entry(g, {k: stats["methods"][g["method"]][k] for k in ("tensors",) + BYTE_FIELDS},
                     f"group {g['method']!r}")

    # A plan through braid.numpy: the runtime matches it, each tensor in its pattern's group.
    plan = '{"emb.*": "fp16", "*": "none"}'
    braid.allreduce(x, name="emb.w", op=braid.Sum, compression=plan)
    braid.allreduce(x[:SMALL], name="fc.w", op=braid.Sum, compression=plan)
    planned = braid.compression_stats()
    got = {(g["method"], g["pattern"]): g["tensors"] for g in planned["groups"]}
    check(got == {("fp16", ""): 1, ("fp4", ""): 1, ("none", ""): 1, ("fp16", "emb.*"): 1,
                  ("none", "*"): 1}, f"groups with a plan {got}")
    check(planned["tensors"]["emb.w"]["pattern"] == "emb.*" and
          planned["tensors"]["grad.fp16"]["pattern"] == "", f"patterns {planned['tensors']}")

    # A second step adds up.
    braid.allreduce(x, name="grad.fp16", op=braid.Sum, compression="fp16")
    again = bnp.compression_stats()  # the same function, through braid.numpy
    expect_entry(again["methods"].get("fp16"),
                 {"tensors": 2, "reductions": 3, "uncompressed_bytes": 12 * N,
                  "payload_bytes": 6 * N}, "methods['fp16'] after a second step")

    braid.shutdown()
    expect_raises(FP, braid.compression_stats, "compression_stats() after shutdown()",
                  contains="shut down")


if __name__ == "__main__":
    main(body)
