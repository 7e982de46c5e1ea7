"""tools/bench/e2e_compare.py's table and verdicts, on synthetic braid-e2e-bench documents
(no processes)."""
import importlib.util
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.join(HERE, "..", "..", "tools", "bench")
sys.path.insert(0, BENCH)  # e2e_compare imports compare
SPEC = importlib.util.spec_from_file_location("e2e_compare", os.path.join(BENCH, "e2e_compare.py"))
e2e_compare = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(e2e_compare)


def doc(e2e, bare, step=None):
    """One braid-e2e-bench --json document with one size (4 bytes)."""
    d = {"rows": [{"bytes": 4, "e2e_us_median": e2e, "bare_us_median": bare,
                   "ratio": e2e / bare}], "step": None}
    if step is not None:
        d["step"] = {"bytes": 4096, "fused_step_us_median": step,
                     "unfused_step_us_median": 2 * step, "single_buffer_us_median": step / 2}
    return d


def test_rows_give_medians_spreads_ratio_and_verdict_per_size():
    runs = {"this": [doc(10, 5), doc(12, 5), doc(30, 6)],
            "base": [doc(20, 5), doc(21, 5), doc(22, 5)]}
    e2e, bare = e2e_compare.summarize(runs)
    assert (e2e["what"], e2e["bytes"]) == ("e2e", 4)
    assert (e2e["this_us"], e2e["this_min"], e2e["this_max"]) == (12, 10, 30)
    assert e2e["base_us"] == 21
    assert abs(e2e["before_over_after"] - 21 / 12) < 1e-12  # time_base / time_this
    assert e2e["verdict"] == "within spread"  # 30 overlaps the base's range
    assert bare["what"] == "bare" and bare["before_over_after"] == 1.0


def test_slower_and_faster_need_disjoint_ranges():
    assert e2e_compare.verdict([20, 21, 22], [10, 11, 19]) == "slower"
    assert e2e_compare.verdict([5, 6, 7], [8, 9, 30]) == "faster"
    assert e2e_compare.verdict([5, 9], [8, 30]) == "within spread"
    assert e2e_compare.verdict([20], [10]) == "one run: no spread"


def test_the_step_rows_follow_the_sizes():
    runs = {"this": [doc(1, 1, step=100), doc(1, 1, step=110)],
            "base": [doc(1, 1, step=200), doc(1, 1, step=210)]}
    rows = e2e_compare.summarize(runs)
    assert [r["what"] for r in rows] == ["e2e", "bare", "step, fused", "step, fusion off",
                                         "step as one buffer"]
    fused = rows[2]
    assert fused["bytes"] == 4096 and fused["verdict"] == "faster"
    assert fused["this_us"] == 105 and fused["base_us"] == 205
