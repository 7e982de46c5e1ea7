"""A failure anywhere reaches every rank (docs/failures.md), with real
processes: a standalone braid-coordinator and ranks started by hand or by braidrun.
"""

import json
import re
import secrets
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import braid_launch

INIT_ONLY = r"""
import sys, time, braid
t0 = time.monotonic()
try:
    braid.init()
    print("joined", flush=True)
except braid.BraidError as e:
    print(f"error after {time.monotonic() - t0:.1f} s: {type(e).__name__}: {e}", flush=True)
    sys.exit(1)
"""


def job_env(build, secret, extra=None):
    """A rank's (or the coordinator's) environment with the job's secret, which every call
    to the coordinator carries (docs/security.md: Who may join)."""
    env = braid_launch.rank_env(build, dict(extra or {}, BRAID_JOB_SECRET=secret))
    env.pop("BRAID_JOB_SECRET_FILE", None)
    return env


def start_coordinator(build, size, register_timeout, tmp, secret):
    """A braid-coordinator whose registration deadline comes from its environment
    (BRAID_REGISTER_TIMEOUT_S; the other tests give it as --register-timeout)."""
    port_file = Path(tmp) / "port"
    coord = subprocess.Popen(
        [str(build / "tools" / "coordinator" / "braid-coordinator"), "--port", "0", "--size",
         str(size), "--port-file", str(port_file)],
        env=job_env(build, secret, {"BRAID_REGISTER_TIMEOUT_S": str(register_timeout)}),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True)
    deadline = time.monotonic() + 30
    while not (port_file.exists() and port_file.read_text().strip()):
        assert time.monotonic() < deadline and coord.poll() is None, "no coordinator"
        time.sleep(0.02)
    return coord, int(port_file.read_text())


