"""Every collective of the braid NumPy API against a NumPy reference, on N ranks.

Run under a launcher: each rank builds every rank's input from (case, rank), so it can compute
the expected result itself.
"""

import re
import time
import zlib

import numpy as np

import braid
from _common import check, check_array, expect_raises, log, main

DTYPES = [np.float32, np.float64, np.float16, np.int32, np.int64, np.uint8]
OPS = [braid.Sum, braid.Average, braid.Min, braid.Max, braid.Product]
SHAPES = [(), (1,), (7,), (3, 5), (2, 3, 4), (1000,), (0,), (0, 3)]


def data(case, r, shape, dtype, op=braid.Sum):
    """Rank r's input for `case`: small values whose sums and products are exact."""
    rng = np.random.default_rng([zlib.crc32(case.encode()), r])
    dt = np.dtype(dtype)
    if op == braid.Product:
        if dt.kind == "u":
            v = rng.integers(1, 6, shape)
        elif dt.kind == "i":
            v = rng.integers(-3, 4, shape)
        else:
            v = rng.choice([-2.0, -1.0, -0.5, 0.5, 1.0, 2.0], shape)
    elif dt.kind == "u":
        v = rng.integers(0, 60, shape)
    elif dt.kind == "i":
        v = rng.integers(-1000, 1000, shape)
    else:
        v = rng.integers(-16, 17, shape) / 2.0
    return np.asarray(v).astype(dt)


def reduce_ref(inputs, op, dtype):
    dt = np.dtype(dtype)
    acc = np.stack([np.asarray(x) for x in inputs]).astype(
        np.float64 if dt.kind == "f" else np.int64)
    if op == braid.Sum:
        out = acc.sum(axis=0)
    elif op == braid.Average:
        out = acc.sum(axis=0) / len(inputs)
    elif op == braid.Min:
        out = acc.min(axis=0)
    elif op == braid.Max:
        out = acc.max(axis=0)
    else:
        out = acc.prod(axis=0)
    return np.asarray(out).astype(dt)


def valid(dtype, op):
    return op != braid.Average or np.dtype(dtype).kind == "f"


