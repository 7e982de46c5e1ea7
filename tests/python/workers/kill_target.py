"""A rank that all-reduces in a loop until something fails, for the kill tests.

argv[1] is a token the test finds the job's processes by (in their command lines). Prints
"ready <rank> <pid>" once the first all-reduce completed, then "error <rank> <class>: <msg>"
when a collective fails, and exits 1. With argv[2] == "sleep" it sleeps instead of looping,
as a rank busy outside braid does (it never notices a lost coordinator by itself).
"""

import os
import sys
import time

import numpy as np

import braid

braid.init()
x = np.ones(1000, np.float32)
step = 0
try:
    braid.allreduce(x, name="warmup")
    print(f"ready {braid.rank()} {os.getpid()}", flush=True)
    while len(sys.argv) > 2 and sys.argv[2] == "sleep":
        time.sleep(1)
    while True:
        braid.allreduce(x, name="loop")
        step += 1
except braid.BraidError as e:
    print(f"error {braid.rank()} {type(e).__name__}: {e}", flush=True)
    os._exit(1)
sys.exit(0)
