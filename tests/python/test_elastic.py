"""Elastic training (docs/elastic.md): a job under braidrun --min-np that loses a rank goes
on with the survivors from the last commit, every survivor holding the same parameters;
one that falls below --min-np fails on every survivor with the reason. The other cases
(compression, a rank lost by heartbeat only, a rank lost during the change) run under the
`long` label: test_elastic_long.py.

Each job trains examples/elastic_fashion_mnist.py (Horovod's elastic style) on 3000 images
for 2 epochs: 3 ranks take 32 steps an epoch, 2 ranks 47.
"""

import signal

import pytest

import elastic_jobs

# The example's commit interval (its default) and a slowed step: the kill lands mid-epoch.
ARGS = ("--epochs", "2", "--train-subset", "3000", "--step-delay", "0.05")
COMMIT_EVERY = 5


def check_survivors(job, lost, survivors, world_after):
    """The survivors' restart and end: the values every elastic case asserts."""
    assert job.returncode == 0, job.output
    assert "elastic job:" in job.output and f"{world_after} ranks go on" in job.output
    # The lost worker started once; each survivor twice: the 3-rank job, then the next.
    assert len(job.starts(lost)) == 1, job.events.get(lost)
    restarts = []
    for w in survivors:
        starts = job.starts(w)
        assert len(starts) == 2, (w, starts)
        first, second = starts
        assert first["size"] == 3 and second["size"] == world_after
        restarts.append(second)
        assert job.end(w) is not None, job.events.get(w)
    # The next membership numbers the survivors 0..n-1 and starts from one commit (a
    # multiple of the commit interval, past the commits the lost worker saw), with the same
    # parameters on every rank.
    assert sorted(s["rank"] for s in restarts) == list(range(world_after))
    assert len({(s["epoch"], s["batch"]) for s in restarts}) == 1, restarts
    assert restarts[0]["batch"] % COMMIT_EVERY == 0 and restarts[0]["batch"] > 0, restarts
    assert len({s["checksum"] for s in restarts}) == 1, restarts
    # They trained to the end in step: identical parameters, one accuracy, and a model that
    # learned (an untrained one scores 0.1).
    ends = [job.end(w) for w in survivors]
    assert len({e["checksum"] for e in ends}) == 1, ends
    assert ends[0]["accuracy"] > 0.6, ends


def test_killed_rank_the_others_go_on_from_the_last_commit(tmp_path):
    job = elastic_jobs.run(tmp_path, np=3, min_np=2, args=ARGS,
                           disturb=[(2, 4, signal.SIGKILL)])
    check_survivors(job, lost=2, survivors=(0, 1), world_after=2)
    # The survivors resumed within 5 s of the kill (the state broadcast included).
    resumed = min(job.starts(w)[1]["time"] for w in (0, 1))
    assert resumed - job.disturbed_at[2] < 5.0, (resumed, job.disturbed_at)


def test_below_min_np_fails_on_every_survivor_with_the_reason(tmp_path):
    job = elastic_jobs.run(tmp_path, np=2, min_np=2, args=ARGS,
                           disturb=[(1, 4, signal.SIGKILL)], timeout=120)
    assert job.returncode == 1, job.output
    reason = "1 rank left, fewer than --min-np 2"
    assert f"braidrun: the elastic job fails: worker 1 ended: {reason}" in job.output
    # The survivor's re-join failed with braidrun's reason, and it said so.
    assert "FailedPreconditionError" in job.output and job.output.count(reason) >= 2, job.output
    assert len(job.starts(0)) == 1 and job.end(0) is None
