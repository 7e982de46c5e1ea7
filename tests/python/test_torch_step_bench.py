"""tools/bench/torch_step_bench.py's choice of DDP communication hook for a braid compression
spec (pure functions; no processes)."""
import importlib.util
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tools", "bench"))  # its `compare` import
SPEC = importlib.util.spec_from_file_location(
    "torch_step_bench", os.path.join(HERE, "..", "..", "tools", "bench", "torch_step_bench.py"))
bench = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(bench)


def test_auto_hook_matches_the_compression():
    assert bench.resolve_ddp_hook("auto", "powersgd:rank=4") == "powersgd"
    assert bench.resolve_ddp_hook("auto", "fp16") == "fp16"
    assert bench.resolve_ddp_hook("auto", "scalecomp:ratio=100") == "none"
    assert bench.resolve_ddp_hook("auto", None) == "none"
    assert bench.resolve_ddp_hook("fp16", "powersgd:rank=2") == "fp16"  # explicit wins


def test_powersgd_spec_becomes_the_hooks_arguments():
    assert bench.powersgd_options("powersgd:rank=4,min_compression_rate=4,ef=0,warm_start=0,"
                                  "orthogonalization_epsilon=1e-08,start_step=5") == {
        "matrix_approximation_rank": 4, "min_compression_rate": 4.0,
        "use_error_feedback": False, "warm_start": False, "orthogonalization_epsilon": 1e-8}
    # braid's defaults are the hook's, at rank 1, whatever the spec is of another method.
    want = {"matrix_approximation_rank": 1, "min_compression_rate": 2.0,
            "use_error_feedback": True, "warm_start": True, "orthogonalization_epsilon": 0.0}
    assert bench.powersgd_options("powersgd") == want
    assert bench.powersgd_options("fp16") == want
