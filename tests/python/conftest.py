"""pytest configuration for braid's Python tests.

The tests need a CMake build tree (BRAID_BUILD_DIR, default build/ or build-py/ of the
repository) with the `braid` package in python/ and braid-coordinator built. The worker
scripts in workers/ run on several ranks through braid_launch.run_worker.
"""

import os
import sys

sys.dont_write_bytecode = True  # keep the source tree clean when run from CTest

import braid_launch  # noqa: E402  (this directory is on sys.path: it has no __init__.py)


def pytest_report_header(config):
    try:
        build = braid_launch.build_dir()
    except RuntimeError as e:
        return f"braid: {e}"
    launcher = braid_launch.find_braidrun(build) or "built-in launcher (braid-coordinator)"
    return f"braid: build dir {build}; launcher {launcher}"
