"""tools/bench/compression_ablation.py's logic (no processes: its one job is stood in for):
the variants, --resume, and the table's differences from none's run of the same seed."""
import importlib.util
import json
import os

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
SPEC = importlib.util.spec_from_file_location(
    "compression_ablation",
    os.path.join(HERE, "..", "..", "tools", "bench", "compression_ablation.py"))
ablation = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(ablation)
RANK_SPEC = importlib.util.spec_from_file_location(
    "comm_bound_rank", os.path.join(HERE, "..", "..", "tools", "bench", "comm_bound_rank.py"))
rank_program = importlib.util.module_from_spec(RANK_SPEC)
RANK_SPEC.loader.exec_module(rank_program)


def test_variants_parse_and_default_to_scalecomps_parts():
    assert ablation.parse_variant("half=fp4:ef=1@0.005") == ("half", "fp4:ef=1", 0.005)
    assert ablation.parse_variant("b=scalecomp:ratio=100,beta=0.5") == \
        ("b", "scalecomp:ratio=100,beta=0.5", None)
    with pytest.raises(Exception, match="NAME=SPEC"):
        ablation.parse_variant("fp4")
    names = [v[0] for v in ablation.default_variants("lm")]
    assert names == ["none", "scalecomp", "beta=0.5", "beta=0.1", "leader=0", "start_step",
                     "granularity=tensor", "lr/2"]
    lm = dict((v[0], v) for v in ablation.default_variants("lm"))
    assert lm["start_step"][1] == "scalecomp:ratio=100,start_step=32"  # a tenth of 320 steps
    assert lm["lr/2"][2] == 2.5


def test_resume_and_the_table(tmp_path, monkeypatch):
    calls = []
    accuracy = {("none", 0): 0.90, ("none", 1): 0.80, ("scalecomp:ratio=100", 0): 0.88,
                ("scalecomp:ratio=100", 1): 0.79}

    def run_one(args, spec, lr, seed):
        calls.append((spec, seed))
        if spec == "fp4":
            return {"error": "exit 1"}
        return {"final_test_accuracy": accuracy[(spec, seed)]}

    monkeypatch.setattr(ablation, "run_one", run_one)
    build = tmp_path / "build"
    (build / "tools" / "braidrun").mkdir(parents=True)
    (build / "tools" / "braidrun" / "braidrun").touch()
    argv = ["--build-dir", str(build), "--out", str(tmp_path), "--seeds", "0", "1", "--variant", "none=none",
            "--variant", "sc=scalecomp:ratio=100", "--variant", "bad=fp4"]
    assert ablation.main(argv) == 1  # fp4 failed
    assert calls == [("none", 0), ("scalecomp:ratio=100", 0), ("fp4", 0), ("none", 1),
                     ("scalecomp:ratio=100", 1), ("fp4", 1)]
    table = (tmp_path / "table.md").read_text().splitlines()
    # sc: mean 83.50%, and -2 and -1 points against none's runs of the same seeds.
    assert table[3] == "| sc | `scalecomp:ratio=100` | 0.01 | 2 | 83.50% | -1.50 |", table
    assert table[4] == "| bad | `fp4` | 0.01 | 0 | failed | |", table
    calls.clear()
    ablation.main(argv + ["--resume"])
    assert calls == [("fp4", 0), ("fp4", 1)]  # only the failed runs again
    # Not another setting's runs (each default resolved: fmnist's own momentum and schedule
    # are no change); the workload, ranks and step limit count too.
    calls.clear()
    ablation.main(argv + ["--resume", "--momentum", "0.9", "--schedule", "cosine"])
    assert calls == [("fp4", 0), ("fp4", 1)]
    for other, said in ((["--momentum", "0"], "momentum 0.9, not 0.0"),
                        (["--schedule", "constant"], "schedule cosine, not constant"),
                        (["--ranks", "2"], "ranks 4, not 2"),
                        (["--max-steps", "20"], "max_steps 0, not 20"),
                        (["--workload", "lm"], "workload fmnist, not lm")):
        with pytest.raises(SystemExit, match=said):
            ablation.main(argv + ["--resume"] + other)
    runs = json.loads((tmp_path / "results.json").read_text())["runs"]
    assert len(runs) == 6


