"""braid's Python API, end to end: each test runs a worker on 2 and 3 ranks.

The workers (workers/*.py) check every result against a NumPy reference and exit non-zero
with a list of the failed checks; the test shows the ranks' output when that happens.
"""

import os
import subprocess

import pytest

import braid_launch


def run(worker, np, timeout=180, reporting=None):
    """Runs the worker; every rank in `reporting` (default: all) must report success."""
    res = braid_launch.run_worker(worker, np, timeout=timeout)
    assert res.returncode == 0, (
        f"{worker} on {np} ranks ({res.launcher}) exited with {res.returncode}:\n{res.output}")
    for r in (range(np) if reporting is None else reporting):
        assert f"rank {r}: all checks passed" in res.output, (
            f"{worker}: rank {r} did not report success:\n{res.output}")
    return res


@pytest.mark.parametrize("np_", [2, 3])
def test_collectives(np_):
    """Every collective, dtype and op vs NumPy; in-place vs out-of-place; strided views."""
    run("collectives.py", np_)


@pytest.mark.parametrize("np_", [2, 3])
def test_errors_and_lifecycle(np_):
    """Each error class with its message; init twice; fork; Ctrl-C; Cancelled at shutdown."""
    run("errors.py", np_)


@pytest.mark.parametrize("np_", [2, 3])
def test_lost_peer(np_):
    """A rank dying makes the others' collectives fail with UnavailableError."""
    res = run("lost_peer.py", np_, reporting=range(np_ - 1))
    assert f"rank {np_ - 1}: exiting abruptly" in res.output, res.output


@pytest.mark.parametrize("np_", [2, 3])
def test_compression_stats(np_):
    """compression_stats(): exact fp16 / fp4 / none byte counts for a 1e6-element tensor."""
    run("compression_stats.py", np_)


SINGLE = r"""
import inspect, os, sys
import numpy as np
import braid
assert braid.__file__.startswith(os.environ["EXPECT_DIR"]), braid.__file__
for n in braid.__all__:
    obj = getattr(braid, n)
    if inspect.isfunction(obj) or inspect.isclass(obj):
        assert obj.__doc__, f"braid.{n} has no docstring"
assert [int(o) for o in (braid.Sum, braid.Average, braid.Min, braid.Max, braid.Product)] == \
    [0, 1, 2, 3, 4]
for e in ("InvalidArgumentError", "AlreadyExistsError", "FailedPreconditionError",
          "CancelledError", "DeadlineExceededError", "UnavailableError", "InternalError"):
    cls = getattr(braid, e)
    assert issubclass(cls, braid.BraidError) and cls.__module__ == "braid", cls
    assert cls.__name__ == e
try:
    braid.size()
    raise SystemExit("size() before init did not raise")
except braid.FailedPreconditionError as e:
    assert "init" in str(e), e
# No launcher: a job of one rank with a private coordinator.
braid.init()
assert (braid.rank(), braid.size(), braid.local_rank(), braid.local_size()) == (0, 1, 0, 1)
x = np.arange(12, dtype=np.float32).reshape(3, 4)
assert np.array_equal(braid.allreduce(x.T, op=braid.Sum), x.T)
assert np.array_equal(braid.allgather(x), x)
assert np.array_equal(braid.reducescatter(x), x)
assert np.array_equal(braid.alltoall(x), x)
assert np.array_equal(braid.broadcast(x, 0), x)
braid.barrier()
print("single OK", flush=True)
"""


def test_single_process_without_launcher():
    """Import from the build tree, docstrings, error classes, and a one-rank job."""
    build = braid_launch.build_dir()
    env = braid_launch.rank_env(build, {"EXPECT_DIR": str(build / "python")})
    p = subprocess.run([braid_launch.PYTHON, "-c", SINGLE], env=env, capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0 and "single OK" in p.stdout, p.stdout + p.stderr


INTERRUPTED_INIT = r"""
import signal, sys, braid
entered = False
def on_sigint(signum, frame):  # Ctrl-C counts once init() is entered; earlier ones are ignored
    if entered:
        raise KeyboardInterrupt
signal.signal(signal.SIGINT, on_sigint)
print("calling init", flush=True)
try:
    entered = True
    braid.init()
except KeyboardInterrupt:
    print("KeyboardInterrupt from init; initialized:", braid.is_initialized(), flush=True)
    sys.exit(3)
print("init returned", flush=True)
"""


@pytest.mark.parametrize("rank", [0, 1])
def test_ctrl_c_interrupts_init_waiting_for_registration(rank):
    """Rank 0 of a job of 2 whose rank 1 never comes waits in init() for registration, and
    rank 1 whose rank 0 never comes waits for the coordinator to come up (each up to 10
    minutes here); Ctrl-C (SIGINT) there raises KeyboardInterrupt within a second, and braid
    is left uninitialized."""
    import signal
    env = braid_launch.rank_env(braid_launch.build_dir(), {
        "RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank),
        "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
        "BRAID_COORDINATOR_PORT": str(braid_launch.free_port()), "BRAID_TIMEOUT_S": "600"})
    p = subprocess.Popen([braid_launch.PYTHON, "-c", INTERRUPTED_INIT], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert p.stdout.readline().strip() == "calling init"
        # Ctrl-C until the child exits (one that lands before init() is ignored), for far
        # less than the registration timeout.
        for _ in range(60):
            p.send_signal(signal.SIGINT)
            try:
                p.wait(timeout=0.5)
                break
            except subprocess.TimeoutExpired:
                pass
        out = p.communicate(timeout=5)[0]
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 3, out
    assert "KeyboardInterrupt from init; initialized: False" in out, out


def test_a_rank_that_cannot_reach_rank_0_says_where_it_looked():
    """Rank 1 of a torchrun-style job whose rank 0 never starts gives up at
    BRAID_REGISTER_TIMEOUT_S (waiting for the coordinator is part of registering), naming
    where rank 0 should host it and which variables said so."""
    import re
    import time
    port = braid_launch.free_port()
    env = braid_launch.rank_env(braid_launch.build_dir(), {
        "RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
        "MASTER_ADDR": "127.0.0.1", "BRAID_COORDINATOR_PORT": str(port),
        "BRAID_REGISTER_TIMEOUT_S": "2"})
    t0 = time.monotonic()
    p = subprocess.run([braid_launch.PYTHON, "-c", "import braid; braid.init()"], env=env,
                       capture_output=True, text=True, timeout=60)
    took = time.monotonic() - t0
    assert p.returncode != 0 and took < 20, (took, p.stdout + p.stderr)
    want = (f"UnavailableError: cannot reach the coordinator at 127.0.0.1:{port} within 2s: "
            f"rank 0 hosts it, on 127.0.0.1 (MASTER_ADDR) at port {port} "
            "(BRAID_COORDINATOR_PORT): is rank 0 running, and do every rank's settings of "
            "these agree?")
    assert want in p.stderr, p.stderr
