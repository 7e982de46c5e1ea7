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


def test_a_rank_that_raises_stops_the_job(tmp_path):
    braidrun = build_dir() / "tools" / "braidrun" / "braidrun"
    if not braidrun.exists():
        pytest.skip("braidrun is not built")
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
