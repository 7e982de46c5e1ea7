"""tools/bench/comm_bound_bench.py's logic (no processes, no hosts): the floor of an
uncompressed step (the fewest bytes a rank must send, in frames, at the link rate, plus the
computation no communication overlaps); time to a target accuracy or perplexity; --resume
(only the missing or failed runs run again, results.json written after each run); merging
parts of a matrix."""
import importlib.util
import json
import os

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
SPEC = importlib.util.spec_from_file_location(
    "comm_bound_bench", os.path.join(HERE, "..", "..", "tools", "bench", "comm_bound_bench.py"))
bench = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(bench)


def run(**kw):
    r = {"method": "none", "label": "braid none", "ranks": 4, "rate": "100mbit",
         "gradient_bytes": 861_480, "forward_median_s": 0.004, "update_median_s": 0.001,
         "step_time_median_s": 0.125, "wire_bytes_timed": 4 * 30 * 1_400_000,
         "timed_steps": 30}
    r.update(kw)
    return r


def test_floor_is_frames_at_the_rate_plus_the_computation():
    # 2*3/4 of 861,480 bytes = 1,292,220 bytes of payload: 893 frames (892.4 rounded up) of
    # 1514 bytes = 1,352,002 bytes, 108.16016 ms at 12.5 MB/s; plus 4 + 1 ms.
    seconds, wire = bench.floor_of(run())
    assert wire == 893 * 1514
    assert abs(seconds - (1_352_002 / 12.5e6 + 0.005)) < 1e-12
    # Two ranks send half the gradient bytes' worth twice: 2*1/2.
    _, wire2 = bench.floor_of(run(ranks=2))
    assert wire2 == 595 * 1514  # 861,480 / 1448 = 594.9
    seconds_g, _ = bench.floor_of(run(rate="1gbit"))
    assert abs(seconds_g - (1_352_002 / 125e6 + 0.005)) < 1e-12


def test_older_results_have_no_floor():
    assert bench.floor_of({"ranks": 4, "rate": "100mbit", "step_time_median_s": 0.1}) is None


def test_table_lists_the_uncompressed_methods_only():
    runs = [run(), run(method="ddp", label="DDP gloo", step_time_median_s=0.131),
            run(method="fp16", label="braid fp16"),
            run(method="ddp-braid", label="DDP braid backend", step_time_median_s=0.133),
            run(method="ddp-braid-hook:powersgd:rank=2", label="DDP braid hook")]
    lines = bench.floor_table(runs, [(4, "100mbit")])
    assert len(lines) == 5, lines
    assert lines[2].startswith("| 4 ranks 100mbit | braid none | 125.0 | 113.2 (108.2 + 4.0 + "
                               "1.0) | 1.105 | 1400, 1292, 1352 |"), lines[2]
    assert "| DDP gloo | 131.0 |" in lines[3]
    assert "| DDP braid backend | 133.0 |" in lines[4]


def test_results_record_no_path_of_the_machine():
    args = bench.parse_args(["--build-dir", os.path.join(bench.REPO, "build"),
                             "--out", "/tmp/somewhere/cb_ddp/"])
    recorded = bench.recorded_args(args)
    assert (recorded["build_dir"], recorded["out"]) == ("build", "cb_ddp")
    assert recorded["ranks"] == args.ranks


def lm_run(method, perplexities, step_s=1.0, **kw):
    r = {"method": method, "label": f"braid {method}", "ranks": 4, "rate": "100mbit",
         "workload": "lm", "framework": "braid", "steps": 10 * len(perplexities),
         "step_time_median_s": step_s, "wire_bytes": 1e6,
         "history": [{"step": 10 * (i + 1), "train_time_s": 10.0 * (i + 1) * step_s,
                      "valid_perplexity": p} for i, p in enumerate(perplexities)]}
    r.update(kw)
    return r


def test_time_to_a_perplexity_is_the_first_score_at_or_below_it():
    history = lm_run("none", [900.0, 151.0, 150.0, 140.0])["history"]
    assert bench.time_to(history, 150.0, "lm") == 30.0
    assert bench.time_to(history, 100.0, "lm") is None
    # An accuracy is reached at or above its target.
    acc = [{"train_time_s": 1.0, "test_accuracy": 0.5}, {"train_time_s": 2.0, "test_accuracy": 0.9}]
    assert bench.time_to(acc, 0.88) == 2.0


