"""The examples start from a fresh build as the README runs them: ``/usr/bin/python3
examples/X.py --help`` from the repository root, with no PYTHONPATH, prints the usage (the
examples find braid in build/python when it is not installed)."""

import os
import subprocess

import pytest

import braid_launch

REPO = braid_launch.REPO
EXAMPLES = ["train_fashion_mnist.py", "horovod_pytorch_mnist.py", "train_digits.py",
            "train_language_model.py"]


def test_examples_help_without_pythonpath():
    if not (REPO / "build" / "python" / "braid").is_dir():
        pytest.skip("no build tree at build/ (the README's scripts/build.sh puts it there)")
    env = {k: v for k, v in os.environ.items()
           if k != "PYTHONPATH" and not k.startswith("BRAID_")}
    # Started together: each spends its time importing torch.
    procs = {e: subprocess.Popen([braid_launch.PYTHON, f"examples/{e}", "--help"], cwd=REPO,
                                 env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 text=True)
             for e in EXAMPLES}
    for example, p in procs.items():
        try:
            out = p.communicate(timeout=120)[0]
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
        assert p.returncode == 0, f"{example} --help exited with {p.returncode}:\n{out}"
        assert out.startswith("usage: ") and "--epochs" in out, f"{example} --help:\n{out}"
