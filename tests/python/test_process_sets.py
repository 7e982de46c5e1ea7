"""Process sets (Note [Process sets] in control/process_sets.h), as Horovod's, on 4 ranks:
workers/process_sets.py, written in Horovod's documented style (static and dynamic sets)
with only the import line changed."""

import braid_launch

WORKER = "process_sets.py"


def _run(mode):
    res = braid_launch.run_worker(WORKER, 4, [mode], timeout=240)
    assert res.returncode == 0, res.output
    assert res.output.count("all checks passed") == 4, res.output


def test_static_sets():
    """init(process_sets=[...]): disjoint sets with the same names and their own exact
    results; a set stalled 3 s does not delay the other; overlapping sets over 1,000 async
    steps; a rank outside a set; broadcast, allgather, barrier, join and every compression
    method in a set; DistributedOptimizer on 2 of 4 ranks averages over those 2."""
    _run("static")


def test_dynamic_sets():
    """init(process_sets="dynamic"): add, a duplicate refused, mismatched adds fail on every
    rank naming both, a set removed while a collective of it is pending fails it naming the
    set, the freed id is reused."""
    _run("dynamic")
