"""PowerSGD from Python on 2 ranks (workers/powersgd.py): braid's output equals an independent
NumPy implementation of the paper's algorithm for 5 steps from an injected Q (warm start and
error feedback included); compression_state() refuses while a compressed all-reduce is in
flight; and a checkpoint of the compression state taken at step 10 gives bit-identical steps
11-15, in the same job and in a new one."""

import braid_launch


def run(args):
    res = braid_launch.run_worker("powersgd.py", 2, args=args, timeout=180)
    assert res.returncode == 0, f"powersgd.py {args} exited with {res.returncode}:\n{res.output}"
    for r in range(2):
        assert f"rank {r}: all checks passed" in res.output, res.output
    return res


def test_matches_the_numpy_reference():
    run(["reference"])


def test_checkpoint_resumes_bit_identically(tmp_path):
    run(["checkpoint", str(tmp_path), "save"])
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "state.rank0", "state.rank1", "steps.rank0.npy", "steps.rank1.npy"]
    run(["checkpoint", str(tmp_path), "resume"])
