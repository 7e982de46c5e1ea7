"""Lets the examples run from a source checkout right after ``scripts/build.sh``.

When ``braid`` is not importable (not installed, no ``PYTHONPATH``), the build tree's Python
package (``build/python`` next to this directory, where ``scripts/build.sh`` puts it) is
appended to ``sys.path``. braidrun already sets ``PYTHONPATH`` for its ranks, and an installed
braid wins: this only makes ``/usr/bin/python3 examples/X.py --help`` (or a one-rank run)
work without it.
"""
import importlib.util
import os
import sys

if importlib.util.find_spec("braid") is None:
    _candidate = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                              "build", "python")
    if os.path.isdir(os.path.join(_candidate, "braid")):
        sys.path.append(_candidate)
