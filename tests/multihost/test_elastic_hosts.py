"""Elastic training across test hosts (`ctest -L long`, outside CI: about a minute): braidrun
on h0 runs examples/elastic_fashion_mnist.py with one rank on each of h0, h1 and h2 and a
host discovery script. h2's link goes down mid-epoch, which only the heartbeat reveals; the
other two go on from the last commit; the discovery output then lists h3, whose new rank
joins at the next commit; every membership holds identical parameters. The same checks as
tests/python/test_elastic.py, whose harness (elastic_jobs.py) this uses.
"""

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import hosts as testhosts

sys.path.insert(0, str(testhosts.REPO / "tests" / "python"))
import elastic_jobs  # noqa: E402
from test_elastic import ARGS, check_change, check_end  # noqa: E402


def test_a_host_cut_off_is_lost_by_heartbeat_and_a_new_host_joins():
    testhosts.require("ip", "tc", "unshare", "nsenter", "setsid", "sshd", "ssh", "ssh-keygen")
    build = testhosts.build_dir()
    # The hosts share the machine's files except /tmp: the report and the discovery file
    # live where braidrun (on h0), its ranks and this test all see them.
    work = Path(tempfile.mkdtemp(prefix="braid-elastic-", dir="/var/tmp"))
    try:
        with testhosts.Hosts(4, ssh=True) as hosts:
            def start(cmd, env, out):
                cmd = [cmd[0], *testhosts.BRAIDRUN_SSH, *cmd[1:]]
                return subprocess.Popen(hosts.argv("h0", cmd, env), stdout=out,
                                        stderr=subprocess.STDOUT, cwd=testhosts.REPO)

            def cut_h2():
                r = hosts.run("h2", ["ip", "link", "set", "eth0", "down"])
                assert r.returncode == 0, r.stderr

            job = elastic_jobs.run(
                work, np=3, min_np=2, args=ARGS, hosts="h0:1\nh1:1\nh2:1\n", start=start,
                env={"BRAID_HEARTBEAT_TIMEOUT_S": "3"}, timeout=300,
                disturb=[(2, 4, cut_h2), (0, 7, "h0:1\nh1:1\nh2:1\nh3:1\n")])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    assert job.returncode == 0, job.output
    assert "declared worker 2 (on h2) lost" in job.output and "silent for" in job.output, \
        job.output
    assert "starting worker 3 on h3" in job.output, job.output
    for w in (0, 1):
        assert [s["size"] for s in job.starts(w)] == [3, 2, 3], job.starts(w)
    restart = check_change(job, (0, 1), 2)
    # The heartbeat timeout (3 s) + 5 s from the cut to the survivors' restart.
    assert min(s["time"] for s in restart) - job.disturbed_at[0] < 8.0, restart
    check_change(job, (0, 1, 3), 3)
    check_end(job, (0, 1, 3))
