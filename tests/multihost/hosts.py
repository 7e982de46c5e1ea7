"""Test hosts for the multi-host tests: a thin Python face of tools/testhosts/braid-testhosts.

    with Hosts(2, ssh=True) as hosts:
        r = hosts.run("h0", ["hostname"])            # CompletedProcess (text)
        p = hosts.popen("h0", ["braidrun", ...])      # Popen, stdout/stderr pipes (text)
        hosts.wait_idle(["h0", "h1"])                 # nothing of a job left on them

Every set gets a name of its own (so two test runs never share one); leaving the `with`
tears it down and asserts that nothing (namespace, link, bridge, qdisc, state) is left.

The tests need root and the tools of scripts/install_deps.sh --tests; a missing one fails the test
with the package to install (`require`), never skips it.
"""

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TOOL = REPO / "tools" / "testhosts" / "braid-testhosts"
SSH_DIR = "/tmp/braid-testhosts/ssh"  # inside each host (braid-testhosts --ssh)
PYTHON = "/usr/bin/python3"

# Options for braidrun's ssh to the test hosts: the set's key, and no known_hosts (each set
# has new host keys).
BRAIDRUN_SSH = ["--ssh-identity-file", f"{SSH_DIR}/id_ed25519",
                "--ssh-option", "StrictHostKeyChecking=no",
                "--ssh-option", "UserKnownHostsFile=/dev/null",
                "--ssh-option", "LogLevel=ERROR"]

TOOLS = {  # tool -> Debian package
    "ip": "iproute2", "tc": "iproute2", "unshare": "util-linux", "nsenter": "util-linux",
    "setsid": "util-linux", "sshd": "openssh-server", "ssh": "openssh-client",
    "ssh-keygen": "openssh-client", "mpirun": "openmpi-bin", "srun": "slurm-wlm",
    "slurmctld": "slurmctld", "slurmd": "slurmd", "munged": "munge",
}


def require(*tools):
    """Fails (never skips) the calling test when it cannot run: not root, or a tool missing."""
    if os.geteuid() != 0:
        pytest.fail("the multi-host tests need root (network namespaces, tc, sshd)")
    missing = [t for t in tools if shutil.which(t, path="/usr/sbin:/usr/bin:/sbin:/bin") is None]
    if missing:
        pkgs = sorted({TOOLS.get(t, t) for t in missing})
        pytest.fail(f"missing {', '.join(missing)}: apt install {' '.join(pkgs)} "
                    "(scripts/install_deps.sh --tests installs them)")


def build_dir():
    d = os.environ.get("BRAID_BUILD_DIR")
    path = Path(d).resolve() if d else REPO / "build"
    if not (path / "python" / "braid").is_dir():
        pytest.fail(f"no braid build in {path} (set BRAID_BUILD_DIR)")
    return path


class Hosts:
    def __init__(self, n, ssh=True, rate=""):
        self.n = n
        self.names = [f"h{k}" for k in range(n)]
        self.prefix = f"bt{os.getpid() % 100000}{Hosts._count}"
        Hosts._count += 1
        self.args = ["-n", str(n)] + (["--ssh"] if ssh else []) + (["--rate", rate] if rate else [])

    _count = 0

    def tool(self, *args, check=True, timeout=60):
        return subprocess.run([str(TOOL), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, check=check, timeout=timeout)

    def __enter__(self):
        r = self.tool("up", "--prefix", self.prefix, *self.args, check=False)
        if r.returncode != 0:
            self.tool("down", "--prefix", self.prefix, check=False)
            pytest.fail(f"braid-testhosts up failed: {r.stderr}")
        return self

    def __exit__(self, *exc):
        down = self.tool("down", "--prefix", self.prefix, check=False)
        left = self.tool("check", "--prefix", self.prefix, check=False)
        assert down.returncode == 0 and left.returncode == 0, (
            f"test hosts left behind: {left.stdout} {down.stderr}")

    def state(self):
        with open(f"/run/braid-testhosts/{self.prefix}.json") as f:
            return json.load(f)

    def argv(self, host, argv, env=None):
        env_words = [f"{k}={v}" for k, v in (env or {}).items()]
        return [str(TOOL), "exec", "--prefix", self.prefix, host, "--", "env", *env_words,
                *[str(a) for a in argv]]

    def run(self, host, argv, env=None, timeout=120, check=False):
        return subprocess.run(self.argv(host, argv, env), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, timeout=timeout, check=check,
                              cwd=REPO)

    def popen(self, host, argv, env=None):
        return subprocess.Popen(self.argv(host, argv, env), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, cwd=REPO)

    def write(self, host, path, text):
        """Writes a file on `host` (paths under /tmp are that host's own)."""
        r = subprocess.run(self.argv(host, ["sh", "-c", 'cat > "$0"', path]), input=text,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=30)
        assert r.returncode == 0, r.stderr

    def processes(self, host):
        """Processes of a host other than its PID 1 and its sshd listener: (pid, command)."""
        script = ("import os\n"
                  "for p in os.listdir('/proc'):\n"
                  "    if not p.isdigit() or int(p) in (1, os.getpid()): continue\n"
                  "    try: c = open(f'/proc/{p}/cmdline','rb').read().replace(b'\\0', b' ')\n"
                  "    except OSError: continue\n"
                  "    c = c.decode(errors='replace').strip()\n"
                  "    if c and not c.startswith('sshd: /usr/sbin/sshd -f'): print(p, c)\n")
        r = self.run(host, [PYTHON, "-c", script], timeout=30)
        assert r.returncode == 0, r.stderr
        return [line for line in r.stdout.splitlines() if line.strip()]

    def wait_idle(self, hosts, timeout=10.0):
        """Waits until `hosts` run nothing but their PID 1 and sshd listener; returns what is
        still running at the deadline ({} when idle)."""
        deadline = time.monotonic() + timeout
        while True:
            left = {h: self.processes(h) for h in hosts}
            left = {h: p for h, p in left.items() if p}
            if not left or time.monotonic() > deadline:
                return left
            time.sleep(0.2)

    def kill_host(self, host):
        """Kills everything on `host` at once, as a machine that loses power (its PID 1)."""
        for h in self.state()["holders"]:
            if h["name"] == host:
                os.kill(h["pid1"], 9)
                return
        raise KeyError(host)


def results(output):
    """The RESULT lines of tests/multihost/workers/job.py in braidrun's prefixed output."""
    out = {}
    decoder = json.JSONDecoder()
    for line in output.splitlines():
        # mpirun forwards each rank's output as it comes: a line may hold one rank's result
        # with another's output run on after it, so each document is read up to its own end.
        for piece in line.split("RESULT ")[1:]:
            r, _ = decoder.raw_decode(piece)
            out[r["rank"]] = r
    return out
