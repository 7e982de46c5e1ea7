"""Runs a command as an N-rank braid job for the Python tests.

Uses the ``braidrun`` launcher when it is built (``$BRAID_BUILD_DIR/tools/braidrun/braidrun``,
or ``tools/braidrun/braidrun`` in the source tree, or ``$BRAIDRUN``); otherwise a small
built-in launcher that starts ``braid-coordinator`` on a free loopback port and N rank
processes with BRAID_COORDINATOR / BRAID_RANK / BRAID_SIZE set. Either way every process
gets a timeout and everything is killed when a rank fails or time runs out.

Set ``BRAIDRUN=builtin`` to force the built-in launcher.
"""

import os
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

PYTHON = "/usr/bin/python3"  # the system Python that has numpy (never the PATH python3)
REPO = Path(__file__).resolve().parents[2]


def build_dir():
    d = os.environ.get("BRAID_BUILD_DIR")
    if d:
        return Path(d).resolve()
    for cand in ("build", "build-py"):
        if (REPO / cand / "python" / "braid").is_dir():
            return REPO / cand
    raise RuntimeError("set BRAID_BUILD_DIR to the CMake build directory")


def find_braidrun(build):
    forced = os.environ.get("BRAIDRUN")
    if forced:
        return None if forced == "builtin" else forced
    for cand in (build / "tools" / "braidrun" / "braidrun", REPO / "tools" / "braidrun" / "braidrun"):
        if cand.is_file() and os.access(cand, os.X_OK):
            return str(cand)
    return None


class Result:
    def __init__(self, returncode, output, launcher):
        self.returncode = returncode
        self.output = output
        self.launcher = launcher

    def __repr__(self):
        return f"Result(returncode={self.returncode}, launcher={self.launcher})"


class _Collector:
    """Merges the lines of several processes, each prefixed with a tag, in arrival order."""

    def __init__(self):
        self.lines = []
        self.lock = threading.Lock()
        self.threads = []

    def follow(self, stream, tag):
        def pump():
            for raw in iter(stream.readline, b""):
                line = raw.decode("utf-8", "replace").rstrip("\n")
                with self.lock:
                    self.lines.append(f"{tag}{line}" if tag else line)
            stream.close()

        t = threading.Thread(target=pump, daemon=True)
        t.start()
        self.threads.append(t)

    def text(self, join_timeout=5.0):
        for t in self.threads:
            t.join(join_timeout)
        with self.lock:
            return "\n".join(self.lines)

    def add(self, line):
        with self.lock:
            self.lines.append(line)


def _kill_group(p, sig=signal.SIGKILL):
    if p.poll() is None:
        try:
            os.killpg(p.pid, sig)
        except ProcessLookupError:
            pass


def _stop(p, grace=5.0):
    """SIGTERM, then SIGKILL after `grace` seconds."""
    if p.poll() is None:
        _kill_group(p, signal.SIGTERM)
        try:
            p.wait(grace)
        except subprocess.TimeoutExpired:
            _kill_group(p, signal.SIGKILL)
            p.wait(5)


def rank_env(build, extra=None):
    env = dict(os.environ)
    env.update({
        "UCX_TLS": "sm",
        "UCX_NET_DEVICES": "lo",
        "PYTHONUNBUFFERED": "1",
        "OMP_NUM_THREADS": "1",
        "BRAID_TIMEOUT_S": env.get("BRAID_TIMEOUT_S", "60"),
    })
    py = str(build / "python")
    env["PYTHONPATH"] = py + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    # Drop a launcher context the test itself may run under.
    for k in ("BRAID_COORDINATOR", "BRAID_RANK", "BRAID_SIZE", "BRAID_LOCAL_RANK",
              "BRAID_LOCAL_SIZE", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
              "SLURM_PROCID", "OMPI_COMM_WORLD_RANK"):
        env.pop(k, None)
    if extra:
        env.update(extra)
    return env


def run(command, np, timeout=120, env=None, grace=15.0):
    """Runs `command` (a list) on `np` ranks; returns a Result with the merged output.

    returncode: 0 when every rank exited 0; else the first failing rank's code, or 124 on
    timeout. After a rank fails the others get `grace` seconds to notice and exit.
    """
    build = build_dir()
    env = rank_env(build, env)
    braidrun = find_braidrun(build)
    if braidrun:
        return _run_braidrun(braidrun, command, np, timeout, env)
    return _run_builtin(build, command, np, timeout, env, grace)


def _run_braidrun(braidrun, command, np, timeout, env):
    out = _Collector()
    p = subprocess.Popen([braidrun, "-np", str(np)] + list(command), env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         stdin=subprocess.DEVNULL, start_new_session=True)
    out.follow(p.stdout, "")
    try:
        rc = p.wait(timeout)
    except subprocess.TimeoutExpired:
        _stop(p)
        out.add(f"[launcher] braidrun timed out after {timeout} s; killed")
        rc = 124
    return Result(rc, out.text(), "braidrun")


