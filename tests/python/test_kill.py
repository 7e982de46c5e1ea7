"""SIGKILL of a rank, of the coordinator, and of braidrun: every surviving process errors or
exits within 15 s and nothing is left running (Note [Ranks die with braidrun] in
tools/braidrun/watchdog.h; the runtime fails every collective when it loses a peer or the
coordinator).

Each job runs workers/kill_target.py, which all-reduces in a loop. The job's processes are
found by a token in their command lines (braidrun, its watchdog and the ranks all carry it).
"""

import os
import re
import signal
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import pytest

import braid_launch

WORKER = Path(__file__).resolve().parent / "workers" / "kill_target.py"
LIMIT_S = 15


def processes_with(token):
    """pid -> command line of every process whose command line holds `token`."""
    found = {}
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == os.getpid():
            continue
        try:
            cmd = Path(f"/proc/{d}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = [ln for ln in Path(f"/proc/{d}/status").read_text().splitlines()
                     if ln.startswith("State:")]
        except OSError:
            continue
        if token in cmd and not (state and "Z" in state[0].split()[1]):  # zombies are gone
            found[int(d)] = cmd
    return found


def wait_gone(token, deadline):
    while time.monotonic() < deadline:
        if not processes_with(token):
            return {}
        time.sleep(0.05)
    return processes_with(token)