def test_language_model_table_gives_time_to_perplexity_and_the_final_perplexity():
    runs = [lm_run("none", [300.0, 160.0, 149.0], step_s=3.0),
            lm_run("powersgd:rank=2", [400.0, 140.0, 120.0], step_s=1.0),
            lm_run("local", [200.0], step_s=0.5, framework="local", label="no communication")]
    lines = bench.accuracy_table(runs, 150.0, "lm")
    assert "time to perplexity 150 (s)" in lines[0] and "final perplexity" in lines[0], lines
    # none: 90 s (third score); powersgd: 20 s (second): 4.50x; comm share 1 - 0.5/3.
    assert lines[2] == "| braid none | 3000.0 | 83% | 90.0 | 1.00x | 149.0 | 0.033 |", lines
    assert lines[3] == "| braid powersgd:rank=2 | 1000.0 | 50% | 20.0 | 4.50x | 120.0 | 0.033 |"
    # Training alone, its score compares with nothing: only its step time is shown.
    assert lines[4] == "| no communication | 500.0 | | - | | - | 0.100 |", lines


class FakeHosts:
    """Stands in for the test hosts: records the jobs asked for and fails those in fail."""
    jobs, fail = [], set()

    def __init__(self, n, rate):
        self.n, self.rate = n, rate

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass

    def run_job(self, build, method, extra, timeout):
        FakeHosts.jobs.append((method, self.n, self.rate))
        if method in FakeHosts.fail:
            return {"method": method, "label": method, "error": "exit 1"}
        return lm_run(method, [100.0], ranks=self.n, rate=self.rate)


def test_resume_runs_only_the_missing_and_the_failed_and_writes_after_each(tmp_path, monkeypatch):
    monkeypatch.setattr(bench, "HostSet", FakeHosts)
    monkeypatch.setattr(bench, "check_setup", lambda args: None)
    FakeHosts.jobs, FakeHosts.fail = [], {"fp4"}
    common = ["--workload", "lm", "--out", str(tmp_path), "--ranks", "4"]
    assert bench.main(common + ["--methods", "none", "fp4"]) == 1  # fp4 failed
    assert FakeHosts.jobs == [("none", 4, "100mbit"), ("fp4", 4, "100mbit")]
    FakeHosts.jobs, FakeHosts.fail = [], set()
    assert bench.main(common + ["--resume", "--methods", "none", "fp4", "fp16"]) == 0
    assert FakeHosts.jobs == [("fp4", 4, "100mbit"), ("fp16", 4, "100mbit")]
    doc = json.loads((tmp_path / "results.json").read_text())
    assert [r["method"] for r in doc["accuracy_runs"]] == ["none", "fp4", "fp16"]
    assert not any("error" in r for r in doc["accuracy_runs"])
    # Nor does it keep runs of another length, cadence or seed.
    for other, said in ((["--max-steps", "50"], "--max-steps 0, not 50"),
                        (["--eval-every", "7"], "--eval-every 25, not 7"),
                        (["--seed", "1"], "seed 0, not 1")):
        with pytest.raises(SystemExit, match=said):
            bench.main(common + ["--resume", "--methods", "none"] + other)
    assert FakeHosts.jobs == [("fp4", 4, "100mbit"), ("fp16", 4, "100mbit")]
    # Without --resume everything runs again.
    FakeHosts.jobs = []
    assert bench.main(common + ["--methods", "none"]) == 0
    assert FakeHosts.jobs == [("none", 4, "100mbit")]


def test_results_are_written_after_every_run(tmp_path, monkeypatch):
    seen = []

    class Hosts(FakeHosts):
        def run_job(self, *a):
            path = tmp_path / "results.json"
            seen.append(len(json.loads(path.read_text())["accuracy_runs"])
                        if path.exists() else 0)
            return super().run_job(*a)

    monkeypatch.setattr(bench, "HostSet", Hosts)
    monkeypatch.setattr(bench, "check_setup", lambda args: None)
    FakeHosts.jobs, FakeHosts.fail = [], set()
    bench.main(["--workload", "lm", "--out", str(tmp_path), "--methods", "none", "fp4", "fp16"])
    assert seen == [0, 1, 2]


def test_merging_refuses_two_workloads(tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps({"accuracy_runs": [lm_run("none", [100.0])]}))
    b.write_text(json.dumps({"accuracy_runs": [run()]}))  # a Fashion-MNIST run
    with pytest.raises(ValueError, match="several workloads"):
        bench.merged_results([str(a), str(b)])
    c = tmp_path / "c.json"
    c.write_text(json.dumps({"accuracy_runs": [lm_run("fp4", [90.0])]}))
    merged, _ = bench.merged_results([str(a), str(c)])
    assert [r["method"] for r in merged["accuracy_runs"]] == ["none", "fp4"]
    # A file that is missing, not JSON, or another tool's results: a clear error, not a table.
    d = tmp_path / "ablation.json"
    d.write_text(json.dumps({"workload": "lm", "ranks": 4, "runs": []}))
    for bad, said in ((tmp_path / "missing.json", "No such file"), (d, "not a results.json")):
        with pytest.raises(ValueError, match=said):
            bench.merged_results([str(bad)])
