"""Bad inputs from Python (workers/bad_inputs.py): configuration variables, names, ranks,
splits, ops, timeouts, compression specs, scale factors and oversized shapes, through the
NumPy and PyTorch APIs. Each raises braid.InvalidArgumentError naming the argument (never a
TypeError of the binding, never a truncated float), and the job goes on working after all of
them. The C API's cases are in tests/c_api/c_api_test.cc, the wire's in
tests/mp/coordinator_wire_test.cc.
"""

import re
import subprocess
from pathlib import Path

import braid_launch


def test_bad_inputs_each_give_their_clear_error():
    build = braid_launch.build_dir()
    script = Path(__file__).resolve().parent / "workers" / "bad_inputs.py"
    # A job of one rank without a launcher: the process hosts its own coordinator.
    res = subprocess.run([braid_launch.PYTHON, str(script)], cwd=script.parent,
                         env=braid_launch.rank_env(build), capture_output=True, text=True,
                         timeout=120)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    assert "all checks passed" in out, out
    cases = int(re.search(r"bad inputs: (\d+) cases", out).group(1))
    assert cases >= 30, out
    assert len(re.findall(r"^case \d+: .* -> InvalidArgumentError: ", out, re.M)) == cases, out
