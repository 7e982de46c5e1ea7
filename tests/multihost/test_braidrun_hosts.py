"""braidrun across hosts: ranks on two test hosts (tools/testhosts), the remote ones started
over ssh with keys made for the test. Every job asserts what its data plane used between
hosts (tcp) and within one (shared memory).
"""

import os
import re
import select
import signal
import time

import hosts as testhosts

JOB = "tests/multihost/workers/job.py"
SHM = re.compile(r"\b(sysv|posix|cma|xpmem|knem)/memory\b")


def braidrun(build, *args):
    return [str(build / "tools" / "braidrun" / "braidrun"), *testhosts.BRAIDRUN_SSH, *args]


def wait_for_lines(proc, pattern, count, timeout):
    """Reads proc's stdout (raw, so nothing waits in a buffer select cannot see) until `count`
    lines match `pattern`; returns their matches."""
    deadline = time.monotonic() + timeout
    found, text = [], ""
    fd = proc.stdout.fileno()
    while len(found) < count and time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            break
        chunk = os.read(fd, 65536).decode(errors="replace")
        if not chunk:
            break
        text += chunk
        found = [m for m in (re.search(pattern, line) for line in text.splitlines(True)
                             if line.endswith("\n")) if m]
    assert len(found) >= count, f"{pattern!r} seen {len(found)}/{count} times in: {text}"
    # Every job started this way spans h0 and h1 with one rank each (each prints its RESULT
    # before READY): tcp between them.
    res = testhosts.results(text)
    assert sorted(res) == [0, 1], text
    for r in res.values():
        assert r["transports"] == "ucx tcp/eth0" and r["wrong_elements"] == 0, r
    return found


def test_two_hosts_one_rank_each(hosts):
    build = testhosts.build_dir()
    r = hosts.run("h0", braidrun(build, "-np", "2", "-H", "h0:1,h1:1", testhosts.PYTHON, JOB))
    assert r.returncode == 0, r.stdout + r.stderr
    res = testhosts.results(r.stdout)
    assert sorted(res) == [0, 1]
    for rank, host in ((0, "h0"), (1, "h1")):
        assert res[rank]["host"] == host
        assert res[rank]["hosts"] == ["h0", "h1"]
        assert (res[rank]["local_rank"], res[rank]["local_size"]) == (0, 1)
        assert res[rank]["wrong_elements"] == 0
        # The only peer is on the other host: tcp, never shared memory.
        assert res[rank]["transports"] == "ucx tcp/eth0", res[rank]
        assert res[rank]["has_secret"]
        assert res[rank]["secret_in_cmdlines"] == [], "the job secret is on a command line"
    # Every line a rank printed carries its prefix.
    assert re.search(r"^\[1\] RESULT ", r.stdout, re.M)
    assert "braidrun: coordinator listening on 198.18.0.1:" in r.stderr
    assert hosts.wait_idle(["h0", "h1"]) == {}


def test_two_hosts_two_ranks_each_from_a_hostfile(hosts):
    build = testhosts.build_dir()
    hostfile = "/tmp/hostfile"  # h0's own /tmp
    hosts.write("h0", hostfile, "# two test hosts\nh0 slots=2\nh1 slots=2\n")
    r = hosts.run("h0", braidrun(build, "-np", "4", "--hostfile", hostfile,
                                 "--network-interface", "eth0", testhosts.PYTHON, JOB))
    assert r.returncode == 0, r.stdout + r.stderr
    res = testhosts.results(r.stdout)
    assert [res[k]["host"] for k in range(4)] == ["h0", "h0", "h1", "h1"]
    assert [(res[k]["local_rank"], res[k]["local_size"]) for k in range(4)] == [
        (0, 2), (1, 2), (0, 2), (1, 2)]
    for k in range(4):
        assert res[k]["wrong_elements"] == 0
        # tcp to the other host's ranks, shared memory to the one on this host.
        assert "tcp/eth0" in res[k]["transports"] and SHM.search(res[k]["transports"]), res[k]
        assert "tcp/lo" not in res[k]["transports"]
    assert hosts.wait_idle(["h0", "h1"]) == {}


