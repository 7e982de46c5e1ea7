"""tools/testhosts/braid-testhosts itself: hosts that are separate machines as far as braid
and UCX can tell, links with the rate asked for, and nothing left behind (namespace, veth,
bridge, qdisc, state), also after a failing command, a timeout or a signal.
"""

import os
import signal
import subprocess

import hosts as testhosts

TOOL = str(testhosts.TOOL)


def leftovers(prefix):
    """What the machine still holds of set `prefix`: namespaces, links (and their qdiscs)."""
    netns = subprocess.run(["ip", "netns", "list"], stdout=subprocess.PIPE, text=True).stdout
    links = subprocess.run(["ip", "-o", "link", "show"], stdout=subprocess.PIPE, text=True).stdout
    qdiscs = subprocess.run(["tc", "qdisc", "show"], stdout=subprocess.PIPE, text=True).stdout
    found = [l for l in netns.splitlines() if l.startswith(prefix + "-")]
    found += [l for l in links.splitlines() if f" {prefix}-" in l]
    found += [l for l in qdiscs.splitlines() if f" {prefix}-" in l]
    if os.path.exists(f"/run/braid-testhosts/{prefix}.json"):
        found.append("state file")
    return found


def run_tool(prefix, *args, timeout=60):
    return subprocess.run([TOOL, "run", "--prefix", prefix, *args], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, timeout=timeout)


def test_hosts_are_separate_machines_on_a_rate_limited_link():
    testhosts.require("ip", "tc", "unshare", "nsenter")
    with testhosts.Hosts(2, ssh=False, rate="100mbit") as h:
        names = [h.run(x, ["hostname"]).stdout.strip() for x in ("h0", "h1")]
        assert names == ["h0", "h1"]
        # Own PID namespace (PID 1 is the host's reaper), own /tmp.
        h.write("h0", "/tmp/mark", "h0 only")
        assert h.run("h0", ["cat", "/tmp/mark"]).stdout == "h0 only"
        assert h.run("h1", ["test", "-e", "/tmp/mark"]).returncode == 1
        pid1 = h.run("h1", ["cat", "/proc/1/cmdline"]).stdout
        assert "braid-testhosts" in pid1 and "sigwaitinfo" in pid1
        # Own IPC namespace: a System V segment made in h0 is not seen in h1.
        mk = h.run("h0", [testhosts.PYTHON, "-c",
                          "import ctypes; libc = ctypes.CDLL(None); "
                          "print(libc.shmget(0x62726964, 4096, 0o1600))"])
        assert int(mk.stdout) >= 0, mk.stderr
        assert "0x62726964" in h.run("h0", ["ipcs", "-m"]).stdout
        assert "0x62726964" not in h.run("h1", ["ipcs", "-m"]).stdout
        # Names and addresses of every host; a route to the other host and nowhere else.
        hosts_file = h.run("h1", ["cat", "/etc/hosts"]).stdout
        assert "198.18.0.1 h0" in hosts_file and "198.18.0.2 h1" in hosts_file
        probe = ("import errno, socket, sys\n"
                 "s = socket.socket(); s.settimeout(5)\n"
                 "try: s.connect((sys.argv[1], 9))\n"
                 "except OSError as e: print(errno.errorcode.get(e.errno, e))\n")
        # h0 answers (nothing listens on port 9: refused); anything else is unreachable.
        assert h.run("h1", [testhosts.PYTHON, "-c", probe, "h0"]).stdout == "ECONNREFUSED\n"
        assert h.run("h1", [testhosts.PYTHON, "-c", probe, "10.0.0.1"]).stdout == "ENETUNREACH\n"
        routes = h.run("h1", ["ip", "route"]).stdout.strip().splitlines()
        assert routes == ["198.18.0.0/24 dev eth0 proto kernel scope link src 198.18.0.2"], routes
        # Both directions of each link are limited to the rate asked for.
        assert "rate 100Mbit" in h.run("h1", ["tc", "qdisc", "show", "dev", "eth0"]).stdout
        bridge_side = subprocess.run(["tc", "qdisc", "show", "dev", f"{h.prefix}-h1p"],
                                     stdout=subprocess.PIPE, text=True).stdout
        assert "tbf" in bridge_side and "rate 100Mbit" in bridge_side
        prefix = h.prefix
    assert leftovers(prefix) == []


def test_run_tears_down_after_success_failure_and_timeout():
    testhosts.require("ip", "tc", "unshare", "nsenter")
    prefix = f"bt{os.getpid() % 100000}r"
    ok = run_tool(prefix, "-n", "2", "--rate", "1gbit", "--", "hostname")
    assert (ok.returncode, ok.stdout) == (0, "h0\n"), ok.stderr
    assert leftovers(prefix) == []
    failed = run_tool(prefix, "-n", "2", "--", "sh", "-c", "exit 7")
    assert failed.returncode == 7, failed.stderr
    assert leftovers(prefix) == []
    slow = run_tool(prefix, "-n", "2", "--timeout", "1", "--", "sleep", "60")
    assert slow.returncode == 124, slow.stderr
    assert "exceeded --timeout 1" in slow.stderr
    assert leftovers(prefix) == []


def test_run_tears_down_on_sigterm():
    testhosts.require("ip", "tc", "unshare", "nsenter")
    prefix = f"bt{os.getpid() % 100000}s"
    p = subprocess.Popen([TOOL, "run", "--prefix", prefix, "-n", "2", "--", "sh", "-c",
                          "echo up; exec sleep 60"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline() == "up\n"
        p.send_signal(signal.SIGTERM)
        p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 130
    assert leftovers(prefix) == []


def test_run_tears_down_on_ctrl_c():
    """Ctrl-C at a terminal: SIGINT to the whole foreground process group (the tool and the
    command it runs in a host), not to the tool alone."""
    testhosts.require("ip", "tc", "unshare", "nsenter")
    prefix = f"bt{os.getpid() % 100000}c"
    p = subprocess.Popen([TOOL, "run", "--prefix", prefix, "-n", "2", "--rate", "100mbit", "--",
                          "sh", "-c", "echo up; exec sleep 60"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert p.stdout.readline() == "up\n"
        os.killpg(p.pid, signal.SIGINT)
        p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    assert p.returncode == 130
    assert leftovers(prefix) == []


def test_down_removes_a_set_whose_owner_died():
    """A crashed `up` caller leaves the set; `down` still removes everything, and `check` says
    whether anything is left."""
    testhosts.require("ip", "tc", "unshare", "nsenter")
    prefix = f"bt{os.getpid() % 100000}d"
    up = subprocess.run([TOOL, "up", "--prefix", prefix, "-n", "3", "--rate", "10mbit"],
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)
    assert up.returncode == 0, up.stderr
    check = subprocess.run([TOOL, "check", "--prefix", prefix], stdout=subprocess.PIPE, text=True)
    assert check.returncode == 1 and f"netns {prefix}-h2" in check.stdout
    down = subprocess.run([TOOL, "down", "--prefix", prefix], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, timeout=30)
    assert down.returncode == 0, down.stderr
    assert leftovers(prefix) == []
    check = subprocess.run([TOOL, "check", "--prefix", prefix], stdout=subprocess.PIPE, text=True)
    assert check.returncode == 0
