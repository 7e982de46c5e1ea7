"""examples/train_digits.py as a user runs it: through braidrun, on real data.

4 ranks must end bit-identical to each other, and equal (within float32 tolerance) to one
process training with the same global batch and seed -- which shows the averaging is right.
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from braid_launch import PYTHON, REPO, build_dir

EXAMPLE = str(REPO / "examples" / "train_digits.py")


def run_job(np_, tmp_path, tag, extra=()):
    braidrun = build_dir() / "tools" / "braidrun" / "braidrun"
    if not braidrun.exists():
        pytest.skip("braidrun is not built")
    env = dict(os.environ, UCX_TLS="sm", UCX_NET_DEVICES="lo")
    out = subprocess.run(
        [str(braidrun), "-np", str(np_), "--timeout", "30", PYTHON, EXAMPLE, "--epochs", "4",
         "--seed", "3", "--batch-size", "64", "--save-weights", str(tmp_path / tag),
         "--json", str(tmp_path / f"{tag}.json"), *extra],
        env=env, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stdout + out.stderr
    return out, json.loads((tmp_path / f"{tag}.json").read_text())


def load(tmp_path, tag, rank):
    with np.load(tmp_path / f"{tag}.rank{rank}.npz") as z:
        return {k: z[k] for k in z.files}


def test_four_ranks_match_one_rank_and_each_other(tmp_path):
    out4, m4 = run_job(4, tmp_path, "w4")
    _, m1 = run_job(1, tmp_path, "w1")
    # Output lines carry their rank prefix; rank 0 reports every epoch.
    epochs = [l for l in out4.stdout.splitlines() if l.startswith("[0] epoch")]
    assert len(epochs) == 4, out4.stdout
    ranks = [load(tmp_path, "w4", r) for r in range(4)]
    for r in range(1, 4):
        for name in ranks[0]:
            assert np.array_equal(ranks[0][name], ranks[r][name]), f"rank {r} {name} differs"
    single = load(tmp_path, "w1", 0)
    for name in single:
        np.testing.assert_allclose(ranks[0][name], single[name], rtol=1e-3, atol=1e-4,
                                   err_msg=name)
    assert m4["ranks"] == 4 and m1["ranks"] == 1
    assert abs(m4["test_accuracy"] - m1["test_accuracy"]) <= 0.01
    assert m4["test_accuracy"] > 0.9, m4
