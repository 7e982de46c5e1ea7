"""The randomized fault soak (workers/fault_soak.py) on fixed seeds: a mixed workload of
every collective and every compression method, with faults injected on random ranks, must
give 0 wrong values, 0 hangs and 0 one-sided errors, with the fast path on and off and
fusion on and off, at 2, 3 and 4 ranks. Each seed injects every kind of fault at least 3
times and at least 80% of its collectives return (the worker checks both and prints its
counts). The long run (100,000 collectives and more) is in BENCHMARKS.md.
"""

import re

import pytest

import braid_launch

# (ranks, seed, steps, fast path, fusion threshold or None for the default)
CONFIGS = [
    (2, 11, 150, 1, None),
    (3, 12, 150, 0, 0),
    (4, 13, 120, 1, 0),
    (2, 14, 150, 0, None),
]

SUMMARY = re.compile(
    r"soak seed (\d+) rank (\d+)/(\d+): (\d+) steps, (\d+) collectives, (\d+) returned "
    r"\(([\d.]+)%\), faults: ((?:\w+=\d+ ?)+); 0 wrong values, 0 hangs, 0 one-sided errors")


@pytest.mark.parametrize("ranks,seed,steps,fast,fusion", CONFIGS,
                         ids=[f"np{c[0]}-seed{c[1]}-fast{c[3]}-fusion{c[4]}" for c in CONFIGS])
def test_fault_soak(ranks, seed, steps, fast, fusion):
    env = {
        # A fault costs seconds: the negotiation deadline 1.5 s, the stall check 1 s (the
        # fast path's fallback half of it).
        "BRAID_NEGOTIATION_TIMEOUT_S": "1.5",
        "BRAID_STALL_CHECK_S": "1",
        "BRAID_FAST_PATH": str(fast),
    }
    if fusion is not None:
        env["BRAID_FUSION_THRESHOLD"] = str(fusion)
    res = braid_launch.run_worker("fault_soak.py", ranks,
                                  args=["--seed", seed, "--steps", steps, "--fault-rate", 0.08],
                                  timeout=300, env=env)
    assert res.returncode == 0, res.output
    found = SUMMARY.findall(res.output)
    assert sorted(int(f[1]) for f in found) == list(range(ranks)), res.output
    for f in found:
        faults = dict(kv.split("=") for kv in f[7].split())
        assert set(faults) == {"name", "refuse", "mismatch", "delay", "object", "skip"}, f
        assert min(int(v) for v in faults.values()) >= 3, f
        assert float(f[6]) >= 80.0, f
        assert int(f[4]) >= 5 * steps // 2, f  # a mixed workload: 3-6 collectives a step
