"""braidctl pointed at a coordinator host that does not resolve, on test hosts whose name
resolution fails in each way a real host's can: no route to the name servers (an answer at
once), and name servers that never answer (packets dropped). Either way braidctl fails
within seconds with exit code 2, naming the host, never after a long or unbounded wait.
"""

import time

import hosts as testhosts

SECRET = {"BRAID_JOB_SECRET": "0123456789abcdef" * 4}  # strong enough to be accepted


def braidctl(build):
    return str(build / "tools" / "braidctl" / "braidctl")


def test_unresolvable_coordinator_host_fails_at_once_naming_it():
    testhosts.require("ip", "tc", "unshare", "nsenter")
    build = testhosts.build_dir()
    with testhosts.Hosts(2, ssh=False) as h:
        # h0 has no route beyond the test hosts' network: the resolver cannot send a query.
        start = time.monotonic()
        r = h.run("h0", [braidctl(build), "status", "--coordinator", "node9.invalid:29600"],
                  env=SECRET, timeout=30)
        elapsed = time.monotonic() - start
        assert r.returncode == 2, r.stderr
        assert r.stdout == ""
        assert r.stderr.startswith("braidctl: cannot resolve the coordinator's host "
                                   "'node9.invalid' (node9.invalid:29600): "), r.stderr
        assert elapsed < 10, elapsed
        # Now every query leaves for h1, which drops it: no name server ever answers. The
        # resolver's own retries would take far longer than braidctl's 3 s bound.
        assert h.run("h0", ["ip", "route", "add", "default", "via", "198.18.0.2"]).returncode == 0
        start = time.monotonic()
        r = h.run("h0", [braidctl(build), "status", "--once", "--coordinator",
                         "node9.invalid:29600"], env=SECRET, timeout=60)
        elapsed = time.monotonic() - start
        assert r.returncode == 2, r.stderr
        # (A name server on this host's loopback, as with a local caching resolver, refuses
        # at once instead: the reason differs, the host is named all the same.)
        assert r.stderr.startswith("braidctl: cannot resolve the coordinator's host "
                                   "'node9.invalid' (node9.invalid:29600): "), r.stderr
        if not open("/etc/resolv.conf").read().count("nameserver 127."):
            assert "no answer within 3s (are the name servers reachable?)" in r.stderr
        assert elapsed < 10, elapsed
        # A name the host knows (/etc/hosts) resolves: braidctl goes on to the coordinator,
        # which is not there (nothing listens on h1:29600).
        r = h.run("h0", [braidctl(build), "status", "--coordinator", "h1:29600"], env=SECRET,
                  timeout=30)
        assert r.returncode == 2, r.stderr
        assert r.stderr.startswith("braidctl: cannot reach the coordinator at h1:29600: "), r.stderr
