"""Elastic training across test hosts (`ctest -L long`, outside CI: about three minutes):
braidrun on h0 runs examples/elastic_fashion_mnist.py with one rank on each of h0, h1 and h2
and a host discovery script; h2's rank is lost mid-epoch, the other two go on from the last
commit, then the discovery output lists h3, whose new rank joins at the next commit; every
membership holds identical parameters. h2's rank is lost either to kill -9 (with `none`,
`powersgd:rank=2` and `fp4`) or to its link going down, which only the heartbeat reveals;
or h2 leaves the discovery output and its rank is drained.
The same checks as tests/python/test_elastic.py, whose harness (elastic_jobs.py) this uses.
"""

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

import hosts as testhosts

sys.path.insert(0, str(testhosts.REPO / "tests" / "python"))
import elastic_jobs  # noqa: E402
from test_elastic import ARGS, check_change, check_end  # noqa: E402


def job_across_hosts(disturb, args=(), env=None):
    """The job above (one rank on each of h0, h1, h2; h3 on standby) with `disturb`, each
    action given the hosts when it is a callable (elastic_jobs.run's disturbances)."""
    testhosts.require("ip", "tc", "unshare", "nsenter", "setsid", "sshd", "ssh", "ssh-keygen")
    # The hosts share the machine's files except /tmp: the report and the discovery file
    # live where braidrun (on h0), its ranks and this test all see them.
    work = Path(tempfile.mkdtemp(prefix="braid-elastic-", dir="/var/tmp"))
    try:
        with testhosts.Hosts(4, ssh=True) as hosts:
            def start(cmd, env, out):
                cmd = [cmd[0], *testhosts.BRAIDRUN_SSH, *cmd[1:]]
                return subprocess.Popen(hosts.argv("h0", cmd, env), stdout=out,
                                        stderr=subprocess.STDOUT, cwd=testhosts.REPO)

            def bind(action):
                return (lambda: action(hosts)) if callable(action) else action

            return elastic_jobs.run(
                work, np=3, min_np=2, args=ARGS + tuple(args), hosts="h0:1\nh1:1\nh2:1\n",
                start=start, env=env, timeout=300,
                disturb=[(w, n, bind(a)) for w, n, a in disturb])
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run_across_hosts(lose_h2, args=(), env=None):
    """The job above, h2's rank lost by `lose_h2(hosts)` after its 4th commit."""
    job = job_across_hosts([(2, 4, lose_h2), (0, 7, "h0:1\nh1:1\nh2:1\nh3:1\n")],
                           args=args, env=env)
    assert job.returncode == 0, job.output
    assert "starting worker 3 on h3" in job.output, job.output
    assert "host h2 is blacklisted" in job.output, job.output
    for w in (0, 1):
        assert [s["size"] for s in job.starts(w)] == [3, 2, 3], job.starts(w)
    restart = check_change(job, (0, 1), 2)
    check_change(job, (0, 1, 3), 3)
    check_end(job, (0, 1, 3))
    return job, restart


@pytest.mark.parametrize("compression", ["none", "powersgd:rank=2", "fp4"])
def test_a_killed_rank_on_another_host_and_a_new_host_joins(compression):
    def kill_h2(hosts):
        # "[e]" keeps the pattern from matching pkill's own command line.
        r = hosts.run("h2", ["pkill", "-9", "-f", "[e]lastic_fashion_mnist"])
        assert r.returncode == 0, r.stderr

    job, restart = run_across_hosts(kill_h2, args=("--compression", compression))
    assert min(s["time"] for s in restart) - job.disturbed_at[0] < 5.0, restart


def test_a_host_cut_off_is_lost_by_heartbeat_and_a_new_host_joins():
    def cut_h2(hosts):
        r = hosts.run("h2", ["ip", "link", "set", "eth0", "down"])
        assert r.returncode == 0, r.stderr

    job, restart = run_across_hosts(cut_h2, env={"BRAID_HEARTBEAT_TIMEOUT_S": "3"})
    assert "declared worker 2 (on h2) lost" in job.output and "silent for" in job.output, \
        job.output
    # The heartbeat timeout (3 s) + 5 s from the cut to the survivors' restart.
    assert min(s["time"] for s in restart) - job.disturbed_at[0] < 8.0, restart


def test_a_host_removed_from_the_discovery_output_is_drained():
    # h2 leaves the script's output: its rank (over ssh) leaves at the next commit and exits
    # 0; nothing is restored, h2 is not blacklisted, the job ends with 2 ranks.
    job = job_across_hosts([(0, 4, "h0:1\nh1:1\n")])
    assert job.returncode == 0, job.output
    assert ("host h2 is no longer in the discovery output: worker 2 (on h2) leaves the job "
            "at the next commit") in job.output, job.output
    assert "worker 2 (on h2) left the job" in job.output, job.output
    assert "lost" not in job.output and "blacklisted" not in job.output, job.output
    for w in (0, 1):
        assert [s["size"] for s in job.starts(w)] == [3, 2], job.starts(w)
    assert job.end(2) is None, job.events.get(2)
    check_change(job, (0, 1), 2)
    check_end(job, (0, 1))
