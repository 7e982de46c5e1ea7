"""The PyTorch examples as users run them, through braidrun, on Fashion-MNIST.

- examples/train_fashion_mnist.py, the main job cut down for CI: 1 epoch on the first 12,000
  training images, 2 ranks, with none, fp16 and fp4 (same seed: same initial weights and
  batches). fp16 and fp4 must end within 1.5 points of none's test accuracy (10,000 test
  images; doing better passes, as in tools/convergence), and their byte counters must show
  the compression. Measured (loaded 2-core machine, seed 0): none 79.44%, fp16 79.38%,
  fp4 80.53%; about 12 s per job.
- examples/horovod_pytorch_mnist.py, Horovod's PyTorch MNIST example call for call: braid
  appears on its import line only, and it trains with Compression.fp16.
"""
import ast
import json
import os
import subprocess

import pytest

from braid_launch import PYTHON, REPO, build_dir

pytest.importorskip("torch")
DATA = "/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz"
TOLERANCE_POINTS = 1.5


def braidrun():
    path = build_dir() / "tools" / "braidrun" / "braidrun"
    if not path.exists():
        pytest.skip("braidrun is not built")
    if not os.path.exists(DATA):
        pytest.fail("Fashion-MNIST is missing: scripts/install_deps.sh installs "
                    "dataset-fashion-mnist")
    return str(path)


def run_job(np_, args, timeout=300):
    env = dict(os.environ, UCX_TLS="sm", UCX_NET_DEVICES="lo", OMP_NUM_THREADS="1")
    env.pop("BRAID_COMPRESSION", None)
    out = subprocess.run([braidrun(), "-np", str(np_), "--timeout", "60", PYTHON, *args],
                         env=env, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def test_fashion_mnist_compression_keeps_accuracy(tmp_path):
    results = {}
    for method in ("none", "fp16", "fp4"):
        report = tmp_path / f"{method}.json"
        run_job(2, [str(REPO / "examples" / "train_fashion_mnist.py"), "--epochs", "1",
                    "--train-subset", "12000", "--seed", "0", "--compression", method,
                    "--no-progress", "--json", str(report)])
        results[method] = json.loads(report.read_text())
    summary = {m: round(100 * r["test_accuracy"], 2) for m, r in results.items()}
    print(f"test accuracy after 1 epoch on 12,000 images, 2 ranks: {summary}")
    base = results["none"]
    assert base["train_images"] == 12000 and base["test_images"] == 10000, base
    assert base["test_accuracy"] > 0.70, base  # it learned: chance is 10%
    for method, ratio in (("fp16", 2.0), ("fp4", 7.0)):
        r = results[method]
        delta = 100 * (r["test_accuracy"] - base["test_accuracy"])
        assert delta >= -TOLERANCE_POINTS, f"{method}: {delta:+.2f} points vs none ({summary})"
        assert r["compression_ratio"] >= ratio * 0.99, (method, r["compression_ratio"])
        assert r["transport_bytes"] < base["transport_bytes"] / (ratio * 0.9), (method, r)
    assert abs(base["compression_ratio"] - 1.0) < 1e-9, base


def test_horovod_style_example_runs_with_only_the_import_changed():
    script = REPO / "examples" / "horovod_pytorch_mnist.py"
    text = script.read_text()
    doc_end = ast.parse(text).body[0].end_lineno  # the module docstring explains; skip it
    code = text.splitlines()[doc_end:]
    assert [l for l in code if "braid" in l] == ["import braid.torch as hvd  # noqa: E402"], \
        "braid must appear on the import line only"
    body = "\n".join(code)
    for call in ("hvd.init()", "hvd.broadcast_parameters(", "hvd.broadcast_optimizer_state(",
                 "hvd.DistributedOptimizer(", "hvd.Compression.fp16", "hvd.allreduce(",
                 "hvd.rank() == 0", "args.lr * lr_scaler"):
        assert call in body, call
    out = run_job(2, [str(script), "--epochs", "1", "--train-subset", "6000",
                      "--fp16-allreduce", "--log-interval", "40"])
    lines = [l for l in out.splitlines() if "Test set:" in l]
    assert len(lines) == 1 and lines[0].startswith("[0] "), out  # rank 0 alone prints
    accuracy = float(lines[0].rsplit("Accuracy: ", 1)[1].rstrip("%"))
    assert accuracy > 30.0, out
    assert "[0] Train Epoch: 1" in out and "[1] Train Epoch" not in out, out