def test_a_world_that_never_fully_registers_names_the_missing_ranks():
    """Ranks 0 and 2 of a world of 4 register; after the register timeout (3 s) both fail
    with DeadlineExceededError naming ranks 1 and 3, and the job ends failed with the same
    reason: `braidctl status --once`, following it from the start, exits 1 with it."""
    build = braid_launch.build_dir()
    with tempfile.TemporaryDirectory(prefix="braid-register-") as tmp:
        secret = secrets.token_hex(32)
        coord, port = start_coordinator(build, 4, 3, tmp, secret)
        follow = None
        try:
            follow = subprocess.Popen(
                [str(build / "tools" / "braidctl" / "braidctl"), "status", "--once", "--json",
                 "--coordinator", f"127.0.0.1:{port}"], env=job_env(build, secret),
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            procs = []
            for r in (0, 2):
                env = job_env(build, secret, {"BRAID_COORDINATOR": f"127.0.0.1:{port}",
                                              "BRAID_RANK": str(r), "BRAID_SIZE": "4"})
                procs.append(subprocess.Popen([braid_launch.PYTHON, "-c", INIT_ONLY], env=env,
                                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                              text=True))
            for p in procs:
                out, _ = p.communicate(timeout=60)
                assert p.returncode == 1, out
                m = re.search(r"error after ([\d.]+) s: DeadlineExceededError: (.*)", out)
                assert m, out
                assert "only 2 of 4 ranks registered within 3s: missing ranks 1, 3" in m.group(2), out
                assert float(m.group(1)) < 15, out
            out, err = follow.communicate(timeout=30)
            assert follow.returncode == 1, err
            status = json.loads(out)
            assert status["job_id"] == "1" and status["phase"] == "JOB_ENDED", out
            assert status["job_state"].startswith(
                "ended, aborted: registration failed: only 2 of 4 ranks registered within 3s: "
                "missing ranks 1, 3; registered: "), out
        finally:
            if follow is not None and follow.poll() is None:
                follow.kill()
                follow.wait()
            coord.kill()
            coord.wait()


def test_a_rank_hosting_the_coordinator_names_the_ranks_that_never_came():
    """torchrun-style launch (rank 0 hosts the coordinator) where rank 1 never starts: rank 0
    fails after the registration timeout (BRAID_REGISTER_TIMEOUT_S, 3 s, which wins over
    BRAID_TIMEOUT_S) naming rank 1, and not with the bare deadline of its own call 5 s later.
    (Without BRAID_REGISTER_TIMEOUT_S it is BRAID_TIMEOUT_S but at least 60 s: the same
    RegistrationTimeout sets both deadlines, tests/unit/config_test.cc.)"""
    build = braid_launch.build_dir()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = braid_launch.rank_env(build, {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0",
                                        "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                                        "MASTER_PORT": str(port), "BRAID_TIMEOUT_S": "5",
                                        "BRAID_REGISTER_TIMEOUT_S": "3"})
    for k in ("BRAID_JOB_SECRET", "BRAID_JOB_SECRET_FILE", "BRAID_COORDINATOR_PORT"):
        env.pop(k, None)
    out = subprocess.run([braid_launch.PYTHON, "-c", INIT_ONLY], env=env, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120).stdout
    m = re.search(r"error after ([\d.]+) s: DeadlineExceededError: (.*)", out)
    assert m, out
    assert "only 1 of 2 ranks registered within 3s: missing rank 1" in m.group(2), out
    assert 2.5 < float(m.group(1)) < 7.5, out


def torchrun_env(build, rank, world_size, port):
    """A rank started by hand as torchrun would start it: no braidrun, no braid variable, the
    job's secret derived from the user's key (docs/security.md: Who may join)."""
    env = braid_launch.rank_env(build, {"RANK": str(rank), "WORLD_SIZE": str(world_size),
                                        "LOCAL_RANK": str(rank), "MASTER_ADDR": "127.0.0.1",
                                        "MASTER_PORT": str(port), "BRAID_TIMEOUT_S": "30"})
    for k in ("BRAID_JOB_SECRET", "BRAID_JOB_SECRET_FILE", "BRAID_COORDINATOR_PORT",
              "LOCAL_WORLD_SIZE"):
        env.pop(k, None)
    return env


def test_ranks_that_disagree_on_the_world_size_both_fail_at_once_naming_both_sizes():
    """torchrun-style launch where rank 0 has WORLD_SIZE=2 and rank 1 WORLD_SIZE=3: both fail
    within seconds with InvalidArgumentError naming both sizes (not a wrong-secret refusal on
    rank 1 and 'only 1 of 2 ranks registered' on rank 0 a minute later)."""
    build = braid_launch.build_dir()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [subprocess.Popen([braid_launch.PYTHON, "-c", INIT_ONLY],
                              env=torchrun_env(build, r, size, port), text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
             for r, size in ((0, 2), (1, 3))]
    for p in procs:
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 1, out
        m = re.search(r"error after ([\d.]+) s: InvalidArgumentError: (.*)", out)
        assert m, out
        # Rank 0 registered first (it waited) or not yet (it came after, and was refused).
        assert re.fullmatch(
            r"registering with the coordinator at 127\.0\.0\.1:\d+: the ranks disagree on the "
            r"world size \(3 vs 2\): rank 1 \(pid \d+ on [^)]+\) expects 3 but "
            r"(rank 0 \(pid \d+ on [^)]+\) expects|this coordinator was started for) 2: give "
            r"every rank the same world size \(WORLD_SIZE, BRAID_SIZE, \.\.\.\)", m.group(2)), out
        assert float(m.group(1)) < 20, out


def test_a_master_addr_that_does_not_resolve_fails_every_rank_at_once_naming_it():
    """MASTER_ADDR=no-such-host.invalid: rank 0 and rank 1 both fail within seconds saying
    the host does not resolve (not 'cannot listen' on rank 0 and 'cannot reach the
    coordinator' on rank 1 a minute later)."""
    build = braid_launch.build_dir()
    procs = []
    for r in (0, 1):
        env = torchrun_env(build, r, 2, 29500)
        env["MASTER_ADDR"] = "no-such-host.invalid"
        procs.append(subprocess.Popen([braid_launch.PYTHON, "-c", INIT_ONLY], env=env,
                                      text=True, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT))
    for p in procs:
        out, _ = p.communicate(timeout=60)
        assert p.returncode == 1, out
        m = re.search(r"error after ([\d.]+) s: UnavailableError: (.*)", out)
        assert m, out
        assert m.group(2).startswith(
            "cannot resolve the coordinator's host 'no-such-host.invalid' (MASTER_ADDR): "), out
        assert float(m.group(1)) < 10, out


def test_a_wrong_job_secret_is_an_invalid_argument_error_saying_where_it_came_from():
    """A rank whose secret is not the coordinator's: InvalidArgumentError (one of the
    subclasses docs/python.md lists, not a bare BraidError 'PERMISSION_DENIED: ...') saying
    where the secret came from."""
    build = braid_launch.build_dir()
    with tempfile.TemporaryDirectory(prefix="braid-secret-") as tmp:
        coord, port = start_coordinator(build, 1, 30, tmp, secrets.token_hex(32))
        try:
            env = job_env(build, secrets.token_hex(32), {
                "BRAID_COORDINATOR": f"127.0.0.1:{port}", "BRAID_RANK": "0", "BRAID_SIZE": "1"})
            out = subprocess.run([braid_launch.PYTHON, "-c", INIT_ONLY], env=env, text=True,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 timeout=60).stdout
            m = re.search(r"error after [\d.]+ s: InvalidArgumentError: (.*)", out)
            assert m, out
            assert "the coordinator refused Register: wrong job secret" in m.group(1), out
            assert m.group(1).endswith("this rank's secret is BRAID_JOB_SECRET(_FILE)"), out
        finally:
            coord.kill()
            coord.wait()


def test_a_local_failure_and_a_negotiation_deadline_reach_every_rank():
    """workers/failures.py on 2 ranks with BRAID_NEGOTIATION_TIMEOUT_S=5: a collective one
    rank refuses (in the runtime, then in the Python layer) fails on the other within 2 s
    naming the tensor, the rank and the cause; calls under different names fail on both
    within 10 s naming the ranks; the job goes on after each."""
    res = braid_launch.run_worker("failures.py", 2, timeout=120,
                                  env={"BRAID_NEGOTIATION_TIMEOUT_S": "5"})
    assert res.returncode == 0, res.output
    assert res.output.count("all checks passed") == 2, res.output


def test_an_object_that_fails_to_pickle_or_unpickle_fails_every_rank_at_once():
    """workers/object_failures.py on 2 ranks with BRAID_NEGOTIATION_TIMEOUT_S=2: an object
    the root (or one rank of an all-gather) cannot pickle, or that a receiver cannot
    unpickle, is an InvalidArgumentError on every rank within 1.5 s naming the collective,
    the rank and the cause; the next object collectives (generated names, and the same
    explicit name) return the right objects."""
    res = braid_launch.run_worker("object_failures.py", 2, timeout=60,
                                  env={"BRAID_NEGOTIATION_TIMEOUT_S": "2"})
    assert res.returncode == 0, res.output
    assert res.output.count("all checks passed") == 2, res.output


def test_a_torchrun_style_job_on_ipv6_loopback():
    """MASTER_ADDR=::1: rank 0 hosts the coordinator on [::1]:PORT and rank 1 reaches it there
    (both wrote "::1:PORT", which gRPC reads as an IPv6 address without a port)."""
    with socket.socket(socket.AF_INET6) as s:
        try:
            s.bind(("::1", 0))
        except OSError:
            return  # no IPv6 here
        port = s.getsockname()[1]
    build = braid_launch.build_dir()
    script = ("import braid, numpy as np\nbraid.init()\n"
              "print('sum', braid.allreduce(np.full(2, braid.rank() + 1.0, np.float32), "
              "name='x', op=braid.Sum).tolist(), flush=True)\nbraid.shutdown()\n")
    procs = [subprocess.Popen([braid_launch.PYTHON, "-c", script],
                              env=dict(torchrun_env(build, r, 2, port), MASTER_ADDR="::1"),
                              text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
             for r in (0, 1)]
    for p in procs:
        out, _ = p.communicate(timeout=60)
        assert p.returncode == 0 and "sum [3.0, 3.0]" in out, out


def test_the_standalone_coordinator_names_the_real_cause_of_a_failed_start():
    """An unwritable --port-file ends braid-coordinator (exit 2) naming the path and the
    system's reason, instead of a coordinator that runs on where nobody can find it; --bind
    ::1 listens on [::1]:PORT (gRPC read an unbracketed '::1:0' as an address without a port,
    and braid said "the port is in use"), and braidctl reaches it there."""
    build = braid_launch.build_dir()
    coordinator = str(build / "tools" / "coordinator" / "braid-coordinator")
    secret = secrets.token_hex(32)
    res = subprocess.run([coordinator, "--port", "0", "--port-file", "/nonexistent-dir/port"],
                         env=job_env(build, secret), capture_output=True, text=True, timeout=20)
    assert res.returncode == 2, res
    assert ("braid-coordinator: --port-file: cannot write '/nonexistent-dir/port' (through "
            "'/nonexistent-dir/port.tmp'): No such file or directory\n") in res.stderr, res
    with socket.socket(socket.AF_INET6) as s:
        try:
            s.bind(("::1", 0))
        except OSError:
            return  # no IPv6 here: tests/inprocess/coordinator_server_test.cc checks the error
    with tempfile.TemporaryDirectory(prefix="braid-ipv6-") as tmp:
        port_file = Path(tmp) / "port"
        coord = subprocess.Popen([coordinator, "--bind", "::1", "--port", "0", "--port-file",
                                  str(port_file)], env=job_env(build, secret),
                                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        try:
            line = coord.stdout.readline()
            m = re.fullmatch(r"braid-coordinator listening on \[::1\]:(\d+)\n", line)
            assert m, line
            port = int(m.group(1))
            # The port file comes just after the line.
            deadline = time.monotonic() + 10
            while not (port_file.exists() and port_file.read_text().strip()):
                assert time.monotonic() < deadline and coord.poll() is None, "no port file"
                time.sleep(0.02)
            assert int(port_file.read_text()) == port
            st = subprocess.run([str(build / "tools" / "braidctl" / "braidctl"), "status",
                                 "--coordinator", f"[::1]:{port}", "--json"],
                                env=job_env(build, secret), capture_output=True, text=True,
                                timeout=30)
            assert st.returncode == 0, st
            assert json.loads(st.stdout)["phase"] == "JOB_FORMING", st.stdout
        finally:
            coord.kill()
            coord.wait()


def test_recovering_after_an_error():
    """workers/resync.py on 2 ranks with a 1 s negotiation deadline: barrier() resynchronizes
    after a rank came later than the deadline (an unnamed barrier keeps its name on every
    rank); an unnamed call refused in the Python layer (NumPy, torch) fails the peer at once;
    a NUL in a name survives into the message; a non-str object-collective name is braid's
    InvalidArgumentError on every rank."""
    res = braid_launch.run_worker("resync.py", 2, timeout=120,
                                  env={"BRAID_NEGOTIATION_TIMEOUT_S": "1"})
    assert res.returncode == 0, res.output
    assert res.output.count("all checks passed") == 2, res.output