def _run_builtin(build, command, np, timeout, env, grace):
    coordinator_bin = build / "tools" / "coordinator" / "braid-coordinator"
    if not coordinator_bin.is_file():
        raise RuntimeError(f"{coordinator_bin} is not built")
    out = _Collector()
    # The job's secret, which the coordinator and every rank share (as braidrun does).
    env = dict(env, BRAID_JOB_SECRET=secrets.token_hex(32))
    env.pop("BRAID_JOB_SECRET_FILE", None)
    procs = []  # the coordinator first, then the ranks
    with tempfile.TemporaryDirectory(prefix="braid-pytest-") as tmp:
        try:
            rc = _launch(coordinator_bin, Path(tmp) / "port", command, np, timeout, env, grace,
                         out, procs)
        finally:
            for p in procs[1:]:
                _kill_group(p)
            for p in procs[1:]:
                try:
                    p.wait(5)
                except subprocess.TimeoutExpired:
                    pass
            if procs:
                _stop(procs[0])
    # Every process is gone, so the output pipes are at EOF.
    return Result(rc, out.text(), "builtin")


def _launch(coordinator_bin, port_file, command, np, timeout, env, grace, out, procs):
    deadline = time.monotonic() + timeout
    coord = subprocess.Popen(
        [str(coordinator_bin), "--bind", "127.0.0.1", "--port", "0", "--size", str(np),
         "--port-file", str(port_file), "--register-timeout", str(int(timeout))],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL, start_new_session=True)
    procs.append(coord)
    out.follow(coord.stdout, "[coordinator] ")
    port = None
    start_deadline = min(deadline, time.monotonic() + 30)
    while time.monotonic() < start_deadline:
        if port_file.exists():
            text = port_file.read_text().strip()
            if text:
                port = int(text)
                break
        if coord.poll() is not None:
            break
        time.sleep(0.02)
    if port is None:
        out.add(f"[launcher] braid-coordinator did not start (exit {coord.poll()})")
        return 125
    ranks = []
    for r in range(np):
        renv = dict(env)
        renv.update({
            "BRAID_COORDINATOR": f"127.0.0.1:{port}",
            "BRAID_RANK": str(r),
            "BRAID_SIZE": str(np),
            "BRAID_LOCAL_RANK": str(r),
            "BRAID_LOCAL_SIZE": str(np),
        })
        p = subprocess.Popen(list(command), env=renv, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             start_new_session=True)
        procs.append(p)
        ranks.append(p)
        out.follow(p.stdout, f"[{r}] ")
    rc = 0
    failed_at = None
    while True:
        codes = [p.poll() for p in ranks]
        for r, c in enumerate(codes):
            if c not in (None, 0) and rc == 0:
                rc = c
                failed_at = time.monotonic()
                out.add(f"[launcher] rank {r} exited with {c}")
        if all(c is not None for c in codes):
            return rc
        now = time.monotonic()
        if now > deadline:
            out.add(f"[launcher] timed out after {timeout} s; killing the ranks still "
                    f"running: {[r for r, c in enumerate(codes) if c is None]}")
            return 124
        if failed_at is not None and now > failed_at + grace:
            out.add(f"[launcher] killing the ranks still running {grace} s after a rank "
                    "failed")
            return rc
        time.sleep(0.02)


def free_port():
    """A TCP port of 127.0.0.1 that was free when this returned."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_without_launcher(command, envs, timeout=120, drop=()):
    """Starts `command` (a list) once per dict of `envs` (variables over rank_env's, less the
    names in `drop`), each process a rank of a job no launcher started (torchrun's variables
    set by hand, or mp.spawn's pattern), and waits for all of them; the process groups still
    running after `timeout` seconds are killed. Returns [(returncode, output)] in order."""
    procs = []
    for extra in envs:
        env = rank_env(build_dir(), extra)
        for name in drop:
            env.pop(name, None)
        procs.append(subprocess.Popen(list(command), env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, start_new_session=True))
    outputs = []
    try:
        for p in procs:
            outputs.append(p.communicate(timeout=timeout)[0].decode(errors="replace"))
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    return [(p.returncode, out) for p, out in zip(procs, outputs)]


def run_worker(worker, np, args=(), timeout=120, env=None):
    """Runs tests/python/workers/<worker> with the system Python on `np` ranks."""
    script = Path(__file__).resolve().parent / "workers" / worker
    return run([PYTHON, str(script)] + [str(a) for a in args], np, timeout=timeout, env=env)


if __name__ == "__main__":  # manual use: braid_launch.py NP COMMAND...
    res = run(sys.argv[2:], int(sys.argv[1]))
    print(res.output)
    sys.exit(res.returncode)
