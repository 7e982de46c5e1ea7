#!/usr/bin/python3
"""The rank program of the multi-host tests: a small braid job that checks its own results
and reports, as one JSON line per rank (prefixed "RESULT "), where it ran and what the data
plane used, for the test to assert.

    job.py [--loop]

Every rank all-reduces (sum) a 1 MiB float32 vector whose elements are rank + 1 and checks
each element equals n(n+1)/2 (exact in float32 for these sizes); all-gathers the hostnames.
With --loop it then prints "READY pid=<pid> ppid=<ppid>" and all-reduces until stopped (for the
tests that kill a rank, a host or braidrun). Exit status 0 when every check passed.

It also checks that the job's secret reached it (BRAID_JOB_SECRET under braidrun) and that no
process of its host shows the secret on its command line.
"""
import json
import os
import socket
import sys

import numpy as np

import braid


def secret_on_a_command_line(secret):
    """PIDs of this host whose command line holds `secret` (this PID namespace is the host)."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if secret.encode() in f.read():
                    found.append(int(pid))
        except OSError:
            pass
    return found


def main():
    loop = "--loop" in sys.argv[1:]
    braid.init()
    rank, size = braid.rank(), braid.size()
    x = np.full(1 << 18, rank + 1, np.float32)
    y = braid.allreduce(x, name="x", op=braid.Sum)
    want = size * (size + 1) / 2
    wrong = int(np.count_nonzero(y != want))
    hosts = braid.allgather_object(socket.gethostname())
    secret = os.environ.get("BRAID_JOB_SECRET", "")
    result = {
        "rank": rank, "size": size, "local_rank": braid.local_rank(),
        "local_size": braid.local_size(), "host": socket.gethostname(), "hosts": hosts,
        "transports": braid.transport_description(), "wrong_elements": wrong,
        "has_secret": bool(secret),
        "secret_in_cmdlines": secret_on_a_command_line(secret) if secret else [],
        "launcher_vars": {k: os.environ[k] for k in ("MASTER_ADDR", "MASTER_PORT") if k in os.environ},
    }
    # One write of the whole line, so a launcher merging ranks' output cannot split it.
    sys.stdout.flush()
    os.write(sys.stdout.fileno(), ("RESULT " + json.dumps(result) + "\n").encode())
    if loop:
        print(f"READY pid={os.getpid()} ppid={os.getppid()}", flush=True)
        step = 0
        while True:
            braid.allreduce(x, name="loop", op=braid.Sum)
            step += 1
    braid.shutdown()
    return 0 if wrong == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
