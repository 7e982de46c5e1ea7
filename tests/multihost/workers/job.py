#!/usr/bin/python3
"""The rank program of the multi-host tests: a small braid job that checks its own results
and reports, as one JSON line per rank (prefixed "RESULT "), where it ran and what the data
plane used, for the test to assert.

    job.py [--loop [MIB]]

Every rank all-reduces (sum) a 1 MiB float32 vector whose elements are rank + 1 and checks
each element equals n(n+1)/2 (exact in float32 for these sizes); all-gathers the hostnames.
Then, across the sizes where the data plane's protocol to another host changes (eager up to
UCX's 8 KiB segment, eager in many segments up to RNDV_SEND_NBR_THRESH, rendezvous above:
Note [Eager across hosts] in transport/ucx_worker.cc), it all-reduces vectors whose elements
differ by index and rank, broadcasts 3 MiB from the last rank and all-gathers 300 KB a rank,
and counts every element that is not the exact expected value.
With --loop it then prints "READY pid=<pid> ppid=<ppid>" and all-reduces (1 MiB, or MIB MiB)
until stopped (for the tests that kill a rank, a host or braidrun). Exit status 0 when every
check passed.

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
    args = sys.argv[1:]
    loop = "--loop" in args
    loop_mib = int(args[args.index("--loop") + 1]) if loop and args[-1] != "--loop" else 1
    braid.init()
    rank, size = braid.rank(), braid.size()
    x = np.full(1 << 18, rank + 1, np.float32)
    y = braid.allreduce(x, name="x", op=braid.Sum)
    want = size * (size + 1) / 2
    wrong = int(np.count_nonzero(y != want))
    hosts = braid.allgather_object(socket.gethostname())
    for n in (1, 2049, 65537, 262145, 300001):  # floats: 4 B to 1.2 MB
        v = (np.arange(n) % 97 + rank + 1).astype(np.float32)
        got = braid.allreduce(v, name=f"sizes.{n}", op=braid.Sum)
        wrong += int(np.count_nonzero(got != size * (np.arange(n) % 97) + want))
    src = np.arange(3 << 20, dtype=np.uint64).astype(np.uint8)
    b = src if rank == size - 1 else np.zeros_like(src)
    braid.broadcast_(b, root_rank=size - 1, name="bcast.3MiB")
    wrong += int(np.count_nonzero(b != src))
    part = ((np.arange(300000) + rank) % 251).astype(np.uint8)
    gathered = braid.allgather(part, name="gather.300KB")
    wrong += sum(int(np.count_nonzero(gathered[r * 300000:(r + 1) * 300000] !=
                                      (np.arange(300000) + r) % 251)) for r in range(size))
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
        big = np.ones(loop_mib << 18, np.float32)
        while True:
            braid.allreduce(big, name="loop", op=braid.Sum)
    braid.shutdown()
    return 0 if wrong == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