class Output:
    """A process's merged output, read as it arrives (a thread)."""

    def __init__(self, p):
        import threading
        self.lines = []
        self.t = threading.Thread(target=self._pump, args=(p.stdout,), daemon=True)
        self.t.start()

    def _pump(self, stream):
        for raw in iter(stream.readline, b""):
            self.lines.append(raw.decode(errors="replace").rstrip("\n"))

    def wait_for(self, pred, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = [ln for ln in list(self.lines) if pred(ln)]
            if got:
                return got
            time.sleep(0.05)
        return [ln for ln in list(self.lines) if pred(ln)]

    def text(self):
        return "\n".join(self.lines)


def ready_pids(out, np_):
    """{rank: pid} once every rank printed its ready line."""
    deadline = time.monotonic() + 60
    pids = {}
    while time.monotonic() < deadline and len(pids) < np_:
        for ln in list(out.lines):
            parts = ln.split()
            if "ready" in parts:
                i = parts.index("ready")
                pids[int(parts[i + 1])] = int(parts[i + 2])
        time.sleep(0.05)
    assert len(pids) == np_, out.text()
    return pids


def start_braidrun(np_, token, mode="loop", flags=()):
    build = braid_launch.build_dir()
    braidrun = build / "tools" / "braidrun" / "braidrun"
    p = subprocess.Popen([str(braidrun), "-np", str(np_)] + list(flags) +
                         [braid_launch.PYTHON, str(WORKER), token, mode],
                         env=braid_launch.rank_env(build), stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                         start_new_session=True)
    return p, Output(p)


def cleanup(token):
    for pid in processes_with(token):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def test_kill_a_rank():
    token = f"braid-kill-{uuid.uuid4().hex}"
    p, out = start_braidrun(3, token)
    try:
        pids = ready_pids(out, 3)
        os.kill(pids[1], signal.SIGKILL)
        t0 = time.monotonic()
        rc = p.wait(LIMIT_S)
        assert rc != 0, out.text()
        left = wait_gone(token, t0 + LIMIT_S)
        assert not left, f"still running {time.monotonic() - t0:.1f} s after the kill: {left}"
        # The survivors failed with the runtime's error (or braidrun stopped them).
        text = out.text()
        assert "rank 1 was killed by signal 9" in text, text
    finally:
        cleanup(token)


@pytest.mark.parametrize("mode", ["loop", "sleep"])
def test_kill_braidrun(mode):
    """Ranks in collectives lose the coordinator braidrun hosts; ranks busy elsewhere (sleep)
    would not notice: braidrun's watchdog stops them."""
    token = f"braid-kill-{uuid.uuid4().hex}"
    p, out = start_braidrun(3, token, mode)
    try:
        ready_pids(out, 3)
        assert len(processes_with(token)) >= 5, processes_with(token)  # braidrun, watchdog, 3
        p.kill()
        t0 = time.monotonic()
        p.wait(5)
        left = wait_gone(token, t0 + LIMIT_S)
        assert not left, f"still running {time.monotonic() - t0:.1f} s after the kill: {left}"
    finally:
        cleanup(token)


def test_kill_braidrun_and_its_watchdog():
    """Both killed with SIGKILL: nothing of braidrun is left to stop ranks busy outside braid
    (sleeping), and they see no coordinator; they end because the launcher pipe braidrun held
    hung up (Note [Ranks die with their launcher] in runtime/launcher_watch.h)."""
    token = f"braid-kill-{uuid.uuid4().hex}"
    p, out = start_braidrun(2, token, "sleep")
    try:
        pids = ready_pids(out, 2)
        others = set(processes_with(token)) - {p.pid} - set(pids.values())
        assert len(others) == 1, processes_with(token)  # the watchdog: a fork of braidrun
        os.kill(others.pop(), signal.SIGKILL)
        p.kill()
        t0 = time.monotonic()
        p.wait(5)
        left = wait_gone(token, t0 + 5)
        assert not left, f"still running {time.monotonic() - t0:.1f} s after the kill: {left}"
    finally:
        cleanup(token)


def test_a_stopped_rank_the_coordinator_declared_lost_ends_the_job():
    """A rank stopped with SIGSTOP never exits; once the coordinator declares it lost
    (silent past the 1 s heartbeat timeout) braidrun ends the job (the other rank sleeps
    outside braid: it would wait for ever too) and exits 1 (Note [Lost ranks] in
    tools/braidrun/launcher.h)."""
    token = f"braid-kill-{uuid.uuid4().hex}"
    p, out = start_braidrun(2, token, "sleep", ["--heartbeat-timeout", "1"])
    try:
        pids = ready_pids(out, 2)
        os.kill(pids[1], signal.SIGSTOP)
        t0 = time.monotonic()
        rc = p.wait(10)
        assert rc == 1, out.text()
        assert not wait_gone(token, t0 + 10), processes_with(token)
        text = out.text()
        assert re.search(
            r"^braidrun: the coordinator declared rank 1 lost \(rank 1 \(pid " + str(pids[1]) +
            r" on \S+\) was lost: silent for [\d.]+s \(BRAID_HEARTBEAT_TIMEOUT_S\)\), and it "
            r"still runs 1s later \(stopped or hung\?\)$", text, re.M), text
        assert "braidrun: rank 1 was lost: sending SIGTERM to 2 ranks (SIGKILL in 3s)" in text, text
    finally:
        cleanup(token)


def test_kill_the_coordinator():
    """A standalone braid-coordinator killed: every rank fails with UnavailableError."""
    build = braid_launch.build_dir()
    token = f"braid-kill-{uuid.uuid4().hex}"
    # The coordinator and its ranks share the job's secret (docs/security.md: Who may join).
    env = braid_launch.rank_env(build, {"BRAID_JOB_SECRET": uuid.uuid4().hex})
    env.pop("BRAID_JOB_SECRET_FILE", None)
    procs = []
    with tempfile.TemporaryDirectory(prefix="braid-kill-") as tmp:
        port_file = Path(tmp) / "port"
        coord = subprocess.Popen(
            [str(build / "tools" / "coordinator" / "braid-coordinator"), "--port", "0",
             "--size", "3", "--port-file", str(port_file)], env=env,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            deadline = time.monotonic() + 30
            while not (port_file.exists() and port_file.read_text().strip()):
                assert time.monotonic() < deadline and coord.poll() is None
                time.sleep(0.02)
            port = int(port_file.read_text())
            outs = []
            for r in range(3):
                renv = dict(env, BRAID_COORDINATOR=f"127.0.0.1:{port}", BRAID_RANK=str(r),
                            BRAID_SIZE="3")
                rp = subprocess.Popen([braid_launch.PYTHON, str(WORKER), token], env=renv,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL, start_new_session=True)
                procs.append(rp)
                outs.append(Output(rp))
            for o in outs:
                assert o.wait_for(lambda ln: ln.startswith("ready"), 60), o.text()
            coord.kill()
            t0 = time.monotonic()
            for rp, o in zip(procs, outs):
                rc = rp.wait(max(0.1, t0 + LIMIT_S - time.monotonic()))
                assert rc == 1, (rc, o.text())
                assert o.wait_for(lambda ln: ln.startswith("error") and "UnavailableError" in ln,
                                  5), o.text()
            assert not wait_gone(token, t0 + LIMIT_S)
        finally:
            for rp in procs:
                if rp.poll() is None:
                    rp.kill()
            coord.kill()
            cleanup(token)
