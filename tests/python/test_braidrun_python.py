"""braidrun with Python ranks: a rank that raises stops the job (non-zero, within 10 s, no
process left behind), and every output line carries its rank prefix."""
import os
import subprocess
import time

import pytest

from braid_launch import PYTHON, build_dir

SCRIPT = r'''
import os, sys, time
import braid
braid.init()
with open(os.path.join(sys.argv[1], "pid.%d" % braid.rank()), "w") as f:
    f.write(str(os.getpid()))
print("hello from", braid.rank(), flush=True)
if braid.rank() == 1:
    raise RuntimeError("rank 1 fails on purpose")
time.sleep(120)
'''


def _braidrun():
    """The build tree's braidrun (the test is skipped when it is not built)."""
    path = build_dir() / "tools" / "braidrun" / "braidrun"
    if not path.exists():
        pytest.skip("braidrun is not built")
    return path


def test_a_rank_that_raises_stops_the_job(tmp_path):
    braidrun = _braidrun()
    script = tmp_path / "fail.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, UCX_TLS="sm", UCX_NET_DEVICES="lo")
    t0 = time.time()
    out = subprocess.run([str(braidrun), "-np", "3", PYTHON, str(script), str(tmp_path)],
                         env=env, capture_output=True, text=True, timeout=60)
    took = time.time() - t0
    assert out.returncode == 1, out.stdout + out.stderr
    assert took < 10 + 5, f"braidrun took {took:.1f} s"  # 10 s after the failure, plus start-up
    for r in range(3):
        assert f"[{r}] hello from {r}" in out.stdout.splitlines(), out.stdout
    assert "[1] RuntimeError: rank 1 fails on purpose" in out.stderr.splitlines(), out.stderr
    assert "braidrun: rank 1 exited with code 1" in out.stderr, out.stderr
    # No rank is left behind.
    time.sleep(0.2)
    for r in range(3):
        pid = int((tmp_path / f"pid.{r}").read_text())
        assert not os.path.exists(f"/proc/{pid}") or \
            open(f"/proc/{pid}/stat").read().split()[2] == "Z", f"rank {r} (pid {pid}) still runs"


WAIT_FOR_GO = r'''
import os, sys, time
import braid
braid.init()
deadline = time.time() + 60
while not os.path.exists(sys.argv[1]) and time.time() < deadline:
    time.sleep(0.05)
braid.barrier()
'''


def _outsider():
    """(uid, gid) of an unprivileged user for the "other user" checks (made when missing, as
    the admission tests do), or None when not root."""
    if os.geteuid() != 0:
        return None
    import pwd
    try:
        pw = pwd.getpwnam("braid-outsider")
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell",
                        "/usr/sbin/nologin", "braid-outsider"], check=False)
        try:
            pw = pwd.getpwnam("braid-outsider")
        except KeyError:
            return None
    return pw.pw_uid, pw.pw_gid