def test_the_language_models_table_compares_the_mean_of_the_last_five_scorings(tmp_path,
                                                                              monkeypatch):
    # Scorings every 25 steps; none's last five average 100, sc's 110 (+10%), while their final
    # scorings alone (90 against 120) would say +33%.
    def run_one(args, spec, lr, seed):
        last = [130, 110, 90, 80, 90] if spec == "none" else [100, 110, 100, 120, 120]
        history = [{"step": 25 * (i + 1), "valid_perplexity": 500 - i} for i in range(8)]
        history += [{"step": 225 + 25 * i, "valid_perplexity": v} for i, v in enumerate(last)]
        return {"final_valid_perplexity": last[-1], "history": history}

    monkeypatch.setattr(ablation, "run_one", run_one)
    assert ablation.WORKLOADS["lm"]["eval_every"] == 25 and ablation.WORKLOADS["lm"]["tail"] == 5
    build = tmp_path / "build"
    (build / "tools" / "braidrun").mkdir(parents=True)
    (build / "tools" / "braidrun" / "braidrun").touch()
    assert ablation.main(["--build-dir", str(build), "--out", str(tmp_path), "--workload", "lm",
                          "--variant", "none=none", "--variant", "sc=scalecomp:ratio=100"]) == 0
    table = (tmp_path / "table.md").read_text().splitlines()
    assert "mean of the last 5 scorings" in table[0], table
    assert table[2] == "| none | `none` | 5 | 1 | 90.0 | 100.0 |  |", table
    assert table[3] == "| sc | `scalecomp:ratio=100` | 5 | 1 | 120.0 | 110.0 | +10.00 |", table


def test_the_language_model_is_scored_every_25_steps_and_the_cnn_once(monkeypatch):
    seen = []

    class Done:
        returncode = 0
        stdout = '[0] RESULT {"final_valid_perplexity": 1.0}\n'

    def run(cmd, **kwargs):
        seen.append(cmd)
        return Done()

    monkeypatch.setattr(ablation.subprocess, "run", run)
    for workload in ("lm", "fmnist"):
        args = ablation.parse_args(["--workload", workload])
        assert ablation.run_one(args, "none", None, 0) == {"final_valid_perplexity": 1.0}
    assert seen[0][seen[0].index("--eval-every") + 1] == "25"
    assert seen[1][seen[1].index("--eval-every") + 1] == "0"
    assert "--momentum" not in seen[1]  # the workload's own
    args = ablation.parse_args(["--workload", "fmnist", "--momentum", "0"])
    ablation.run_one(args, "none", 0.1, 0)
    assert seen[2][seen[2].index("--momentum") + 1] == "0.0"
    assert seen[2][seen[2].index("--lr") + 1] == "0.1"
    assert "--schedule" not in seen[2]  # the workload's own
    ablation.run_one(ablation.parse_args(["--schedule", "constant"]), "none", None, 0)
    assert seen[3][seen[3].index("--schedule") + 1] == "constant"


def test_bad_variants_and_arguments_are_refused_before_any_job(tmp_path, monkeypatch):
    monkeypatch.setattr(ablation, "run_one", lambda *a: pytest.fail("a job ran"))
    build = os.environ.get("BRAID_BUILD_DIR") or os.path.join(HERE, "..", "..", "build")
    if not os.path.exists(os.path.join(build, "python", "braid")):
        pytest.skip("needs the build's braid module (BRAID_BUILD_DIR)")
    with pytest.raises(SystemExit, match="late: compression 'scalecomp:ratio=0'.*'ratio'"):
        ablation.main(["--build-dir", build, "--out", str(tmp_path), "--variant", "none=none",
                       "--variant", "late=scalecomp:ratio=0"])
    for bad in (["--variant", "a=none@-1"], ["--ranks", "0"], ["--max-steps", "-3"]):
        with pytest.raises(SystemExit):
            ablation.parse_args(bad)


def test_the_rank_programs_learning_rate_schedules():
    # fmnist decays its rate (0.01 x 4 ranks) along a cosine to 0 at the last step; lm's is
    # constant (5 x 4); either takes the other with --schedule.
    fmnist = rank_program.parse_args(["--framework", "braid"])
    assert (fmnist.schedule, fmnist.lr) == ("cosine", 0.01)
    rates = [rank_program.scheduled_lr(fmnist, 4, step, 100) for step in (0, 50, 100)]
    assert rates == pytest.approx([0.04, 0.02, 0.0], abs=1e-12)
    lm = rank_program.parse_args(["--framework", "braid", "--workload", "lm"])
    assert [rank_program.scheduled_lr(lm, 4, step, 100) for step in (0, 99)] == [20.0, 20.0]
    flat = rank_program.parse_args(["--framework", "braid", "--schedule", "constant"])
    assert rank_program.scheduled_lr(flat, 4, 99, 100) == pytest.approx(0.04)
    lm.schedule = "cosine"
    assert rank_program.scheduled_lr(lm, 4, 50, 100) == pytest.approx(10.0)
