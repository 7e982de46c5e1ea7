"""The convergence harness (tools/convergence/check_convergence.py) on 4 ranks, 20 epochs.

fp16, bf16, fp4, int4 and powersgd:rank=2 must end within 1 point of uncompressed training's
test accuracy with the payload ratio they exist for (one harness call: the baseline runs
once), and the deliberately harmful test_randomk (keeps 1% of the gradient,
BRAID_TEST_COMPRESSORS=1) must be flagged, as must a PowerSGD warm-up longer than the run
(accurate, but it never compressed) -- which shows the check can fail. Fusion is on (braidrun's default); each run is bit-for-bit repeatable, so
the verdict is too. Each job takes ~5 s on an idle 2-core machine (mostly start-up: numpy,
scikit-learn) and up to ~15 s on a loaded one; nine jobs in all.

Measured at 20 epochs, seed 0, fusion on: none 97.78%, fp16 97.78%, bf16 97.78%, fp4 98.00%
(+0.22), int4 97.78% (+0.00), powersgd:rank=2 97.78% (+0.00, payload ratio 10.06x),
test_randomk:keep=0.01 86.00% (-11.78), powersgd:rank=2,start_step=100000 97.78% (ratio 1.00x).

scalecomp:ratio=50 runs in a call of its own, at 40 epochs and without fusion: keeping 2% of
the gradient, it converges more slowly (at 20 epochs it ends 0.9-2.0 points below `none`,
depending on how fusion grouped the tensors); at 40 both reach the same plateau (measured:
none 97.56%, scalecomp:ratio=50 97.78%). Without fusion every tensor is its own bucket, so
the run is repeatable and the achieved ratio is known exactly: k = ceil(N / 50) per tensor,
82 + 2 + 13 + 1 = 98 of 4810 elements.
"""
import json
import os
import subprocess

import pytest

from braid_launch import PYTHON, REPO, build_dir

HARNESS = str(REPO / "tools" / "convergence" / "check_convergence.py")
GOOD = ["fp16", "bf16", "fp4", "int4", "powersgd:rank=2"]
HARMFUL = "test_randomk:keep=0.01"
NEVER_COMPRESSES = "powersgd:rank=2,start_step=100000"
# train_digits.py's gradients (64x64, 64, 64x10, 10 floats): 19,240 bytes a step; PowerSGD at
# rank 2 sends (64+64)*2*4 + (64+10)*2*4 + 64*4 + 10*4 = 1,912 of them.
POWERSGD_RATIO = 19240 / 1912
EPOCHS = 20


def run_harness(tmp_path, tag, specs, extra_env=None, extra_args=()):
    braidrun = build_dir() / "tools" / "braidrun" / "braidrun"
    if not braidrun.exists():
        pytest.skip("braidrun is not built")
    env = dict(os.environ, UCX_TLS="sm", UCX_NET_DEVICES="lo", OMP_NUM_THREADS="1")
    env.pop("BRAID_COMPRESSION", None)  # the baseline must really be uncompressed
    env.pop("BRAID_TEST_COMPRESSORS", None)
    env.update(extra_env or {})
    report = tmp_path / f"{tag}.json"
    out = subprocess.run(
        [PYTHON, HARNESS, *specs, "--ranks", "4", "--epochs", str(EPOCHS), "--tolerance", "1.0",
         "--braidrun", str(braidrun), "--json", str(report), *extra_args],
        env=env, capture_output=True, text=True, timeout=600)
    text = out.stdout + out.stderr
    assert report.exists(), text
    return out.returncode, json.loads(report.read_text()), text


def test_good_methods_reach_the_uncompressed_accuracy(tmp_path):
    rc, report, text = run_harness(tmp_path, "good", GOOD)
    print(text)  # the table, for the log (pytest -rA shows it)
    assert report["baseline"]["accuracy"] > 0.95, text
    assert [m["spec"] for m in report["methods"]] == GOOD, text
    assert rc == 0, text
    for m in report["methods"]:
        assert m["status"] == "pass" and m["delta_points"] >= -1.0, (m["spec"], text)
        assert m["ratio_ok"] and m["payload_ratio"] >= 1.5, (m["spec"], text)
    ratios = {m["spec"]: m["payload_ratio"] for m in report["methods"]}
    assert ratios["fp16"] == 2.0 and ratios["bf16"] == 2.0, text
    assert abs(ratios["powersgd:rank=2"] - POWERSGD_RATIO) < 1e-9, text
    assert "PASS" in out_lines(text), text


def test_harmful_method_is_flagged(tmp_path):
    rc, report, text = run_harness(tmp_path, "harmful", [HARMFUL, NEVER_COMPRESSES],
                                   extra_env={"BRAID_TEST_COMPRESSORS": "1"})
    print(text)
    assert rc == 1, text
    m, warm = report["methods"]
    # FAIL (accuracy), not ERROR (a job that did not run): the accuracy check caught it.
    assert m["spec"] == HARMFUL and m["status"] == "FAIL", text
    assert m["delta_points"] < -1.0, text
    # Uncompressed all along: as accurate as the baseline, failed by its payload ratio.
    assert warm["spec"] == NEVER_COMPRESSES and warm["status"] == "FAIL", text
    assert warm["payload_ratio"] == 1.0 and warm["ratio_ok"] is False, text
    assert abs(warm["delta_points"]) < 1e-9, text
    assert report["failed"] == [HARMFUL, NEVER_COMPRESSES] and report["passed"] is False, text
    assert f"FAIL: {HARMFUL}, {NEVER_COMPRESSES}" in out_lines(text), text


def test_scalecomp_reaches_the_uncompressed_accuracy_at_its_ratio(tmp_path):
    spec = "scalecomp:ratio=50"
    rc, report, text = run_harness(tmp_path, "scalecomp", [spec],
                                   extra_args=["--epochs", "40", "--fusion-threshold-mb", "0"])
    print(text)
    assert rc == 0, text
    (m,) = report["methods"]
    assert m["spec"] == spec and m["status"] == "pass" and m["delta_points"] >= -1.0, text
    # Payload: 4 bytes per selected element, every step; uncompressed: 4 per element.
    assert m["ratio"]["achieved"] == pytest.approx(4810 / 98, rel=1e-9), text
    assert m["ratio"]["dense_per_k"] == pytest.approx(4810 / 98, rel=1e-9), text
    # On the wire: the values' all-reduce and the leaders' index broadcasts, far below `none`.
    assert m["ratio"]["wire"] > 10, text


def out_lines(text):
    return [l.strip() for l in text.splitlines()]
