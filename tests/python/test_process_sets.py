"""Process sets (Note [Process sets] in control/process_sets.h), as Horovod's, on 4 ranks:
workers/process_sets.py, written in Horovod's documented style (static and dynamic sets)
with only the import line changed."""

import braid_launch

WORKER = "process_sets.py"


def _run(*args):
    res = braid_launch.run_worker(WORKER, 4, list(args), timeout=240)
    assert res.returncode == 0, res.output
    assert res.output.count("all checks passed") == 4, res.output


def test_static_sets(tmp_path):
    """init(process_sets=[...]): disjoint sets with the same names and their own exact
    results; a set stalled until the other has run 20 steps does not hold it back; overlapping sets over 1,000 async
    steps; a rank outside a set; broadcast, allgather, barrier, join and every compression
    method in a set; DistributedOptimizer on 2 of 4 ranks averages over those 2."""
    _run("static", tmp_path)


def test_dynamic_sets():
    """init(process_sets="dynamic"): add, a duplicate refused, mismatched adds fail on every
    rank naming both, a set removed while a collective of it is pending fails it naming the
    set, the freed id is reused."""
    _run("dynamic")


def test_a_set_goes_on_when_another_sets_ranks_leave():
    """Ranks of one set shut down while a collective of a disjoint set waits for its vote:
    the fast path ends for the job, and the set's collectives complete through the
    coordinator, with their exact results."""
    _run("leave")


def test_horovods_documented_examples_run_with_only_the_import_changed():
    """Horovod's documented static and dynamic process-set examples (workers/
    horovod_process_sets.py), each result checked."""
    for mode, env in (("static", None), ("dynamic", None),
                      ("dynamic_env", {"BRAID_DYNAMIC_PROCESS_SETS": "1"})):
        res = braid_launch.run_worker("horovod_process_sets.py", 4, [mode], timeout=120,
                                      env=env)
        assert res.returncode == 0, res.output
        assert res.output.count("all checks passed") == 4, res.output