def test_killed_remote_rank_ends_the_job_everywhere(hosts):
    build = testhosts.build_dir()
    p = hosts.popen("h0", braidrun(build, "-np", "2", "-H", "h0:1,h1:1", testhosts.PYTHON, JOB,
                                   "--loop"))
    try:
        ready = wait_for_lines(p, r"^\[(\d)\] READY pid=(\d+)", 2, timeout=60)
        remote_pid = next(int(m.group(2)) for m in ready if m.group(1) == "1")
        killed = time.monotonic()
        assert hosts.run("h1", ["kill", "-KILL", str(remote_pid)]).returncode == 0
        out, err = p.communicate(timeout=30)
        elapsed = time.monotonic() - killed
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode not in (0, None), err
    assert elapsed < 20, f"braidrun took {elapsed:.1f} s to end the job"
    assert "braidrun: rank 1 (on h1) exited with code 137 (128+9: SIGKILL)" in err, err
    assert hosts.wait_idle(["h0", "h1"]) == {}


def test_sigint_reaches_remote_ranks(hosts):
    build = testhosts.build_dir()
    p = hosts.popen("h0", braidrun(build, "-np", "2", "-H", "h0:1,h1:1", testhosts.PYTHON, JOB,
                                   "--loop"))
    try:
        ready = wait_for_lines(p, r"^\[(\d)\] READY pid=(\d+) ppid=(\d+)", 2, timeout=60)
        braidrun_pid = next(int(m.group(3)) for m in ready if m.group(1) == "0")
        assert hosts.run("h0", ["kill", "-INT", str(braidrun_pid)]).returncode == 0
        out, err = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 128 + signal.SIGINT, err
    # Both ranks saw the interrupt as Python does (KeyboardInterrupt), none was killed.
    assert re.search(r"^\[1\] KeyboardInterrupt", err, re.M), err
    assert re.search(r"^\[0\] KeyboardInterrupt", err, re.M), err
    assert "still running" not in err, err  # no rank needed SIGKILL
    assert hosts.wait_idle(["h0", "h1"]) == {}


def test_lost_host_ends_the_job_with_a_clear_error():
    testhosts.require("ip", "tc", "unshare", "nsenter", "setsid", "sshd", "ssh", "ssh-keygen")
    build = testhosts.build_dir()
    with testhosts.Hosts(2, ssh=True) as hosts:
        p = hosts.popen("h0", braidrun(build, "-np", "2", "-H", "h0:1,h1:1", testhosts.PYTHON,
                                       JOB, "--loop"))
        try:
            wait_for_lines(p, r"^\[(\d)\] READY", 2, timeout=60)
            lost = time.monotonic()
            hosts.kill_host("h1")
            out, err = p.communicate(timeout=40)
            elapsed = time.monotonic() - lost
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
        assert p.returncode not in (0, None), err
        assert elapsed < 20, f"braidrun took {elapsed:.1f} s to end the job"
        # Whichever noticed first, the report names the host or the rank that was on it.
        assert ("rank 1 (on h1): lost host h1" in err or re.search(r"rank 1\b.*lost", err)), err
        assert hosts.wait_idle(["h0"]) == {}


def test_ssh_port(hosts):
    """--ssh-port reaches the other hosts' sshd on that port (the test hosts' also listen on
    2222); a port nothing listens on loses the host at once."""
    build = testhosts.build_dir()
    r = hosts.run("h0", braidrun(build, "-np", "2", "-H", "h0:1,h1:1", "--ssh-port", "2222",
                                 testhosts.PYTHON, JOB))
    assert r.returncode == 0, r.stdout + r.stderr
    res = testhosts.results(r.stdout)
    assert sorted(res) == [0, 1] and res[1]["host"] == "h1", r.stdout
    assert all(x["transports"] == "ucx tcp/eth0" and x["wrong_elements"] == 0
               for x in res.values()), res
    r = hosts.run("h0", braidrun(build, "-np", "2", "-H", "h0:1,h1:1", "--ssh-port", "2223",
                                 "/bin/true"), timeout=60)
    assert r.returncode == 255, r.stderr
    assert "rank 1 (on h1): lost host h1" in r.stderr, r.stderr
    assert "port 2223: Connection refused" in r.stderr, r.stderr
    assert hosts.wait_idle(["h0", "h1"]) == {}


def test_unreachable_host_fails_fast(hosts):
    build = testhosts.build_dir()
    # 198.18.0.9 is on the test hosts' network but nobody has it: ssh cannot connect.
    r = hosts.run("h0", braidrun(build, "-np", "2", "-H", "h0:1,198.18.0.9:1",
                                 "--ssh-option", "ConnectTimeout=3", "/bin/true"), timeout=60)
    assert r.returncode == 255, r.stderr
    assert "rank 1 (on 198.18.0.9): lost host 198.18.0.9" in r.stderr
    assert hosts.wait_idle(["h0", "h1"]) == {}