def test_a_job_is_watched_with_the_command_braidrun_prints(tmp_path):
    """A job whose secret braidrun made up: braidrun keeps it in a file of mode 0600 in a
    directory of mode 0700 (HOME/.cache/braid/jobs without XDG_RUNTIME_DIR) and prints the
    braidctl command; that command, run as printed, shows the job; another user running it
    is refused; the file is gone when the job ends, and one left by a dead braidrun is
    removed."""
    import json
    import shlex
    import stat
    import threading
    braidrun = _braidrun()
    home = tmp_path / "home"
    jobs = home / ".cache" / "braid" / "jobs"
    jobs.mkdir(parents=True, mode=0o700)
    (home / ".cache").chmod(0o700)
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = jobs / f"job-{dead.pid}.secret"
    stale.write_text("0" * 64)
    stale.chmod(0o600)
    script = tmp_path / "wait.py"
    script.write_text(WAIT_FOR_GO)
    go = tmp_path / "go"
    env = {k: v for k, v in os.environ.items()
           if k not in ("XDG_RUNTIME_DIR", "BRAID_JOB_SECRET", "BRAID_JOB_SECRET_FILE")}
    env.update(HOME=str(home), UCX_TLS="sm", UCX_NET_DEVICES="lo")
    job = subprocess.Popen([str(braidrun), "-np", "2", PYTHON, str(script), str(go)], env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = []
    printed = threading.Event()

    def read_stderr():
        for line in job.stderr:
            lines.append(line)
            if "watch this job with: " in line:
                printed.set()
    reader = threading.Thread(target=read_stderr, daemon=True)
    reader.start()
    try:
        assert printed.wait(30), "".join(lines)
        cmd = next(l for l in lines if "watch this job with: " in l).split(
            "watch this job with: ", 1)[1].strip()
        words = shlex.split(cmd)
        secret_file = words[words.index("--secret-file") + 1]
        assert os.path.dirname(secret_file) == str(jobs), cmd
        st = os.stat(secret_file)
        assert stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == os.geteuid(), oct(st.st_mode)
        assert stat.S_IMODE(os.stat(jobs).st_mode) == 0o700
        assert not stale.exists(), "the file of a dead braidrun was left"
        # The printed command, as printed (plus --json to read it), shows this job's ranks.
        deadline = time.time() + 30
        while True:
            st_out = subprocess.run(words + ["--json"], capture_output=True, text=True,
                                    timeout=30)
            status = json.loads(st_out.stdout) if st_out.returncode == 0 else {}
            if len(status.get("ranks", [])) == 2 or time.time() > deadline:
                break
            time.sleep(0.2)
        assert st_out.returncode == 0, st_out.stderr
        assert len(status["ranks"]) == 2, st_out.stdout
        outsider = _outsider()
        if outsider is not None:
            uid, gid = outsider

            def demote():
                os.setgroups([])
                os.setgid(gid)
                os.setuid(uid)
            other = subprocess.run(words, capture_output=True, text=True, timeout=30,
                                   preexec_fn=demote, cwd="/")
            assert other.returncode != 0, other.stdout
            assert "secret" in other.stderr and "ranks" not in other.stdout, other.stderr
        go.write_text("")
        assert job.wait(timeout=60) == 0, "".join(lines)
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    reader.join(5)
    assert not os.path.exists(secret_file), "the job's secret file outlived braidrun"


def test_the_watch_line_is_a_command_or_says_why_there_is_none(tmp_path):
    """With BRAID_JOB_SECRET given, the printed command pastes as it is (what it needs is a
    shell comment); with nowhere private to keep a made-up secret (no HOME, no
    XDG_RUNTIME_DIR), braidrun prints no command but says why, once."""
    import secrets as _secrets
    import shlex
    braidrun = _braidrun()
    base = {k: v for k, v in os.environ.items()
            if k not in ("XDG_RUNTIME_DIR", "BRAID_JOB_SECRET", "BRAID_JOB_SECRET_FILE", "HOME")}
    given = subprocess.run([str(braidrun), "-np", "1", "/bin/true"], capture_output=True,
                           text=True, timeout=60,
                           env=dict(base, HOME=str(tmp_path),
                                    BRAID_JOB_SECRET=_secrets.token_hex(32)))
    assert given.returncode == 0, given.stderr
    line = [l for l in given.stderr.splitlines() if "watch this job with: " in l]
    assert len(line) == 1, given.stderr
    words = shlex.split(line[0].split("watch this job with: ", 1)[1], comments=True)
    assert words[1:] == ["status", "--coordinator", words[3]] and words[0].endswith("braidctl"), words
    assert line[0].endswith("# with this job's BRAID_JOB_SECRET in the environment"), line
    nowhere = subprocess.run([str(braidrun), "-np", "1", "/bin/true"], capture_output=True,
                             text=True, timeout=60, env=base)
    assert nowhere.returncode == 0, nowhere.stderr
    assert "watch this job with" not in nowhere.stderr, nowhere.stderr
    assert nowhere.stderr.count("braidctl") == 1, nowhere.stderr
    assert ("braidrun: this job cannot be watched with braidctl (no private directory for its "
            "secret: XDG_RUNTIME_DIR is not set, and HOME is not set); give braidrun "
            "--secret-file FILE to watch a job") in nowhere.stderr, nowhere.stderr
