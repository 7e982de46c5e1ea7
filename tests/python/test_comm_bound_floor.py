"""tools/bench/comm_bound_bench.py's floor of an uncompressed step (pure functions; no
processes): the fewest bytes a rank must send, in frames, at the link rate, plus the
computation no communication overlaps."""
import importlib.util
import os

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
