"""join() for uneven inputs (braid.join and braid.torch.join): real multi-process runs on 2
and 3 ranks of workers/join.py, where the last rank has 3 batches fewer than the others.
The worker checks every result against a reference it computes itself (sums with the joined
rank's zeros, averages divided by the whole world size), that join() returns the rank that
joined last on every rank, and that training goes on after the join round.
"""

import pytest

import braid_launch

pytest.importorskip("torch")


@pytest.mark.parametrize("np_", [2, 3])
def test_join_uneven_inputs(np_):
    res = braid_launch.run_worker("join.py", np_, timeout=180)
    assert res.returncode == 0, (
        f"join.py on {np_} ranks ({res.launcher}) exited with {res.returncode}:\n{res.output}")
    for r in range(np_):
        assert f"rank {r}: all checks passed" in res.output, (
            f"join.py: rank {r} did not report success:\n{res.output}")