def even_rows(n, size):
    return [n // size + (1 if r < n % size else 0) for r in range(size)]


def body():
    braid.init()
    rank, size = braid.rank(), braid.size()
    log(f"rank {rank} of {size}, local {braid.local_rank()} of {braid.local_size()}")
    check(braid.is_initialized(), "is_initialized() after init()")
    check(0 <= rank < size, f"rank {rank} within size {size}")
    check(0 <= braid.local_rank() < braid.local_size() <= size,
          f"local rank {braid.local_rank()} / local size {braid.local_size()}")
    check(braid.local_size() == size, "one host: local size equals the world size")
    check(braid.local_rank() == rank, "one host: local rank equals the rank")

    # --- all-reduce: every dtype x op x shape, out-of-place, synchronous -------------------
    for dtype in DTYPES:
        for op in OPS:
            if not valid(dtype, op):
                continue
            for shape in SHAPES:
                case = f"ar/{np.dtype(dtype)}/{op.name}/{shape}"
                x = data(case, rank, shape, dtype, op)
                before = x.copy()
                got = braid.allreduce(x, name=case, op=op)
                want = reduce_ref([data(case, r, shape, dtype, op) for r in range(size)], op, dtype)
                check_array(got, want, f"allreduce {case}")
                check(got is not x, f"allreduce {case}: returned the input")
                check_array(x, before, f"allreduce {case}: input modified")

    # --- all-reduce, async: many in flight at once (fused), in place and not ---------------
    handles = []
    for i, dtype in enumerate(DTYPES):
        for op in OPS:
            if not valid(dtype, op):
                continue
            case = f"ara/{np.dtype(dtype)}/{op.name}"
            shape = (17 + i, 3)
            x = data(case, rank, shape, dtype, op)
            want = reduce_ref([data(case, r, shape, dtype, op) for r in range(size)], op, dtype)
            if i % 2:
                h = braid.allreduce_async_(x, name=case, op=op)
                handles.append((case, h, x, want, True))
            else:
                h = braid.allreduce_async(x, name=case, op=op)
                handles.append((case, h, x.copy(), want, False))
    for case, h, x, want, inplace in reversed(handles):
        got = braid.synchronize(h)
        check_array(got, want, f"allreduce_async {case}")
        check(braid.poll(h), f"poll after synchronize {case}")
        again = braid.synchronize(h)
        check(again is got, f"synchronize twice returns the same result {case}")
        if inplace:
            check(got is x, f"allreduce_async_ {case}: result is the input array")
            check_array(x, want, f"allreduce_async_ {case}: input mutated")

    # --- a large one (several ring chunks) ---------------------------------------------------
    case = "big"
    x = data(case, rank, (1 << 18) + 3, np.float32)
    want = reduce_ref([data(case, r, x.shape, np.float32) for r in range(size)], braid.Sum,
                      np.float32)
    check_array(braid.allreduce(x, name=case, op=braid.Sum), want, "allreduce big")

    # --- in place -----------------------------------------------------------------------------
    for dtype in DTYPES:
        case = f"ip/{np.dtype(dtype)}"
        x = data(case, rank, (5, 4), dtype)
        want = reduce_ref([data(case, r, (5, 4), dtype) for r in range(size)], braid.Max, dtype)
        out = braid.allreduce_(x, name=case, op=braid.Max)
        check(out is x, f"allreduce_ {case} returns its argument")
        check_array(x, want, f"allreduce_ {case} mutates its argument")

    # --- non-contiguous inputs: transposed view, strided slice, other byte order ---------------
    case = "transposed"
    base = data(case, rank, (6, 4), np.float32)
    view = base.T
    check(not view.flags.c_contiguous, "a transposed view is not C-contiguous")
    want = reduce_ref([data(case, r, (6, 4), np.float32).T for r in range(size)], braid.Sum,
                      np.float32)
    base_before = base.copy()
    check_array(braid.allreduce(view, op=braid.Sum, name=case), want, "allreduce transposed")
    check_array(base, base_before, "allreduce transposed: base untouched")
    out = braid.allreduce_(view, op=braid.Sum, name=case + "_")
    check(out is view, "allreduce_ transposed returns the view")
    check_array(view, want, "allreduce_ transposed: view holds the result")
    check_array(base, want.T, "allreduce_ transposed: written through to the base array")

    case = "strided"
    base = data(case, rank, (10, 3), np.float64)
    view = base[::2, 1]
    others = base.copy()
    want = reduce_ref([data(case, r, (10, 3), np.float64)[::2, 1] for r in range(size)],
                      braid.Average, np.float64)
    out = braid.allreduce_(view, name=case)
    check_array(view, want, "allreduce_ strided slice")
    others[::2, 1] = want
    check_array(base, others, "allreduce_ strided slice leaves the other elements alone")
    check_array(braid.allreduce(data(case, rank, (10, 3), np.float64)[::2, 1], name=case + "o"),
                want, "allreduce strided slice")

    case = "bigendian"
    x = data(case, rank, (9,), np.int32).astype(">i4")
    want = reduce_ref([data(case, r, (9,), np.int32) for r in range(size)], braid.Sum, np.int32)
    check_array(braid.allreduce(x, op=braid.Sum, name=case), want, "allreduce >i4")
    out = braid.allreduce_(x, op=braid.Sum, name=case + "_")
    check(out is x and out.dtype == np.dtype(">i4"), "allreduce_ >i4 keeps the array")
    check(np.array_equal(x.astype(np.int32), want), "allreduce_ >i4 values")

    # Python lists and scalars
    got = braid.allreduce([1.0, 2.0 * rank], op=braid.Sum, name="list")
    check_array(got, np.array([float(size), float(size * (size - 1))]), "allreduce of a list")
    got = braid.allreduce(np.float32(rank), op=braid.Max, name="scalar")
    check_array(got, np.array(size - 1, dtype=np.float32), "allreduce of a numpy scalar")

    # --- default names ---------------------------------------------------------------------
    h = braid.allreduce_async(np.ones(3, np.float32))
    check(re.fullmatch(r"allreduce\.noname\.\d+", h.name) is not None,
          f"default name {h.name!r} looks like allreduce.noname.N")
    n0 = int(h.name.rsplit(".", 1)[1])
    check_array(braid.synchronize(h), np.ones(3, np.float32), "default-named allreduce")
    h2 = braid.allreduce_async(np.ones(3, np.float32))
    check(h2.name == f"allreduce.noname.{n0 + 1}", f"next default name {h2.name!r}")
    braid.synchronize(h2)
    h3 = braid.allgather_async(np.ones(1, np.float32))
    check(re.fullmatch(r"allgather\.noname\.\d+", h3.name) is not None,
          f"allgather default name {h3.name!r}")
    braid.synchronize(h3)

    # --- all-gather: first dims differ per rank ------------------------------------------------
    for dtype in DTYPES:
        for trailing in [(), (3,), (2, 2)]:
            case = f"ag/{np.dtype(dtype)}/{trailing}"
            shapes = [(r + 1,) + trailing for r in range(size)]
            x = data(case, rank, shapes[rank], dtype)
            before = x.copy()
            got = braid.allgather(x, name=case)
            want = np.concatenate([data(case, r, shapes[r], dtype) for r in range(size)])
            check_array(got, want, f"allgather {case}")
            check_array(x, before, f"allgather {case}: input untouched")
    case = "ag/empty-rank0"
    shapes = [(r, 2) for r in range(size)]  # rank 0 contributes no rows
    want = np.concatenate([data(case, r, shapes[r], np.int64) for r in range(size)])
    check_array(braid.allgather(data(case, rank, shapes[rank], np.int64), name=case), want,
                "allgather with an empty contribution")
    case = "ag/transposed"
    x = data(case, rank, (3, 2), np.float32).T  # (2, 3), non-contiguous
    want = np.concatenate([data(case, r, (3, 2), np.float32).T for r in range(size)])
    check_array(braid.allgather(x, name=case), want, "allgather transposed")
    hs = [braid.allgather_async(data(f"aga{i}", rank, (rank + i + 1, 2), np.float64),
                                name=f"aga{i}") for i in range(4)]
    for i, h in enumerate(hs):
        want = np.concatenate([data(f"aga{i}", r, (r + i + 1, 2), np.float64)
                               for r in range(size)])
        check_array(braid.synchronize(h), want, f"allgather_async {i}")

    # --- broadcast: every root, every dtype, in place and not -------------------------------
    for dtype in DTYPES:
        for root in range(size):
            case = f"bc/{np.dtype(dtype)}/{root}"
            x = data(case, rank, (4, 3), dtype)
            before = x.copy()
            want = data(case, root, (4, 3), dtype)
            got = braid.broadcast(x, root, name=case)
            check_array(got, want, f"broadcast {case}")
            check_array(x, before, f"broadcast {case}: input untouched")
            check(got is not x, f"broadcast {case}: new array")
            out = braid.broadcast_(x, root_rank=root, name=case + "_")
            check(out is x, f"broadcast_ {case} returns its argument")
            check_array(x, want, f"broadcast_ {case} mutates its argument")
    case = "bc/transposed"
    base = data(case, rank, (5, 2), np.float64)
    view = base.T
    braid.broadcast_(view, size - 1, name=case)
    check_array(base, data(case, size - 1, (5, 2), np.float64), "broadcast_ transposed view")
    hs = [(root, braid.broadcast_async(data(f"bca{root}", rank, (6,), np.float16), root,
                                       name=f"bca{root}")) for root in range(size)]
    for root, h in hs:
        check_array(braid.synchronize(h), data(f"bca{root}", root, (6,), np.float16),
                    f"broadcast_async root {root}")
    x = data("bca_", rank, (6,), np.int32)
    h = braid.broadcast_async_(x, 0, name="bca_")
    check(braid.synchronize(h) is x, "broadcast_async_ returns the argument")
    check_array(x, data("bca_", 0, (6,), np.int32), "broadcast_async_ values")

    # --- reduce-scatter: uneven dim 0, first ranks one more row -----------------------------
    for dtype in DTYPES:
        for op in OPS:
            if not valid(dtype, op):
                continue
            for n in [2 * size + 1, size, 1, 3 * size + 2]:
                case = f"rs/{np.dtype(dtype)}/{op.name}/{n}"
                shape = (n, 3)
                x = data(case, rank, shape, dtype, op)
                before = x.copy()
                got = braid.reducescatter(x, name=case, op=op)
                full = reduce_ref([data(case, r, shape, dtype, op) for r in range(size)], op,
                                  dtype)
                rows = even_rows(n, size)
                start = sum(rows[:rank])
                check_array(got, full[start:start + rows[rank]], f"reducescatter {case}")
                check_array(x, before, f"reducescatter {case}: input untouched")
    case = "rs/1d-default-op"
    x = data(case, rank, (2 * size + 1,), np.float32)
    full = reduce_ref([data(case, r, (2 * size + 1,), np.float32) for r in range(size)],
                      braid.Average, np.float32)
    rows = even_rows(2 * size + 1, size)
    start = sum(rows[:rank])
    check_array(braid.reducescatter(x, name=case), full[start:start + rows[rank]],
                "reducescatter 1-D, default op (average)")
    h = braid.reducescatter_async(x, name=case + "a", op=braid.Sum)
    full = reduce_ref([data(case, r, (2 * size + 1,), np.float32) for r in range(size)],
                      braid.Sum, np.float32)
    check_array(braid.synchronize(h), full[start:start + rows[rank]], "reducescatter_async")

    # --- all-to-all ------------------------------------------------------------------------
    for dtype in DTYPES:
        case = f"a2a/{np.dtype(dtype)}"
        x = data(case, rank, (2 * size, 3), dtype)
        got = braid.alltoall(x, name=case)
        want = np.concatenate([data(case, r, (2 * size, 3), dtype)[2 * rank:2 * rank + 2]
                               for r in range(size)])
        check_array(got, want, f"alltoall even {case}")

    def splits_of(r):
        return [(r + p) % 3 for p in range(size)]

    for dtype in [np.float32, np.int64, np.uint8]:
        case = f"a2as/{np.dtype(dtype)}"
        inputs = [data(case, r, (sum(splits_of(r)), 2), dtype) for r in range(size)]
        before = inputs[rank].copy()
        got = braid.alltoall(inputs[rank], splits=splits_of(rank), name=case)
        parts = []
        for r in range(size):
            off = sum(splits_of(r)[:rank])
            parts.append(inputs[r][off:off + splits_of(r)[rank]])
        check_array(got, np.concatenate(parts), f"alltoall splits {case}")
        check_array(inputs[rank], before, f"alltoall {case}: input untouched")
    case = "a2a/np-splits"
    inputs = [data(case, r, (sum(splits_of(r)),), np.float64) for r in range(size)]
    h = braid.alltoall_async(inputs[rank], splits=np.array(splits_of(rank)), name=case)
    parts = []
    for r in range(size):
        off = sum(splits_of(r)[:rank])
        parts.append(inputs[r][off:off + splits_of(r)[rank]])
    check_array(braid.synchronize(h), np.concatenate(parts), "alltoall_async, ndarray splits")

    # --- barrier; poll --------------------------------------------------------------------------
    braid.barrier()
    braid.barrier(name="named-barrier")
    h = braid.allreduce_async(np.ones(4, np.float32), name="poll")
    for _ in range(20000):
        if braid.poll(h):
            break

        time.sleep(0.001)
    check(braid.poll(h), "poll() turns True")
    check_array(braid.synchronize(h), np.ones(4, np.float32), "result after poll")
    check("poll" in repr(h), f"repr {h!r}")
    # Errors do not leak out of poll()
    expect_raises(braid.InvalidArgumentError,
                  lambda: braid.allreduce(np.ones(2, np.int32), name="int-average"),
                  "average of int32", contains=("int-average",))
    # braid.numpy is the same API
    import braid.numpy as bnp
    check(bnp.allreduce is braid.allreduce and bnp.Sum is braid.Sum, "braid.numpy re-exports")
    # The shutdown happens at exit (atexit), in this process.


if __name__ == "__main__":
    main(body)
