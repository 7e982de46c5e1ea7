"""tools/bench/compare.py's before/after verdict, on synthetic runs (no processes)."""
import importlib.util
import os

HERE = os.path.dirname(os.path.abspath(__file__))
SPEC = importlib.util.spec_from_file_location(
    "compare", os.path.join(HERE, "..", "..", "tools", "bench", "compare.py"))
compare = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(compare)


def run(variant, rnd, times):
    """A record of one run of `variant` with per-size mean times {bytes: us}."""
    rows = [{"bytes": b, "count": b // 4, "inplace": True, "time_us": t, "time_us_median": t,
             "algbw_gbps": b / t / 1e3, "busbw_gbps": b / t / 1e3, "wrong": 0}
            for b, t in times.items()]
    return {"variant": variant, "round": rnd, "doc": {"rows": rows}}


def verdicts(after, before):
    records = [run("braid-shm", i, {1024: t}) for i, t in enumerate(after)]
    records += [run("base-shm", i, {1024: t}) for i, t in enumerate(before)]
    summary = compare.summarize(records, "in-place")
    return compare.before_after(summary, 1024)


def test_overlapping_ranges_are_within_spread():
    [(label, a, b, ratio, verdict)] = verdicts([10, 12, 30], [9, 11, 13])
    assert label == "shm" and verdict == "within spread"
    assert a["time_us"] == 12 and b["time_us"] == 11
    assert abs(ratio - 11 / 12) < 1e-12  # time_before / time_after


def test_slower_and_faster_need_disjoint_ranges():
    assert verdicts([20, 21, 22], [10, 11, 19])[0][4] == "slower"
    assert verdicts([5, 6, 7], [8, 9, 30])[0][4] == "faster"


def test_a_single_run_gives_no_verdict():
    assert verdicts([20], [10])[0][4] == "one run: no spread"


def test_the_table_shows_the_spread_of_each_side():
    records = [run("braid-tcp", i, {4: t}) for i, t in enumerate([7.0, 8.0, 9.0])]
    records += [run("base-tcp", i, {4: t}) for i, t in enumerate([6.0, 6.5, 30.0])]
    lines = compare.before_after_lines(compare.summarize(records, "in-place"), [4], True)
    assert lines[0].startswith("| size | tcp after us | tcp before us")
    assert lines[2] == ("| 4 | 8.0 (7.0-9.0) | 6.5 (6.0-30.0) | 0.81x | within spread |")
