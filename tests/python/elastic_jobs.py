"""Runs examples/elastic_fashion_mnist.py under braidrun --min-np and disturbs it: the
elastic tests' shared harness (test_elastic.py in CI, test_elastic_long.py under the `long`
label).

A disturbance is (worker, after_commits, action): once braidrun's process `worker` (its
BRAID_WORKER) has reported that many commits, the test sends it the signal `action`
(SIGKILL: a process lost; SIGSTOP: a process that only the heartbeat reveals), or, for a
string, makes it the host discovery script's output (`hosts`: the first output; with it,
braidrun runs with --host-discovery-script, re-run every `discovery_interval` seconds). The
example writes its events (start, commit, end: JSON lines) per worker into the job's report directory.
"""

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import braid_launch

EXAMPLE = braid_launch.REPO / "examples" / "elastic_fashion_mnist.py"


class ElasticRun:
    def __init__(self, returncode, output, events, disturbed_at):
        self.returncode = returncode
        self.output = output
        self.events = events              # worker -> [event dicts]
        self.disturbed_at = disturbed_at  # disturbance index -> time.time() it happened

    def starts(self, worker):
        return [e for e in self.events.get(worker, []) if e["event"] == "start"]

    def end(self, worker):
        ends = [e for e in self.events.get(worker, []) if e["event"] == "end"]
        return ends[-1] if ends else None


def _read_events(report):
    events = {}
    for f in Path(report).glob("worker*.jsonl"):
        worker = int(f.stem[len("worker"):])
        events[worker] = [json.loads(line) for line in f.read_text().splitlines() if line]
    return events


def commits(report, worker):
    f = Path(report) / f"worker{worker}.jsonl"
    if not f.exists():
        return 0, None
    lines = [json.loads(line) for line in f.read_text().splitlines() if line]
    commits = [e for e in lines if e["event"] == "commit"]
    return len(commits), (lines[-1]["pid"] if lines else None)


def wrapped_example(tmp_path, shell):
    """A command line for `run` that runs the shell code `shell` (it sees BRAID_WORKER; an
    `exit` there ends the rank) and then the example, through tmp_path/rank.sh."""
    wrapper = tmp_path / "rank.sh"
    wrapper.write_text(f'{shell}\nexec "$@"\n')
    return ["/bin/sh", str(wrapper), braid_launch.PYTHON, str(EXAMPLE)]


def run(tmp_path, np, min_np, disturb=(), args=(), env=None, timeout=240, hosts=None,
        launcher_args=(), command=None, discovery_interval=1, start=None):
    """Runs the example on `np` ranks (--min-np `min_np`) with `disturb` as above; returns
    an ElasticRun once braidrun exits (returncode 124 after `timeout` seconds). `command`
    replaces the example's command line (its arguments are added). `start(cmd, env, out)`,
    when given, starts braidrun's command line elsewhere (on a test host), with `env` the
    variables to add and its output to the file `out`, and returns its Popen; an action may
    then be a callable, called with no argument (cut a host's link)."""
    build = braid_launch.build_dir()
    braidrun = braid_launch.find_braidrun(build)
    assert braidrun, "the elastic tests need braidrun"
    report = tmp_path / "report"
    report.mkdir()
    hosts_file = tmp_path / "hosts"
    discovery = []
    if hosts is not None:
        hosts_file.write_text(hosts)
        discovery = ["--host-discovery-script", f"cat {hosts_file}",
                     "--discovery-interval", str(discovery_interval)]
    cmd = [braidrun, "-np", str(np), "--min-np", str(min_np), *discovery, *launcher_args,
           *(command or [braid_launch.PYTHON, str(EXAMPLE)]), "--report", str(report), *args]
    out_path = tmp_path / "braidrun.log"
    with open(out_path, "w") as out:
        if start is not None:
            p = start(cmd, env, out)
        else:
            p = subprocess.Popen(cmd, env=braid_launch.rank_env(build, env), stdout=out,
                                 stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 start_new_session=True)
    pending = list(enumerate(disturb))
    disturbed_at = {}
    deadline = time.monotonic() + timeout
    rc = None
    while rc is None and time.monotonic() < deadline:
        for d in list(pending):
            i, (worker, after, sig) = d
            n, pid = commits(report, worker)
            if n >= after and pid is not None:
                if isinstance(sig, str):
                    hosts_file.write_text(sig)
                elif callable(sig):
                    sig()
                else:
                    os.kill(pid, sig)
                disturbed_at[i] = time.time()
                pending.remove(d)
        rc = p.poll()
        time.sleep(0.05)
    if rc is None:
        if start is not None:
            p.kill()
        else:
            os.killpg(p.pid, signal.SIGKILL)
        p.wait(10)
        rc = 124
    return ElasticRun(rc, out_path.read_text(), _read_events(report), disturbed_at)
