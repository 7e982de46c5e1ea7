"""Helpers shared by the rank programs of the Python tests.

A worker records every failed check (with a message) and exits 1 at the end if any failed,
so one run reports all mismatches. References are computed independently in NumPy: every
rank can build every rank's input from (case id, rank).
"""

import os
import sys
import time
import traceback

import numpy as np

FAILURES = []
RANK = int(os.environ.get("BRAID_RANK", "-1"))


def log(msg):
    print(msg, flush=True)


def fail(msg):
    FAILURES.append(msg)
    log(f"FAIL: {msg}")


def check(cond, msg):
    if not cond:
        fail(msg)
    return bool(cond)


TOL = {
    np.dtype(np.float16): (2e-3, 1e-3),
    np.dtype(np.float32): (1e-6, 1e-6),
    np.dtype(np.float64): (1e-12, 1e-12),
}


def check_array(got, want, what):
    """Same dtype and shape, values equal (integers) or close (floats, per-dtype tolerance)."""
    want = np.asarray(want)
    if not isinstance(got, np.ndarray):
        return fail(f"{what}: expected an ndarray, got {type(got).__name__}")
    if got.dtype != want.dtype:
        return fail(f"{what}: dtype {got.dtype}, expected {want.dtype}")
    if got.shape != want.shape:
        return fail(f"{what}: shape {got.shape}, expected {want.shape}")
    if want.dtype.kind == "f":
        rtol, atol = TOL[want.dtype]
        ok = np.allclose(got.astype(np.float64), want.astype(np.float64), rtol=rtol, atol=atol)
    else:
        ok = np.array_equal(got, want)
    if not ok:
        bad = np.argwhere(~np.isclose(got.astype(np.float64), want.astype(np.float64)))
        idx = tuple(bad[0]) if len(bad) else ()
        fail(f"{what}: values differ ({len(bad)} elements), first at {idx}: "
             f"got {got[idx] if idx or got.ndim == 0 else got!r}, "
             f"expected {want[idx] if idx or want.ndim == 0 else want!r}")
        return False
    return True


def expect_raises(cls, fn, what, contains=(), exact=None):
    """Calls fn(); checks it raises `cls` (exactly that class) whose message contains every
    string of `contains` (or equals `exact`). Returns the message or None."""
    if isinstance(contains, str):
        contains = (contains,)
    try:
        fn()
    except BaseException as e:  # noqa: B902 - KeyboardInterrupt is a case too
        if type(e) is not cls:
            fail(f"{what}: raised {type(e).__module__}.{type(e).__name__}({e}), expected "
                 f"{cls.__name__}")
            return None
        msg = str(e)
        if exact is not None and msg != exact:
            fail(f"{what}: message {msg!r}, expected exactly {exact!r}")
        for c in contains:
            if c not in msg:
                fail(f"{what}: message {msg!r} lacks {c!r}")
        return msg
    fail(f"{what}: did not raise {cls.__name__}")
    return None


def main(body):
    """Runs body(); exit 0 when every check passed, 1 otherwise (with the failures listed)."""
    t0 = time.time()
    try:
        body()
    except Exception:
        fail("unexpected exception:\n" + traceback.format_exc())
    if FAILURES:
        log(f"rank {RANK}: {len(FAILURES)} check(s) failed:")
        for f in FAILURES:
            log(f"  - {f.splitlines()[0]}")
        sys.stdout.flush()
        os._exit(1)  # no atexit shutdown: peers may be stuck; the launcher cleans up
    log(f"rank {RANK}: all checks passed in {time.time() - t0:.1f} s")
