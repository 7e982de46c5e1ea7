"""Elastic training's longer cases (`ctest -L long`, outside CI): a lost rank under
compression (powersgd:rank=2, fp4), a rank that only the heartbeat reveals lost (SIGSTOP),
and a rank lost while the membership changes. The CI cases and the checks they share are in
test_elastic.py; the last results are in BENCHMARKS.md.
"""

import signal

import elastic_jobs
from test_elastic import ARGS, check_survivors


def test_compression_powersgd_survives_a_killed_rank(tmp_path):
    job = elastic_jobs.run(tmp_path, np=3, min_np=2,
                           args=ARGS + ("--compression", "powersgd:rank=2"),
                           disturb=[(2, 4, signal.SIGKILL)])
    check_survivors(job, lost=2, survivors=(0, 1), world_after=2)


def test_compression_fp4_survives_a_killed_rank(tmp_path):
    job = elastic_jobs.run(tmp_path, np=3, min_np=2, args=ARGS + ("--compression", "fp4"),
                           disturb=[(1, 4, signal.SIGKILL)])
    check_survivors(job, lost=1, survivors=(0, 2), world_after=2)


def test_a_stopped_rank_is_lost_by_its_heartbeat_and_ended(tmp_path):
    timeout_s = 3
    job = elastic_jobs.run(tmp_path, np=3, min_np=2, args=ARGS,
                           env={"BRAID_HEARTBEAT_TIMEOUT_S": str(timeout_s)},
                           disturb=[(2, 4, signal.SIGSTOP)])
    check_survivors(job, lost=2, survivors=(0, 1), world_after=2)
    assert "declared worker 2 lost" in job.output and "silent for" in job.output, job.output
    resumed = min(job.starts(w)[1]["time"] for w in (0, 1))
    assert resumed - job.disturbed_at[2] < timeout_s + 5.0


def test_a_rank_lost_during_the_membership_change(tmp_path):
    # Worker 3 is stopped first (its heartbeat stops), then worker 2 killed: the change that
    # worker 2's loss starts cannot complete until worker 3 is found lost too, and the job
    # goes on with 2 ranks, not 3.
    job = elastic_jobs.run(tmp_path, np=4, min_np=2, args=ARGS,
                           env={"BRAID_HEARTBEAT_TIMEOUT_S": "3"},
                           disturb=[(3, 3, signal.SIGSTOP), (2, 3, signal.SIGKILL)])
    assert job.returncode == 0, job.output
    for w in (0, 1):
        starts = job.starts(w)
        assert [s["size"] for s in starts][0] == 4 and starts[-1]["size"] == 2, starts
        assert job.end(w) is not None
    assert job.end(0)["checksum"] == job.end(1)["checksum"]
    assert "declared worker 3 lost" in job.output, job.output
