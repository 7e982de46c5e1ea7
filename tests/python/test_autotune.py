"""Autotuning through braidrun (docs/configuration.md, Autotuning): real processes, the real
coordinator. Every rank applies the same settings changes at the same steps, the search ends
once and says so, and rank 0's --autotune-log-file has a header and one row per measured
candidate, whose best is the settings the job keeps."""
import os
import re
import subprocess
from pathlib import Path

import pytest

from braid_launch import PYTHON, build_dir

BENCH = Path(__file__).resolve().parents[2] / "tools" / "bench" / "autotune_bench.py"
CHANGE = re.compile(r"^\[(\d)\] .*braid: settings epoch (\d+) from step (\d+): (.*) \((.*)\)$")


def settings_changes(text):
    """Per rank, the (epoch, step, settings, reason) of each change it logged."""
    changes = {0: [], 1: []}
    for line in text.splitlines():
        m = CHANGE.match(line)
        if m:
            changes[int(m.group(1))].append(m.groups()[1:])
    return changes


def test_every_rank_changes_settings_at_the_same_steps(tmp_path):
    braidrun = build_dir() / "tools" / "braidrun" / "braidrun"
    if not braidrun.exists():
        pytest.skip("braidrun is not built")
    log = tmp_path / "autotune.csv"
    # GLOG_v=1: the ranks other than 0 log their changes too (rank 0 always does).
    env = dict(os.environ, UCX_TLS="sm", UCX_NET_DEVICES="lo", GLOG_v="1",
               PYTHONPATH=str(build_dir() / "python"))
    out = subprocess.run(
        [str(braidrun), "-np", "2", "--autotune", "--autotune-log-file", str(log), PYTHON,
         str(BENCH), "--rank-program", "--steps", "250", "--tensors", "40", "--mib", "1"],
        env=env, capture_output=True, text=True, timeout=120)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-4000:]
    changes = settings_changes(text)
    assert len(changes[0]) >= 5, text[-4000:]
    assert changes[1] == changes[0]
    steps = [int(step) for _, step, _, _ in changes[0]]
    assert steps == sorted(set(steps)), "one change per step at most, in order"
    done = [c for c in changes[0] if c[3].startswith("autotuning done after")]
    assert len(done) == 1 and done[0] == changes[0][-1], changes[0]
    rows = log.read_text().splitlines()
    assert rows[0] == ("epoch,step,fusion_threshold_bytes,cycle_time_ms,ring_chunk_bytes,"
                       "ring_window,measured_steps,bytes_per_second,best")
    rows = [r.split(",") for r in rows[1:]]
    assert len(rows) == len(changes[0]), "one row per measured candidate"
    assert [int(r[0]) for r in rows] == list(range(len(rows)))
    # The settings kept are the last candidate marked best.
    best = [r for r in rows if r[8] == "1"][-1]
    kept = changes[0][-1][2]
    mib = int(best[2]) // (1 << 20)
    assert f"fusion_threshold={mib}MiB" in kept or best[2] == "0", (best, kept)
    assert f"ring_window={best[5]}" in kept, (best, kept)
    cycle = "own" if float(best[3]) == 0 else f"{float(best[3]):g}ms"
    assert f"cycle_time={cycle}" in kept, (best, kept)


AUTO_WORKER = """
import torch
import braid.torch as hvd

hvd.init()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 10))
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                               named_parameters=model.named_parameters(), compression="auto")
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
x = torch.randn(32, 64)
for step in range(20):
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), torch.zeros(32, 10)).backward()
    opt.step()
print("rank", hvd.rank(), "weights", float(model[0].weight.sum()), flush=True)
hvd.shutdown()
"""


def test_compression_auto_chooses_once_at_the_same_step(tmp_path):
    """DistributedOptimizer(compression="auto") through braidrun: after the warm-up steps and
    a window, both ranks apply the same choice at the same step, and its reason; over shared
    memory with this small model, none (docs/compression.md, Chosen by braid)."""
    braidrun = build_dir() / "tools" / "braidrun" / "braidrun"
    if not braidrun.exists():
        pytest.skip("braidrun is not built")
    worker = tmp_path / "auto_worker.py"
    worker.write_text(AUTO_WORKER)
    env = dict(os.environ, UCX_TLS="sm", UCX_NET_DEVICES="lo", GLOG_v="1",
               PYTHONPATH=str(build_dir() / "python"))
    out = subprocess.run([str(braidrun), "-np", "2", PYTHON, str(worker)], env=env,
                         capture_output=True, text=True, timeout=120)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-4000:]
    changes = settings_changes(text)
    assert len(changes[0]) == 1, text[-4000:]
    assert changes[1] == changes[0]
    epoch, step, settings, reason = changes[0][0]
    assert epoch == "1" and int(step) >= 11, changes[0]
    assert settings.endswith("auto compression=none"), settings
    # none's step is within 25% of the shortest: its reduction is small against the step.
    assert reason.startswith("auto: none, link ") and "is within 25% of " in reason, reason
    weights = re.findall(r"rank (\d) weights (\S+)", text)
    assert len(weights) == 2 and weights[0][1] == weights[1][1], weights
