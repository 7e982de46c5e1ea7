"""Elastic training (docs/elastic.md): a job under braidrun --min-np that loses a rank goes
on with the survivors from the last commit, every survivor holding the same parameters;
a replacement host listed by the discovery script joins at the next commit; a job that
falls below --min-np fails on every survivor with the reason. The other cases (compression,
a rank lost by heartbeat only, a rank lost during the change, a host that keeps failing) run
under the `long` label: test_elastic_long.py.

Each job trains examples/elastic_fashion_mnist.py (Horovod's elastic style) on 8000 images
for 2 epochs, a few hundred steps: 3 ranks take 84 steps an epoch, 2 ranks 125.
"""

import signal

import pytest

import elastic_jobs

# The example's commit interval (its default) and a slowed step: the kill lands mid-epoch.
ARGS = ("--epochs", "2", "--train-subset", "8000", "--step-delay", "0.03")
COMMIT_EVERY = 5


def check_change(job, workers, size):
    """The start of a membership of `size` ranks on `workers` (each one's start of that
    size): ranks 0..size-1, one commit (a multiple of the commit interval) and one set of
    parameters on every rank. Returns the start events."""
    starts = []
    for w in workers:
        of_size = [s for s in job.starts(w) if s["size"] == size]
        assert of_size, (w, size, job.starts(w))
        starts.append(of_size[-1])
    assert sorted(s["rank"] for s in starts) == list(range(size)), starts
    assert len({(s["epoch"], s["batch"]) for s in starts}) == 1, starts
    assert starts[0]["batch"] % COMMIT_EVERY == 0, starts
    assert len({s["checksum"] for s in starts}) == 1, starts
    return starts


def check_survivors(job, lost, survivors, world_after):
    """A job that lost worker `lost` and went on with `survivors`: what every case asserts."""
    assert job.returncode == 0, job.output
    assert f"{world_after} ranks go on" in job.output, job.output
    # The lost worker started once; each survivor twice: the 3-rank job, then the next.
    assert len(job.starts(lost)) == 1, job.events.get(lost)
    for w in survivors:
        assert [s["size"] for s in job.starts(w)] == [3, world_after], job.starts(w)
    restart = check_change(job, survivors, world_after)
    assert restart[0]["batch"] > 0, restart  # it went on from a commit, not from the start
    check_end(job, survivors)


def check_end(job, workers):
    """They trained to the end in step: identical parameters, one accuracy, and a model that
    learned (an untrained one scores 0.1)."""
    ends = [job.end(w) for w in workers]
    assert all(ends), job.events
    assert len({e["checksum"] for e in ends}) == 1, ends
    assert ends[0]["accuracy"] > 0.6, ends


def test_killed_rank_the_others_go_on_and_a_replacement_host_joins(tmp_path):
    # Worker 2 is killed after its 4th commit; its host (localhost) is then blacklisted, so
    # its free slot gets no new rank; once worker 0 is 2 commits further, the discovery
    # script lists a new host, 127.0.0.1, whose rank (worker 3) joins at the next commit.
    # About 200 steps remain then: a new rank must start (a Python start, seconds under
    # load) before training ends, or its init() fails (the job is finishing).
    job = elastic_jobs.run(
        tmp_path, np=3, min_np=2, args=ARGS, hosts="localhost:3\n",
        disturb=[(2, 4, signal.SIGKILL), (0, 6, "localhost:3\n127.0.0.1:1\n")])
    assert job.returncode == 0, job.output
    assert "host localhost is blacklisted for 1m" in job.output, job.output
    assert "starting worker 3 on 127.0.0.1" in job.output, job.output
    assert sorted(job.events) == [0, 1, 2, 3], sorted(job.events)  # no rank on localhost
    assert len(job.starts(2)) == 1
    for w in (0, 1):
        assert [s["size"] for s in job.starts(w)] == [3, 2, 3], job.starts(w)
    restart = check_change(job, (0, 1), 2)
    assert restart[0]["batch"] > 0, restart
    # The survivors resumed within 5 s of the kill (the state broadcast included).
    assert min(s["time"] for s in restart) - job.disturbed_at[0] < 5.0, restart
    # The newcomer took the survivors' state at their next commit.
    grown = check_change(job, (0, 1, 3), 3)
    assert len(job.starts(3)) == 1
    assert grown[0]["batch"] > restart[0]["batch"], (grown, restart)
    # Discovery interval (1 s) + 10 s from the new host's listing to its first step.
    assert job.starts(3)[0]["time"] - job.disturbed_at[1] < 11.0
    check_end(job, (0, 1, 3))


def test_below_min_np_fails_on_every_survivor_with_the_reason(tmp_path):
    job = elastic_jobs.run(tmp_path, np=2, min_np=2, args=ARGS,
                           disturb=[(1, 4, signal.SIGKILL)], timeout=120)
    assert job.returncode == 1, job.output
    reason = "1 rank left, fewer than --min-np 2"
    assert f"braidrun: the elastic job fails: worker 1 ended: {reason}" in job.output
    # The survivor's re-join failed with braidrun's reason, and it said so.
    assert "FailedPreconditionError" in job.output and job.output.count(reason) >= 2, job.output
    assert len(job.starts(0)) == 1 and job.end(0) is None
